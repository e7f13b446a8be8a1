"""`kit metrics`: per engine (DP rank) load and throughput from vLLM's /metrics, or a Prometheus
scrape configuration (file_sd) for the cluster. The logic is in kit/health/prometheus.py and kit/health/observe.py;
this verb only finds the head and prints."""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from kit import validate
from kit.cluster import Cluster
from kit.commands._options import cluster_overrides, config_options, json_option
from kit.commands._params import KitCommand, Number
from kit.config import KitConfig
from kit.errors import ConfigError, KitError
from kit.health import observe
from kit.health import prometheus as metrics
from kit.health.liveness import plan_engines
from kit.output import emit, out, table, warn
from kit.plan.replicas import router_mode
from kit.runtime.base import NodeHandle
from kit.safe import files as safefile


def _finite_interval(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not math.isfinite(value) or not 0.1 <= value <= 600:
        raise click.BadParameter("must be a number of seconds from 0.1 to 600", ctx=ctx, param=param)
    return value


@click.command(name="metrics", cls=KitCommand)
@click.option("--url", help="Server URL (default: the head of the cluster, port ports.api).")
@click.option(
    "--interval",
    type=float,
    default=2.0,
    show_default=True,
    callback=_finite_interval,
    help="Seconds between the two scrapes the rates come from.",
)
@click.option(
    "--timeout",
    type=Number(0, 600, above=True),
    default=10.0,
    show_default=True,
    help="Seconds each request to the server may take (kit ends within this plus a few seconds).",
)
@click.option(
    "--prometheus",
    "prometheus_file",
    metavar="FILE",
    help="Write a Prometheus file_sd target list for the cluster's /metrics endpoints to FILE ('-': print it).",
)
@config_options
@json_option
def command(
    url: str | None,
    interval: float,
    timeout: float,
    prometheus_file: str | None,
    config_path: str | None,
    cluster: str | None,
    set_values: tuple[str, ...],
    as_json: bool,
) -> None:
    """Per engine (DP rank): requests running and waiting, KV-cache use, prompt and generation
    tokens/s, finished requests/s and mean TTFT/ITL, from two scrapes of the head's /metrics
    --interval apart (the head's API server reports every engine, those of headless nodes too).
    Engines the plan expects but /metrics lacks are listed as missing.

    With --prometheus FILE: the scrape targets (the head's API server; with the Ray backend also
    each Ray node's exporter, on ports.ray_metrics_export) as a file_sd JSON list labelled
    cluster/node/role/rank/component. Headless mp nodes serve no metrics of their own.

    \b
    Examples:
      kit metrics
      kit metrics --interval 10 --json
      kit metrics --prometheus /etc/prometheus/kit/$(hostname).json
    """
    if url is not None:
        _check_url(url)
    if prometheus_file not in (None, "-"):
        _writable(prometheus_file)  # before anything is asked of the runtime (issue 16)
    served = Cluster.find(config_path, cluster_overrides(cluster, set_values))
    running = served.running()  # no runtime here (a laptop): none, and the record or the config says
    config = served.operated(running).config  # its ports, backend and layout as it runs (issue 25)
    warn([d.line(served.name) for d in served.drift(running)], as_json=as_json)
    nodes = list(running.nodes)
    if prometheus_file is not None:
        _write_targets(config, nodes, prometheus_file, as_json=as_json)
        return
    base = (url or served.url(nodes)).rstrip("/")
    if url is None and router_mode(config):  # issue 29: each replica's own /metrics
        result = top_replicas(base, config, nodes, interval, deadline_s=timeout)
    else:
        result = top(base, config, interval, deadline_s=timeout)
    emit(result, as_json=as_json)


@dataclass(frozen=True)
class Rates:
    """`kit metrics`: each engine's rates between two scrapes of `url`, and the engines of the
    plan /metrics did not show."""

    url: str
    interval_s: float
    health: str
    engines: list[dict[str, Any]]  # a row per engine: its rates, engine, node_rank
    missing: list[dict[str, Any]]  # engine, node_rank
    command = "metrics"

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "interval_s": self.interval_s,
            "health": self.health,
            "engines": self.engines,
            "missing": self.missing,
        }

    def text(self) -> str:
        return render(self)


@dataclass(frozen=True)
class ScrapeTargets:
    """`kit metrics --prometheus FILE`: the file_sd file written and its target groups."""

    file: str
    targets: list[dict[str, Any]]
    command = "metrics"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "targets": self.targets}

    def text(self) -> str:
        return (
            f"wrote {len(self.targets)} scrape target(s) to {self.file}; in prometheus.yml: "
            f"scrape_configs: [{{job_name: kit, file_sd_configs: [{{files: [{self.file}]}}]}}]"
        )


def top_replicas(
    endpoint: str, config: KitConfig, nodes: list[NodeHandle], interval: float, *, deadline_s: float = 10.0
) -> Rates:
    """Router replicas (model.dp_lb router): every replica on this host is a server of its own
    with one engine; two scrapes of each, a row per replica (its engine named replica-K)."""
    from kit.cluster.replicas import local_replicas

    found = local_replicas(config, nodes)
    t0 = time.monotonic()
    first = {}
    for local in found:
        with contextlib.suppress(KitError):  # a replica that does not answer: missing below
            first[local.replica.index] = observe.scrape(local.url, deadline_s=deadline_s)
    time.sleep(interval)
    t1 = time.monotonic()
    rows, missing = [], []
    for local in found:
        try:
            if local.replica.index not in first:
                raise KitError("no first scrape")
            second = observe.scrape(local.url, deadline_s=deadline_s)
        except KitError:
            missing.append({"engine": local.replica.name, "node_rank": local.replica.head})
            continue
        for rates in metrics.rates(t0, first[local.replica.index], t1, second).values():
            rows.append({**rates.to_dict(), "engine": local.replica.name, "node_rank": local.replica.head})
    return Rates(
        url=endpoint,
        interval_s=round(t1 - t0, 3),
        health=observe.health_error(found[0].url, deadline_s=deadline_s) or "ok"
        if found
        else "no replica on this host",
        engines=rows,
        missing=missing,
    )


def _writable(path: str) -> None:
    try:
        validate.writable_file(path)
    except validate.Invalid as exc:
        raise ConfigError(exc.message, key="--prometheus", hint=exc.hint) from None


def top(base: str, config: KitConfig, interval: float, *, deadline_s: float = 10.0) -> Rates:
    """Two scrapes `interval` apart and the per-engine rates between them, with each engine's
    node rank from the plan; each request bounded by deadline_s."""
    t0, first = time.monotonic(), observe.scrape(base, deadline_s=deadline_s)
    time.sleep(interval)
    t1, second = time.monotonic(), observe.scrape(base, deadline_s=deadline_s)
    planned = plan_engines(config.dp, config.dp_local, config.backend)
    rows = []
    for engine, rates in metrics.rates(t0, first, t1, second).items():
        rows.append({**rates.to_dict(), "node_rank": planned.get(engine)})
    seen = {row["engine"] for row in rows}
    return Rates(
        url=base,
        interval_s=round(t1 - t0, 3),
        health=observe.health_error(base, deadline_s=deadline_s) or "ok",
        engines=rows,
        missing=[{"engine": e, "node_rank": rank} for e, rank in planned.items() if e not in seen],
    )


def render(result: Rates) -> str:
    lines = [f"{result.url}: /health {result.health}; rates over {result.interval_s:.1f} s"]
    lines.append(
        table(
            ["engine", "node", "running", "waiting", "KV cache", "prompt tok/s", "gen tok/s", "req/s", "TTFT", "ITL"],
            [
                (
                    r["engine"],
                    "-" if r["node_rank"] is None else r["node_rank"],
                    _num(r["running"], "{:g}"),
                    _num(r["waiting"], "{:g}"),
                    _num(None if r["kv_cache_usage"] is None else 100 * r["kv_cache_usage"], "{:.1f}%"),
                    _num(r["prompt_tokens_per_s"], "{:.1f}"),
                    _num(r["generation_tokens_per_s"], "{:.1f}"),
                    _num(r["requests_per_s"], "{:.2f}"),
                    _num(r["mean_ttft_s"], "{:.3f}s"),
                    _num(r["mean_itl_s"], "{:.4f}s"),
                )
                for r in result.engines
            ],
        )
    )
    if any(r["reset"] for r in result.engines):
        lines.append("a counter went back to zero: that engine restarted between the scrapes")
    for gone in result.missing:
        where = "" if gone["node_rank"] is None else f" (node rank {gone['node_rank']})"
        lines.append(f"missing: engine {gone['engine']}{where} is in the plan but not in /metrics")
    return "\n".join(lines)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _head_ip(config: KitConfig, nodes: list[NodeHandle]) -> str | None:
    head = next((n for n in nodes if n.role == "head" and n.ip), None)
    return head.ip if head is not None else config.head_address


def _check_url(url: str) -> None:
    scheme, sep, rest = url.partition("://")
    if (
        scheme not in ("http", "https")
        or not sep
        or not rest.strip("/")
        or any(c.isspace() or ord(c) < 32 for c in url)
    ):
        raise ConfigError(f"{url!r} is not an http(s) URL", source="flag --url", hint="e.g. http://10.0.0.1:8000")


def _write_targets(config: KitConfig, nodes: list[NodeHandle], path: str, *, as_json: bool) -> None:
    head_ip = _head_ip(config, nodes)
    if head_ip is None:
        raise ConfigError(
            "the head's address is unknown", key="head_address", hint="run on the head's host, or set head_address"
        )
    groups = metrics.scrape_targets(
        cluster=config.cluster,
        backend=config.backend,
        api_port=config.ports.api,
        ray_metrics_port=config.ports.ray_metrics_export,
        head_ip=head_ip,
        nodes=[metrics.NodeAddress(n.role, n.rank, n.ip) for n in nodes if n.ip],
    )
    text = json.dumps(groups, indent=2) + "\n"
    if path == "-":
        out(text, nl=False, raw=True)
        return
    _write_atomically(Path(path), text)
    emit(ScrapeTargets(path, groups), as_json=as_json)


def _write_atomically(path: Path, text: str) -> None:
    """The whole file or nothing (kit.safe.files): Prometheus re-reads file_sd files when they change."""
    try:
        safefile.write_atomic(path, text, mode=0o644)
    except OSError as exc:
        raise ConfigError(
            f"cannot write {path}: {exc.strerror}", source="flag --prometheus", hint="pass a writable file path"
        ) from None
