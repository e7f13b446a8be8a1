"""What an image is, as its own probe said (kit/images/vllm_probe.py `facts`, issue 24): the probe's
output read back (bounded, every field checked: it comes from inside an arbitrary image) and a
typed view of it that the planners ask: does this vLLM have an option, which choices does it take,
is there Ray. Pure: running the probe is the cluster layer's (kit.cluster.images), storing it
kit.images.records'.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from kit.errors import ImageError
from kit.images import vllm_probe

# One of kit's shipped in-container programs (kit.resources.PROGRAMS), read from its file.
PROBE_PATH = Path(vllm_probe.__file__)
MAX_OUTPUT = 4 << 20  # bytes of probe output kit reads at most (a real parser record is ~100 KB)
MAX_OPTIONS = 4000
_FLAG_RE = re.compile(r"-{1,2}[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}\Z")
_TEXT_LIMIT = 500


def probe_source() -> str:
    """The probe program's text (it runs as `python3 -c SOURCE facts` in images that lack it)."""
    return PROBE_PATH.read_text()


@lru_cache(maxsize=1)
def packed_probe() -> str:
    """The probe as one word a launcher carries: gzip (no name, no time: the same bytes every
    time) then base64; the launcher runs `base64 -d | gzip -dc | python3 - check ...`."""
    return base64.b64encode(gzip.compress(probe_source().encode(), compresslevel=9, mtime=0)).decode()


def parse_output(stdout: str, *, image: str) -> dict[str, Any]:
    """The probe's facts from its output (vLLM logs to stdout too: the one KIT_IMAGE_FACTS line),
    checked field by field; ImageError (exit 5) when there is none or it is malformed."""
    text = stdout[-MAX_OUTPUT:]
    lines = [ln for ln in text.splitlines() if ln.startswith(vllm_probe.MARK)]
    if not lines:
        raise ImageError(
            f"the image probe printed no facts in {image}",
            hint="does the image have python3 on PATH? `kit verify --image IMAGE` shows more",
        )
    try:
        data = json.loads(lines[-1].removeprefix(vllm_probe.MARK))
    except ValueError as exc:
        raise ImageError(f"the image probe's output from {image} is not JSON: {exc}") from None
    return clean_facts(data, image=image)


def _text(value: Any) -> str | None:
    return value[:_TEXT_LIMIT] if isinstance(value, str) else None


def _action(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, Mapping):
        return None
    flags = [f for f in raw.get("flags") or [] if isinstance(f, str) and _FLAG_RE.match(f)]
    choices = raw.get("choices")
    if not flags:
        return None
    return {
        "flags": flags,
        "dest": _text(raw.get("dest")) or "",
        "takes_value": bool(raw.get("takes_value")),
        "nargs": _text(raw.get("nargs")),
        "choices": [c[:200] for c in choices if isinstance(c, str)][:1000] if isinstance(choices, list) else None,
        "type": _text(raw.get("type")),
        "hidden": bool(raw.get("hidden")),
        "action": _text(raw.get("action")),
    }


def _section(data: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A flat section (ray, torch, user): strings, numbers, booleans and None only."""
    raw = data.get(name)
    if not isinstance(raw, Mapping):
        return {}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(key, str) and (value is None or isinstance(value, (bool, int, float))):
            out[key[:100]] = value
        elif isinstance(key, str) and isinstance(value, str):
            out[key[:100]] = value[:_TEXT_LIMIT]
    return out


def clean_facts(data: Any, *, image: str) -> dict[str, Any]:
    """Only the fields kit knows, each of its type and bounded; anything else is dropped."""
    if not isinstance(data, Mapping) or data.get("probe") != "image-facts":
        raise ImageError(f"the image probe's output from {image} is not kit's image facts")
    raw_vllm = data.get("vllm")
    vllm: Mapping[str, Any] = raw_vllm if isinstance(raw_vllm, Mapping) else {}
    clean_vllm: dict[str, Any] = {"version": _text(vllm.get("version")), "error": _text(vllm.get("error"))}
    serve = vllm.get("serve")
    if isinstance(serve, Mapping):
        options = [a for a in (_action(r) for r in (serve.get("options") or [])[:MAX_OPTIONS]) if a]
        clean_vllm["serve"] = {
            "allow_abbrev": bool(serve.get("allow_abbrev", True)),
            "options": options,
            "positionals": [p[:100] for p in serve.get("positionals") or [] if isinstance(p, str)][:20],
        }
    return {
        "probe": "image-facts",
        "probe_version": _text(data.get("probe_version")),
        "python": _text(data.get("python")),
        "vllm": clean_vllm,
        "ray": _section(data, "ray"),
        "torch": _section(data, "torch"),
        "user": _section(data, "user"),
    }


@dataclass(frozen=True)
class ImageFacts:
    """An image's recorded facts, and where they came from."""

    data: Mapping[str, Any]
    key: str  # what they are stored under: the image id / digest, or a SIF's sha256
    image: str = ""  # the reference or file they were read from

    @property
    def vllm_version(self) -> str | None:
        version = (self.data.get("vllm") or {}).get("version")
        return version if isinstance(version, str) else None

    @property
    def serve(self) -> Mapping[str, Any] | None:
        serve = (self.data.get("vllm") or {}).get("serve")
        return serve if isinstance(serve, Mapping) else None

    @cached_property
    def _index(self) -> dict[str, Mapping[str, Any]]:
        return vllm_probe.option_index(self.serve or {})

    def options(self) -> list[str]:
        """Every option string of the image's `vllm serve`."""
        return sorted(self._index)

    def has_option(self, flag: str) -> bool:
        return flag in self._index

    def choices(self, flag: str) -> list[str] | None:
        action = self._index.get(flag)
        return None if action is None else action.get("choices")

    @property
    def has_ray(self) -> bool:
        return vllm_probe.check_ray(self.data) is None

    def ray_problem(self) -> str | None:
        return vllm_probe.check_ray(self.data)

    def versions(self) -> dict[str, str | None]:
        """vllm, ray, torch, cuda, nccl, python: what `kit verify --image` shows."""
        ray, torch = self.data.get("ray") or {}, self.data.get("torch") or {}
        return {
            "vllm": self.vllm_version,
            "ray": ray.get("version"),
            "torch": torch.get("version"),
            "cuda": torch.get("cuda"),
            "nccl": torch.get("nccl"),
            "python": self.data.get("python"),
        }

    def user(self) -> tuple[str | None, str | None]:
        user = self.data.get("user") or {}
        return user.get("name"), user.get("home")

    def summary(self) -> str:
        parts = [f"{k} {v}" for k, v in self.versions().items() if v]
        options = len((self.serve or {}).get("options", []))
        parts.append(f"{options} serve options" if self.serve else "no serve parser")
        name, home = self.user()
        if name:
            parts.append(f"user {name} (home {home})")
        return ", ".join(parts)
