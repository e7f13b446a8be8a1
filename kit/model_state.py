"""kit's record of the models it fetched: $KIT_STATE_DIR/models.json (beside images.json, see
kit/state.py), one entry per `REPO@REVISION` with the commit it resolved to, where the snapshot
is, its size and whether the last fetch finished complete. Writes are atomic (temp + rename).

The record is this host's memory; the manifest beside the snapshot (kit/fetch.py) is what a
compute node sharing the cache checks against.
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
from kit.state import state_dir


def models_file() -> Path:
    return state_dir() / "models.json"


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise KitError(
            f"cannot read kit's model record {path}: {exc}",
            hint="delete the file (kit fetch rewrites it) or set KIT_STATE_DIR",
        ) from None
    return data if isinstance(data, dict) else {}


def record_model(repo: str, revision: str, **fields: Any) -> dict[str, Any]:
    """Remember what repo@revision resolved to and where it is; returns the record written."""
    path = models_file()
    record: dict[str, Any] = {
        "repo": repo,
        "revision": revision,
        **fields,
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "kit_version": __version__,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _load(path)
        data[f"{repo}@{revision}"] = record
        fd, tmp = tempfile.mkstemp(prefix=".models.", suffix=".json", dir=path.parent)
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise KitError(
            f"cannot write kit's model record {path}: {exc.strerror or exc}",
            hint="set KIT_STATE_DIR to a writable folder",
        ) from None
    return record


def recorded_model(repo: str, revision: str = "main") -> dict[str, Any] | None:
    """The record of repo@revision, or None when kit never fetched it here."""
    record = _load(models_file()).get(f"{repo}@{revision}")
    return record if isinstance(record, dict) else None
