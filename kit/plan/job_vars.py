"""Values only a SLURM job knows (this node's IP and interface, its rank, the head's address, the
job id), planned as sentinel strings and turned into "${VAR}" expansions of the launcher, every
other byte quoted by kit.render.shell_quote. Shared by the launchers (kit.plan.slurm,
kit.plan.slurm_enroot) and the supervised scripts (kit.plan.slurm_supervise).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kit.render import Arg, EnvRef, Word, shell_quote


def job_var(name: str) -> str:
    """A value only the job knows (this node's IP, its rank, ...): planned as a sentinel that
    runtime_word turns into "${NAME}". NUL-delimited, so no configured value can contain one
    (shell_quote refuses NUL): a value is never mistaken for a sentinel."""
    return f"\x00{name}\x00"


_SENTINEL_RE = re.compile("\x00([A-Z_]+)\x00")


def sentinels(text: str) -> set[str]:
    """The job variables `text` refers to (job_var sentinels)."""
    return set(_SENTINEL_RE.findall(text))


def has_sentinel(text: str, names: Sequence[str]) -> bool:
    return bool(sentinels(text) & set(names))


def runtime_word(text: str) -> Arg:
    """`text` as one shell word: each sentinel becomes the variable the launcher sets inside the
    job ("${VAR}"), every other character stays literal."""
    parts: list[str | EnvRef] = []
    pos = 0
    for match in _SENTINEL_RE.finditer(text):
        parts += [text[pos : match.start()], EnvRef(match.group(1))]
        pos = match.end()
    if not parts:
        return text
    return Word((*parts, text[pos:]))


def argv_text(argv: Sequence[str], *, joined: int = 2) -> str:
    """One option (with its value) per line, for a readable launcher (inside a bash array); the
    first `joined` words share the first line (`docker run`, `apptainer exec`)."""
    lines: list[str] = []
    for i, arg in enumerate(argv):
        quoted = shell_quote(runtime_word(arg))
        if lines and (i < joined or lines[-1] == "-c"):
            lines[-1] += " " + quoted  # `docker run`, `apptainer exec`, `-c SCRIPT`
        else:
            lines.append(quoted)
    return "\n      ".join(lines)
