"""Helpers for the supervision tests and benchmarks/recovery.py (issue 18): a steady request load
through kit's bench client, faults injected into the node containers, the supervisor's event
record and the processes left in each container. Not a test module."""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kit.bench.dataset import Prompt
from kit.bench.runner import Runner, Target
from kit.bench.schedule import LoadPoint
from kit.plan.supervise import RUN_DIR
from kit.supervise import events

# Shell run inside a node container: signal every process whose title (argv[0]) starts with $1.
SIGNAL_TITLE = (
    'n=0; for p in /proc/[0-9]*; do t="$(tr "\\0" "\\n" < "$p/cmdline" 2>/dev/null | head -n 1)"; '
    'case "$t" in "$2"*) kill "-$1" "${p#/proc/}" && n=$((n + 1));; esac; done; echo "signalled $n"'
)
# Every process of the container: pid, pgid, state and the whole command line.
PS = (
    'for p in /proc/[0-9]*; do s="$(cat "$p/stat" 2>/dev/null)" || continue; r="${s##*) }"; '
    'read -r -a f <<<"$r"; printf "%s %s %s %s\\n" "${p#/proc/}" "${f[2]}" "${f[0]}" '
    '"$(tr "\\0\\n" "  " < "$p/cmdline" 2>/dev/null)"; done'
)


@dataclass
class Outcome:
    start: float  # wall clock
    end: float
    ok: bool
    error: str | None


@dataclass
class Load:
    """`concurrency` threads, each sending one streaming chat request after another through
    kit's bench client (kit/bench/runner.py), a fresh client per request (a refused connection
    stops a client for good), until stop()."""

    url: str
    model: str = "tiny"
    concurrency: int = 3
    max_tokens: int = 16
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        for k in range(self.concurrency):
            thread = threading.Thread(target=self._loop, args=(k,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _loop(self, k: int) -> None:
        i = 0
        while not self._stop.is_set():
            prompt = Prompt(({"role": "user", "content": f"load {k}-{i}: tell me a story"},), self.max_tokens, 8)
            started = time.time()
            run = Runner(Target(self.url, self.model, timeout_s=60)).run([prompt], LoadPoint(math.inf, 1))
            record = run.records[0] if run.records else None
            # Whole answers only: the bench client counts a stream cut after its first token a
            # success (it measured TTFT); the usage chunk arrives only with a finished one.
            ok = bool(record and record.success and record.output_tokens == self.max_tokens)
            self.outcomes.append(Outcome(started, time.time(), ok, None if ok else (record.error if record else "?")))
            i += 1
            if not ok:
                self._stop.wait(1.0)  # a down server refuses at once: one try a second per thread

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(70)

    def failed_between(self, t0: float, t1: float) -> int:
        return sum(1 for o in self.outcomes if not o.ok and t0 <= o.end <= t1)

    def cut_off(self, t: float) -> int:
        """Requests in flight at time t that failed: the ones the fault itself broke."""
        return sum(1 for o in self.outcomes if not o.ok and o.start <= t <= o.end)

    def ok_between(self, t0: float, t1: float) -> int:
        return sum(1 for o in self.outcomes if o.ok and t0 <= o.end <= t1)

    def first_ok_after(self, t: float) -> float | None:
        """When the first request that started after t succeeded."""
        done = [o.end for o in self.outcomes if o.ok and o.start >= t]
        return min(done) if done else None


def exec_out(container: Any, argv: list[str]) -> str:
    result = container.exec_run(argv)
    return str(result.output.decode(errors="replace"))


def signal_title(container: Any, signal: str, title: str) -> int:
    """Send `signal` (KILL, STOP, ...) to the processes of the container titled `title...`."""
    out = exec_out(container, ["bash", "-c", SIGNAL_TITLE, "kit-test", signal, title])
    return int(out.strip().rsplit(" ", 1)[-1])


def processes(container: Any) -> list[dict[str, Any]]:
    rows = []
    for line in exec_out(container, ["bash", "-c", PS]).splitlines():
        parts = line.split(" ", 3)
        if len(parts) == 4:
            rows.append({"pid": int(parts[0]), "pgid": int(parts[1]), "state": parts[2], "cmd": parts[3].strip()})
    return rows


def read_events(head: Any) -> list[events.Event]:
    return events.parse_lines(exec_out(head, ["cat", f"{RUN_DIR}/events.jsonl"]).splitlines())


def read_state(head: Any) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads(exec_out(head, ["cat", f"{RUN_DIR}/state.json"]))
    except ValueError:
        return {}
    return doc


def wait_event(head_of: Any, kind: str, *, after: float, timeout: float) -> events.Event:
    """The first event of `kind` recorded after wall time `after`; head_of() gives the (current)
    head container (it may be restarted meanwhile)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            found = [e for e in read_events(head_of()) if e.kind == kind and e.ts >= after]
        except Exception:  # the head is restarting: its exec fails for a moment
            found = []
        if found:
            return found[0]
        time.sleep(1)
    raise AssertionError(f"no {kind} event within {timeout} s")


def serving_processes(container: Any) -> dict[str, list[dict[str, Any]]]:
    """What runs in a node container, sorted: `vllm serve` processes, vLLM's engines and workers,
    the supervisor's agent and coordinator."""
    rows = [p for p in processes(container) if p["state"] not in ("Z", "X")]
    return {
        "serve": [p for p in rows if _is_vllm_serve(p["cmd"])],
        "engines": [p for p in rows if p["cmd"].startswith("VLLM::")],
        "agent": [p for p in rows if "kit-supervise.pyz agent" in p["cmd"]],
        "coordinator": [p for p in rows if "kit-supervise.pyz coordinator" in p["cmd"]],
    }


def _is_vllm_serve(cmd: str) -> bool:
    """`[python3] .../vllm serve ...` (not a shell whose script merely mentions it)."""
    words = cmd.split()[:3]
    return any(w.endswith("vllm") and words[i + 1 : i + 2] == ["serve"] for i, w in enumerate(words))
