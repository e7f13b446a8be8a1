"""`kit up`: start this node's container (Ray head/worker, or an mp-backend node)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import click

from kit.cluster import Cluster, NodePlan
from kit.cluster.nodes import UpResult
from kit.commands._options import (
    config_flag,
    config_options,
    json_option,
    layout_options,
    overrides_from,
    role_from_flags,
)
from kit.commands._params import KitCommand
from kit.output import emit, progress, warn
from kit.plan.container_args import (
    to_apptainer_env,
    to_apptainer_exec_argv,
    to_apptainer_start_argv,
    to_docker_argv,
    to_docker_kwargs,
)
from kit.render import shell_quote, shell_words
from kit.runtime import check_local


@click.command(name="up", cls=KitCommand)
@click.option("--head", "is_head", is_flag=True, help="Start the head node (rank 0). The default.")
@click.option("--worker", "is_worker", is_flag=True, help="Start a worker node (needs --head-address).")
@click.option("--node-rank", type=int, help="This worker's rank, 1..nodes-1 (default 1).")
@config_flag("head_address", "--head-address")
@config_flag("node_ip", "--node-ip")
@config_flag("interface", "--interface")
@config_flag("image", "--image")
@config_flag("runtime", "--runtime", choices=("docker", "apptainer"), help="container runtime")
@config_flag("backend", "--backend")
@config_flag("accelerator", "--accelerator")
@config_flag("nodes", "--nodes")
@config_flag("gpus_per_node", "--gpus-per-node")
@config_flag("gpus", "--gpus")
@layout_options
@config_flag("model.id", "--model")
@config_flag("network", "--network")
@config_flag("timeouts.join", "--timeout")
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
    cluster = Cluster.load(config_path, overrides_from(flags, set_values))
    check_local(cluster.config)  # pyxis/edf: srun starts the containers (a dry run included)
    if not dry_run:  # issue 24: an image kit never saw is probed now, before any container starts
        cluster.ensure_image(functools.partial(progress, as_json=as_json))
    node = cluster.plan_node(role)
    plan = describe(cluster, node)
    # The model not complete in hf_cache is said before anything starts (issue 19); what the node
    # leaves open and what this host could only guess once the plan is valid (a dry run) or the
    # node is up: one stderr line each, and the `warnings` field of --json (kit.cluster.warnings).
    warnings = cluster.warnings(role)
    cache = cluster.model_cache()
    if dry_run:
        warn(warnings.lines, as_json=as_json)
        emit(DryRun(plan, warnings.lines), as_json=as_json)
        return
    say = functools.partial(progress, as_json=as_json)
    from kit.commands._signals import sigterm_as_interrupt

    with sigterm_as_interrupt():  # issue 18: SIGTERM (a scheduler, `kill`) cleans up like Ctrl-C
        result = cluster.up(role, replace=replace, wait=not no_wait, on_progress=say, plan=node, notes=warnings.before)
    warn(warnings.after, as_json=as_json)
    net = node.net
    emit(Started(result, node.spec.role.label, net.ip, net.interface, cache.to_dict(), warnings.lines), as_json=as_json)


@dataclass(frozen=True)
class DryRun:
    """`kit up --dry-run`: the node's plan (describe) and the warnings."""

    plan: dict[str, Any]
    warnings: list[str]
    command = "up"

    def to_dict(self) -> dict[str, Any]:
        return {"dry_run": True, **self.plan, "warnings": self.warnings}

    def text(self) -> str:
        return dry_run_text(self.plan)


@dataclass(frozen=True)
class Started:
    """`kit up`: the runtime's node (its container and state), where it runs, the model cache."""

    node: UpResult
    role: str
    node_ip: str
    interface: str
    model_cache: dict[str, Any]
    warnings: list[str]
    command = "up"

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.node.to_dict(),
            "node_ip": self.node_ip,
            "interface": self.interface,
            "model_cache": self.model_cache,
            "warnings": self.warnings,
        }

    def text(self) -> str:
        return f"{self.node.container}: {self.node.state} ({self.role}, {self.node_ip} on {self.interface})"


def describe(cluster: Cluster, node: NodePlan) -> dict[str, Any]:
    """The node's plan as --dry-run shows it (--json: this document; text: dry_run_text)."""
    config, spec, net, layout = cluster.config, node.spec, node.net, cluster.layout
    out: dict[str, Any] = {
        "cluster": config.cluster,
        "role": spec.role.kind,
        "rank": spec.role.rank,
        "node_ip": net.ip,
        "interface": net.interface,
        "head_address": net.head_address,
        "runtime": config.runtime,
        "backend": config.backend,
        "parallel": {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep},
        "layout_from": layout.decided_by,
        "model_cache": cluster.model_cache().to_dict(),
        "image": spec.image,
        "vllm": {"version": str(config.vllm), "from": config.vllm.source},
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
        out["apptainer_env"] = to_apptainer_env(spec.env)  # in the environment of both, never --env
    return out


def dry_run_text(plan: dict[str, Any]) -> str:
    """The plan for a person: comments hold only kit's own words and numbers (the layout and
    how it was decided are kit's fixed words); configured values are shell-quoted words (the
    node line, the command), never inside a comment."""
    par = plan["parallel"]
    node = {key: plan[key] for key in ("cluster", "node_ip", "interface", "head_address")}
    lines = [
        f"# kit up --dry-run: {plan['role']} (rank {plan['rank']}); the node:",
        " ".join(f"{key}={shell_quote(value)}" for key, value in node.items()),
        f"# parallel: TP={par['tp']} PP={par['pp']} DP={par['dp']}" + (" EP" if par["ep"] else ""),
        f"# layout decided by: {plan['layout_from']}",
        "# entrypoint script (run as: bash -c SCRIPT):",
        plan["script"].rstrip("\n"),
        "# command:",
    ]
    if "docker_argv" in plan:
        lines.append(shell_words(plan["docker_argv"]))
    else:
        env = ["env", *(f"{key}={value}" for key, value in plan["apptainer_env"].items())]
        lines.append(shell_words([*env, *plan["apptainer_start_argv"]]))
        lines.append(shell_words([*env, *plan["apptainer_exec_argv"]]))
    return "\n".join(lines)
