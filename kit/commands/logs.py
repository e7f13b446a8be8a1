"""`kit logs`: a node container's output, or the server's log inside it."""

from __future__ import annotations

import time

import click

from kit.cluster.resolve import resolve
from kit.commands._options import cluster_overrides, config_options
from kit.commands._params import Count, KitCommand
from kit.errors import ConfigError, StartError
from kit.output import out
from kit.plan.scripts import SERVE_LOG
from kit.runtime import get_runtime
from kit.runtime.base import ContainerRuntime, NodeHandle


@click.command(name="logs", cls=KitCommand)
@click.option("--role", type=click.Choice(["head", "worker"]), default="head", show_default=True)
@click.option("--rank", type=Count(0, 16384), help="Worker rank (default: the first worker).")
@click.option("--serve", "serve_log", is_flag=True, help="Show the vLLM server's log instead of the node's.")
@click.option("--events", "events_log", is_flag=True, help="Show the supervisor's events (kit serve --supervise).")
@click.option("--tail", default="200", show_default=True, help="Lines from the end, or 'all'.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines (Ctrl-C to stop).")
@config_options
def command(
    role: str,
    rank: int | None,
    serve_log: bool,
    events_log: bool,
    tail: str,
    follow: bool,
    config_path: str | None,
    cluster: str | None,
    set_values: tuple[str, ...],
) -> None:
    """Show a node's logs (the Ray/entrypoint output), or with --serve the vLLM server's log, or
    with --events the supervisor's events (detected, why, restarted, ready again, given up)."""
    if tail != "all" and not (tail.isascii() and tail.isdigit() and len(tail) <= 9):
        raise ConfigError(f"{tail[:20]!r} is not a line count", key="--tail", hint="pass a number of lines, or all")
    resolved = resolve(config_path, cluster_overrides(cluster, set_values))
    runtime = get_runtime(resolved.config)
    nodes = [
        n for n in runtime.find_nodes(resolved.config.cluster) if n.role == role and (rank is None or n.rank == rank)
    ]
    if not nodes:
        raise StartError(
            f"no {role} node of cluster {resolved.config.cluster} on this host",
            hint="check `kit status`, or pass --cluster/--role/--rank",
        )
    node = nodes[0]
    n_tail: int | str = tail if tail == "all" else int(tail)
    if events_log:  # issue 18: the head's events.jsonl, one line per event
        from kit.cluster.supervision import events_text

        out(events_text(runtime, node, None if tail == "all" else int(tail)), nl=False)
        return
    if serve_log:
        argv = ["tail", "-n", "+1" if tail == "all" else str(tail), SERVE_LOG]
        if follow:
            _follow_file(runtime, node)
            return
        result = runtime.exec(node, argv)
        out(result.stdout, nl=False, raw=True)
        return
    if follow:
        for chunk in runtime.follow_logs(node.name, tail=n_tail):
            out(chunk, nl=False, raw=True)
        return
    out(runtime.logs(node.name, tail=n_tail), nl=False, raw=True)


def _follow_file(runtime: ContainerRuntime, node: NodeHandle) -> None:
    """Poll the server log inside the container (works the same for every runtime)."""
    seen = 0
    while True:
        text = runtime.exec(node, ["tail", "-n", f"+{seen + 1}", SERVE_LOG]).stdout
        if text:
            out(text, nl=False, raw=True)
            seen += text.count("\n")
        time.sleep(1)
