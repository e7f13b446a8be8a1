"""kit's record of each cluster it started on this host (issue 25): clusters.json in kit's state
folder (kit.state's record-file store), one entry per cluster name, written when a node starts
and when serving starts, removed by `kit down`.

It holds what a later command needs where no label can tell it: the runtime the nodes run on
(labels are found through it), the operating values of the nodes (kit.cluster.running's keys,
also for nodes on other hosts), the config it was started from (its file and every value set
there, in KIT_* or by a flag, with where it came from; env values that look secret are
redacted), and how it is served (supervised or not). Never a secret: the API key's file is
recorded as a path.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kit.config import Resolved, redacted_value
from kit.errors import KitError
from kit.state import drop_record, read_records, state_dir, update_record

WHAT = "cluster"
REWRITTEN_BY = "`kit up`"


def path() -> Path:
    return state_dir() / "clusters.json"


def read(cluster: str) -> dict[str, Any] | None:
    """The record of `cluster` on this host, or None (never recorded, or an unreadable file:
    day-two commands then go by the labels and the config)."""
    try:
        record = read_records(path(), WHAT, REWRITTEN_BY).get(cluster)
    except KitError:
        return None
    return record if isinstance(record, dict) else None


def started(settings: Resolved, node: Mapping[str, Any], operating: Mapping[str, Any]) -> dict[str, Any]:
    """Record a node kit just started (`node`: its name, role, rank, IP), with the operating
    values of the cluster (kit.cluster.running.OPERATING_KEYS) and the config it came from. The
    nodes already recorded for the same cluster stay (the demo's worker, then its head; nodes
    on hosts that share kit's state folder, started at once: the record is read under its lock)."""
    config = settings.config
    entry = {**node, "started_at": _now()}
    configured = {
        "path": settings.path,
        "set": {
            key: [redacted_value(key, settings.values[key]), source]
            for key, source in sorted(settings.sources.items())
            if source != "default"
        },
    }

    def build(previous: dict[str, Any] | None) -> dict[str, Any]:
        previous = previous or {}
        same = previous.get("values") == dict(operating) and isinstance(previous.get("nodes"), dict)
        nodes = dict(previous["nodes"]) if same else {}
        nodes[str(node["name"])] = entry
        return {
            "cluster": config.cluster,
            "values": dict(operating),
            "config": configured,
            "nodes": nodes,
            "serve": None,  # a node (re)started: whatever served before is gone
        }

    record = update_record(path(), config.cluster, build, WHAT, REWRITTEN_BY)
    assert record is not None  # build always gives one
    return record


def served(cluster: str, *, url: str, supervised: bool) -> None:
    """Record that serving started (kit serve, kit demo): where it answers, supervised or not."""

    def build(previous: dict[str, Any] | None) -> dict[str, Any] | None:
        if previous is None:
            return None  # nodes kit did not start here (another host's, an older kit's): nothing to add to
        fields = {k: v for k, v in previous.items() if k not in ("recorded_at", "kit_version")}
        fields["serve"] = {"url": url, "supervised": supervised, "started_at": _now()}
        return fields

    if read(cluster) is not None:  # an unreadable record is not written over here (kit up rewrites it)
        update_record(path(), cluster, build, WHAT, REWRITTEN_BY)


def forget(cluster: str) -> None:
    """`kit down`: the cluster is gone from this host, and so is its record."""
    drop_record(path(), cluster, WHAT, REWRITTEN_BY)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
