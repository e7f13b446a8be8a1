"""One error root for kit; exit codes are decided only at the CLI boundary (kit/cli.py)."""

from __future__ import annotations

import enum
from collections.abc import Sequence


class ExitCode(enum.IntEnum):
    """Documented exit codes (also printed by `kit --help`)."""

    OK = 0
    FAILURE = 1  # generic failure, or a verb that is not implemented yet
    USAGE = 2  # bad command line (click's own code)
    CONFIG = 3  # bad kit.yaml, environment, flag values or input files; impossible topology
    RUNTIME_UNAVAILABLE = 4  # Docker engine / apptainer / sbatch not reachable
    IMAGE = 5  # image missing, pull/build failed, malformed reference
    START = 6  # a node or server failed to start or timed out
    VERIFY = 7  # verification found the cluster wrong
    SERVER = 8  # the server is unreachable, answered with an error (401, 5xx, …) or stopped answering
    INTERRUPTED = 130  # Ctrl-C


class KitError(Exception):
    """Root of every error kit raises on purpose.

    `message` is one line that names what is wrong; `hint` says how to fix it.
    """

    exit_code: ExitCode = ExitCode.FAILURE

    def __init__(self, message: str, *, hint: str | None = None, details: Sequence[str] = ()):
        super().__init__(message)
        self.message = message
        self.hint = hint
        # Evidence (e.g. the last log lines of a container) shown under the message.
        self.details = list(details)

    def to_dict(self) -> dict[str, object]:
        return {
            "type": type(self).__name__,
            "message": self.message,
            "hint": self.hint,
            "details": self.details,
            "exit_code": int(self.exit_code),
        }


class UsageError(KitError):
    exit_code = ExitCode.USAGE


class ConfigError(KitError):
    """Bad configuration. `key` is the dotted config key, `source` where the value came from."""

    exit_code = ExitCode.CONFIG

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        source: str | None = None,
        hint: str | None = None,
    ):
        # "flag --set model.tp" already names the key: said once, not "flag --set model.tp: model.tp"
        named = bool(source and key and source.endswith(f" {key}"))
        where = ": ".join(p for p in (source, None if named else key) if p)
        super().__init__(f"{where}: {message}" if where else message, hint=hint)
        self.key = key
        self.source = source


class ImageRefError(ConfigError):
    """A malformed image reference in the configuration."""

    exit_code = ExitCode.IMAGE


class RuntimeUnavailable(KitError):
    exit_code = ExitCode.RUNTIME_UNAVAILABLE


class ImageError(KitError):
    exit_code = ExitCode.IMAGE


class StartError(KitError):
    """A node or server did not come up; `details` carries the last log lines."""

    exit_code = ExitCode.START


class NotFound(KitError):
    """Nothing to act on: no node of the cluster on this host (`kit logs`), no such job. Exit 1:
    nothing failed to start (issue 25: `kit logs --events` with no head was exit 6)."""

    exit_code = ExitCode.FAILURE


class VerifyFailed(KitError):
    exit_code = ExitCode.VERIFY


class ServerError(KitError):
    exit_code = ExitCode.SERVER


class OutputLost(KitError):
    """Standard output is closed or broken (`>&-`, a full disk, a pipe whose reader left): what
    kit printed did not arrive, so the command failed."""

    exit_code = ExitCode.FAILURE


class CommandError(KitError):
    """A command kit ran (kit.proc) failed or timed out. argv is already redacted."""

    exit_code = ExitCode.FAILURE

    def __init__(
        self,
        message: str,
        *,
        argv: Sequence[str] = (),
        returncode: int | None = None,
        stderr: str = "",
        hint: str | None = None,
    ):
        tail = [ln for ln in stderr.strip().splitlines()[-10:] if ln.strip()]
        super().__init__(message, hint=hint, details=tail)
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
