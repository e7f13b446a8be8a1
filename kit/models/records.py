"""kit's record of the models it fetched: $KIT_STATE_DIR/models.json (beside images.json, see
kit/state.py), one entry per `REPO@REVISION` with the commit it resolved to, where the snapshot
is, its size and whether the last fetch finished complete. Writes are atomic (temp + rename).

The record is this host's memory; the manifest beside the snapshot (kit/models/fetch.py) is what a
compute node sharing the cache checks against.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kit.state import read_records, state_dir, write_record


def models_file() -> Path:
    return state_dir() / "models.json"


def record_model(repo: str, revision: str, **fields: Any) -> dict[str, Any]:
    """Remember what repo@revision resolved to and where it is; returns the record written."""
    record = {"repo": repo, "revision": revision, **fields}
    return write_record(models_file(), f"{repo}@{revision}", record, "model", "kit fetch")


def recorded_model(repo: str, revision: str = "main") -> dict[str, Any] | None:
    """The record of repo@revision, or None when kit never fetched it here."""
    record = read_records(models_file(), "model", "kit fetch").get(f"{repo}@{revision}")
    return record if isinstance(record, dict) else None
