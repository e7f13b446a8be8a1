"""kit's small on-disk state: where it lives and the one record-file store.

The state folder is $KIT_STATE_DIR, else $XDG_STATE_HOME/kit, else ~/.local/state/kit. Record
files (images.json: kit/images/records.py; models.json: kit/models/records.py; clusters.json:
kit/cluster/record.py) map a key to a JSON record. The folder may be shared by nodes and users
(issue 27): a record is added or dropped under the file's lock with the file read again
(kit/safe/files.py), so `kit pull`/`kit fetch` on several nodes at once keep every node's entry;
the file is replaced by one atomic rename that no planted link redirects, and read through the
bounded loader (a FIFO or a deeply nested file is one error line, not a hang or a traceback).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kit import __version__, safeload
from kit.errors import ConfigError, KitError
from kit.safe import files as safefile
from kit.safe import text as safetext

MAX_RECORD_BYTES = 16 * 1024 * 1024  # thousands of records are a few hundred kB


def state_dir() -> Path:
    explicit = os.environ.get("KIT_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "kit"


def read_records(path: Path, what: str, rewritten_by: str) -> dict[str, Any]:
    """One of kit's record files ({} when there is none yet); `what` names it in errors."""
    if not os.path.lexists(path):
        return {}
    try:
        data = safeload.load_json_file(path, max_bytes=MAX_RECORD_BYTES, what=f"kit's {what} record")
    except ConfigError as err:
        raise KitError(err.message, hint=f"delete the file ({rewritten_by} rewrites it) or set KIT_STATE_DIR") from None
    return data if isinstance(data, dict) else {}


def write_record(path: Path, key: str, fields: dict[str, Any], what: str, rewritten_by: str) -> dict[str, Any]:
    """Add (or replace) `key` in a record file: under its lock, the file read again, then
    replaced atomically; the record written, stamped with the time and kit's version."""
    record = update_record(path, key, lambda _: fields, what, rewritten_by)
    assert record is not None  # fields were given: a record was written
    return record


def update_record(
    path: Path,
    key: str,
    build: Callable[[dict[str, Any] | None], dict[str, Any] | None],
    what: str,
    rewritten_by: str,
) -> dict[str, Any] | None:
    """Replace `key` with `build(its record now)` (None: its record stays as it is), the record
    read under the file's lock so that two writers on nodes sharing the folder never lose each
    other's part (issue 25: each node of a cluster adds itself). Returns the record written."""
    written: dict[str, Any] = {}

    def change(data: dict[str, Any]) -> None:
        previous = data.get(key)
        fields = build(previous if isinstance(previous, dict) else None)
        if fields is None:
            return
        record = {
            **fields,
            "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "kit_version": __version__,
        }
        data[key] = safetext.strict(record)  # strict JSON, and no secret ever lands in a record
        written.update(record)

    _update(path, change, what, rewritten_by)
    return written or None


def drop_record(path: Path, key: str, what: str, rewritten_by: str) -> None:
    """Remove `key` from a record file (nothing to do when it is not there)."""

    def drop(data: dict[str, Any]) -> None:
        data.pop(key, None)

    if key in read_records(path, what, rewritten_by):
        _update(path, drop, what, rewritten_by)


def _update(path: Path, change: Callable[[dict[str, Any]], None], what: str, rewritten_by: str) -> None:
    try:
        safefile.update_json(path, change, read=lambda p: read_records(p, what, rewritten_by))
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise KitError(
            f"cannot write kit's {what} record {path}: {why}",
            hint="set KIT_STATE_DIR to a writable folder",
        ) from None
