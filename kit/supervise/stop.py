"""Stops what supervision runs in a node container, whatever state it is in: no resume on a
restart, SIGTERM to the coordinator then the agent (the agent stops its serve group first), and
what is left of the serve group after that (SIGKILL). Only processes of the bundle or named by
the serve pid file are signalled, after checking their command line (a pid file that survived a
container restart may name anything). Prints one `KIT_SUPERVISE_STOPPED {...}` line.

Runs inside a node container with its python3 (standard library only), as
`python3 -c SOURCE RUN_DIR PID_FILE` (kit/cluster/supervision.py reads this file and passes it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time


def cmd(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def pid_of(path: str, mark: bytes) -> int | None:
    try:
        with open(path) as handle:
            pid = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 1 and mark in cmd(pid) else None


def wait_gone(pids: list[int], seconds: float) -> list[int]:
    end = time.monotonic() + seconds
    while time.monotonic() < end and any(cmd(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if cmd(p)]


def main(argv: list[str]) -> int:
    run_dir, pid_file = argv[0], argv[1]
    done: dict[str, int] = {}
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(run_dir, "resume"))
    for what in ("coordinator", "agent"):
        pid = pid_of(os.path.join(run_dir, what + ".pid"), b"kit-supervise.pyz\0" + what.encode() + b"\0")
        if pid:
            os.kill(pid, signal.SIGTERM)
            done[what] = pid
            if wait_gone([pid], 25):
                os.kill(pid, signal.SIGKILL)
    serve = pid_of(pid_file, b"vllm") or pid_of(pid_file, b"serve.sh")
    if serve:
        try:
            pgid: int | None = os.getpgid(serve)
        except OSError:
            pgid = None
        if pgid and pgid > 1 and pgid not in (os.getpgid(0), os.getpgid(1)):
            for sig in (signal.SIGCONT, signal.SIGTERM):
                os.killpg(pgid, sig)
            if wait_gone([serve], 10):
                os.killpg(pgid, signal.SIGKILL)
            done["serve_group"] = pgid
        with contextlib.suppress(OSError):
            os.unlink(pid_file)
    print("KIT_SUPERVISE_STOPPED " + json.dumps(done))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
