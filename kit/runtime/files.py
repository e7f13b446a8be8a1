"""What file-backed image stores share (Apptainer SIF, enroot squashfs): the file name for an
image reference, atomic writes, and the JSON record beside each file of where it came from.

A `docker://` import rebuilds the file (two pulls are not byte-identical, FIELD_NOTES §4), so
the record keeps the source digest, from a pinned reference or the image's labels, instead of
a hash of the file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import secrets
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kit import __version__, safeload
from kit.errors import ConfigError
from kit.runtime.base import ImageFile, ImageInfo
from kit.safe import files as safefile
from kit.safe import text as safetext

DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
URI_RE = re.compile(r"^(docker|docker-daemon|oras|library|https?|shub)://")


def image_file_name(ref: str, suffix: str) -> str:
    """A file name for an image reference: docker://vllm/vllm-openai:v0.11.0 -> vllm_vllm-openai_v0.11.0.sif."""
    text = URI_RE.sub("", ref)
    text, _, digest = text.partition("@")
    if digest:
        text += "_" + digest.replace(":", "-")[:19]
    elif ":" not in text.rsplit("/", 1)[-1]:
        text += ":latest"
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text.replace(":", "_")).strip("._")
    return f"{name}{suffix}"


def digest_from(ref: str, labels: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(digest, where it came from): a pinned reference wins, then a digest-looking image label."""
    match = DIGEST_RE.search(ref)
    if match:
        return match.group(0), "reference"
    for key in sorted(labels):
        if "digest" in key.lower():
            found = DIGEST_RE.search(str(labels[key]))
            if found:
                return found.group(0), f"label {key}"
    return None, None


@contextlib.contextmanager
def partial_file(dest: Path) -> Iterator[Path]:
    """Yield a temporary name next to dest; on success the caller renames it, on any failure or
    interrupt it is removed, so no half-written image is ever left behind. The name is not one
    another user of a shared image folder can guess and plant a link at."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.partial-{os.getpid()}-{secrets.token_hex(6)}")
    try:
        yield partial
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()


def record_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def write_record(
    path: Path,
    source: str,
    labels: Mapping[str, str],
    started: float,
    *,
    digest: tuple[str | None, str | None] | None = None,
) -> ImageFile:
    """Write the JSON record beside the image file; `digest` (value, where from) overrides the
    one found in the source reference or the labels."""
    found, where = digest if digest is not None and digest[0] else digest_from(source, labels)
    meta = record_path(path)
    record = ImageFile(
        path=str(path),
        source=source,
        digest=found,
        digest_source=where,
        labels=dict(labels),
        size=path.stat().st_size,
        seconds=round(time.monotonic() - started, 1),
        metadata=str(meta),
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        kit_version=__version__,
    )
    safefile.write_atomic(meta, safetext.to_json(record.to_dict()) + "\n")
    return record


def read_record(path: Path) -> dict[str, Any]:
    """The JSON record beside an image file ({} when there is none or it is unreadable)."""
    try:
        data = safeload.load_json_file(record_path(path), max_bytes=1 << 20, what="image record")
    except ConfigError:
        return {}
    return data if isinstance(data, dict) else {}


def file_info(ref: str, path: Path) -> ImageInfo | None:
    """ImageInfo of an image file (None when the file is not there); reads only the record."""
    if not path.is_file():
        return None
    record = read_record(path)
    digest = record.get("digest")
    labels = record.get("labels") if isinstance(record.get("labels"), dict) else {}
    return ImageInfo(
        ref=ref,
        id=str(path),
        digests=(str(digest),) if digest else (),
        labels={str(k): str(v) for k, v in (labels or {}).items()},
        path=str(path),
    )


def remove_file(path: Path) -> bool:
    """Remove an image file and its record; False when the file was not there."""
    with contextlib.suppress(FileNotFoundError):
        record_path(path).unlink()
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
