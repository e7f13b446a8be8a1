"""`kit bench --plot`: latency against throughput, one curve per layout (or per result file).

matplotlib is an optional extra (`pip install 'kit[plot]'`); it is imported only here."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kit.bench.results import point_label
from kit.errors import ConfigError, UsageError

PANELS = (
    ("median_ttft_ms", "TTFT p50 (ms)"),
    ("median_tpot_ms", "TPOT p50 (ms)"),
    ("median_e2el_ms", "E2E latency p50 (ms)"),
)


def curves(docs: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Series name -> its points in the order they ran (rising load). A layout names a series (kit tune);
    otherwise each document is one series."""
    out: dict[str, list[dict[str, Any]]] = {}
    for doc, name in zip(docs, names, strict=True):
        for point in doc["points"]:
            m = point["metrics"]
            if not m.get("completed") or not all(
                isinstance(m.get(k), int | float) for k in ("output_throughput", *(key for key, _ in PANELS))
            ):
                continue  # nothing finished, or a document without these numbers: no dot to draw
            key = point.get("layout") or name
            out.setdefault(key, []).append(point)
    return out


def short_label(point: dict[str, Any]) -> str:
    """c=4 (concurrency, everything at once), r=2 (rate), or r=2 c=4."""
    rate, conc = point.get("rate"), point.get("concurrency")
    parts = ([] if rate is None else [f"r={rate:g}"]) + ([f"c={conc}"] if conc else [])
    return " ".join(parts) or point_label(point)


def plot(docs: Sequence[dict[str, Any]], names: Sequence[str], path: Path, title: str | None = None) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(
            "--plot needs matplotlib, which is not installed",
            hint="pip install 'kit[plot]' (or pip install matplotlib)",
        ) from None
    series = curves(docs, names)
    if not series:
        raise ConfigError("no finished request to plot", key="--plot", hint="run a benchmark that completes first")
    fig, axes = plt.subplots(1, len(PANELS), figsize=(12, 3.8), dpi=100)
    for ax, (key, label) in zip(axes, PANELS, strict=True):
        for name, points in series.items():
            xs = [p["metrics"]["output_throughput"] for p in points]
            ys = [p["metrics"][key] for p in points]
            ax.plot(xs, ys, marker="o", label=name)
            for x, y, p in zip(xs, ys, points, strict=True):
                ax.annotate(short_label(p), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xlabel("output throughput (tokens/s)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0].legend(fontsize=8, title="layout" if any(p.get("layout") for d in docs for p in d["points"]) else None)
    fig.suptitle(title or "latency vs throughput (c = concurrency, r = request rate)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
