"""An image's facts (issue 24): read from kit's record, or found by running the probe
(kit/images/vllm_probe.py `facts`) once in the image through its ImageStore, then recorded by
digest (kit.images.records). `kit pull`, `kit build` and `kit verify --image` probe what they
fetch or make; `kit up`/`kit serve` probe an image kit has no record of at first use."""

from __future__ import annotations

from collections.abc import Callable

from kit.errors import ImageError
from kit.images import records
from kit.images.facts import ImageFacts, parse_output, probe_source
from kit.runtime.base import ImageStore

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def is_file_image(ref: str) -> bool:
    return ref.startswith("/") or ref.endswith((".sif", ".sqsh"))


def find_facts(ref: str) -> ImageFacts | None:
    """The recorded facts of `ref` (no probe, no engine: what a dry run can know)."""
    key = records.recorded_key(ref)
    data = records.load_facts(key) if key else None
    return ImageFacts(data, key, ref) if data is not None and key is not None else None


def identify(store: ImageStore, ref: str) -> tuple[str, dict[str, object]]:
    """The key the image's facts are stored under (a Docker image id; an image file's sha256)
    and what its record keeps to find them again."""
    info = store.image_info(ref)
    if info is None:
        raise ImageError(f"image {ref} is not on this host", hint="`kit pull` (or `kit build`) it first")
    if info.path is not None:  # a file store (Apptainer SIF): the file's own hash
        stamp = records.file_stamp(info.path)
        return records.file_key(info.path), {"stamp": stamp, "path": info.path}
    key = records.facts_key(info.id)
    if key is None:
        raise ImageError(f"{store.name} gave {ref} no image id kit can key its facts by ({info.id[:80]!r})")
    return key, {"image_id": info.id}


def probe(store: ImageStore, ref: str, *, say: Say = _quiet, timeout: float = 900) -> ImageFacts:
    """Run the probe in `ref`, record what it found, return it."""
    key, fields = identify(store, ref)
    say(f"probing {ref}: its vLLM version, `vllm serve` parser, Ray, torch (a throwaway container)")
    result = store.run_probe(ref, probe_source(), ["facts"], timeout=timeout)
    if result.returncode != 0:
        tail = [ln for ln in (result.stderr or result.stdout).strip().splitlines() if ln.strip()][-8:]
        raise ImageError(
            f"the image probe failed in {ref} (exit {result.returncode})",
            hint="does the image have python3 on PATH? `kit verify --image IMAGE` shows more",
            details=tail,
        )
    data = parse_output(result.stdout, image=ref)
    records.save_facts(key, data, image=ref)
    facts = ImageFacts(data, key, ref)
    version = (
        {"vllm_version": facts.vllm_version, "vllm_version_from": "the image's probe"} if facts.vllm_version else {}
    )
    records.link_facts(ref, key, **fields, **version)
    say(f"{ref}: {facts.summary()}")
    return facts


def ensure_facts(store: ImageStore, ref: str, *, say: Say = _quiet) -> ImageFacts:
    """The recorded facts, else a probe now (first use)."""
    return find_facts(ref) or probe(store, ref, say=say)
