"""kit's small on-disk state: where it lives and the one record-file store.

The state folder is $KIT_STATE_DIR, else $XDG_STATE_HOME/kit, else ~/.local/state/kit. Record
files (images.json: kit/images/records.py; models.json: kit/models/records.py; clusters.json:
kit/cluster/record.py) map a key to a JSON record; writes are atomic (temp file + rename).
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from kit import __version__
from kit.errors import KitError


def state_dir() -> Path:
    explicit = os.environ.get("KIT_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "kit"


def read_records(path: Path, what: str, rewritten_by: str) -> dict[str, Any]:
    """One of kit's record files ({} when there is none yet); `what` names it in errors."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise KitError(
            f"cannot read kit's {what} record {path}: {exc}",
            hint=f"delete the file ({rewritten_by} rewrites it) or set KIT_STATE_DIR",
        ) from None
    return data if isinstance(data, dict) else {}


def write_record(path: Path, key: str, fields: dict[str, Any], what: str, rewritten_by: str) -> dict[str, Any]:
    """Add (or replace) `key` in a record file, atomically (temp + rename); the record written,
    stamped with the time and kit's version."""
    record: dict[str, Any] = {
        **fields,
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "kit_version": __version__,
    }
    _update(path, what, rewritten_by, lambda data: data.__setitem__(key, record))
    return record


def drop_record(path: Path, key: str, what: str, rewritten_by: str) -> None:
    """Remove `key` from a record file (nothing to do when it is not there)."""
    if key in read_records(path, what, rewritten_by):
        _update(path, what, rewritten_by, lambda data: data.pop(key, None))


def _update(path: Path, what: str, rewritten_by: str, change: Any) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = read_records(path, what, rewritten_by)
        change(data)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".json", dir=path.parent)
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise KitError(
            f"cannot write kit's {what} record {path}: {exc.strerror or exc}",
            hint="set KIT_STATE_DIR to a writable folder",
        ) from None
