"""Processes inside a node container: the serve script in its own process group, a scan of /proc
for vLLM's engine processes, and stopping a whole group. Standard library only (runs inside the
node container, in the supervise bundle).

Why a process group: `vllm serve` starts its engine core and worker processes with
multiprocessing; measured on vLLM 0.32's CPU build (TP=2 over two nodes) every one of them
stays in the process group of the `vllm serve` process (`VLLM::EngineCore`, `VLLM::Worker_TP0`
on the head, `VLLM::Worker_TP1` on the worker, and multiprocessing's resource tracker), also
after a parent dies. Started with a new session, the serve script's pid is the group id, so one
killpg reaches every process it made, a stopped (SIGSTOP) one included.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

# vLLM titles its processes `VLLM::EngineCore[_DP<rank>]`, `VLLM::Worker_TP<k>[_PP<j>]`, ...
# (setproctitle; seen in /proc/PID/cmdline); with the Ray backend engines are Ray actors titled
# `ray::EngineCoreActor...` / `ray::DPMoEEngineCoreActor...`.
ENGINE_PREFIXES = ("VLLM::", "ray::EngineCoreActor", "ray::DPMoEEngineCoreActor")


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    state: str  # R, S, D, T (stopped), t, Z, X
    title: str  # argv[0] (a process title for vLLM's engines), else the executable's name

    def to_dict(self) -> dict[str, object]:
        return {"pid": self.pid, "pgid": self.pgid, "state": self.state, "title": self.title}


def read_proc(pid: int, root: str = "/proc") -> ProcInfo | None:
    """One process from /proc (None when it is gone or unreadable)."""
    try:
        stat = Path(root, str(pid), "stat").read_text()
        cmdline = Path(root, str(pid), "cmdline").read_bytes()
    except OSError:
        return None
    # stat: "pid (comm) state ppid pgrp ...": comm may hold spaces and ')', so split at the last ')'.
    comm = stat[stat.find("(") + 1 : stat.rfind(")")]
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 3:
        return None
    args = [a for a in cmdline.split(b"\0") if a]
    title = args[0].decode(errors="replace").strip() if args else comm
    return ProcInfo(pid=pid, ppid=int(fields[1]), pgid=int(fields[2]), state=fields[0], title=title)


def all_procs(root: str = "/proc") -> list[ProcInfo]:
    out = []
    for entry in os.listdir(root):
        if entry.isdigit():
            info = read_proc(int(entry), root)
            if info is not None:
                out.append(info)
    return sorted(out, key=lambda p: p.pid)


def engines(procs: Sequence[ProcInfo]) -> list[ProcInfo]:
    """vLLM's engine and worker processes among procs (zombies left out: they are gone)."""
    return [p for p in procs if p.title.startswith(ENGINE_PREFIXES) and p.state not in ("Z", "X")]


def in_group(procs: Sequence[ProcInfo], pgid: int) -> list[ProcInfo]:
    return [p for p in procs if p.pgid == pgid and p.state not in ("Z", "X")]


@dataclass
class ServeGroup:
    """The node's serve script, run as `bash SCRIPT` in a new session (its own process group),
    output appended to `log`. One group at a time; `generation` is the coordinator's number for it."""

    script: str
    log: str
    env: Mapping[str, str] | None = None
    proc_root: str = "/proc"
    process: subprocess.Popen[bytes] | None = None
    generation: int = 0
    exit_code: int | None = None
    started_at: float | None = None
    stop_deadline: float | None = None
    killed: list[int] = field(default_factory=list)
    closed: bool = False  # the end of this generation is written in the log

    def start(self, generation: int) -> int:
        if self.running() or self.members():
            raise RuntimeError("the serve group is still running")
        Path(self.log).parent.mkdir(parents=True, exist_ok=True)
        # Each generation's log is its own (issue 25: a failure's tail showed the previous run's
        # lines): the previous one is kept beside it, one deep.
        with contextlib.suppress(FileNotFoundError):
            os.replace(self.log, previous_log(self.log))
        with open(self.log, "ab") as out:
            _mark(out, f"kit-supervise: generation {generation}: starting {self.script}")
            self.process = subprocess.Popen(
                ["bash", self.script],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own session and process group: killpg reaches all of it
                env=None if self.env is None else dict(self.env),
                close_fds=True,
            )
        self.generation, self.exit_code, self.started_at = generation, None, time.time()
        self.stop_deadline, self.killed, self.closed = None, [], False
        return self.process.pid

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def running(self) -> bool:
        """The serve script's own process is alive (reaped here once it exits)."""
        if self.process is None:
            return False
        code = self.process.poll()
        if code is not None and self.exit_code is None:
            self.exit_code = code
        return code is None

    def members(self) -> list[ProcInfo]:
        """Processes still in the group (the serve process may be gone while its engines live on)."""
        if self.process is None:
            return []
        return in_group(all_procs(self.proc_root), self.process.pid)

    def begin_stop(self, grace_s: float = 10.0) -> None:
        """SIGCONT then SIGTERM to the whole group (a stopped process must run to handle SIGTERM);
        `poll_stop` sends SIGKILL to what is left once grace_s has passed."""
        if self.process is None or self.stop_deadline is not None:
            return
        for sig in (signal.SIGCONT, signal.SIGTERM):
            _killpg(self.process.pid, sig)
        self.stop_deadline = time.monotonic() + grace_s

    def poll_stop(self) -> bool:
        """True once no process of the group is left (SIGKILL past the deadline)."""
        if self.process is None:
            return True
        self.running()  # reap the leader
        left = self.members()
        if not left:
            self._stopped()
            return True
        if self.stop_deadline is not None and time.monotonic() >= self.stop_deadline:
            self.killed = [p.pid for p in left]
            _killpg(self.process.pid, signal.SIGKILL)
        return False

    def stop(self, grace_s: float = 10.0, *, sleep: Callable[[float], None] = time.sleep) -> list[int]:
        """Stop the whole group and wait for it (at most grace_s, then SIGKILL and a few seconds
        more); the pids that needed SIGKILL."""
        self.begin_stop(grace_s)
        end = time.monotonic() + grace_s + 10
        while not self.poll_stop() and time.monotonic() < end:
            sleep(0.1)
        return list(self.killed)

    def _stopped(self) -> None:
        """Write the end of this generation into the log, once."""
        if self.process is None or self.closed:
            return
        self.closed = True
        if self.exit_code is None:
            self.exit_code = self.process.poll()
        what = "stopped" if self.stop_deadline is not None else f"exited (code {self.exit_code})"
        killed = f", {len(self.killed)} process(es) killed" if self.killed else ""
        with open(self.log, "ab") as out:
            _mark(out, f"kit-supervise: generation {self.generation}: {what}{killed}")


def previous_log(log: str) -> str:
    """Where the previous generation's serve log is kept: /tmp/kit/serve.log -> serve.prev.log."""
    path = Path(log)
    return str(path.with_name(f"{path.stem}.prev{path.suffix}"))


def _killpg(pgid: int, sig: signal.Signals) -> None:
    if pgid <= 1:  # never the container's init group, never "every process"
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _mark(out: IO[bytes], text: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out.write(f"{stamp} {text}\n".encode())
    out.flush()


# uvicorn's access-log lines of the coordinator's own /health and /metrics polls (every second):
# no evidence, so left out of the tail an event carries. (They can be left out of the
# log itself: model.extra_args [--disable-access-log-for-endpoints, "/health,/metrics"], which vLLM
# 0.32 has; older releases may not.)
POLL_NOISE = re.compile(r'"GET /(?:health|metrics) HTTP/[0-9.]+" 200')


def tail(
    path: str, lines: int = 20, max_bytes: int = 256 * 1024, skip: re.Pattern[str] | None = POLL_NOISE
) -> list[str]:
    """The last lines of a log file (at most max_bytes read), blank lines and `skip` lines left out."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    kept = [ln.rstrip() for ln in text.splitlines() if ln.strip() and not (skip and skip.search(ln))]
    return [ln[:400] for ln in kept[-lines:]]
