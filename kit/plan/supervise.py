"""What a supervised run needs, from the config (pure): the run's settings file (supervise.json,
read by the coordinator and every agent), the nodes that run an agent and the engines the
coordinator expects. Node-specific values (this node's IP, role, rank, the head's address) are
not in it: the agents and the coordinator read them from the node's environment, so the same
file serves every node and the SLURM launcher."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kit.config import KitConfig
from kit.images.vllm_releases import FAULT_TOLERANCE_SINCE, fmt
from kit.plan.paths import API_KEY_PATH
from kit.plan.replicas import Replica, replicas_on, replicas_per_node, router_mode
from kit.plan.scripts import SERVE_LOG
from kit.plan.vllm import REPLICA_HEAD_VAR

RUN_DIR = "/tmp/kit/supervise"  # in every supervised node container
SERVE_SCRIPT = "/tmp/kit/serve.sh"  # as kit.cluster.serving writes it
PID_FILE = "/tmp/kit/serve.pid"
GRACE_S = 10  # SIGTERM to SIGKILL of a serve group


@dataclass(frozen=True)
class RunFiles:
    """Where one supervised group keeps its files in its node container: the run directory (the
    bundle, supervise.json, token, logs, state and events) and the serve script, its log and its
    pid file. A node has one group (slot 0: kit's usual paths); router replicas that share a node
    (issue 29) have one each, by their slot on the node."""

    run_dir: str
    serve_script: str
    serve_log: str
    pid_file: str

    @property
    def slot(self) -> int:
        return slot_of(self.run_dir)


def run_files(slot: int = 0) -> RunFiles:
    """Slot 0: kit's usual paths; slot K: each with -K before its suffix (serve-K.log)."""
    if slot == 0:
        return RunFiles(RUN_DIR, SERVE_SCRIPT, SERVE_LOG, PID_FILE)
    return RunFiles(f"{RUN_DIR}-{slot}", *(_slotted(path, slot) for path in (SERVE_SCRIPT, SERVE_LOG, PID_FILE)))


def _slotted(path: str, slot: int) -> str:
    stem, dot, suffix = path.rpartition(".")
    return f"{stem}-{slot}{dot}{suffix}"


def slot_of(run_dir: str) -> int:
    """The slot of a run directory kit names (run_files); ValueError for any other path."""
    if run_dir == RUN_DIR:
        return 0
    tail = run_dir.removeprefix(f"{RUN_DIR}-")
    if tail == run_dir or not tail.isdigit() or tail.startswith("0") or not 0 < int(tail) < 1000:
        raise ValueError(f"not a kit supervision directory: {run_dir!r}")
    return int(tail)


def supervised_nodes(config: KitConfig) -> tuple[str, ...]:
    """The nodes that run an agent: every node with the mp backend (each runs `vllm serve`), the
    head with Ray (the serve step; the workers are Ray nodes, watched through the Ray cluster)."""
    if config.backend == "ray":
        return ("head",)
    return ("head", *(f"worker-{rank}" for rank in range(1, config.nodes)))


def expected_engines(config: KitConfig) -> tuple[str, ...]:
    """The engines the head's /metrics must show: one per DP rank (headless nodes' included)."""
    return tuple(str(rank) for rank in range(max(1, config.dp)))


def plan_supervise(config: KitConfig) -> dict[str, Any]:
    """The contents of supervise.json."""
    return {
        "version": 1,
        "cluster": config.cluster,
        "backend": config.backend,
        "port": config.ports.supervisor,
        "api_port": config.ports.api,
        "model": config.served_name,
        "nodes": list(supervised_nodes(config)),
        "engines": list(expected_engines(config)),
        "liveness_s": config.timeouts.liveness,
        "ready_s": config.timeouts.ready_s,
        "node_wait_s": config.timeouts.join,
        "max_restarts": config.supervise.max_restarts,
        "backoff_s": config.supervise.backoff,
        "stable_s": config.supervise.stable,
        "api_key_path": API_KEY_PATH if config.api_key_file else None,
        "ray": {"gcs_port": config.ports.ray_gcs, "nodes": config.nodes} if config.backend == "ray" else None,
        "agents_on_workers": config.backend == "mp",
        "serve_script": SERVE_SCRIPT,
        "serve_log": SERVE_LOG,
        "pid_file": PID_FILE,
        # An agent stops its group on its own after this long without its coordinator, and exits
        # (its node no longer resumes supervision) after this long: longer than a head restart
        # and the coordinator's wait for its nodes (issue 25).
        "orphan_s": max(60, 2 * config.timeouts.liveness),
        "abandon_s": max(60, 2 * config.timeouts.liveness) + config.timeouts.join + 60,
        "grace_s": GRACE_S,
    }


def supervise_json(config: KitConfig, *, node: int | None = None, router_url: str | None = None, slot: int = 0) -> str:
    """The settings file; with router replicas (issue 29) that of the replica in slot `slot` of
    node `node`."""
    doc = plan_supervise(config) if node is None else plan_replica_supervise(config, node, router_url, slot)
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def plan_replica_supervise(config: KitConfig, node: int, router_url: str | None, slot: int = 0) -> dict[str, Any]:
    """model.dp_lb router (issue 29): each replica is its own supervised group, so a dead one is
    restarted alone while the others serve. Its coordinator runs on its first node (where its API
    server is), its agents on its nodes; on a failure the coordinator takes it out of the router
    at `router_url`, and puts it back once ready. Replicas that share a node each have their own
    files (run_files of their slot), coordinator port (ports.supervisor + slot) and agent, which
    counts only the engines of its own serve group."""
    replica = node_replica(config, node, slot)
    files = run_files(replica.slot)
    doc = plan_supervise(config)
    doc.update(
        {
            "replica": replica.index,
            "port": config.ports.supervisor + replica.slot,
            "api_port": replica.port,
            "serve_script": files.serve_script,
            "serve_log": files.serve_log,
            "pid_file": files.pid_file,
            "own_engines_only": replicas_per_node(config) > 1,
            "nodes": [_node_name(rank) for rank in replica.nodes],
            "engines": ["0"],  # one engine per replica (no DP group)
            "coordinator_rank": replica.head,
            "coordinator_address_env": REPLICA_HEAD_VAR if replica.spans_nodes else "VLLM_HOST_IP",
            "router_url": router_url,
        }
    )
    return doc


def node_replica(config: KitConfig, node: int, slot: int = 0) -> Replica:
    """The replica in slot `slot` of node `node`."""
    found = [r for r in replicas_on(config, node) if r.slot == slot]
    if len(found) != 1:
        raise ValueError(f"node {node} holds no replica in slot {slot}")
    return found[0]


def _node_name(rank: int) -> str:
    return "head" if rank == 0 else f"worker-{rank}"


def supervised_text(config: KitConfig) -> str:
    """The dry run's supervision lines: kit's own words and numbers only (no configured value
    goes into a comment)."""
    nodes = supervised_nodes(config)
    if router_mode(config):
        return (
            f"# {recovery_mechanism(config)}\n"
            f"# on a failure: liveness {config.timeouts.liveness} s, at most {config.supervise.max_restarts} "
            f"restart(s) in a row per replica, backoff {config.supervise.backoff} s doubling"
        )
    return (
        f"# supervised: an agent on {len(nodes)} node(s) runs each script below in its own process group; "
        f"the coordinator on the head (port {config.ports.supervisor}) restarts the whole group\n"
        f"# on a failure: liveness {config.timeouts.liveness} s, at most {config.supervise.max_restarts} restart(s) "
        f"in a row, backoff {config.supervise.backoff} s doubling, counted afresh after {config.supervise.stable} s "
        "of serving"
    )


def recovery_mechanism(config: KitConfig) -> str:
    """Which mechanism recovers a failed replica (issue 29), in kit's own words: kit's supervisor,
    one group per replica. vLLM's own fault tolerance (--enable-fault-tolerance, from 0.27, external
    load balancer only) keeps the surviving ranks of one DP group going; kit's replicas are no DP
    group (no rank of one knows another), so it is not used, and the line says so."""
    vllm = config.vllm.version
    has = vllm >= FAULT_TOLERANCE_SINCE
    return (
        f"recovery: replica-level, by kit's supervisor ({config.dp} replica(s), each drained, restarted alone "
        f"and readmitted); vLLM's fault tolerance {'exists in' if has else 'is not in'} vLLM {fmt(vllm)} "
        f"(from {fmt(FAULT_TOLERANCE_SINCE)}) and is not used: the replicas are no DP group"
    )
