"""Run the probes (on this host, or in every node through a Runtime) and judge the results.

Side effects live here and only here; what the probes print is judged by kit.verify.policy.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kit import proc
from kit.errors import CommandError, KitError
from kit.resources import program_source
from kit.runtime.base import ExecResult, NodeHandle
from kit.verify import nccl, policy
from kit.verify.report import VerifyResult


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


# This host runs the probes from their files; containers get their text (program_source).
PROBE_PATH = Path(__file__).with_name("probe.py")
COLLECTIVE_PATH = Path(__file__).with_name("collective.py")


def probe_source() -> str:
    return program_source("verify/probe.py")


def collective_source() -> str:
    """The collective probe as one program for `python3 -c`: collective.py, then latency.py,
    whose last lines start it (both docstrings say how)."""
    return program_source("verify/collective.py") + "\n\n" + program_source("verify/latency.py")


# The head's Ray view (kit.commands.status.ray_view + merge_views): one row per Ray node with
# its registered `ip`, the `vllm_host_ip` its raylet sees, `alive` and `lost`.
RayView = Callable[[NodeHandle, Sequence[NodeHandle]], list[dict[str, Any]]]


@dataclass(frozen=True)
class Expectations:
    expect: str = "auto"
    nodes: int | None = None
    gpus_per_node: int | None = None
    accelerator: str = "gpu"  # "cpu": no GPUs expected, the collective runs on Gloo


@dataclass(frozen=True)
class CollectiveSpec:
    sizes: str | None = None  # None: the probe's default for its backend (collective.DEFAULT_SIZES)
    budget_s: float = 0.5
    timeout_s: int = 120
    master_port: int | None = None  # None: a free port on one node, 29512 across nodes
    collectives: tuple[str, ...] = ("all-reduce",)  # and/or "all-to-all" (expert parallelism)
    latency: str = "auto"  # decode latency: auto, off or a method of kit/verify/latency.py (issue 30)

    def env(self, *, master_addr: str, node_rank: int, nnodes: int, nproc: int | None) -> dict[str, str]:
        env = {
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(self.master_port or (free_port() if nnodes == 1 else 29512)),
            "KIT_NODE_RANK": str(node_rank),
            "KIT_NNODES": str(nnodes),
            "KIT_BUDGET_S": str(self.budget_s),
            "KIT_TIMEOUT_S": str(self.timeout_s),
            "KIT_COLLECTIVES": ",".join(self.collectives),
            "KIT_LATENCY": self.latency,
        }
        if self.sizes:
            env["KIT_SIZES"] = self.sizes
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
    ray: Sequence[Mapping[str, Any]] | None = None,
    ray_error: str | None = None,
    started: float,
) -> VerifyResult:
    """Classify the transport and apply the policy: pure apart from reading the clock."""
    if ray is not None:
        # Each node's row of the head's Ray view, by the IP kit planned for it (None: not in Ray).
        alive = {r.get("ip"): r for r in ray if r.get("alive") and not r.get("lost")}
        ips = planned_ips or {}
        nodes = {name: {**f, "ray": alive.get(ips.get(name) or _get_ip(f))} for name, f in nodes.items()}
    summary = None
    if collective and collective.get("backend") == "gloo":
        summary = nccl.gloo_summary(int(collective.get("nnodes") or 1), int(collective.get("nproc") or 1))
    elif collective:
        summary = nccl.summarize_lines(collective.get("nccl_lines") or [])
    checks = policy.evaluate(
        nodes,
        collective,
        summary,
        expect=expectations.expect,
        expected_nodes=expectations.nodes,
        expected_gpus_per_node=expectations.gpus_per_node,
        planned_ips=planned_ips,
        accelerator=expectations.accelerator,
        ray=ray,
        ray_error=ray_error,
    )
    return VerifyResult(
        mode=mode,
        checks=checks,
        nodes=nodes,
        collective=collective,
        transport=summary,
        expect=expectations.expect,
        ray=[dict(r) for r in ray] if ray is not None else None,
        wall_s=round(time.monotonic() - started, 2),
    )


def _get_ip(facts: Mapping[str, Any]) -> str | None:
    ip = (facts.get("network") or {}).get("node_ip")
    return str(ip) if ip else None


# --- this host ------------------------------------------------------------------------------


def _local(argv: list[str], env: Mapping[str, str] | None, timeout: float) -> ExecResult:
    """Run a probe on this host (its environment plus `env`); its exit code is for the caller
    to judge. The probe's source is long: errors show only the first two words."""
    result = proc.run(argv, env={**os.environ, **(env or {})}, check=False, timeout=timeout, shown=argv[:2])
    return ExecResult(result.returncode, result.stdout, result.stderr)


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


def verify_cluster(
    runtime: NodeRunner,
    cluster: str,
    expectations: Expectations,
    spec: CollectiveSpec,
    *,
    model: str | None = None,
    collective: bool = True,
    ray_view: RayView | None = None,
    probe_env: Mapping[str, str] | None = None,
) -> VerifyResult:
    """Probe every node the runtime finds (and read the head's Ray view at the same time), then
    run one collective across all of them with rank 0 on the head.

    probe_env: extra environment for the node probe (e.g. KIT_RAY_TEMP_DIR).
    """
    started = time.monotonic()
    nodes = [n for n in runtime.find_nodes(cluster) if n.state == "running"]
    if not nodes:
        raise KitError(f"no running nodes of cluster {cluster!r}", hint="start them with `kit up`")
    head = next((n for n in nodes if n.role == "head"), None)
    if head is None:
        raise KitError(f"the head of cluster {cluster!r} is not running", hint="start it with `kit up --head`")
    if not head.ip:
        raise KitError(f"head node {head.name} has no planned IP", hint="recreate it with `kit up`")
    nodes = [head, *(n for n in nodes if n is not head)]

    def probe(node: NodeHandle) -> dict[str, Any]:
        argv = ["python3", "-c", probe_source(), "--head-ip", head.ip or ""]
        if model:
            argv += ["--model", model]
        env = dict(probe_env or {})
        if node.image_digest:
            env["KIT_IMAGE_DIGEST"] = node.image_digest
        facts = parse_probe_output("node", runtime.exec(node, argv, env=env or None, timeout=120), argv)
        if node.image_digest:
            facts.setdefault("versions", {})["image_digest"] = node.image_digest
        return facts

    ray: list[dict[str, Any]] | None = None
    ray_error = None
    with ThreadPoolExecutor(max_workers=len(nodes) + 1) as pool:
        view = pool.submit(ray_view, head, nodes) if ray_view else None
        facts = dict(zip([n.name for n in nodes], pool.map(probe, nodes), strict=True))
        if view is not None:
            try:
                ray = view.result()
            except KitError as err:
                ray_error = f"cannot read the Ray view from the head: {err.message}"
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
        ray=ray,
        ray_error=ray_error,
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
    if "collectives" in head:
        head["collectives"] = {
            name: {**c, "correct": all(((r.get("collectives") or {}).get(name) or {}).get("correct") for r in per_node)}
            for name, c in (head.get("collectives") or {}).items()
        }
    return head
