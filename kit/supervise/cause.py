"""The cause of a failed start, from a serve log: the first error, not the noise every rank prints
while the group shuts down after it (issue 25: the tail kit attached to a failure was mostly
"Engine core initialization failed. See root cause above" and broken connections). Standard
library only (runs in the node containers, in the supervise bundle); pure but for `Scanner`,
which reads one log file incrementally.

What counts, in the order of the log: the last line of a Python traceback (`ValueError: ...`),
an argparse refusal (`vllm serve: error: ...`), a killed or crashed process; else the first
ERROR-level line logged before the shutdown began. Lines that only echo an earlier failure (a
peer gone, a shutdown, "see root cause above") name no cause: a log with nothing else has none
(the failure is then on another node, or outside the log: a killed container).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

# vLLM's prefixes: "(EngineCore_DP0 pid=12) " from its process wrappers (or Ray's
# "(RayWorkerWrapper pid=1, ip=...) "), then "ERROR 11-26 02:21:21 [core.py:708] " from its logger.
_PROC = re.compile(r"^\((?:[\w:.-]+ )?pid=\d+(?:, ip=[\d.]+)?\)\s*")
_LEVEL = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\]\s?")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault)\b(?::|$)")
_ERROR_WORDS = re.compile(
    r"(?:: error: |\bout of memory\b|\bSegmentation fault\b|\bcore dumped\b|^Killed$|\bFatal Python error\b)",
    re.IGNORECASE,
)
# A process of the group killed by a signal (vLLM's executor says so on the node where it
# happened; measured: vLLM 0.32's CPU TP worker dies of SIGILL, exit code -4): a cause.
_KILLED = re.compile(r"died unexpectedly \(exit code: -\d+\)")
# Consequences of an earlier failure, printed by every rank as the group goes down.
NOISE = re.compile(
    r"see (?:the )?root cause above|see stack trace|initialization failed|shutting down|shut down|"
    r"RuntimeError: cancelled|Dumping (?:input data|scheduler)|"
    r"connection (?:reset|closed|refused|aborted)|broken ?pipe|\bEOFError\b|KeyboardInterrupt|SystemExit|"
    r"CancelledError|died unexpectedly|\bterminated\b|EngineDeadError|EngineCore encountered|SIGTERM|"
    r"signal 15|leaked (?:shared_memory|semaphore)|ProcessGroup.*(?:aborted|destroyed)|"
    r"peer (?:closed|gone|disconnected)|kit-supervise: generation",
    re.IGNORECASE,
)
MAX_CAUSE = 300


def message(line: str) -> str:
    """The line without vLLM's process and logger prefixes."""
    text = _PROC.sub("", line.strip())
    return _LEVEL.sub("", text).strip()


def _level(line: str) -> str | None:
    match = _LEVEL.match(_PROC.sub("", line.strip()))
    return match.group(1) if match else None


@dataclass
class Finding:
    """The best candidates seen so far, by rank: an error that is not noise, an ERROR line,
    then anything noisy."""

    error: str | None = None
    logged: str | None = None
    noise: str | None = None  # set once the shutdown cascade began: ERROR lines after it echo it

    def add(self, line: str) -> None:
        if self.error is not None:
            return  # the first real error is the cause: nothing later replaces it
        text = message(line)
        if not text:
            return
        is_error = bool(_EXCEPTION.match(text) or _ERROR_WORDS.search(text) or _KILLED.search(text))
        noisy = bool(NOISE.search(text)) and not _KILLED.search(text)
        if is_error and not noisy:
            self.error = text[:MAX_CAUSE]
        elif _level(line) in ("ERROR", "CRITICAL") and not noisy and not text.startswith(("Traceback", "File ")):
            if self.noise is None:
                self.logged = self.logged or text[:MAX_CAUSE]
        elif is_error or _level(line) in ("ERROR", "CRITICAL"):
            self.noise = self.noise or text[:MAX_CAUSE]

    @property
    def cause(self) -> str | None:
        """The error, else the first ERROR line; never noise alone (it names no cause)."""
        return self.error or self.logged


def first_error(lines: Iterable[str]) -> str | None:
    """The cause of a failure in these log lines (in order), or None when none looks like one."""
    finding = Finding()
    for line in lines:
        finding.add(line)
    return finding.cause


class Scanner:
    """The cause in one log file, read as it grows (every report reads only the new bytes; a log
    that shrank was rotated: a new run, scanned from its start)."""

    def __init__(self, path: str, max_line: int = 4096) -> None:
        self.path = path
        self.max_line = max_line
        self.offset = 0
        self.partial = b""
        self.finding = Finding()

    def reset(self) -> None:
        self.offset, self.partial, self.finding = 0, b"", Finding()

    def scan(self, max_bytes: int = 1 << 20) -> str | None:
        try:
            size = os.path.getsize(self.path)
            if size < self.offset:
                self.reset()
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read(max_bytes)
        except OSError:
            return self.finding.cause
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()[-self.max_line :]
        for raw in lines:
            self.finding.add(raw[: self.max_line].decode(errors="replace"))
        return self.finding.cause
