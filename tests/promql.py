"""The metric and label names a PromQL expression uses, for checking deploy/grafana's dashboard
against a real scrape (tests/unit/test_grafana.py, tests/integration/test_dp_cluster.py).

Not a PromQL parser: enough of the grammar for the expressions a dashboard holds (functions,
aggregations with by/without, binary operators, label matchers, ranges, Grafana variables)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from kit.health import prometheus as metrics

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "vllm-kit.json"

# Words that are PromQL syntax, not metric names, where they appear without a '(' after them.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_IDENT = re.compile(r"(?<![\w:$.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")
_MATCHER_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
# Series Prometheus makes itself for every target (not in any /metrics answer).
PROMETHEUS_OWN = {"up"}
# Labels Prometheus adds to every scraped series: kit's file_sd labels, plus instance and job.
TARGET_LABELS = {"cluster", "node", "role", "rank", "component", "instance", "job"}
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$")


def metric_names(expr: str) -> set[str]:
    """Every metric (series) name the expression selects."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        word, call = match.group(1), match.group(2)
        if call or word in KEYWORDS or word.lower() in ("inf", "nan"):
            continue
        names.add(word)
    return names


def grouping_labels(expr: str) -> set[str]:
    """Labels named in by(...), without(...), on(...) and the like."""
    text = _STRING.sub('""', expr)
    return {label.strip() for m in _GROUPING.finditer(text) for label in m.group(2).split(",") if label.strip()}


def matcher_labels(expr: str) -> set[str]:
    """Labels named inside {...} selectors."""
    text = _STRING.sub('""', expr)
    return {label for block in _MATCHERS.findall(text) for label in _MATCHER_LABEL.findall(block)}


def split_label_values(query: str) -> tuple[str, str] | None:
    """A Grafana `label_values(EXPR, LABEL)` variable query as (EXPR, LABEL)."""
    match = _LABEL_VALUES.match(query)
    return (match.group(1), match.group(2)) if match else None


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside rows included (rows themselves are left out)."""
    out = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


def expressions(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression: panel targets and the inner expressions of variable queries."""
    exprs = [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        parts = split_label_values(query)
        exprs.append(parts[0] if parts else query)
    return exprs


def dashboard_problems(dashboard: dict[str, Any], scrape: metrics.Scrape) -> list[str]:
    """Every metric or label the dashboard uses that the scrape lacks (empty: all there)."""
    names = scrape.names()
    histograms = metrics.histogram_families(scrape)
    problems = []
    for expr in expressions(dashboard):
        used = metric_names(expr)
        if not used:
            problems.append(f"no metric found in {expr!r}")
        for name in used - PROMETHEUS_OWN:
            if name not in names:
                problems.append(f"{name} (in {expr!r}) is not in the scrape")
            elif name.endswith("_bucket") and name.removesuffix("_bucket") not in histograms:
                problems.append(f"{name} is not the _bucket series of a histogram with _sum and _count")
        if not used <= names | PROMETHEUS_OWN:
            continue  # a missing metric is reported once, not again for each of its labels
        labels = metrics.label_names(scrape, used) | TARGET_LABELS
        for label in (grouping_labels(expr) | matcher_labels(expr)) - labels:
            problems.append(f"label {label!r} (in {expr!r}) is on none of {sorted(used)}")
    return problems
