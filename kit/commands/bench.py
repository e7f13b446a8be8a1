"""`kit bench`: load the cluster's OpenAI endpoint and report TTFT, TPOT, ITL, E2E latency and
throughput the way `vllm bench serve` computes them; save, compare and plot results."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from kit.bench import results
from kit.bench.load import build_load
from kit.bench.measure import Load
from kit.bench.runner import Target
from kit.bench.target import cluster_info, resolve_target
from kit.cluster import Cluster
from kit.commands._options import cluster_overrides, config_options, json_option, load_options
from kit.commands._params import KitCommand, Url, readable, writable
from kit.errors import UsageError
from kit.output import emit, progress, warn


def has_matplotlib() -> bool:
    """Whether --plot can work, found without importing it: importing matplotlib writes its
    config folder under $HOME, and a refused command must write nothing."""
    if "matplotlib" in sys.modules:
        return sys.modules["matplotlib"] is not None
    return importlib.util.find_spec("matplotlib") is not None


@click.command(name="bench", cls=KitCommand)
@click.option("--url", type=Url(), help="Server URL (default: the cluster's head, port ports.api).")
@click.option("--model", help="Model name to load (default: the first one the server lists).")
@load_options
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Where to save the results JSON.")
@click.option("--no-save", is_flag=True, help="Do not save the results.")
@click.option(
    "--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), help="Write a latency vs throughput PNG."
)
@click.option(
    "--from",
    "from_files",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --plot: plot saved results (repeatable) instead of running.",
)
@click.option(
    "--compare",
    nargs=2,
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="A.json B.json",
    help="Print B/A ratios of two saved results; runs nothing.",
)
@click.option(
    "--keep-going",
    is_flag=True,
    help="Keep sending through failed requests (a replica dying, the server restarting), counting and "
    "timing each; only a 401 or the time budget stops the run. The load of a failover measurement.",
)
@config_options
@json_option
def command(
    url: str | None,
    model: str | None,
    keep_going: bool,
    output: Path | None,
    no_save: bool,
    plot_path: Path | None,
    from_files: tuple[Path, ...],
    compare: tuple[Path, Path] | None,
    config_path: str | None,
    cluster: str | None,
    set_values: tuple[str, ...],
    as_json: bool,
    api_key_file: str | None,
    **flags: Any,
) -> None:
    """Benchmark the server: streaming chat requests at a request rate or concurrency (or sweeps
    of them), then TTFT, TPOT (first token excluded), ITL, end-to-end latency (mean, p50, p90,
    p99), request and token throughput and errors — the definitions of `vllm bench serve`.

    \b
    Results (with the cluster's plan, vLLM version and image digest) are saved under the state
    directory (or --output) after every load point, so a failure keeps what was measured.

    \b
    Examples:
      kit bench                                   # 16 requests, 32 words in, 32 tokens out
      kit bench -n 64 --concurrency 1,4,16 --plot curve.png
      kit bench --rate 2,4,8 --dataset prompts.jsonl --api-key-file ~/.config/kit/api_key
      kit bench --compare before.json after.json
      kit bench --plot tp.png --from tp1.json --from tp2.json
    """
    if compare:
        show_compare(compare, as_json=as_json)
        return
    if from_files:
        plot_saved(from_files, plot_path, as_json=as_json)
        return
    if plot_path and not has_matplotlib():  # fail before the run, not after it
        raise UsageError(
            "--plot needs matplotlib, which is not installed",
            hint="pip install 'kit[plot]' (or pip install matplotlib)",
        )
    from kit.state import state_dir

    load = build_load(flags)  # a malformed dataset fails here, before any request
    writable(None if no_save else output, "--output")  # and an unwritable output file
    writable(plot_path, "--plot")
    readable(api_key_file, "--api-key-file")
    measured = Cluster.find(config_path, cluster_overrides(cluster, set_values))
    if url is None:  # the cluster that runs is measured as it runs (issue 25)
        warn([d.line(measured.name) for d in measured.drift()], as_json=as_json)
    target, key = resolve_target(
        measured, url, api_key_file, model, ignore_eos=flags["ignore_eos"], timeout_s=flags["request_timeout"]
    )
    if keep_going:
        target = dataclasses.replace(target, keep_going=True)
    save_to = None if no_save else (output or results.default_path(state_dir(), measured.name))
    doc = run(measured, target, key, load, save_to, as_json=as_json)
    if plot_path:
        from kit.bench.plot import plot

        plot([doc], [measured.name], plot_path)
    emit(Measured(doc, save_to, plot_path), as_json=as_json)


@dataclass(frozen=True)
class Measured:
    """`kit bench`: the results document (kit.bench.results), where it was saved, the plot."""

    doc: dict[str, Any]
    saved_to: Path | None
    plot: Path | None
    command = "bench"

    def to_dict(self) -> dict[str, Any]:
        saved, plot = self.saved_to, self.plot
        return {**self.doc, "saved_to": str(saved) if saved else None, "plot": str(plot) if plot else None}

    def text(self) -> str:
        lines = [results.render(self.doc)]
        if self.saved_to:
            lines.append(f"saved to {self.saved_to}")
        if self.plot:
            lines.append(f"plot: {self.plot}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Compared:
    """`kit bench --compare A B`: B/A ratios of two saved results."""

    files: tuple[Path, Path]
    rows: list[dict[str, Any]]
    a: dict[str, Any]
    b: dict[str, Any]
    command = "bench"

    def to_dict(self) -> dict[str, Any]:
        return {"compare": [str(p) for p in self.files], "rows": self.rows}

    def text(self) -> str:
        return results.render_compare(self.rows, self.a, self.b)


@dataclass(frozen=True)
class Plotted:
    """`kit bench --plot PNG --from ...`: the plot written."""

    plot: Path
    command = "bench"

    def to_dict(self) -> dict[str, Any]:
        return {"plot": str(self.plot)}

    def text(self) -> str:
        return f"wrote {self.plot}"


def run(
    measured: Cluster, target: Target, key: str | None, load: Load, save_to: Path | None, *, as_json: bool
) -> dict[str, Any]:
    """Every load point against the target; the document (saved after each point)."""
    from kit.bench import measure
    from kit.output import LiveLine

    version = measure.server_version(target.base_url, key)
    doc = results.new_document(
        target={"url": target.base_url, "model": target.model},
        load=load.to_dict(),
        cluster=cluster_info(measured, target.base_url, version, target.model),
    )
    progress(
        f"kit bench: {len(load.prompts)} requests x {len(load.points)} point(s) "
        f"against {target.base_url} ({target.model})",
        as_json=as_json,
    )
    measure.interrupt_on_sigterm()
    stopped = measure.run_load(target, load, doc, save_to=save_to, live=LiveLine(as_json=as_json))
    measure.finish(doc, stopped, save_to)
    return doc


def show_compare(compare: tuple[Path, Path], *, as_json: bool) -> None:
    """--compare A B: B/A ratios of two saved results; runs nothing."""
    a, b = results.load(compare[0]), results.load(compare[1])
    emit(Compared(compare, results.compare(a, b), a, b), as_json=as_json)


def plot_saved(from_files: tuple[Path, ...], plot_path: Path | None, *, as_json: bool) -> None:
    """--plot PNG --from A --from B: plot saved results; runs nothing."""
    if not plot_path:
        raise UsageError("--from only goes with --plot", hint="kit bench --plot out.png --from a.json --from b.json")
    from kit.bench.plot import plot

    writable(plot_path, "--plot")
    docs = [results.load(p, "--from") for p in from_files]
    plot(docs, [p.stem for p in from_files], plot_path)
    emit(Plotted(plot_path), as_json=as_json)
