"""The results document of `kit bench`: load, per-point metrics and per-request records, with
the cluster's plan, versions and image digest; saving, loading, rendering and comparing."""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kit import __version__, safeload
from kit.errors import ConfigError, KitError
from kit.safe import files as safefile
from kit.safe import text as safetext

KIND = "kit-bench"
SCHEMA_VERSION = 1

# (metric key, column title, higher is better) in the order tables show them.
HEADLINE: tuple[tuple[str, str, bool], ...] = (
    ("completed", "ok", True),
    ("failed", "err", False),
    ("request_throughput", "req/s", True),
    ("output_throughput", "out tok/s", True),
    ("total_token_throughput", "tok/s", True),
    ("median_ttft_ms", "TTFT p50", False),
    ("p90_ttft_ms", "TTFT p90", False),
    ("p99_ttft_ms", "TTFT p99", False),
    ("median_tpot_ms", "TPOT p50", False),
    ("p99_tpot_ms", "TPOT p99", False),
    ("median_itl_ms", "ITL p50", False),
    ("p99_itl_ms", "ITL p99", False),
    ("median_e2el_ms", "E2E p50", False),
    ("p90_e2el_ms", "E2E p90", False),
    ("p99_e2el_ms", "E2E p99", False),
)
COMPARED: tuple[tuple[str, bool], ...] = (
    *((k, better) for k, _, better in HEADLINE if k not in ("completed", "failed")),
    ("mean_ttft_ms", False),
    ("mean_tpot_ms", False),
    ("mean_itl_ms", False),
    ("mean_e2el_ms", False),
)


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def new_document(*, target: dict[str, Any], load: dict[str, Any], cluster: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "kind": KIND,
        "schema": SCHEMA_VERSION,
        "kit_version": __version__,
        "created": now_iso(),
        "target": target,
        "cluster": cluster,
        "load": load,
        "points": [],
        "complete": False,
        "error": None,
    }


def default_path(state_dir: Path, label: str) -> Path:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in label)[:60] or "bench"
    return state_dir / "bench" / f"{safe}-{stamp}.json"


def save(doc: dict[str, Any], path: Path) -> Path:
    """Atomic write (kit.safe.files: temp file + rename, no link followed): a Ctrl-C never leaves
    half a document. Strict JSON (NaN and Infinity as null) with every secret kit knows
    redacted, whatever a server echoed into an error: results files get shared."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        safefile.write_atomic(path, safetext.to_json(doc, indent=1) + "\n")
    except OSError as exc:
        raise KitError(
            f"cannot write the results to {path}: {exc.strerror or exc}", hint="pass --output to a writable path"
        ) from None
    return path


def load(path: Path, flag: str = "--compare") -> dict[str, Any]:
    """A saved results document (or `kit bench --json` output), checked: every bad file is one
    ConfigError naming the file and what is wrong, never a KeyError later."""
    hint = "pass a results file that `kit bench` or `kit tune` saved"
    try:  # bounded: a FIFO, /dev/zero or JSON nested thousands deep is one error, not a hang
        doc = safeload.load_json_file(path, what="results file")
    except ConfigError as err:
        raise ConfigError(err.message, key=flag, hint=err.hint or hint) from None
    if isinstance(doc, dict) and doc.get("command") == "bench" and isinstance(doc.get("result"), dict):
        doc = doc["result"]  # a saved `kit bench --json` envelope
    problem = invalid(doc)
    if problem:
        raise ConfigError(f"{path}: {problem}", key=flag, hint=hint)
    checked: dict[str, Any] = doc
    return checked


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# Every metric that render, compare and plot read as a number (plot's panels are headline ones).
NUMERIC_METRICS = {k for k, _, _ in HEADLINE} | {k for k, _ in COMPARED}


def invalid(doc: Any) -> str | None:
    """What is wrong with a results document, in a few words; None when it can be shown,
    compared and plotted."""
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        return f'not a kit bench result (no "kind": "{KIND}")'
    if not isinstance(doc.get("points"), list):
        return '"points" is not a list'
    for name in ("target", "cluster"):
        if doc.get(name) is not None and not isinstance(doc[name], dict):
            return f'"{name}" is not an object'
    plan = (doc.get("cluster") or {}).get("plan")
    if plan is not None and not isinstance(plan, dict):
        return '"cluster.plan" is not an object or null'
    for i, point in enumerate(doc["points"], 1):
        if not isinstance(point, dict):
            return f"point {i} is not an object"
        if point.get("rate") is not None and not _number(point["rate"]):
            return f"point {i}: rate {point['rate']!r} is not a number or null"
        conc = point.get("concurrency")
        if conc is not None and (not isinstance(conc, int) or isinstance(conc, bool)):
            return f"point {i}: concurrency {conc!r} is not an integer or null"
        if point.get("layout") is not None and not isinstance(point["layout"], str):
            return f"point {i}: layout is not a string"
        metrics = point.get("metrics")
        if not isinstance(metrics, dict):
            return f'point {i} has no "metrics" object'
        bad = sorted(k for k in NUMERIC_METRICS if metrics.get(k) is not None and not _number(metrics[k]))
        if bad:
            return f"point {i}: metrics {', '.join(bad)} not a number"
        if not isinstance(metrics.get("errors", {}), dict):
            return f'point {i}: metrics "errors" is not an object'
    return None


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def point_label(point: dict[str, Any]) -> str:
    rate = point.get("rate")
    conc = point.get("concurrency")
    return f"{'inf' if rate is None else f'{rate:g}'}/{conc if conc else 'max'}"


def render(doc: dict[str, Any]) -> str:
    from kit.output import table

    rows = []
    for point in doc["points"]:
        m = point["metrics"]
        label = point_label(point)
        if point.get("layout"):
            label = f"{point['layout']} {label}"
        rows.append([label, *(fmt(m.get(k)) for k, _, _ in HEADLINE)])
    head = ["rate/conc", *(title for _, title, _ in HEADLINE)]
    if any(p.get("layout") for p in doc["points"]):
        head[0] = "layout rate/conc"
    lines = [table(head, rows), "(latencies in ms; p50 = median; throughputs per second of wall time)"]
    errors: dict[str, int] = {}
    for point in doc["points"]:
        for err, n in point["metrics"].get("errors", {}).items():
            errors[err] = errors.get(err, 0) + n
    for err, n in sorted(errors.items(), key=lambda kv: -kv[1])[:5]:
        lines.append(f"  {n} x {err}")
    return "\n".join(lines)


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Per matching point (same rate/concurrency/layout, in order), B / A for each metric."""
    rows: list[dict[str, Any]] = []
    bkeys = {(p.get("layout"), p.get("rate"), p.get("concurrency")): p for p in b["points"]}
    for pa in a["points"]:
        pb = bkeys.get((pa.get("layout"), pa.get("rate"), pa.get("concurrency")))
        if pb is None:
            continue
        for key, higher_better in COMPARED:
            va, vb = pa["metrics"].get(key), pb["metrics"].get(key)
            ratio = vb / va if isinstance(va, int | float) and isinstance(vb, int | float) and va else None
            better = None if ratio is None or ratio == 1 else (ratio > 1) == higher_better
            rows.append(
                {
                    "point": (f"{pa['layout']} " if pa.get("layout") else "") + point_label(pa),
                    "metric": key,
                    "a": va,
                    "b": vb,
                    "ratio": ratio,
                    "b_better": better,
                }
            )
    return rows


def describe(doc: dict[str, Any]) -> str:
    c = doc.get("cluster") or {}
    plan = c.get("plan") or {}
    if plan:
        layout = f"TP={plan.get('tp')} PP={plan.get('pp')} nodes={plan.get('nodes')}"
    elif doc.get("kind_detail") == "tune":
        layout = "kit tune: each point has its layout's plan"
    else:
        layout = "external server, no kit plan"
    digest = str(c.get("image_digest") or "-")[:19]
    target = doc.get("target") or {}
    return f"{doc.get('created')} {target.get('model')} @ {target.get('url')} ({layout}, {digest})"


def render_compare(rows: Sequence[dict[str, Any]], a: dict[str, Any], b: dict[str, Any]) -> str:
    from kit.output import table

    if not rows:
        return "no load point in common (same rate, concurrency and layout) between the two runs"
    body = [
        [
            r["point"],
            r["metric"],
            fmt(r["a"]),
            fmt(r["b"]),
            "-" if r["ratio"] is None else f"{r['ratio']:.3f}",
            {True: "B better", False: "A better", None: ""}[r["b_better"]],
        ]
        for r in rows
    ]
    return "\n".join([f"A: {describe(a)}", f"B: {describe(b)}", table(["point", "metric", "A", "B", "B/A", ""], body)])
