"""The one place kit runs subprocesses: argv lists only (never a shell), secrets redacted in logs."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Mapping, Sequence

from kit.errors import CommandError, RuntimeUnavailable
from kit.render import shell_words

log = logging.getLogger("kit.proc")

REDACTED = "<redacted>"


def redact(argv: Sequence[str], secrets: Sequence[str] = ()) -> list[str]:
    out = []
    for arg in argv:
        for secret in secrets:
            if secret:
                arg = arg.replace(secret, REDACTED)
        out.append(arg)
    return out


def run(
    argv: Sequence[str],
    *,
    secrets: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    check: bool = True,
    timeout: float | None = None,
    input_text: str | None = None,
    what: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run argv, capture text output. Raises RuntimeUnavailable when the binary is missing,
    CommandError (argv redacted) on a non-zero exit when check is true."""
    shown = redact(argv, secrets)
    log.debug("run: %s", shell_words(shown))
    try:
        result = subprocess.run(
            list(argv),
            env=dict(env) if env is not None else None,
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        raise RuntimeUnavailable(
            f"`{argv[0]}` is not installed or not on PATH", hint=f"install {argv[0]} or fix PATH"
        ) from None
    except subprocess.TimeoutExpired:
        raise CommandError(f"`{shell_words(shown)}` timed out after {timeout} s", argv=shown) from None
    if check and result.returncode != 0:
        stderr = result.stderr
        for secret in secrets:
            if secret:
                stderr = stderr.replace(secret, REDACTED)
        raise CommandError(
            f"{what or shown[0]} failed (exit {result.returncode})",
            argv=shown,
            returncode=result.returncode,
            stderr=stderr,
        )
    return result
