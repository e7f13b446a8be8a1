"""The control protocol between the agents and the coordinator: JSON over HTTP on the head's node
IP (ports.supervisor). Standard library only (runs inside the node containers).

- POST /v1/report: an agent's report (Report) -> the coordinator's order for it (Order). Agents
  only ever connect out to the head: no agent listens on anything, no node needs SSH or the
  Docker socket.
- GET /v1/status: the coordinator's state and its latest events (kit's host side reads the same
  from the head's files; this is for a client on the network, e.g. the SLURM launcher).
- POST /v1/stop: stop supervising: every agent stops its serve group and exits, then the
  coordinator exits.

Every request carries the token of the supervised run (header X-Kit-Token), compared in constant
time; a body is at most MAX_BODY bytes and every field is checked: the coordinator listens on the
cluster network.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kit.safeload import json_depth_ok

TOKEN_HEADER = "X-Kit-Token"
MAX_BODY = 64 * 1024
MAX_LINES = 40
MAX_LINE = 400
MAX_ENGINES = 512
MAX_DEPTH = 8  # a report nests three levels
NODE_RE = re.compile(r"^(head|worker-[0-9]{1,5})\Z")
_INSTANCE_RE = re.compile(r"^[A-Za-z0-9._:-]{1,80}\Z")
ACTIONS = ("run", "stop", "exit")


class ProtocolError(ValueError):
    """A message that is not what the protocol allows (the coordinator answers 400)."""


def node_name(role: str, rank: int) -> str:
    """The node's short name, as kit's container names end: head, worker-1, ..."""
    return "head" if role == "head" else f"worker-{rank}"


@dataclass(frozen=True)
class EngineProc:
    pid: int
    state: str
    title: str

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "state": self.state, "title": self.title}


@dataclass(frozen=True)
class Report:
    """What an agent says about its node, every second."""

    node: str
    instance: str  # new each time an agent starts: a restarted container brings a new one
    boot: str  # the container's start (PID 1's start time and the kernel boot id)
    generation: int  # the generation of its serve group (0: none started yet)
    running: bool  # the serve script's process is alive
    exit_code: int | None  # of that process, once it exited
    stopped: bool  # no process of the serve group is left (engines included)
    engines: tuple[EngineProc, ...] = ()
    exiting: bool = False  # obeying an exit order: its last report
    log_tail: tuple[str, ...] = ()  # the serve log's last lines, when its group exited or stopped
    cause: str | None = None  # the first error of this generation's serve log (kit.supervise.cause)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "instance": self.instance,
            "boot": self.boot,
            "generation": self.generation,
            "running": self.running,
            "exit_code": self.exit_code,
            "stopped": self.stopped,
            "engines": [e.to_dict() for e in self.engines],
            "exiting": self.exiting,
            "log_tail": list(self.log_tail),
            "cause": self.cause,
        }


@dataclass(frozen=True)
class Order:
    """What the coordinator wants of one agent: run generation N (starting it when the agent runs
    another or none), stop its group, or stop and exit with exit_code."""

    generation: int
    action: str
    exit_code: int = 0
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "action": self.action,
            "exit_code": self.exit_code,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class StopRequest:
    reason: str = "stopped by kit"
    extra: Mapping[str, Any] = field(default_factory=dict)


def token_ok(expected: str, given: str | None) -> bool:
    return bool(expected) and given is not None and hmac.compare_digest(expected.encode(), given.encode())


def loads(body: bytes) -> dict[str, Any]:
    """A message's JSON object: at most MAX_BODY bytes and MAX_DEPTH levels deep (a deeply
    nested body is a 400, not a RecursionError in the server's thread), no NaN or Infinity."""
    if len(body) > MAX_BODY:
        raise ProtocolError(f"body over {MAX_BODY} bytes")
    try:
        text = body.decode("utf-8")
        if not json_depth_ok(text, MAX_DEPTH):
            raise ProtocolError(f"body nested deeper than {MAX_DEPTH} levels")
        doc = json.loads(text, parse_constant=_no_constant)
    except ProtocolError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ProtocolError("body is not JSON") from None
    if not isinstance(doc, dict):
        raise ProtocolError("body is not a JSON object")
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def dumps(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def _get(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
    value = doc.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) and kind is int:  # JSON true is not a number here
        raise ProtocolError(f"{key} must be an integer")
    if not isinstance(value, kind):
        raise ProtocolError(f"{key} is missing or of the wrong type")
    return value


def _text(value: Any, limit: int = MAX_LINE) -> str:
    if not isinstance(value, str):
        raise ProtocolError("a text field is not a string")
    return "".join(c if c.isprintable() else "?" for c in value[:limit])


def report_from(doc: Mapping[str, Any]) -> Report:
    node = _get(doc, "node", str)
    if not NODE_RE.match(node):
        raise ProtocolError("node must be head or worker-N")
    instance = _get(doc, "instance", str)
    if not _INSTANCE_RE.match(instance):
        raise ProtocolError("instance must be a short id")
    generation = _get(doc, "generation", int)
    if not 0 <= generation < 2**31:
        raise ProtocolError("generation out of range")
    exit_code = _get(doc, "exit_code", int, optional=True)
    engines_doc = _get(doc, "engines", list)
    if len(engines_doc) > MAX_ENGINES:
        raise ProtocolError("too many engines")
    engines = []
    for item in engines_doc:
        if not isinstance(item, dict):
            raise ProtocolError("an engine is not an object")
        engines.append(
            EngineProc(_get(item, "pid", int), _text(_get(item, "state", str), 2), _text(item.get("title"), 80))
        )
    lines = _get(doc, "log_tail", list)
    return Report(
        node=node,
        instance=instance,
        boot=_text(_get(doc, "boot", str), 120),
        generation=generation,
        running=_get(doc, "running", bool),
        exit_code=exit_code,
        stopped=_get(doc, "stopped", bool),
        engines=tuple(engines),
        exiting=_get(doc, "exiting", bool),
        log_tail=tuple(_text(line) for line in lines[-MAX_LINES:]),
        cause=None if doc.get("cause") is None else _text(doc["cause"]),
    )


def order_from(doc: Mapping[str, Any]) -> Order:
    action = _get(doc, "action", str)
    if action not in ACTIONS:
        raise ProtocolError(f"action must be one of {', '.join(ACTIONS)}")
    code = _get(doc, "exit_code", int)
    if not 0 <= code <= 255:
        raise ProtocolError("exit_code out of range")
    return Order(
        generation=_get(doc, "generation", int), action=action, exit_code=code, reason=_text(doc.get("reason", ""))
    )


def stop_from(doc: Mapping[str, Any]) -> StopRequest:
    reason = doc.get("reason", "stopped by kit")
    return StopRequest(reason=_text(reason, 200) or "stopped by kit")
