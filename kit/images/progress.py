"""Progress lines for `kit pull` and `kit build`, from the engine's event stream (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# ---- pull progress ------------------------------------------------------------------------

# Statuses the engine sends per layer (moby's distribution/xfer and pull_v2).
_LAYER_STATUSES = {
    "Pulling fs layer",
    "Waiting",
    "Downloading",
    "Verifying Checksum",
    "Download complete",
    "Extracting",
    "Pull complete",
    "Already exists",
    "Retrying",
}
_DOWNLOADED = {"Verifying Checksum", "Download complete", "Extracting", "Pull complete"}
_DONE = {"Pull complete", "Already exists"}


def format_size(current: int | None, total: int | None) -> str:
    """Bytes in decimal MB, like the docker CLI: '12.3/45.6 MB', or '12.3 MB' with no total."""
    cur = (current or 0) / 1e6
    if total:
        return f"{cur:.1f}/{total / 1e6:.1f} MB"
    return f"{cur:.1f} MB"


def format_layer_line(layer: str, status: str, current: int | None = None, total: int | None = None) -> str:
    """'a1b2c3d4e5f6: Downloading 12.3/45.6 MB' (sizes only while bytes move)."""
    line = f"{layer}: {status}"
    if current is not None and status in ("Downloading", "Extracting"):
        line += " " + format_size(current, total)
    return line


@dataclass
class _Layer:
    status: str = ""
    current: int = 0
    total: int = 0
    last_line_at: float | None = None


@dataclass
class PullProgress:
    """Turns the engine's pull events into progress text; time is passed in, so it is pure.

    `line(event, now)` gives the plain line to print (non-TTY), or None when throttled:
    at most one line per layer per `interval` seconds, plus every status change.
    `summary()` gives one line for the whole pull (a TTY's updating line).
    """

    interval: float = 1.0
    layers: dict[str, _Layer] = field(default_factory=dict)
    digest: str | None = None
    _last_other: str | None = None

    def line(self, event: Mapping[str, Any], now: float) -> str | None:
        status = str(event.get("status") or "").strip()
        layer_id = str(event.get("id") or "")
        if status.startswith("Digest: "):
            self.digest = status.removeprefix("Digest: ").strip()
        if not status:
            return None
        if layer_id and (status in _LAYER_STATUSES or status.startswith("Retrying")):
            return self._layer_line(layer_id, status, event.get("progressDetail") or {}, now)
        text = f"{layer_id}: {status}" if layer_id else status
        if text == self._last_other:
            return None
        self._last_other = text
        return text

    def _layer_line(self, layer_id: str, status: str, detail: Mapping[str, Any], now: float) -> str | None:
        layer = self.layers.setdefault(layer_id, _Layer())
        changed = status != layer.status
        layer.status = status
        current, total = detail.get("current"), detail.get("total")
        if status == "Downloading":
            layer.current = int(current or 0)
            layer.total = int(total or layer.total or 0)
        elif status in _DOWNLOADED and layer.total:
            layer.current = layer.total
        due = layer.last_line_at is None or now - layer.last_line_at >= self.interval
        if not (changed or due):
            return None
        layer.last_line_at = now
        shown = int(current) if current is not None else None
        return format_layer_line(layer_id, status, shown, int(total) if total else None)

    def summary(self) -> str:
        total_layers = len(self.layers)
        done = sum(1 for layer in self.layers.values() if layer.status in _DONE)
        current = sum(layer.current for layer in self.layers.values())
        total = sum(layer.total for layer in self.layers.values())
        return f"{done}/{total_layers} layers complete, {format_size(current, total)} downloaded"


# ---- build progress -----------------------------------------------------------------------

_STEP_RE = re.compile(r"^Step \d+/\d+ : ")


def build_step_line(event: Mapping[str, Any]) -> str | None:
    """The classic builder's 'Step 3/12 : RUN ...' lines (shortened), else None."""
    text = str(event.get("stream") or "").strip()
    if not _STEP_RE.match(text):
        return None
    first = text.splitlines()[0]
    return first if len(first) <= 160 else first[:157] + "..."


def build_image_id(event: Mapping[str, Any]) -> str | None:
    """The built image id, from the builder's aux event or its 'Successfully built' line."""
    aux = event.get("aux")
    if isinstance(aux, Mapping) and aux.get("ID"):
        return str(aux["ID"])
    text = str(event.get("stream") or "").strip()
    if text.startswith("Successfully built "):
        return text.removeprefix("Successfully built ").strip()
    return None


# Builder output worth a line without --verbose: what pip and apt are doing (issue 24: a pip
# step that installs vLLM or Ray otherwise says nothing for minutes). Milestones always show;
# the others at most one per BuildProgress.interval.
_MILESTONE_RE = re.compile(
    r"^(kit: |Installing collected packages|Successfully installed|Requirement already satisfied: ray)"
)
_ACTIVITY_RE = re.compile(r"^(Collecting |Downloading |Building wheel|Get:\d+ |Unpacking |Setting up |Processing )")


@dataclass
class BuildProgress:
    """What to show of a long build step (pure: time is passed in). `detail(line, now)`: the
    builder line to show, or None; `heartbeat(now)`: a line saying the step still runs when
    nothing was shown for `quiet_after` seconds (pip installing big wheels prints nothing)."""

    interval: float = 10.0
    quiet_after: float = 30.0
    step: str | None = None
    step_at: float = 0.0
    shown_at: float = 0.0
    last_line: str = ""

    def on_step(self, text: str, now: float) -> None:
        self.step, self.step_at, self.shown_at, self.last_line = text, now, now, ""

    def detail(self, line: str, now: float) -> str | None:
        text = line.strip()
        if not text:
            return None
        self.last_line = text
        shown = bool(_MILESTONE_RE.match(text)) or (
            bool(_ACTIVITY_RE.match(text)) and now - self.shown_at >= self.interval
        )
        if not shown:
            return None
        self.shown_at = now
        return "  " + (text if len(text) <= 140 else text[:137] + "...")

    def heartbeat(self, now: float) -> str | None:
        if self.step is None or now - self.shown_at < self.quiet_after:
            return None
        self.shown_at = now
        elapsed = int(now - self.step_at)
        last = f"; last output: {self.last_line[:80]}" if self.last_line else ""
        return f"  ... {self.step.split(' : ', 1)[0]} still running ({elapsed // 60} min {elapsed % 60:02d} s{last})"


_RUN_FAILED = re.compile(r"The command '.*' returned a non-zero code: (\d+)\s*$", re.DOTALL)


def shorten_build_error(message: str, tag: str, step: str | None) -> str:
    """The classic builder repeats the whole RUN command in its error; name the step instead."""
    match = _RUN_FAILED.search(message)
    if match is None or step is None:
        return message
    return f"build of {tag} failed: {step.split(' : ', 1)[0]} exited with code {match.group(1)}"
