"""What a supervised run needs, from the config (pure): the run's settings file (supervise.json,
read by the coordinator and every agent), the nodes that run an agent and the engines the
coordinator expects. Node-specific values (this node's IP, role, rank, the head's address) are
not in it: the agents and the coordinator read them from the node's environment, so the same
file serves every node and the SLURM launcher."""

from __future__ import annotations

import json
from typing import Any

from kit.config import KitConfig
from kit.plan.paths import API_KEY_PATH
from kit.plan.scripts import SERVE_LOG

RUN_DIR = "/tmp/kit/supervise"  # in every supervised node container
SERVE_SCRIPT = "/tmp/kit/serve.sh"  # as kit.cluster.serving writes it
PID_FILE = "/tmp/kit/serve.pid"
GRACE_S = 10  # SIGTERM to SIGKILL of a serve group


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


def supervise_json(config: KitConfig) -> str:
    return json.dumps(plan_supervise(config), indent=1, sort_keys=True) + "\n"


def supervised_text(config: KitConfig) -> str:
    """The dry run's supervision lines: kit's own words and numbers only (no configured value
    goes into a comment)."""
    nodes = supervised_nodes(config)
    return (
        f"# supervised: an agent on {len(nodes)} node(s) runs each script below in its own process group; "
        f"the coordinator on the head (port {config.ports.supervisor}) restarts the whole group\n"
        f"# on a failure: liveness {config.timeouts.liveness} s, at most {config.supervise.max_restarts} restart(s) "
        f"in a row, backoff {config.supervise.backoff} s doubling, counted afresh after {config.supervise.stable} s "
        "of serving"
    )
