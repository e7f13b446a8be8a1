"""The `kit` command line: click only. Parse, dispatch to kit.commands.<verb>, map errors to exit codes.

Verb modules are imported lazily so `kit --help` stays fast (no docker-py, spython or requests).
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import warnings
from typing import Any

import click

from kit import __version__
from kit.errors import ExitCode, KitError, OutputLost, UsageError
from kit.safe import text as safetext

# verb -> (module under kit.commands, one-line help). Order is the order in --help.
VERBS: dict[str, tuple[str, str]] = {
    "plan": ("plan", "Size a model: GPUs, nodes, TP/PP and KV-cache room."),
    "pull": ("pull", "Pull a vLLM image (Docker image or Apptainer SIF) and record its digest."),
    "fetch": ("fetch", "Download a model once into the shared HF cache and check it is complete."),
    "build": ("build", "Build kit's images from containers/ (GPU or CPU engine)."),
    "up": ("up", "Start this node's container: Ray head/worker or an mp-backend node."),
    "serve": ("serve", "Start `vllm serve` on the cluster and wait until it is healthy."),
    "status": ("status", "Show the cluster's containers and the Ray view of its nodes."),
    "metrics": ("metrics", "Per-engine load and tokens/s from vLLM's /metrics; a Prometheus scrape config."),
    "logs": ("logs", "Show (or follow) a node container's logs."),
    "query": ("query", "Send OpenAI-style requests to the server: models and a chat."),
    "bench": ("bench", "Benchmark the server: TTFT, TPOT, ITL, latency percentiles, throughput; compare, plot."),
    "tune": ("tune", "Try each TP/PP layout on this host, benchmark it, and recommend the fastest."),
    "verify": ("verify", "Prove the cluster is right: GPUs, versions, NCCL transport, bandwidth."),
    "diagnose": ("diagnose", "Classify known failure lines and NCCL transports in log files."),
    "down": ("down", "Remove every container and network of the cluster."),
    "slurm": ("slurm", "Write (and optionally submit) an sbatch launcher from the same plan."),
    "demo": ("demo", "Run the local demo: a 2-node CPU cluster serving a tiny model."),
    "config": ("config", "Show the resolved configuration and where each value came from."),
}

EXIT_CODES_HELP = "\b\nExit codes:\n" + "\n".join(
    f"  {int(code):>3}  {code.name.lower().replace('_', ' ')}" for code in ExitCode
)


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(VERBS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in VERBS:
            return None
        module = importlib.import_module(f"kit.commands.{VERBS[cmd_name][0]}")
        command: click.Command = module.command
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name not in VERBS and not name.startswith("-"):
            close = difflib.get_close_matches(name, list(VERBS), n=1, cutoff=0.6)
            shown = name if name.isprintable() and len(name) <= 40 else repr(name[:40])
            raise UsageError(
                f"No such command '{shown}'",
                hint=f"did you mean `kit {close[0]}`?" if close else "see `kit --help` for the verbs",
            )
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Use the static table so --help imports no verb module.
        with formatter.section("Commands"):
            formatter.write_dl([(name, text) for name, (_, text) in VERBS.items()])


@click.group(cls=LazyGroup, epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kit")
def cli() -> None:
    """kit: multi-node vLLM serving made boring.

    \b
    Typical cluster bring-up (one command per node):
      kit pull                                  # image + digest, on every node
      kit up --head                             # on the head node
      kit up --worker --head-address HEAD_IP    # on every other node
      kit serve && kit query                    # on the head
      kit verify                                # prove GPUs, versions, NCCL transport
    Configuration: ./kit.yaml (or --config / KIT_CONFIG); see `kit config show`.
    """


def _wants_json(argv: list[str]) -> bool:
    return "--json" in argv


def _show_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """Library warnings (a secret file others can read) as one `kit: warning:` line."""
    click.echo(f"kit: warning: {safetext.clean(str(message), newlines=False)}", err=True)


def _flush_stdout() -> None:
    """What kit printed must have arrived: a closed, full or broken stdout is an error (exit 1)."""
    if sys.stdout is None:
        return
    try:
        sys.stdout.flush()
    except (OSError, ValueError) as exc:
        from kit.output import output_lost

        raise output_lost(exc) from None


def _lost(exc: OSError) -> OutputLost | None:
    """OutputLost when `exc` came from a write to standard output (click's echo, which is how
    kit and click print, without err=True), else None."""
    from kit.output import output_lost

    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame if tb is not None else None
    if frame is not None and frame.f_code.co_name == "echo" and frame.f_locals.get("err") is False:
        return output_lost(exc)
    return None


def _drop_stdout() -> None:
    """After a failed write to stdout, point it at /dev/null so the interpreter's own flush at
    exit does not print a second error."""
    real = sys.__stdout__
    if real is None or sys.stdout is not real:
        return
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, real.fileno())
        os.close(fd)
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    from kit.safeload import LooseSecretFile

    warnings.simplefilter("always", LooseSecretFile)
    previous, warnings.showwarning = warnings.showwarning, _show_warning
    try:
        _run(args)
    finally:
        warnings.showwarning = previous


def _run(args: list[str]) -> None:
    try:
        if sys.stdout is None:  # `kit ... >&-`: refused before anything is done, not after
            raise OutputLost("standard output is closed: kit's output would be lost", hint="run it without >&-")
        cli.main(args=args, prog_name="kit", standalone_mode=False)
        _flush_stdout()
    except OutputLost as err:
        _drop_stdout()
        _report(err, as_json=False)
        sys.exit(int(err.exit_code))
    except OSError as exc:  # a write click made itself (--help) to a broken stdout
        lost = _lost(exc)
        if lost is None:
            raise
        _drop_stdout()
        _report(lost, as_json=False)
        sys.exit(int(lost.exit_code))
    except KitError as err:
        _report(err, as_json=_wants_json(args))
        sys.exit(int(err.exit_code))
    except click.exceptions.Abort:
        click.echo("kit: interrupted", err=True)
        sys.exit(int(ExitCode.INTERRUPTED))
    except KeyboardInterrupt:
        click.echo("kit: interrupted", err=True)
        sys.exit(int(ExitCode.INTERRUPTED))
    except click.exceptions.Exit as exc:  # --help, --version
        try:
            _flush_stdout()
        except OutputLost as err:
            _drop_stdout()
            _report(err, as_json=False)
            sys.exit(int(err.exit_code))
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        # One line like kit's own errors (click would print usage lines around it), or one
        # JSON document with --json.
        ctx = getattr(exc, "ctx", None)
        usage = UsageError(exc.format_message(), hint=f"see `{ctx.command_path if ctx else 'kit'} --help`")
        if not isinstance(exc, click.UsageError):
            usage.exit_code = ExitCode.FAILURE
        _report(usage, as_json=_wants_json(args))
        sys.exit(int(usage.exit_code))
    sys.exit(0)


def _report(err: KitError, *, as_json: bool) -> None:
    """The error as one line on stderr (its details under it), or one JSON document on stdout;
    redacted and terminal-safe either way (a message may quote what a server sent)."""
    if as_json:
        payload: dict[str, Any] = {"ok": False, "error": err.to_dict()}
        try:
            click.echo(safetext.to_json(payload))
            _flush_stdout()
            return
        except (OSError, ValueError, OutputLost):
            _drop_stdout()  # the JSON could not be written: say it on stderr instead
    line = f"kit: error: {safetext.clean(err.message, newlines=False)}"
    if err.hint:
        line += f" (fix: {safetext.clean(err.hint, newlines=False)})"
    click.echo(line, err=True)
    for detail in err.details:
        click.echo(f"  | {safetext.clean(detail, newlines=False)}", err=True)
