"""`kit tune`'s run: each layout planned (kit.plan.layout, through kit.cluster), brought up on this
host, served, measured with the load `kit bench` sends, and torn down; what each layout did is
kept in a state file so a later run measures only what is left. Every wait shares the budget's
end (`deadline`, time.monotonic()), and nothing it started is left running, whatever happens."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.bench import measure, results
from kit.bench.measure import Load
from kit.bench.runner import Target
from kit.bench.target import cluster_info
from kit.bench.tune import rank, recommendation
from kit.cluster import Cluster, ServeResult
from kit.config import KitConfig
from kit.errors import ConfigError, KitError
from kit.layout import Layout
from kit.output import LiveLine

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


def layout_cluster(base: Cluster, layout: Layout) -> Cluster:
    """The cluster of one layout: its values set through the layout planner (whole nodes)."""
    source = f"kit tune --layouts {layout.name}"
    return base.with_layout(
        {key: (value, source) for key, value in layout.overrides(base.config.gpus_per_node).items()}
    )


def check_layout(base: Cluster, layout: Layout) -> None:
    """The plan checks `kit up` makes, for this layout, naming the layout in the error."""
    from kit.plan.checks import check_config

    planned = layout_cluster(base, layout)
    try:
        check_config(planned.config, {}, model=planned.model)
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


def serve_layout(cluster: Cluster, say: Callable[[str], None], deadline: float) -> ServeResult:
    """kit up (workers, then the head) and kit serve, as `kit demo` does. Every wait ends at
    `deadline`: the waits share it, each does not get the whole remainder."""
    cluster.bring_up(deadline=deadline, on_progress=lambda line: say(f"  {line}"))
    return cluster.serve(deadline=deadline)


@dataclass
class TuneRun:
    """One `kit tune` run: the cluster, the load, the budget and where its results go."""

    base: Cluster
    load: Load
    key: str | None
    ignore_eos: bool
    request_timeout: float
    deadline: float
    state: dict[str, Any]
    state_path: Path
    doc: dict[str, Any]
    say: Callable[[str], None]
    live: Callable[[], LiveLine]

    def measure_all(self, chosen: list[Layout]) -> None:
        """Every chosen layout, in order; what each did goes into the state file at once."""
        for layout in chosen:
            entry = self.state["layouts"].get(layout.name)
            if entry and entry.get("status") in ("done", "failed"):
                self.say(f"{layout.name}: {entry['status']} in an earlier run (kept; --fresh measures it again)")
                self.doc["points"].extend(entry.get("points") or ([entry["point"]] if entry.get("point") else []))
                continue
            nodes = layout.nodes(self.base.config.gpus_per_node)
            if self.deadline - time.monotonic() < MIN_LAYOUT_S:
                self.state["layouts"][layout.name] = {
                    "status": "skipped",
                    "nodes": nodes,
                    "error": "time budget used up",
                }
                self.say(f"{layout.name}: skipped (time budget used up)")
                continue
            self.say(
                f"{layout.name}: {nodes} node(s), TP={layout.tp} PP={layout.pp}"
                + (f" DP={layout.dp}" if layout.dp > 1 else "")
                + (" EP" if layout.ep else "")
            )
            record = self.measure_one(layout, nodes)
            self.say(f"  {layout.name}: torn down ({record['status']}, {record['seconds']} s)")

    def measure_one(self, layout: Layout, nodes: int) -> dict[str, Any]:
        """Bring one layout up, measure it, tear it down; its record (also in the state file)."""
        started = time.monotonic()
        record: dict[str, Any] = {"status": "failed", "nodes": nodes}
        layout_doc: dict[str, Any] | None = None
        planned = layout_cluster(self.base, layout)
        try:
            served = serve_layout(planned, self.say, self.deadline)
            record["ready_s"] = round(time.monotonic() - started, 1)
            self.say(f"  serving at {served.url} after {record['ready_s']} s; measuring")
            layout_doc = self.layout_document(planned, served.url)
            stopped = measure.run_load(
                self.target(served.url),
                self.load,
                layout_doc,
                save_to=None,
                live=self.live(),
                layout=layout.name,
                deadline=self.deadline,
            )
            # cut by the budget before a point was measured: measured again next run, like a skip
            status = "done" if not stopped else "partial" if layout_doc["points"] else "skipped"
            record.update({"status": status, "error": stopped})
        except KitError as err:
            record["error"] = err.message
            if time.monotonic() >= self.deadline - 1:  # cut short by the budget: measured again next run
                record.update({"status": "skipped", "error": f"time budget ran out ({err.message})"})
            self.say(f"  {layout.name} {record['status']}: {err.message}")
        except BaseException:
            record.update({"status": "interrupted", "error": "interrupted"})
            raise
        finally:
            if layout_doc is not None:  # whatever was measured stays, even when interrupted
                keep_points(record, layout_doc, self.doc)
            self.base.down()  # never leave a server up that kit tune started
            record["seconds"] = round(time.monotonic() - started, 1)
            self.state["layouts"][layout.name] = record
            results.save(self.state, self.state_path)
        return record

    def target(self, url: str) -> Target:
        return Target(
            base_url=url,
            model=self.base.config.served_name,
            api_key=self.key,
            ignore_eos=self.ignore_eos,
            timeout_s=self.request_timeout,
        )

    def layout_document(self, planned: Cluster, url: str) -> dict[str, Any]:
        served_name = self.base.config.served_name
        version = measure.server_version(url, self.key, timeout=min(5, self.deadline - time.monotonic()))
        return results.new_document(
            target={"url": url, "model": served_name},
            load=self.load.to_dict(),
            cluster=cluster_info(planned, url, version, served_name),
        )


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
