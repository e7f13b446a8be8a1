"""`kit tune`: bring the server up with each candidate layout on this host, run the same load,
tear it down, and rank the layouts. Resumable (finished layouts are kept in a state file),
bounded by a hard time budget, and it never leaves a server up that it started."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from kit.bench import results
from kit.bench.tune import (
    Layout,
    candidates,
    check_fits,
    load_state,
    parse_layouts,
    rank,
    recommendation,
    recommendation_line,
    state_key,
)
from kit.commands._common import config_options, json_option, model_experts, model_heads, resolve_cluster
from kit.commands._params import KitCommand, readable, writable
from kit.commands.bench import build_load, load_options
from kit.config import KitConfig, Resolved
from kit.errors import ConfigError, KitError
from kit.output import emit, progress, table
from kit.plan.facts import HEAD, Role

MIN_LAYOUT_S = 30  # a layout is not started with less budget left than this


MAX_BUDGET_S = 7 * 86400


def parse_budget(text: str) -> float:
    """A duration above 0 and at most a week. (A budget below MIN_LAYOUT_S is allowed: every layout
    is then skipped and the results say so.)"""
    m = re.fullmatch(r"\s*(\d{1,9}(?:\.\d{1,6})?)\s*([smh]?)\s*", text)
    if not m:
        raise ConfigError(f"{text[:20]!r} is not a duration", key="--budget", hint="e.g. --budget 20m, 900s, 1h")
    seconds = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]
    if not 0 < seconds <= MAX_BUDGET_S:
        raise ConfigError(
            f"{text.strip()} is {seconds:g} s; kit tune needs more than 0 s and takes at most {MAX_BUDGET_S} s",
            key="--budget",
            hint="e.g. --budget 20m",
        )
    return seconds


def layout_config(config: KitConfig, layout: Layout) -> KitConfig:
    o = layout.overrides(config.gpus_per_node)
    model = dataclasses.replace(config.model, tp=o["model.tp"], pp=o["model.pp"], dp=o["model.dp"], ep=o["model.ep"])
    return config.replace(nodes=o["nodes"], gpus_per_node=o["gpus_per_node"], model=model)


def check_layout(
    config: KitConfig, sources: Mapping[str, str], layout: Layout, heads: int | None, kv: int | None
) -> None:
    """The plan checks `kit up` makes, for this layout, naming the layout in the error."""
    from kit.plan.topology import check_config

    lconf = layout_config(config, layout)
    experts = model_experts(lconf) if layout.ep else None
    try:
        check_config(lconf, {}, attention_heads=heads, kv_heads=kv, experts=experts)
    except ConfigError as err:
        raise ConfigError(f"layout {layout.name}: {err.message}", key="--layouts", hint=err.hint) from None


def check_local(config: KitConfig) -> None:
    """Every node of a layout starts on this host: one node, or the local simulation (network:)."""
    if config.runtime != "docker":
        raise ConfigError(
            "kit tune starts nodes with Docker on this host", key="runtime", hint="use runtime: docker (or kit bench)"
        )
    if config.nodes > 1 and not config.network:
        raise ConfigError(
            "kit tune brings every node up on this host; with several real hosts it cannot",
            key="network",
            hint="tune on one node (nodes: 1), or the local simulation (network: NAME); compare hosts with kit bench",
        )


def serve_layout(resolved: Resolved, config: KitConfig, say: Callable[[str], None], deadline: float) -> dict[str, Any]:
    """kit up (workers, then the head) and kit serve, as `kit demo` does. Every wait ends at
    `deadline` (time.monotonic(), the budget's end): the waits share it, each does not get the
    whole remainder."""
    from kit.commands.serve import serve_cluster
    from kit.commands.up import plan_up, start_node
    from kit.runtime import get_runtime

    roles = [Role("worker", r) for r in range(config.nodes - 1, 0, -1)] + [HEAD]
    for role in roles:
        spec, net = plan_up(dataclasses.replace(resolved, config=config), role)
        say(f"  kit up --{role.kind}: {spec.name} at {net.ip}")
        start_node(config, spec, replace=True, wait=True, as_json=True, deadline=deadline)
    return serve_cluster(config, get_runtime(config), on_progress=lambda line: None, deadline=deadline)


def keep_points(record: dict[str, Any], layout_doc: dict[str, Any], doc: dict[str, Any]) -> None:
    """A layout's measured points into its state record and the run's document: every point goes
    into the plot, the last (heaviest) one is what the ranking uses."""
    points = layout_doc["points"]
    for point in points:
        point["cluster"] = layout_doc["cluster"]
    doc["points"].extend(points)
    if doc["cluster"] is None:
        doc["cluster"] = {k: v for k, v in layout_doc["cluster"].items() if k != "plan"}
    record.update({"point": points[-1] if points else None, "points": points})


def conclude(
    doc: dict[str, Any], state: dict[str, Any], chosen: list[Layout], tie: float, save_to: Path
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Rank what the state holds for the chosen layouts, recommend one, save the document."""
    ranking = rank({lay.name: state["layouts"][lay.name] for lay in chosen if lay.name in state["layouts"]})
    best = recommendation(ranking, tie)
    doc["ranking"] = ranking
    doc["tie"] = tie
    doc["recommendation"] = best["layout"] if best else None
    doc["complete"] = not doc.get("error") and all(r["status"] == "done" for r in ranking)
    results.save(doc, save_to)
    return ranking, best


@click.command(name="tune", cls=KitCommand)
@click.option("--layouts", help="Layouts to try, e.g. tp1,tp2,tp2-pp2,tp1-dp2 (default: every layout that fits).")
@click.option("--budget", default="30m", show_default=True, help="Hard time limit for the whole run (s, m, h).")
@click.option("--fresh", is_flag=True, help="Forget finished layouts of an earlier run with the same load.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Where to save the results.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), help="Latency vs throughput PNG.")
@click.option(
    "--tie",
    type=click.FloatRange(0, 100),
    default=5.0,
    show_default=True,
    metavar="PERCENT",
    help="Layouts within this many percent of the best output tokens/s count as tied; "
    "a tie goes to the layout on fewer nodes, then fewer GPUs.",
)
@load_options
@config_options
@json_option
def command(
    layouts: str | None,
    budget: str,
    fresh: bool,
    output: Path | None,
    plot_path: Path | None,
    tie: float,
    config_path: str | None,
    cluster: str | None,
    set_values: tuple[str, ...],
    as_json: bool,
    api_key_file: str | None,
    **flags: Any,
) -> None:
    """Measure each layout of the cluster and recommend one.

    \b
    For each layout (TP x PP, and DP/EP: tp1-dp2, tp1-dp4-ep; on whole nodes): kit up the
    nodes it needs, kit serve, the same load as `kit bench` (same flags), kit down. The
    ranking is by output tokens/s at the last (heaviest) load point, then median latency;
    layouts with no measurement rank last. The recommendation is the fastest layout that
    finished cleanly, or, among those within --tie percent of it, the one on fewer nodes,
    then fewer GPUs. Finished layouts are kept in a state file, so running it again after a
    Ctrl-C or an exhausted --budget measures only what is left (--fresh starts over); an
    interrupted run still writes what it measured. --budget bounds every wait (bring-up,
    warm-up, requests), so the run ends within it plus the last teardown. Nothing it started
    is left running, whatever happens. Nodes start on this host: one node, or the local
    multi-node simulation (network:).

    \b
    Examples:
      kit tune --budget 20m
      kit tune --layouts tp1,tp2,tp1-dp2 -n 32 --concurrency 4 --plot layouts.png
    """
    from kit.bench import measure
    from kit.bench.runner import Target
    from kit.client import read_key
    from kit.output import LiveLine
    from kit.runtime import get_runtime
    from kit.state import state_dir

    # The budget's end, on the clock every wait below compares with: bring-up, warm-up and
    # measurement of every layout share it.
    deadline = time.monotonic() + parse_budget(budget)
    load = build_load(flags)
    writable(output, "--output")  # checked before any node starts, like every flag above
    writable(plot_path, "--plot")
    readable(api_key_file, "--api-key-file")
    resolved = resolve_cluster(config_path, cluster, set_values)
    config = resolved.config
    check_local(config)
    heads, kv = model_heads(config)
    chosen = (
        parse_layouts(layouts)
        if layouts
        else candidates(
            config.nodes,
            config.gpus_per_node,
            accelerator=config.accelerator,
            backend=config.backend,
            attention_heads=heads,
            kv_heads=kv,
            experts=model_experts(config),
        )
    )
    check_fits(chosen, config.nodes, config.gpus_per_node)
    for layout in chosen:  # every layout's plan is checked before the first one starts
        check_layout(config, resolved.sources, layout, heads, kv)
    key = read_key(api_key_file or config.api_key_file)
    rt = get_runtime(config)
    if any(n.state == "running" for n in rt.find_nodes(config.cluster)):
        raise KitError(
            f"cluster {config.cluster} is running on this host",
            hint="`kit down` first: kit tune starts each layout itself and leaves nothing running",
        )

    def say(text: str) -> None:
        progress(text, as_json=as_json)

    tune_key = state_key(
        {"load": load.to_dict(), "image": config.image, "model": config.model.id, "gpn": config.gpus_per_node}
    )
    state_path = state_dir() / "tune" / f"{config.cluster}.json"
    state: dict[str, Any] = {"key": tune_key, "layouts": {}} if fresh else load_state(state_path, tune_key)
    save_to = output or results.default_path(state_dir(), f"tune-{config.cluster}")
    doc = results.new_document(target={"url": None, "model": config.served_name}, load=load.to_dict(), cluster=None)
    doc["kind_detail"] = "tune"
    # SIGTERM (a job scheduler, `kill`) unwinds like Ctrl-C, so the finally below tears down.
    measure.interrupt_on_sigterm()
    say(f"kit tune: {len(chosen)} layout(s) {', '.join(lay.name for lay in chosen)}; budget {budget}")
    try:
        for layout in chosen:
            entry = state["layouts"].get(layout.name)
            if entry and entry.get("status") in ("done", "failed"):
                say(f"{layout.name}: {entry['status']} in an earlier run (kept; --fresh measures it again)")
                doc["points"].extend(entry.get("points") or ([entry["point"]] if entry.get("point") else []))
                continue
            remaining = deadline - time.monotonic()
            nodes = layout.nodes(config.gpus_per_node)
            if remaining < MIN_LAYOUT_S:
                state["layouts"][layout.name] = {"status": "skipped", "nodes": nodes, "error": "time budget used up"}
                say(f"{layout.name}: skipped (time budget used up)")
                continue
            lconf = layout_config(config, layout)
            say(
                f"{layout.name}: {nodes} node(s), TP={layout.tp} PP={layout.pp}"
                + (f" DP={layout.dp}" if layout.dp > 1 else "")
                + (" EP" if layout.ep else "")
            )
            started = time.monotonic()
            record: dict[str, Any] = {"status": "failed", "nodes": nodes}
            layout_doc: dict[str, Any] | None = None
            try:
                served = serve_layout(resolved, lconf, say, deadline)
                record["ready_s"] = round(time.monotonic() - started, 1)
                say(f"  serving at {served['url']} after {record['ready_s']} s; measuring")
                from kit.commands.bench import cluster_info

                version = measure.server_version(served["url"], key, timeout=min(5, deadline - time.monotonic()))
                target = Target(
                    base_url=served["url"],
                    model=config.served_name,
                    api_key=key,
                    ignore_eos=flags["ignore_eos"],
                    timeout_s=flags["request_timeout"],
                )
                layout_doc = results.new_document(
                    target={"url": served["url"], "model": config.served_name},
                    load=load.to_dict(),
                    cluster=cluster_info(lconf, served["url"], version, config.served_name),
                )
                stopped = measure.run_load(
                    target,
                    load,
                    layout_doc,
                    save_to=None,
                    live=LiveLine(as_json=as_json),
                    layout=layout.name,
                    deadline=deadline,
                )
                # cut by the budget before a point was measured: measured again next run, like a skip
                status = "done" if not stopped else "partial" if layout_doc["points"] else "skipped"
                record.update({"status": status, "error": stopped})
            except KitError as err:
                record["error"] = err.message
                if time.monotonic() >= deadline - 1:  # cut short by the budget: measured again next run
                    record.update({"status": "skipped", "error": f"time budget ran out ({err.message})"})
                say(f"  {layout.name} {record['status']}: {err.message}")
            except BaseException:
                record.update({"status": "interrupted", "error": "interrupted"})
                raise
            finally:
                if layout_doc is not None:  # whatever was measured stays, even when interrupted
                    keep_points(record, layout_doc, doc)
                rt.remove_cluster(config.cluster)  # never leave a server up that kit tune started
                record["seconds"] = round(time.monotonic() - started, 1)
                state["layouts"][layout.name] = record
                results.save(state, state_path)
            say(f"  {layout.name}: torn down ({record['status']}, {record['seconds']} s)")
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM: the results so far are written before exit 130
        doc["error"] = "interrupted"
        conclude(doc, state, chosen, tie / 100, save_to)
        say(f"kit tune: interrupted; results so far saved to {save_to}")
        raise
    ranking, best = conclude(doc, state, chosen, tie / 100, save_to)
    if plot_path and doc["points"]:
        from kit.bench.plot import plot

        plot([doc], [config.cluster], plot_path, title="kit tune: latency vs throughput per layout")

    def text() -> str:
        rows = [
            [
                i + 1,
                r["layout"],
                r["nodes"],
                r["status"],
                results.fmt(r["output_throughput"]),
                results.fmt(r["request_throughput"]),
                results.fmt(r["median_ttft_ms"]),
                results.fmt(r["median_tpot_ms"]),
                results.fmt(r["median_e2el_ms"]),
                results.fmt(r["ready_s"]),
                (r["error"] or "")[:60],
            ]
            for i, r in enumerate(ranking)
        ]
        head = [
            "#",
            "layout",
            "nodes",
            "status",
            "out tok/s",
            "req/s",
            "TTFT p50",
            "TPOT p50",
            "E2E p50",
            "ready s",
            "note",
        ]
        rec = recommendation_line(best, ranking, tie / 100)
        return "\n".join(
            [table(head, rows), rec, f"saved to {save_to}"] + ([f"plot: {plot_path}"] if plot_path else [])
        )

    emit("tune", {**doc, "saved_to": str(save_to), "state": str(state_path)}, as_json=as_json, text=text)
