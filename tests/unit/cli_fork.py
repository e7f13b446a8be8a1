"""Run kit's real CLI in a process of its own without paying its imports each time.

The bad-input corpus runs `python -m kit` ~200 times; most of each run was the interpreter and
kit's imports (~0.3 s of CPU a row on the CI machine). Here a multiprocessing forkserver imports kit
once; each run is a fresh process forked from it, with its own environment, working folder, stdin
(/dev/null), stdout and stderr (files), running kit/__main__.py as `python -m kit` does, and its
exit status as the process's. What is shared is only what `import kit.cli` and the verbs' modules
did (kit reads no environment at import: tests/unit/test_bad_input_corpus.py relies on that).
"""

from __future__ import annotations

import multiprocessing
import os
import pkgutil
import runpy
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import kit.commands

VERBS = [f"kit.commands.{m.name}" for m in pkgutil.iter_modules(kit.commands.__path__)]
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["kit.cli", *VERBS, __name__])
# One run at a time: multiprocessing's Process is not safe across threads (start() reaps every
# finished child, reading another thread's exit status first; that thread then sees 255).
_ONE_AT_A_TIME = threading.Lock()


def _child(argv: Sequence[str], env: Mapping[str, str], cwd: str, out: str, err: str) -> None:
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, out, os.O_WRONLY), (2, err, os.O_WRONLY)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.argv = ["kit", *argv]
    runpy.run_module("kit", run_name="__main__", alter_sys=True)


def run_kit(argv: Sequence[str], env: Mapping[str, str], cwd: Path, timeout: float) -> tuple[int | None, str, str]:
    """(exit code, or None if killed at the timeout; stdout; stderr) of `kit ARGV`."""
    out, err = cwd.parent / "stdout.txt", cwd.parent / "stderr.txt"
    out.touch()
    err.touch()
    proc = _CONTEXT.Process(target=_child, args=(list(argv), dict(env), str(cwd), str(out), str(err)))
    with _ONE_AT_A_TIME:
        proc.start()
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            rc = None
        else:
            rc = proc.exitcode
    text = out.read_bytes().decode(errors="replace"), err.read_bytes().decode(errors="replace")
    out.unlink()
    err.unlink()
    return rc, *text
