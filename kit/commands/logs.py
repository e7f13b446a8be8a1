"""`kit logs`: a node container's output, or the server's log inside it, or the supervisor's events."""

from __future__ import annotations

import time

import click

from kit.cluster import Cluster
from kit.commands._options import cluster_overrides, config_options
from kit.commands._params import Count, KitCommand
from kit.commands._signals import sigterm_as_interrupt
from kit.errors import ConfigError, NotFound
from kit.output import out, progress
from kit.plan.supervise import RunFiles, run_files
from kit.runtime.base import ContainerRuntime, NodeHandle


@click.command(name="logs", cls=KitCommand)
@click.option("--role", type=click.Choice(["head", "worker"]), default="head", show_default=True)
@click.option("--rank", type=Count(0, 16384), help="Worker rank (default: the first worker).")
@click.option("--serve", "serve_log", is_flag=True, help="Show the vLLM server's log instead of the node's.")
@click.option("--events", "events_log", is_flag=True, help="Show the supervisor's events (kit serve --supervise).")
@click.option(
    "--slot",
    type=Count(0, 999),
    default=0,
    show_default=True,
    help="With --serve/--events, router replicas sharing the node: the replica in this slot of it (0: the first).",
)
@click.option("--tail", default="200", show_default=True, help="Lines from the end, or 'all'.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines (Ctrl-C to stop).")
@config_options
def command(
    role: str,
    rank: int | None,
    serve_log: bool,
    events_log: bool,
    slot: int,
    tail: str,
    follow: bool,
    config_path: str | None,
    cluster: str | None,
    set_values: tuple[str, ...],
) -> None:
    """Show a node's logs (the Ray/entrypoint output), or with --serve the vLLM server's log (this
    run's: each start, and each restart under supervision, begins a new one), or with --events
    the supervisor's events (detected, why, restarted, ready again, given up; they live in the
    head, or with router replicas in each replica's first node: --role worker --rank K). Router
    replicas that share a node each have their own log and events: --slot K. Needs only the
    cluster's name: no kit.yaml, whatever the model (issue 25). When there is nothing to show it
    says so; no node of the cluster on this host is exit 1."""
    if tail != "all" and not (tail.isascii() and tail.isdigit() and len(tail) <= 9):
        raise ConfigError(f"{tail[:20]!r} is not a line count", key="--tail", hint="pass a number of lines, or all")
    found = Cluster.find(config_path, cluster_overrides(cluster, set_values))
    runtime = found.runtime
    nodes = [n for n in found.nodes() if n.role == role and (rank is None or n.rank == rank)]
    if not nodes:
        where = "the supervisor's events live in the head container (router replicas: in each one's first node); "
        where = where if events_log else ""
        raise NotFound(
            f"no {role} node of cluster {found.name} on this host",
            hint=f"{where}`kit status --cluster {found.name}` lists its nodes; run kit logs on the host that runs it",
        )
    node = nodes[0]
    n_tail: int | str = tail if tail == "all" else int(tail)
    with sigterm_as_interrupt():
        if events_log:
            _events(found, runtime, node, None if tail == "all" else int(tail), run_files(slot))
        elif serve_log:
            _serve_log(runtime, node, tail, run_files(slot), follow=follow)
        elif follow:
            for chunk in runtime.follow_logs(node.name, tail=n_tail):
                out(chunk, nl=False, raw=True)
        else:
            text = runtime.logs(node.name, tail=n_tail)
            out(text, nl=False, raw=True)
            if not text:
                progress(f"{node.name} has printed nothing ({node.state})")


def _events(found: Cluster, runtime: ContainerRuntime, head: NodeHandle, tail: int | None, files: RunFiles) -> None:
    """The coordinator's events, or one line saying why there are none."""
    from kit.cluster.supervision import events_text, read_state

    text = events_text(runtime, head, tail, run_dir=files.run_dir)
    if text:
        out(text, nl=False)
        return
    if read_state(runtime, head, run_dir=files.run_dir) is None:
        progress(
            f"no supervisor events: cluster {found.name} is not served under supervision in {_where(head, files)} "
            "(`kit serve --supervise` starts it; `kit logs --serve` shows the server's log)"
        )
    else:
        progress(f"no supervisor events yet in {head.name}")


def _where(node: NodeHandle, files: RunFiles) -> str:
    return node.name + (f" slot {files.slot}" if files.slot else "")


def _serve_log(runtime: ContainerRuntime, node: NodeHandle, tail: str, files: RunFiles, *, follow: bool) -> None:
    argv = ["tail", "-n", "+1" if tail == "all" else str(tail), files.serve_log]
    result = runtime.exec(node, argv, timeout=30)
    if result.returncode != 0:
        progress(f"no server log in {_where(node, files)}: `kit serve` has not run there since it started")
        return
    out(result.stdout, nl=False, raw=True)
    if follow:
        _follow_file(runtime, node, files.serve_log, result.stdout.count("\n") if tail == "all" else None)


def _follow_file(runtime: ContainerRuntime, node: NodeHandle, log: str, seen: int | None) -> None:
    """Poll the server log inside the container (works the same for every runtime), from the
    end of what was shown (a rotated log starts over). The path arrives as $1."""
    count = ["bash", "-c", 'wc -l < "$1"', "kit-logs", log]
    if seen is None:
        seen = int(runtime.exec(node, count, timeout=30).stdout.strip() or 0)
    while True:
        time.sleep(1)
        total = runtime.exec(node, count, timeout=30).stdout.strip()
        if total.isdigit() and int(total) < seen:
            seen = 0  # a new run's log
        text = runtime.exec(node, ["tail", "-n", f"+{seen + 1}", log], timeout=30).stdout
        if text:
            out(text, nl=False, raw=True)
            seen += text.count("\n")
