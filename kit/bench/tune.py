"""`kit tune`'s pure pieces: candidate layouts, the resumable state, the ranking.

A layout is TP × PP × DP, with expert parallelism on or off (`tp1-dp2`, `tp1-dp4-ep`): the
config keys model.tp, model.pp, model.dp and model.ep. Each layout uses whole nodes:
nodes = ceil(TP·PP·DP / GPUs per node), and a DP replica (TP×PP GPUs) stays inside one node.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kit import safeload
from kit.errors import ConfigError
from kit.layout import Layout
from kit.plan.layout import ModelFacts


def parse_layouts(text: str) -> list[Layout]:
    seen: list[Layout] = []
    for part in text.split(","):
        if part.strip():
            layout = Layout.parse(part)
            if layout not in seen:
                seen.append(layout)
    if not seen:
        raise ConfigError("no layout given", key="--layouts", hint="e.g. --layouts tp1,tp2")
    return seen


def candidates(
    nodes: int,
    gpus_per_node: int,
    *,
    accelerator: str = "gpu",
    backend: str = "mp",
    model: ModelFacts | None = None,
) -> list[Layout]:
    """Every layout on 1..nodes whole nodes that vLLM can run. TP × PP: TP a power of two that
    splits the model's heads when its facts are known (kit.sizing's rule); no PP on CPU (vLLM's
    CPU build asserts in PP across nodes, FIELD_NOTES §7). Data parallel: replicas of TP GPUs
    inside a node, DP ranks spread evenly over the nodes (not on CPU with the Ray backend, which
    kit refuses); with EP too when the model has experts that split over TP×DP, except on CPU,
    where vLLM's EP fails on the first request (tests/integration/test_dp_cluster.py). Smallest
    first, so a short budget still measures the cheap layouts."""
    out: list[Layout] = []
    experts = model.experts if model is not None else None
    for n in range(1, nodes + 1):
        total = n * gpus_per_node
        tp = 1
        while tp <= total:
            if total % tp == 0 and (model is None or model.splits_heads(tp)):
                pp = total // tp
                if not (accelerator == "cpu" and pp > 1):
                    out.append(Layout(tp, pp))
                dp = total // tp
                dp_ok = dp > 1 and tp <= gpus_per_node and dp % n == 0
                if dp_ok and not (accelerator == "cpu" and backend == "ray"):
                    out.append(Layout(tp, 1, dp))
                    if experts and experts % (tp * dp) == 0 and accelerator != "cpu":
                        out.append(Layout(tp, 1, dp, ep=True))
            tp *= 2
    return sorted(set(out), key=lambda lay: (lay.gpus, lay.pp, lay.dp, lay.ep, lay.tp))


def check_fits(layouts: Sequence[Layout], nodes: int, gpus_per_node: int) -> None:
    for layout in layouts:
        if layout.nodes(gpus_per_node) > nodes:
            raise ConfigError(
                f"layout {layout.name} needs {layout.gpus} GPUs ({layout.nodes(gpus_per_node)} nodes), "
                f"the cluster has {nodes} node(s) x {gpus_per_node}",
                key="--layouts",
                hint="drop it or raise nodes",
            )


def state_key(parts: dict[str, Any]) -> str:
    """What must match for finished layouts to be reused: the load, the image and the model."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_state(path: Path, key: str) -> dict[str, Any]:
    """kit tune's saved state ({} of layouts when there is none, or it is unreadable: a FIFO or
    a deeply nested file in the state folder is read through the bounded loader)."""
    try:
        data = safeload.load_json_file(path, what="kit tune state")
    except ConfigError:
        return {"key": key, "layouts": {}}
    if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("layouts"), dict):
        return {"key": key, "layouts": {}}
    return data


def rank(entries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Layouts best first, in tiers: finished cleanly; finished with failed requests; measured
    in part (cut by the budget or interrupted); nothing measured (skipped, failed to start).
    Within a tier: output token throughput, then lower median E2E latency."""
    rows = []
    for name, entry in entries.items():
        m = (entry.get("point") or {}).get("metrics")
        rows.append(
            {
                "layout": name,
                "status": entry.get("status"),
                "nodes": entry.get("nodes"),
                "gpus": Layout.parse(name).gpus,
                "output_throughput": m["output_throughput"] if m else None,
                "request_throughput": m["request_throughput"] if m else None,
                "median_ttft_ms": m["median_ttft_ms"] if m else None,
                "median_tpot_ms": m["median_tpot_ms"] if m else None,
                "median_e2el_ms": m["median_e2el_ms"] if m else None,
                "failed": (m["failed"] + m.get("not_sent", 0)) if m else None,
                "ready_s": entry.get("ready_s"),
                "error": entry.get("error"),
            }
        )

    def order(row: dict[str, Any]) -> tuple[int, float, float]:
        if row["output_throughput"] is None:
            tier = 3
        elif row["status"] != "done":
            tier = 2
        else:
            tier = 1 if row["failed"] else 0
        return (tier, -(row["output_throughput"] or 0.0), row["median_e2el_ms"] or math.inf)

    return sorted(rows, key=order)


def recommendation(ranking: Sequence[dict[str, Any]], tie: float = 0.0) -> dict[str, Any] | None:
    """The layout to use, among those that finished cleanly: the fastest, unless others are
    within `tie` (a fraction) of its output throughput; then the one on the fewest nodes, then
    GPUs (a difference that small is noise on a shared host, the hardware saved is not).
    The row comes back with "over": the faster layout it was preferred to, or None."""
    clean = [r for r in ranking if r["status"] == "done" and not r["failed"] and r["output_throughput"] is not None]
    if not clean:
        return None
    fastest = max(clean, key=lambda r: r["output_throughput"])
    tied = [r for r in clean if r["output_throughput"] >= fastest["output_throughput"] * (1 - tie)]
    pick = min(tied, key=lambda r: (r["nodes"], r["gpus"], -r["output_throughput"]))
    return {**pick, "over": None if pick is fastest else fastest["layout"]}


def recommendation_line(best: dict[str, Any] | None, ranking: Sequence[dict[str, Any]], tie: float) -> str:
    if best is None:
        return "no recommendation: no layout finished cleanly"
    line = f"recommended: {best['layout']} ({best['output_throughput']:.1f} output tokens/s"
    if best["over"]:
        fastest = next(r for r in ranking if r["layout"] == best["over"])
        line += (
            f"; {fastest['layout']} made {fastest['output_throughput']:.1f}, within the {tie:.0%} tie tolerance"
            f" (--tie), and {best['layout']} uses fewer nodes/GPUs: {best['nodes']} node(s), {best['gpus']} GPU(s)"
            f" vs {fastest['nodes']}, {fastest['gpus']}"
        )
    return line + ")"
