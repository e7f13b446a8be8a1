"""Helpers for the router-replica tests and benchmarks/failover.py (issue 29): kit's router image
(built once, cached by tag), a load through kit's own bench runner in its keep-going mode (the
load of a failover measurement), and reading each replica's supervision record. Not a test module."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit.bench.dataset import Prompt
from kit.bench.metrics import RequestRecord, output_tokens
from kit.bench.runner import Runner, Target
from kit.bench.schedule import LoadPoint
from tests.integration import supervise_support as sup

ROUTER_IMAGE = "kit/vllm-router:0.1.17"
VERSION = "0.1.17"  # vllm-router, as containers/router/Dockerfile pins it


def ensure_router_image(docker_client: Any, kit: Any, tmp: Path) -> None:
    """`kit build router` once (the tag is the cache): the wheel fetched by the host's pip (its
    index and CA settings), the build itself offline from it."""
    try:
        docker_client.images.get(ROUTER_IMAGE)
        return
    except Exception:  # not built yet
        pass
    wheels = tmp / "router-wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    got = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), f"vllm-router=={VERSION}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert got.returncode == 0, got.stderr[-2000:]
    built = kit("build", "router", "--wheels", str(wheels), "--offline")
    assert built.returncode == 0, built.stderr[-3000:]


@dataclass
class Load:
    """A steady load through kit's bench runner with keep_going: `rate` requests a second (at most
    `concurrency` in flight) for `seconds`, every failure counted and timed, in a thread."""

    url: str
    key: str | None
    rate: float = 2.0
    concurrency: int = 4
    seconds: float = 120.0
    max_tokens: int = 16
    records: list[RequestRecord] = field(default_factory=list)
    t0_wall: float = 0.0
    t0_perf: float = 0.0
    _runner: Runner | None = None
    _thread: threading.Thread | None = None

    def start(self) -> Load:
        n = max(1, int(self.rate * self.seconds))
        prompts = [
            Prompt(({"role": "user", "content": f"load {i}: tell me a story"},), self.max_tokens, 8) for i in range(n)
        ]
        target = Target(self.url, "tiny", api_key=self.key, timeout_s=60, keep_going=True)
        self._runner = Runner(target)
        self.t0_wall, self.t0_perf = time.time(), time.perf_counter()

        def run() -> None:
            assert self._runner is not None
            self.records = self._runner.run(prompts, LoadPoint(self.rate, self.concurrency)).records

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._runner is not None:
            self._runner.stop("the test is done")
        if self._thread is not None:
            self._thread.join(90)

    def wall(self, record: RequestRecord) -> float:
        return self.t0_wall + (record.start - self.t0_perf)

    def between(self, t0: float, t1: float) -> list[RequestRecord]:
        """Requests sent between wall times t0 and t1 (stopped ones left out)."""
        return [r for r in self.records if r.error != "stopped" and t0 <= self.wall(r) <= t1]

    def summary(self, t0: float, t1: float) -> dict[str, Any]:
        sent = self.between(t0, t1)
        # Whole answers only: a stream cut after its first token is a success to the bench client.
        ok = [r for r in sent if r.success and output_tokens(r) >= self.max_tokens]
        return {
            "sent": len(sent),
            "answered": len(ok),
            "failed": len(sent) - len(ok),
            "availability": round(len(ok) / len(sent), 3) if sent else math.nan,
            "errors": sorted({r.error for r in sent if not r.success})[:5],
        }


def replica_events(container: Any, slot: int = 0) -> list[Any]:
    """The supervision record of the replica in `slot` of the node (its coordinator's run directory)."""
    from kit.plan.supervise import run_files
    from kit.supervise import events

    text = sup.exec_out(container, ["cat", f"{run_files(slot).run_dir}/events.jsonl"])
    return events.parse_lines(text.splitlines())


def wait_kinds(container_of: Any, kinds: list[str], *, after: float, timeout: float, slot: int = 0) -> dict[str, Any]:
    """Each of `kinds`, in order, recorded after wall time `after` by the coordinator of the
    replica in `slot` of the node in container_of() (a container that may be restarted meanwhile)."""
    found: dict[str, Any] = {}
    start = after
    end = time.monotonic() + timeout
    for kind in kinds:
        while kind not in found:
            try:
                hits = [e for e in replica_events(container_of(), slot) if e.kind == kind and e.ts >= start]
            except Exception:  # the node is restarting: its exec fails for a moment
                hits = []
            if hits:
                found[kind] = hits[0]
                start = hits[0].ts
            elif time.monotonic() > end:
                raise AssertionError(f"slot {slot}: no {kind} within {timeout} s")
            else:
                time.sleep(1)
    return found


def replica_processes(container: Any, ports: tuple[int, ...] = (8100, 8101)) -> dict[int, dict[str, Any]]:
    """Per replica API port on the node: its `vllm serve` (pid, process group) and the engines of
    that process group."""
    rows = sup.processes(container)
    serve = sup.serving_processes(container)["serve"]
    out = {}
    for port in ports:
        [mine] = [p for p in serve if f"--port {port}" in p["cmd"]]
        engines = [p["pid"] for p in rows if p["cmd"].startswith("VLLM::") and p["pgid"] == mine["pgid"]]
        out[port] = {"serve": mine["pid"], "pgid": mine["pgid"], "engines": sorted(engines)}
    return out


def kill_replica_engines(container: Any, port: int) -> list[int]:
    """kill -9 of the engines of the replica whose API server listens on `port` in the container
    (its own process group: a replica beside it on the node keeps its engines); their pids."""
    pids: list[int] = replica_processes(container, (port,))[port]["engines"]
    for pid in pids:
        container.exec_run(["kill", "-9", str(pid)])
    return pids
