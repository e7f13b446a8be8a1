"""`kit up`: start this node's container (Ray head/worker, or an mp-backend node)."""

from __future__ import annotations

import time
from typing import Any

import click

from kit.commands._common import (
    check_mounts,
    check_plan,
    check_secret_files,
    config_options,
    gather_host_facts,
    json_option,
    overrides_from,
    resolve,
    role_from_flags,
)
from kit.commands._params import KitCommand
from kit.config import KitConfig, Resolved
from kit.errors import StartError
from kit.output import emit, progress, warn
from kit.plan.exposure import exposures
from kit.plan.facts import NodeNet, Role
from kit.plan.forms import to_apptainer_exec_argv, to_apptainer_start_argv, to_docker_argv, to_docker_kwargs
from kit.plan.node import ContainerSpec, plan_node
from kit.plan.scripts import JOINED_MARK, READY_MARK
from kit.plan.topology import plan_node_net
from kit.render import shell_quote, shell_words
from kit.runtime.base import Runtime

FLAG_KEYS = {
    "head_address": "head_address",
    "node_ip": "node_ip",
    "interface": "interface",
    "image": "image",
    "runtime": "runtime",
    "backend": "backend",
    "accelerator": "accelerator",
    "nodes": "nodes",
    "gpus_per_node": "gpus_per_node",
    "gpus": "gpus",
    "tp": "model.tp",
    "pp": "model.pp",
    "dp": "model.dp",
    "ep": "model.ep",
    "model": "model.id",
    "network": "network",
    "cluster": "cluster",
    "timeout": "timeouts.join",
}


def plan_up(resolved: Resolved, role: Role, *, check_files: bool = True) -> tuple[ContainerSpec, NodeNet]:
    """Validate everything, then plan this node. No side effects."""
    config, sources = resolved.config, resolved.sources
    check_plan(resolved)
    if check_files:
        check_secret_files(config, sources)
        check_mounts(config, sources)
    host = gather_host_facts(config)
    net = plan_node_net(config, sources, role, host)
    return plan_node(config, role, net, has_infiniband=host.has_infiniband), net


def describe(config: KitConfig, spec: ContainerSpec, net: NodeNet) -> dict[str, Any]:
    out: dict[str, Any] = {
        "cluster": config.cluster,
        "role": spec.role.kind,
        "rank": spec.role.rank,
        "node_ip": net.ip,
        "interface": net.interface,
        "head_address": net.head_address,
        "runtime": config.runtime,
        "backend": config.backend,
        "parallel": {"tp": config.tp, "pp": config.pp, "dp": config.dp, "ep": config.model.ep},
        "image": spec.image,
        "container": spec.name,
        "script": spec.script,
    }
    if config.runtime == "docker":
        kwargs = to_docker_kwargs(spec)
        out["docker_argv"] = to_docker_argv(spec)
        out["docker_kwargs"] = kwargs
    else:
        out["apptainer_start_argv"] = to_apptainer_start_argv(spec, config.image)
        out["apptainer_exec_argv"] = to_apptainer_exec_argv(spec)
    return out


def dry_run_text(plan: dict[str, Any]) -> str:
    """The plan for a person: comments hold only kit's own words and numbers; configured values
    are shell-quoted words (the node line, the command), never inside a comment."""
    par = plan["parallel"]
    node = {key: plan[key] for key in ("cluster", "node_ip", "interface", "head_address")}
    lines = [
        f"# kit up --dry-run: {plan['role']} (rank {plan['rank']}); the node:",
        " ".join(f"{key}={shell_quote(value)}" for key, value in node.items()),
        f"# parallel: TP={par['tp']} PP={par['pp']} DP={par['dp']}" + (" EP" if par["ep"] else ""),
        "# entrypoint script (run as: bash -c SCRIPT):",
        plan["script"].rstrip("\n"),
        "# command:",
    ]
    if "docker_argv" in plan:
        lines.append(shell_words(plan["docker_argv"]))
    else:
        lines.append(shell_words(plan["apptainer_start_argv"]))
        lines.append(shell_words(plan["apptainer_exec_argv"]))
    return "\n".join(lines)


@click.command(name="up", cls=KitCommand)
@click.option("--head", "is_head", is_flag=True, help="Start the head node (rank 0). The default.")
@click.option("--worker", "is_worker", is_flag=True, help="Start a worker node (needs --head-address).")
@click.option("--node-rank", type=int, help="This worker's rank, 1..nodes-1 (default 1).")
@click.option("--head-address", help="The head node's IPv4 address.")
@click.option("--node-ip", help="This node's IPv4 address (default: auto).")
@click.option("--interface", help="Interface for NCCL/Gloo (default: the one carrying the node IP).")
@click.option("--image", help="Image reference (or SIF path with --runtime apptainer).")
@click.option("--runtime", type=click.Choice(["docker", "apptainer"]), help="Container runtime.")
@click.option("--backend", type=click.Choice(["ray", "mp"]), help="Ray cluster, or vLLM's mp backend.")
@click.option("--accelerator", type=click.Choice(["gpu", "cpu"]), help="gpu, or cpu (vLLM CPU build).")
@click.option("--nodes", type=int, help="Nodes in the cluster.")
@click.option("--gpus-per-node", type=int, help="GPUs per node.")
@click.option("--gpus", help="'all' or indices like 0,1.")
@click.option("--tp", help="Tensor parallel size, or auto.")
@click.option("--pp", help="Pipeline parallel size, or auto.")
@click.option("--dp", help="Data parallel size (engine replicas), or auto.")
@click.option(
    "--ep/--no-ep", default=None, help="Expert parallelism for MoE layers over TP×DP GPUs (--enable-expert-parallel)."
)
@click.option("--model", help="Model id or path.")
@click.option("--network", help="Docker network for local multi-node simulation (fixed IP per node).")
@click.option("--timeout", type=int, help="Seconds to wait for the node to be ready (timeouts.join).")
@click.option("--replace", is_flag=True, help="Recreate the container if it already exists.")
@click.option("--no-wait", is_flag=True, help="Return once the container is started.")
@click.option("--dry-run", is_flag=True, help="Print the entrypoint script and the exact command; start nothing.")
@config_options
@json_option
def command(
    is_head: bool,
    is_worker: bool,
    node_rank: int | None,
    config_path: str | None,
    set_values: tuple[str, ...],
    replace: bool,
    no_wait: bool,
    dry_run: bool,
    as_json: bool,
    **flags: Any,
) -> None:
    """Start this node's container: host network, GPUs, IPC, HF cache, per-node VLLM_HOST_IP and
    NCCL/Gloo interface, then a Ray head (which waits for every node and GPU), a Ray worker
    (which retries joining the head), or an mp-backend node.

    \b
    Examples:
      kit up --head --dry-run                     # print what would run
      kit up --head --nodes 2 --gpus-per-node 8   # on the head node
      kit up --worker --head-address 10.0.0.1 --nodes 2 --gpus-per-node 8
      kit up --head --network kitnet --accelerator cpu   # local simulation
    """
    role = role_from_flags(is_head, is_worker, node_rank)
    resolved = resolve(config_path, overrides_from(flags, FLAG_KEYS, set_values))
    spec, net = plan_up(resolved, role)
    plan = describe(resolved.config, spec, net)
    # What the node leaves open (no API key, no Ray token): one stderr line each once the plan is
    # valid (a dry run) or the node is up, and a `warnings` field in --json output.
    warnings = [e.warning() for e in exposures(resolved.config, api=role.is_head)]
    if dry_run:
        warn(warnings, as_json=as_json)
        emit("up", {"dry_run": True, **plan, "warnings": warnings}, as_json=as_json, text=lambda: dry_run_text(plan))
        return
    from kit.supervise.hooks import sigterm_as_interrupt

    with sigterm_as_interrupt():  # issue 18: SIGTERM (a scheduler, `kill`) cleans up like Ctrl-C
        result = start_node(resolved.config, spec, replace=replace, wait=not no_wait, as_json=as_json)
    warn(warnings, as_json=as_json)
    emit(
        "up",
        {**result, "node_ip": net.ip, "interface": net.interface, "warnings": warnings},
        as_json=as_json,
        text=f"{result['container']}: {result['state']} ({spec.role.label}, {net.ip} on {net.interface})",
    )


def start_node(
    config: KitConfig,
    spec: ContainerSpec,
    *,
    replace: bool,
    wait: bool,
    as_json: bool,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Start (or report) the node container and wait for readiness. Ctrl-C leaves no orphan.
    `deadline` (time.monotonic()) ends the wait earlier than timeouts.join (kit tune's budget)."""
    from kit.runtime import get_runtime

    runtime = get_runtime(config)
    state = runtime.state(spec.name)
    if state == "running" and not replace:
        progress(f"{spec.name} is already running (use --replace to recreate it)", as_json=as_json)
        return {"container": spec.name, "state": "running", "created": False}
    if state is not None:
        runtime.remove(spec.name)
    if config.network and config.runtime == "docker":
        runtime.ensure_network(config.network, config.network_subnet, config.cluster)
    drift = image_drift(runtime, spec.image)
    if drift:
        progress(f"warning: {drift}", as_json=as_json)
    progress(f"starting {spec.name} from {spec.image}", as_json=as_json)
    try:
        runtime.start(spec)
        if not wait:
            return {"container": spec.name, "state": "started", "created": True}
        is_ready = spec.role.is_head or config.backend == "mp"
        what = (
            "the Ray cluster: all nodes and GPUs/CPUs alive"
            if spec.role.is_head and config.backend == "ray"
            else "the node to be ready"
            if is_ready
            else "the worker to join the head"
        )
        timeout: float = config.timeouts.join + 30
        if deadline is not None:
            timeout = max(min(timeout, deadline - time.monotonic()), 0)
        line = runtime.wait_for_mark(
            spec.name,
            [READY_MARK] if is_ready else [JOINED_MARK],
            timeout=timeout,
            on_progress=lambda text: progress(f"{spec.name}: {text}", as_json=as_json),
            what=what,
        )
    except KeyboardInterrupt:
        # Interrupted while starting: remove what we created so nothing is left half-up (the
        # network too, when nothing else of the cluster is left on this host: issue 18).
        from kit.supervise.hooks import remove_after_interrupt

        remove_after_interrupt(runtime, config, spec.name)
        raise
    except StartError:
        raise  # the container stays, so `kit logs` can show why; `kit down` removes it
    return {"container": spec.name, "state": "ready", "created": True, "ready_line": line}


def image_drift(runtime: Runtime, ref: str) -> str | None:
    """A one-line warning when the local image is not the one `kit pull`/`kit build` recorded
    (another pull changed the tag on this node: nodes may now run different images)."""
    from kit.state import recorded_image

    image_info = getattr(runtime, "image_info", None)
    record = recorded_image(ref)
    if image_info is None or not record or not record.get("image_id"):
        return None
    info = image_info(ref)
    if info and info["id"] != record["image_id"]:
        return (
            f"{ref} is now {info['id'][:19]} but kit recorded {record['image_id'][:19]} "
            f"on {record.get('recorded_at', '?')}; run `kit pull` on every node, then `kit verify`"
        )
    return None
