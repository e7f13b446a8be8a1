"""The one place kit runs subprocesses: argv lists only (never a shell), secrets redacted in logs
and errors, a missing binary is RuntimeUnavailable, every wait can be bounded.

Exception (by design): kit/verify/probe.py and kit/verify/collective.py run inside containers
with plain python and must stay stdlib-only; they start their own child processes.
tests/unit/test_runtime_protocols.py fails if any other module of kit/ starts one.
"""

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


def _redact_text(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


def run(
    argv: Sequence[str],
    *,
    secrets: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    check: bool = True,
    timeout: float | None = None,
    input_text: str | None = None,
    what: str | None = None,
    shown: Sequence[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run argv, capture text output. Raises RuntimeUnavailable when the binary is missing,
    CommandError (argv redacted) on a non-zero exit when check is true, and CommandError with
    the output so far when `timeout` passes (the child is killed).

    `env` replaces the whole environment (None: inherit). `shown` is how argv appears in logs
    and errors when it is too long to show (e.g. a script passed with -c); secrets are redacted
    from it too.
    """
    shown = redact(shown if shown is not None else argv, secrets)
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
    except subprocess.TimeoutExpired as exc:
        partial = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        raise CommandError(
            f"`{shell_words(shown)}` timed out after {timeout} s", argv=shown, stderr=_redact_text(partial, secrets)
        ) from None
    if check and result.returncode != 0:
        raise CommandError(
            f"{what or shown[0]} failed (exit {result.returncode})",
            argv=shown,
            returncode=result.returncode,
            stderr=_redact_text(result.stderr, secrets),
        )
    return result
