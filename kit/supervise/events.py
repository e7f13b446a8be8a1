"""Supervision events: what happened, when, and why; one JSON object per line (events.jsonl in the
head container, and `KIT_EVENT {...}` lines on the coordinator's output, which is the job output
under SLURM). Standard library only (the coordinator writes them; kit reads them back).

Kinds, in the order a failure produces them:
  supervising  the coordinator started (or resumed after its container restarted)
  started      generation N was ordered to run on every node
  ready        the server answered /health with every engine present (recovery_s after a failure)
  detected     a failure and its reason (a node lost or restarted, vllm serve exited, an engine
               dead or hung, the API down, not ready in time)
  stopping     the whole group is being stopped before a restart
  waiting      a node must come back (or the Ray cluster be whole) before the restart
  restarting   restart K of max_restarts, after the backoff
  given-up     the restart limit was reached: everything stopped (details: the last log lines)
  stopped      supervision was stopped on purpose (kit serve interrupted, --replace, ctl stop)

With replicas behind vLLM's router (model.dp_lb router, issue 29) each replica is its own group
with its own coordinator (on its first node), and two more kinds record the router's side:
  drained      the replica was taken out of the router on `detected` (the others keep answering)
  readmitted   the replica was put back into the router on `ready`
  route-failed the router could not be told (it then judges the replica by its own health checks)
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

EVENT_MARK = "KIT_EVENT"
KINDS = (
    "supervising",
    "started",
    "ready",
    "detected",
    "stopping",
    "waiting",
    "restarting",
    "given-up",
    "stopped",
    "drained",
    "readmitted",
    "route-failed",
)


@dataclass(frozen=True)
class Event:
    ts: float  # seconds since the epoch (wall clock)
    kind: str
    reason: str
    generation: int = 0
    restarts: int = 0
    node: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)  # numbers such as recovery_s, detect_s
    details: tuple[str, ...] = ()  # evidence: the last log lines

    @property
    def time(self) -> str:
        return iso(self.ts)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "time": self.time,
            "ts": round(self.ts, 3),
            "event": self.kind,
            "reason": self.reason,
            "generation": self.generation,
            "restarts": self.restarts,
        }
        if self.node is not None:
            doc["node"] = self.node
        if self.data:
            doc["data"] = dict(self.data)
        if self.details:
            doc["details"] = list(self.details)
        return doc

    def line(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def iso(ts: float) -> str:
    seconds, millis = divmod(round(ts * 1000), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def from_dict(doc: Mapping[str, Any]) -> Event:
    return Event(
        ts=float(doc.get("ts", 0.0)),
        kind=str(doc.get("event", "?")),
        reason=str(doc.get("reason", "")),
        generation=int(doc.get("generation", 0)),
        restarts=int(doc.get("restarts", 0)),
        node=doc.get("node") if isinstance(doc.get("node"), str) else None,
        data=dict(doc["data"]) if isinstance(doc.get("data"), dict) else {},
        details=tuple(str(d) for d in doc.get("details", []) if isinstance(d, str)),
    )


def parse_lines(lines: Iterable[str]) -> list[Event]:
    """Events from JSONL text or from output lines holding `KIT_EVENT {...}` (SLURM job output,
    where srun --label prefixes each line); anything else is skipped."""
    out = []
    for raw in lines:
        text = raw.strip()
        if EVENT_MARK in text:
            text = text[text.index(EVENT_MARK) + len(EVENT_MARK) :].strip()
        if not text.startswith("{"):
            continue
        try:
            doc = json.loads(text)
        except ValueError:
            continue
        if isinstance(doc, dict) and "event" in doc:
            out.append(from_dict(doc))
    return out


def summary(events: Sequence[Event]) -> dict[str, Any]:
    """Restarts, the last failure and the latest state, for `kit status`."""
    failures = [e for e in events if e.kind == "detected"]
    last = events[-1] if events else None
    return {
        "restarts": max((e.restarts for e in events), default=0),
        "last_failure": failures[-1].reason if failures else None,
        "last_failure_time": failures[-1].time if failures else None,
        "last_event": last.kind if last else None,
        "last_event_time": last.time if last else None,
        "given_up": any(e.kind == "given-up" for e in events),
    }


def render(events: Sequence[Event]) -> str:
    """One line per event, for `kit logs --events`."""
    lines = []
    for e in events:
        where = f" [{e.node}]" if e.node else ""
        lines.append(f"{e.time}  {e.kind:<11} gen {e.generation:<3} restarts {e.restarts:<3}{where} {e.reason}")
        lines += [f"    | {d}" for d in e.details]
    return "\n".join(lines)
