"""Signals for the verbs that start things: SIGTERM unwinds like Ctrl-C (issue 18), so an
interrupted `kit up`/`kit serve` leaves nothing it started and kit exits 130 with a message."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM (a scheduler, `kill`, a closing terminal's shell) raises
    KeyboardInterrupt, so the same cleanup as Ctrl-C runs and kit exits 130 with a message."""

    def _raise(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread (kit called as a library): leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
