"""kit's record of the images it pulled or built: $KIT_STATE_DIR/images.json (kit/state.py),
one entry per reference with the digest it resolved to. `kit pull`/`kit build` record it;
`kit up`/`kit verify` compare a node's image with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kit.state import read_records, state_dir, write_record


def images_file() -> Path:
    return state_dir() / "images.json"


def record_image(ref: str, digest: str, **extra: Any) -> dict[str, Any]:
    """Remember what `ref` resolved to; returns the record written."""
    return write_record(images_file(), ref, {"ref": ref, "digest": digest, **extra}, "image", "kit pull/build")


def recorded_image(ref: str) -> dict[str, Any] | None:
    """The record of `ref`, or None when kit never pulled or built it here."""
    record = read_records(images_file(), "image", "kit pull/build").get(ref)
    return record if isinstance(record, dict) else None
