"""kit's record of the images it pulled or built, and what they are.

- $KIT_STATE_DIR/images.json (kit/state.py): one entry per reference with the digest it resolved
  to. `kit pull`/`kit build` record it; `kit up`/`kit verify` compare a node's image with it.
- <state>/image-facts/ (issue 24): an image's facts (kit/images/facts.py), one JSON file per image
  named by its digest (a Docker image id or repo digest, a SIF's sha256), so every tag of one image
  shares them and a retagged image is probed again; the image record names the facts file's key.
  Written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from kit.errors import KitError
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


_KEY_RE = re.compile(r"[a-z0-9]+:[0-9a-f]{32,128}\Z")


def facts_dir() -> Path:
    return state_dir() / "image-facts"


def facts_key(digest: str) -> str | None:
    """The storage key of a digest: 'sha256:…' (an image id), the digest of 'repo@sha256:…';
    None for anything else."""
    digest = digest.rsplit("@", 1)[-1].strip().lower()
    return digest if _KEY_RE.match(digest) else None


def _path(key: str) -> Path:
    return facts_dir() / (key.replace(":", "-") + ".json")


def save_facts(key: str, facts: dict[str, Any], *, image: str) -> Path:
    """Write the facts of the image stored under `key` (temp file + rename)."""
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".facts.", suffix=".json", dir=path.parent)
        with os.fdopen(fd, "w") as handle:
            json.dump({"key": key, "image": image, "facts": facts}, handle, sort_keys=True)
            handle.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise KitError(
            f"cannot write kit's image facts {path}: {exc.strerror or exc}",
            hint="set KIT_STATE_DIR to a writable folder",
        ) from None
    return path


def load_facts(key: str) -> dict[str, Any] | None:
    """The facts stored under `key`, None when there are none (or the file is unreadable: the
    image is then probed again)."""
    try:
        data = json.loads(_path(key).read_text())
    except (OSError, ValueError):
        return None
    facts = data.get("facts") if isinstance(data, dict) else None
    return facts if isinstance(facts, dict) else None


def recorded_key(ref: str) -> str | None:
    """The facts key kit's image record (kit pull/build/verify) names for `ref`."""
    try:
        record = recorded_image(ref) or {}
    except KitError:
        return None
    stamp = record.get("stamp")
    if stamp is not None and stamp != file_stamp(str(record.get("path") or ref)):
        return None  # an image file changed since it was probed: probe it again
    for field in ("facts", "image_id", "digest"):
        value = record.get(field)
        if isinstance(value, str) and (key := facts_key(value)) and load_facts(key) is not None:
            return key
    return None


def file_key(path: str) -> str:
    """A SIF (or squashfs) by its content: sha256 of the file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def file_stamp(path: str) -> dict[str, int] | None:
    """Size and mtime of an image file: its record's key is trusted while both still match."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def link_facts(ref: str, key: str, **fields: Any) -> None:
    """Name the facts key in `ref`'s image record (kept as it was otherwise; a new record when kit
    never pulled or built `ref`: the image was probed at first use or by `kit verify --image`)."""
    try:
        record = dict(recorded_image(ref) or {})
    except KitError:
        record = {}
    for stale in ("recorded_at", "kit_version", "ref"):
        record.pop(stale, None)
    digest = str(record.pop("digest", "") or key)
    record_image(ref, digest, **{**record, **fields, "facts": key})
