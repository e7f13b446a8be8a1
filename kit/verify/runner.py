"""Run the probes (on this host, or in every node through a Runtime) and judge the results.

Side effects live here and only here; what the probes print is judged by kit.verify.policy.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kit.errors import CommandError, KitError, RuntimeUnavailable
from kit.runtime.base import ExecResult, NodeHandle, Runtime
from kit.verify import nccl, policy
from kit.verify.report import VerifyResult

PROBE_PATH = Path(__file__).with_name("probe.py")
COLLECTIVE_PATH = Path(__file__).with_name("collective.py")


class NodeRunner(Protocol):
    """The part of kit.runtime.base.Runtime that verify needs."""

    def find_nodes(self, cluster: str) -> list[NodeHandle]: ...

    def exec(
        self,
        node: NodeHandle,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult: ...


def probe_source() -> str:
    return PROBE_PATH.read_text()


def collective_source() -> str:
    return COLLECTIVE_PATH.read_text()


@dataclass(frozen=True)
class Expectations:
    expect: str = "auto"
    nodes: int | None = None
    gpus_per_node: int | None = None


@dataclass(frozen=True)
class CollectiveSpec:
    sizes: str = "1M,32M,256M,1G"
    budget_s: float = 0.5
    timeout_s: int = 120
    master_port: int | None = None  # None: a free port on one node, 29512 across nodes

    def env(self, *, master_addr: str, node_rank: int, nnodes: int, nproc: int | None) -> dict[str, str]:
        env = {
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(self.master_port or (free_port() if nnodes == 1 else 29512)),
            "KIT_NODE_RANK": str(node_rank),
            "KIT_NNODES": str(nnodes),
            "KIT_SIZES": self.sizes,
            "KIT_BUDGET_S": str(self.budget_s),
            "KIT_TIMEOUT_S": str(self.timeout_s),
        }
        if nproc:
            env["KIT_NPROC"] = str(nproc)
        return env


def parse_probe_output(what: str, result: ExecResult, argv: Sequence[str] = ()) -> dict[str, Any]:
    """The last JSON object a probe printed on stdout (libraries may print before it)."""
    for line in reversed(result.stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                data: dict[str, Any] = json.loads(line)
            except ValueError:
                break
            return data
    raise CommandError(
        f"the {what} probe printed no result (exit {result.returncode})",
        argv=[a if len(a) < 200 else "<source>" for a in argv],
        returncode=result.returncode,
        stderr=result.stderr or result.stdout,
    )


def judge(
    mode: str,
    nodes: dict[str, dict[str, Any]],
    collective: dict[str, Any] | None,
    expectations: Expectations,
    *,
    planned_ips: Mapping[str, str | None] | None = None,
    started: float,
) -> VerifyResult:
    """Classify the NCCL lines and apply the policy: pure apart from reading the clock."""
    summary = nccl.summarize_lines(collective.get("nccl_lines") or []) if collective else None
    checks = policy.evaluate(
        nodes,
        collective,
        summary,
        expect=expectations.expect,
        expected_nodes=expectations.nodes,
        expected_gpus_per_node=expectations.gpus_per_node,
        planned_ips=planned_ips,
    )
    return VerifyResult(
        mode=mode,
        checks=checks,
        nodes=nodes,
        collective=collective,
        transport=summary,
        expect=expectations.expect,
        wall_s=round(time.monotonic() - started, 2),
    )


# --- this host ------------------------------------------------------------------------------


def _local(argv: list[str], env: Mapping[str, str] | None, timeout: float) -> ExecResult:
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, **(env or {})},
        )
    except FileNotFoundError as exc:
        raise CommandError(f"cannot run {argv[0]}: {exc}", argv=argv[:1]) from exc
    except subprocess.TimeoutExpired as exc:
        raise CommandError(
            f"probe timed out after {timeout:.0f}s", argv=argv[:2], stderr=str(exc.stderr or "")
        ) from exc
    return ExecResult(proc.returncode, proc.stdout, proc.stderr)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port


def verify_host(
    expectations: Expectations,
    spec: CollectiveSpec,
    *,
    python: str,
    model: str | None = None,
    head_address: str | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    collective: bool = True,
) -> VerifyResult:
    """Probe this host and run the collective probe on its GPUs.

    With nnodes > 1 every host runs `kit verify --host --nnodes N --node-rank K --head-address
    HEAD_IP` at the same time (like torchrun); each judges its own node facts.
    """
    started = time.monotonic()
    probe_argv = [python, str(PROBE_PATH)]
    if head_address:
        probe_argv += ["--head-ip", head_address]
    if model:
        probe_argv += ["--model", model]
    facts = parse_probe_output("node", _local(probe_argv, None, 120), probe_argv)
    node = facts.get("network", {}).get("hostname") or "localhost"
    result = None
    if collective:
        nproc = len(facts.get("gpu", {}).get("gpus") or []) or None
        env = spec.env(master_addr=head_address or "127.0.0.1", node_rank=node_rank, nnodes=nnodes, nproc=nproc)
        argv = [python, str(COLLECTIVE_PATH)]
        result = parse_probe_output("collective", _local(argv, env, spec.timeout_s + 90), argv)
    return judge("host", {node: facts}, result, expectations, started=started)


# --- every node of a cluster through a runtime ------------------------------------------------


def get_runtime() -> Runtime:
    try:
        from kit.runtime.docker import DockerRuntime  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise RuntimeUnavailable(
            f"the Docker runtime is not available ({exc})",
            hint="run `kit verify --host` on each node, or `kit verify --image IMAGE`",
        ) from exc
    runtime: Runtime = DockerRuntime()
    return runtime


def verify_cluster(
    runtime: NodeRunner,
    cluster: str,
    expectations: Expectations,
    spec: CollectiveSpec,
    *,
    model: str | None = None,
    collective: bool = True,
) -> VerifyResult:
    """Probe every node the runtime finds, then one collective across all of them."""
    started = time.monotonic()
    nodes = [n for n in runtime.find_nodes(cluster) if n.state == "running"]
    if not nodes:
        raise KitError(f"no running nodes of cluster {cluster!r}", hint="start them with `kit up`")
    head = nodes[0]
    if not head.ip:
        raise KitError(f"head node {head.name} has no planned IP", hint="recreate it with `kit up`")

    def probe(node: NodeHandle) -> dict[str, Any]:
        argv = ["python3", "-c", probe_source(), "--head-ip", head.ip or ""]
        if model:
            argv += ["--model", model]
        env = {"KIT_IMAGE_DIGEST": node.image_digest} if node.image_digest else None
        facts = parse_probe_output("node", runtime.exec(node, argv, env=env, timeout=120), argv)
        if node.image_digest:
            facts.setdefault("versions", {})["image_digest"] = node.image_digest
        return facts

    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        facts = dict(zip([n.name for n in nodes], pool.map(probe, nodes), strict=True))

    result = None
    if collective:
        nproc = {n.name: len(facts[n.name].get("gpu", {}).get("gpus") or []) or None for n in nodes}

        def run(item: tuple[int, NodeHandle]) -> dict[str, Any]:
            rank, node = item
            env = spec.env(master_addr=head.ip or "", node_rank=rank, nnodes=len(nodes), nproc=nproc[node.name])
            argv = ["python3", "-c", collective_source()]
            return parse_probe_output(
                "collective", runtime.exec(node, argv, env=env, timeout=spec.timeout_s + 90), argv
            )

        with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            per_node = list(pool.map(run, enumerate(nodes)))
        result = merge_collective(per_node)
    return judge(
        "cluster",
        facts,
        result,
        expectations,
        planned_ips={n.name: n.ip for n in nodes},
        started=started,
    )


def merge_collective(per_node: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One collective result from every node's: rank 0's numbers, everyone's NCCL lines."""
    head = dict(per_node[0])
    errors = [r.get("error") for r in per_node if r.get("error")]
    head["ok"] = all(r.get("ok") for r in per_node)
    head["correct"] = all(r.get("correct") for r in per_node)
    head["error"] = errors[0] if errors else None
    head["ranks"] = [rank for r in per_node for rank in r.get("ranks", [])]
    head["nccl_lines"] = [ln for r in per_node for ln in r.get("nccl_lines", [])]
    return head
