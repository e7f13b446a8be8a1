"""`kit tune`: bring the server up with each candidate layout on this host, run the same load,
tear it down, and rank the layouts. Resumable (finished layouts are kept in a state file),
bounded by a hard time budget, and it never leaves a server up that it started. The run itself
is kit.bench.trials; the layouts are planned by kit.plan.layout through kit.cluster."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from kit.bench import results
from kit.bench.load import build_load
from kit.bench.trials import TuneRun, check_layout, check_local, conclude, parse_budget
from kit.bench.tune import candidates, check_fits, load_state, parse_layouts, recommendation_line, state_key
from kit.cluster import Cluster
from kit.commands._options import cluster_overrides, config_options, json_option, load_options
from kit.commands._params import KitCommand, readable, writable
from kit.errors import KitError
from kit.layout import Layout
from kit.output import LiveLine, emit, progress, table


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
    from kit.net.openai import read_key
    from kit.state import state_dir

    # The budget's end, on the clock every wait below compares with: bring-up, warm-up and
    # measurement of every layout share it.
    deadline = time.monotonic() + parse_budget(budget)
    load = build_load(flags)
    writable(output, "--output")  # checked before any node starts, like every flag above
    writable(plot_path, "--plot")
    readable(api_key_file, "--api-key-file")
    base = Cluster.load(config_path, cluster_overrides(cluster, set_values))
    config = base.config
    chosen = choose_layouts(base, layouts)
    key = read_key(api_key_file or config.api_key_file)
    if any(n.state == "running" for n in base.nodes()):
        raise KitError(
            f"cluster {config.cluster} is running on this host",
            hint="`kit down` first: kit tune starts each layout itself and leaves nothing running",
        )
    say = functools.partial(progress, as_json=as_json)
    tune_key = state_key(
        {"load": load.to_dict(), "image": config.image, "model": config.model.id, "gpn": config.gpus_per_node}
    )
    state_path = state_dir() / "tune" / f"{config.cluster}.json"
    save_to = output or results.default_path(state_dir(), f"tune-{config.cluster}")
    doc = results.new_document(target={"url": None, "model": config.served_name}, load=load.to_dict(), cluster=None)
    doc["kind_detail"] = "tune"
    run = TuneRun(
        base=base,
        load=load,
        key=key,
        ignore_eos=flags["ignore_eos"],
        request_timeout=flags["request_timeout"],
        deadline=deadline,
        state={"key": tune_key, "layouts": {}} if fresh else load_state(state_path, tune_key),
        state_path=state_path,
        doc=doc,
        say=say,
        live=lambda: LiveLine(as_json=as_json),
    )
    # SIGTERM (a job scheduler, `kill`) unwinds like Ctrl-C, so the run tears down.
    measure.interrupt_on_sigterm()
    say(f"kit tune: {len(chosen)} layout(s) {', '.join(lay.name for lay in chosen)}; budget {budget}")
    try:
        run.measure_all(chosen)
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM: the results so far are written before exit 130
        doc["error"] = "interrupted"
        conclude(doc, run.state, chosen, tie / 100, save_to)
        say(f"kit tune: interrupted; results so far saved to {save_to}")
        raise
    ranking, best = conclude(doc, run.state, chosen, tie / 100, save_to)
    if plot_path and doc["points"]:
        from kit.bench.plot import plot

        plot([doc], [config.cluster], plot_path, title="kit tune: latency vs throughput per layout")
    emit(Tuned(doc, save_to, state_path, ranking, best, tie / 100, plot_path), as_json=as_json)


@dataclass(frozen=True)
class Tuned:
    """`kit tune`: the results document (every layout's points), where it and the state file are,
    the ranking and the recommendation (within `tie`, a fraction), the plot."""

    doc: dict[str, Any]
    saved_to: Path
    state: Path
    ranking: list[dict[str, Any]]
    best: dict[str, Any] | None
    tie: float
    plot: Path | None
    command = "tune"

    def to_dict(self) -> dict[str, Any]:
        return {**self.doc, "saved_to": str(self.saved_to), "state": str(self.state)}

    def text(self) -> str:
        return render(self.ranking, self.best, self.tie, self.saved_to, self.plot)


def choose_layouts(base: Cluster, layouts: str | None) -> list[Layout]:
    """--layouts, or every layout that fits this host's nodes and the model; each one's plan is
    checked before the first one starts."""
    config = base.config
    check_local(config)
    chosen = (
        parse_layouts(layouts)
        if layouts
        else candidates(config.nodes, config.gpus_per_node, accelerator=config.accelerator, backend=config.backend,
                        model=base.model)
    )  # fmt: skip
    check_fits(chosen, config.nodes, config.gpus_per_node)
    for layout in chosen:
        check_layout(base, layout)
    return chosen


def render(
    ranking: list[dict[str, Any]], best: dict[str, Any] | None, tie: float, save_to: Path, plot_path: Path | None
) -> str:
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
    rec = recommendation_line(best, ranking, tie)
    return "\n".join([table(head, rows), rec, f"saved to {save_to}"] + ([f"plot: {plot_path}"] if plot_path else []))
