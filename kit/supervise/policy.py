"""The coordinator's decisions, pure: a state machine over the agents' reports and the liveness
verdicts, with backoff and a restart limit. Standard library only (runs in the head container);
no I/O, no clock of its own: every input arrives in a Tick, every effect leaves as an Event or as
the Order `order_for` gives an agent.

Phases (one generation = one start of the whole group on every node):

    waiting --every node reports (and, with Ray, the Ray cluster is whole)--> starting (gen 1)
                                                                           or backoff (gen > 0)
    backoff --the delay of this restart--> starting (gen + 1: a restart)
    starting --/health and every engine in /metrics--> serving
    starting | serving --a failure--> stopping --every node stopped--> waiting
                        (past max_restarts restarts in a row: giving-up --> given-up, exit 6)
    any --stop asked--> shutting-down --> stopped (exit 0)

A failure is one of: a node that stopped reporting (its container died) or came back with a new
agent (its container restarted), `vllm serve` that exited, an engine process gone from a node,
the API down or an engine missing from /metrics for `confirm_s`, an engine judged hung by
kit/health/liveness.py, or not ready within `ready_s`. Restarts count in a row: they start again from 0
once the group has served for `stable_s`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kit.health.liveness import Verdict
from kit.supervise.events import Event
from kit.supervise.protocol import Order, Report

ACTIVE = ("starting", "serving")
TERMINAL = ("given-up", "stopped")
PHASES = ("waiting", "backoff", "starting", "serving", "stopping", "giving-up", "shutting-down", *TERMINAL)
GIVE_UP_EXIT = 6  # kit's ExitCode.START: the server could not be kept up


@dataclass(frozen=True)
class Settings:
    nodes: tuple[str, ...]  # nodes that run an agent: every node (mp), the head (Ray)
    engines: tuple[str, ...]  # the engines (DP ranks) /metrics must show
    liveness_s: float
    ready_s: float
    max_restarts: int
    backoff_s: float
    stable_s: float
    node_wait_s: float
    needs_ray: bool = False
    agent_timeout_s: float = 5.0  # agents report every second
    confirm_s: float = 2.0  # an API or engine failure must last this long (one lost scrape is not one)
    stop_timeout_s: float = 30.0
    backoff_cap_s: float = 300.0


@dataclass(frozen=True)
class Seen:
    """One node's latest report and when it arrived (the coordinator's monotonic clock)."""

    report: Report
    t: float


@dataclass(frozen=True)
class Tick:
    now: float  # monotonic seconds
    wall: float  # seconds since the epoch, for the events
    agents: Mapping[str, Seen]
    verdicts: Sequence[Verdict] | None = None  # None: the API was not observed in this tick
    ray_complete: bool | None = None  # Ray: every node alive (None: not asked)
    started: float = 0.0  # when the coordinator started: a node unseen since counts from then


@dataclass
class State:
    phase: str = "waiting"
    generation: int = 0
    restarts: int = 0  # every restart so far
    attempts: int = 0  # restarts in a row (since the group last served for stable_s)
    phase_since: float = 0.0
    instances: dict[str, str] = field(default_factory=dict)  # node -> the agent that runs this generation
    boots: dict[str, str] = field(default_factory=dict)
    baseline: dict[str, list[str]] = field(default_factory=dict)  # node -> engine titles when ready
    suspects: dict[str, float] = field(default_factory=dict)  # failure key -> first seen
    waiting_for: list[str] = field(default_factory=list)
    failure_at: float | None = None  # first detection of the failure being recovered from
    ready_at: float | None = None
    last_failure: str | None = None
    last_failure_ts: float | None = None
    last_tail: list[str] = field(default_factory=list)
    final_reason: str | None = None
    exit_code: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """What is written to state.json (monotonic times are left out: they mean nothing later)."""
        return {
            "phase": self.phase,
            "generation": self.generation,
            "restarts": self.restarts,
            "attempts": self.attempts,
            "instances": dict(self.instances),
            "boots": dict(self.boots),
            "last_failure": self.last_failure,
            "last_failure_ts": self.last_failure_ts,
            "final_reason": self.final_reason,
            "exit_code": self.exit_code,
        }

    @classmethod
    def resumed(cls, doc: Mapping[str, Any], now: float) -> State:
        """The state a restarted coordinator goes on from: a running generation stays (the agent
        that comes back with a new instance is then a failure: the group restarts); a restart in
        progress starts again from stopping."""
        phase = str(doc.get("phase", "waiting"))
        state = cls(
            phase=phase if phase in ACTIVE or phase in TERMINAL else "stopping",
            generation=int(doc.get("generation", 0)),
            restarts=int(doc.get("restarts", 0)),
            attempts=int(doc.get("attempts", 0)),
            phase_since=now,
            instances={str(k): str(v) for k, v in dict(doc.get("instances", {})).items()},
            boots={str(k): str(v) for k, v in dict(doc.get("boots", {})).items()},
            last_failure=doc.get("last_failure"),
            last_failure_ts=doc.get("last_failure_ts"),
        )
        if state.generation == 0:
            state.phase = "waiting"
        return state


def backoff_delay(attempt: int, settings: Settings) -> float:
    """Seconds before the `attempt`-th restart in a row: the first at once (a lone fault recovers
    as fast as a start allows), then backoff_s, doubling, at most backoff_cap_s."""
    if attempt <= 1:
        return 0.0
    return float(min(settings.backoff_cap_s, settings.backoff_s * 2 ** (attempt - 2)))


def order_for(state: State, node: str, instance: str) -> Order:
    """The order for the agent `instance` on `node`. Only the agents that were there when this
    generation started run it: a node that comes back in the middle waits for the next one."""
    if state.phase in ACTIVE:
        if state.instances.get(node) == instance:
            return Order(state.generation, "run")
        return Order(state.generation, "stop", reason="not part of this generation")
    if state.phase in ("giving-up", "given-up"):
        return Order(state.generation, "exit", GIVE_UP_EXIT, state.final_reason or "")
    if state.phase in ("shutting-down", "stopped"):
        return Order(state.generation, "exit", 0, state.final_reason or "")
    return Order(state.generation, "stop", reason=state.phase)


def request_stop(state: State, tick: Tick, reason: str) -> list[Event]:
    if state.phase in TERMINAL or state.phase == "shutting-down":
        return []
    state.final_reason = reason
    _enter(state, "shutting-down", tick.now)
    return []


def step(state: State, tick: Tick, settings: Settings) -> list[Event]:
    """Advance the state by one tick; the events it produced, in order."""
    handler = _HANDLERS.get(state.phase)
    return [] if handler is None else handler(state, tick, settings)


# ---- phases -----------------------------------------------------------------------------------


def _waiting(state: State, tick: Tick, settings: Settings) -> list[Event]:
    missing = _missing(tick, settings)
    ray_short = settings.needs_ray and not tick.ray_complete
    if not missing and not ray_short:
        state.waiting_for = []
        if state.generation == 0:
            return _start(state, tick, settings, 1)
        _enter(state, "backoff", tick.now)
        return _backoff(state, tick, settings)
    events = []
    what = [*missing, *(["the Ray cluster"] if ray_short else [])]
    if what != state.waiting_for:
        state.waiting_for = what
        reason = f"waiting for {_names(missing)} to report" if missing else ""
        if ray_short:
            reason += ("; " if reason else "") + "waiting for every node to be alive in the Ray cluster"
        events.append(_event(state, tick, "waiting", f"{reason} (up to {settings.node_wait_s:g} s)"))
    if tick.now - state.phase_since > settings.node_wait_s:
        gone = _names(missing) if missing else "the Ray cluster"
        events += _give_up(state, tick, settings, f"{gone} did not come back within {settings.node_wait_s:g} s")
    return events


def _backoff(state: State, tick: Tick, settings: Settings) -> list[Event]:
    if _missing(tick, settings):
        _enter(state, "waiting", tick.now)
        return []
    if tick.now - state.phase_since < backoff_delay(state.attempts + 1, settings):
        return []
    state.attempts += 1
    state.restarts += 1
    delay = backoff_delay(state.attempts, settings)
    started = _start(state, tick, settings, state.generation + 1)
    reason = f"restart {state.attempts} of at most {settings.max_restarts} in a row"
    return [_event(state, tick, "restarting", reason, data={"backoff_s": delay}), *started]


def _start(state: State, tick: Tick, settings: Settings, generation: int) -> list[Event]:
    state.generation = generation
    state.instances = {n: tick.agents[n].report.instance for n in settings.nodes if n in tick.agents}
    state.boots = {n: tick.agents[n].report.boot for n in settings.nodes if n in tick.agents}
    state.baseline = {}
    state.suspects = {}
    state.ready_at = None
    _enter(state, "starting", tick.now)
    return [_event(state, tick, "started", f"generation {generation} ordered on {_names(list(settings.nodes))}")]


def _starting(state: State, tick: Tick, settings: Settings) -> list[Event]:
    problem = _node_failure(state, tick, settings)
    if problem is not None:
        return _fail(state, tick, settings, *problem)
    if tick.verdicts is not None and _ready(tick.verdicts, settings):
        took = tick.now - state.phase_since
        data = {"start_s": round(took, 1)}
        if state.failure_at is not None:
            data["recovery_s"] = round(tick.now - state.failure_at, 1)
        state.failure_at = None
        state.ready_at = tick.now
        state.baseline = {
            n: sorted({e.title for e in seen.report.engines}) for n, seen in tick.agents.items() if n in settings.nodes
        }
        _enter(state, "serving", tick.now)
        reason = f"serving: /health answers and {_count(settings.engines, 'engine')} reported ({took:.0f} s)"
        return [_event(state, tick, "ready", reason, data=data)]
    if tick.now - state.phase_since > settings.ready_s:
        return _fail(state, tick, settings, f"not ready after {settings.ready_s:g} s", None)
    return []


def _serving(state: State, tick: Tick, settings: Settings) -> list[Event]:
    if state.ready_at is not None and state.attempts and tick.now - state.ready_at >= settings.stable_s:
        state.attempts = 0  # served long enough: the next failure is a first one again
    problem = _node_failure(state, tick, settings) or _engine_failure(state, tick, settings)
    if problem is not None:
        return _fail(state, tick, settings, *problem)
    return []


def _stopping(state: State, tick: Tick, settings: Settings) -> list[Event]:
    if _all_stopped(tick, settings, exiting=False) or tick.now - state.phase_since > settings.stop_timeout_s:
        _enter(state, "waiting", tick.now)
        state.waiting_for = []
        return _waiting(state, tick, settings)
    return []


def _giving_up(state: State, tick: Tick, settings: Settings) -> list[Event]:
    if _all_stopped(tick, settings, exiting=True) or tick.now - state.phase_since > settings.stop_timeout_s:
        _enter(state, "given-up", tick.now)
        state.exit_code = GIVE_UP_EXIT
        reason = f"gave up after {state.attempts} restart(s) in a row: {state.final_reason}"
        return [_event(state, tick, "given-up", reason, details=tuple(state.last_tail))]
    return []


def _shutting_down(state: State, tick: Tick, settings: Settings) -> list[Event]:
    if _all_stopped(tick, settings, exiting=True) or tick.now - state.phase_since > settings.stop_timeout_s:
        _enter(state, "stopped", tick.now)
        state.exit_code = 0
        return [_event(state, tick, "stopped", state.final_reason or "stopped")]
    return []


_HANDLERS = {
    "waiting": _waiting,
    "backoff": _backoff,
    "starting": _starting,
    "serving": _serving,
    "stopping": _stopping,
    "giving-up": _giving_up,
    "shutting-down": _shutting_down,
}


# ---- failures -----------------------------------------------------------------------------------


def _node_failure(state: State, tick: Tick, settings: Settings) -> tuple[str, str | None] | None:
    for node in settings.nodes:
        seen = tick.agents.get(node)
        last = max(seen.t if seen else tick.started, tick.started)
        if tick.now - last > settings.agent_timeout_s:
            return f"node {node} stopped reporting {tick.now - last:.0f} s ago (its container died?)", node
        if seen is None:
            continue
        report = seen.report
        if state.instances.get(node) != report.instance:
            if state.boots.get(node) not in (None, report.boot):
                return f"node {node} restarted (its container started again)", node
            return f"the agent on node {node} restarted", node
        if report.generation == state.generation and not report.running and report.exit_code is not None:
            return f"vllm serve exited on node {node} (code {report.exit_code})", node
    return None


def _engine_failure(state: State, tick: Tick, settings: Settings) -> tuple[str, str | None] | None:
    """A process of the ready group gone from its node, or a bad liveness verdict. Both must last
    confirm_s (a hung verdict already covers liveness_s of evidence); suspects about the API are
    kept, unconfirmed, through a tick that did not observe it."""
    procs: dict[str, tuple[str, str | None]] = {}
    for node, titles in state.baseline.items():
        seen = tick.agents.get(node)
        live = {e.title for e in seen.report.engines} if seen else set(titles)
        for title in titles:
            if title not in live:
                procs[f"proc:{node}:{title}"] = (f"process {title} is gone from node {node}", node)
    api: dict[str, tuple[str, str | None]] | None = None
    if tick.verdicts is not None:
        api = {}
        for verdict in tick.verdicts:
            if verdict.state == "hung":
                return f"engine {verdict.engine} hung: {verdict.reason}", None
            if verdict.state == "api-down":
                api["api"] = (f"the API server is down: {verdict.reason}", "head")
            elif verdict.state == "dead":
                api[f"dead:{verdict.engine}"] = (f"engine {verdict.engine} is dead: {verdict.reason}", None)
    state.suspects = {
        key: since
        for key, since in state.suspects.items()
        if (key in procs if key.startswith("proc:") else api is None or key in api)
    }
    for key, problem in {**procs, **(api or {})}.items():
        first = state.suspects.setdefault(key, tick.now)
        if tick.now - first >= settings.confirm_s:
            return problem
    return None


def _fail(state: State, tick: Tick, settings: Settings, reason: str, node: str | None) -> list[Event]:
    found = _cause_of(state, tick, node)
    if found:
        reason = f"{reason}; first error: {found}"  # the cause, not the shutdown noise (issue 25)
    state.last_failure, state.last_failure_ts = reason, tick.wall
    if state.failure_at is None:
        state.failure_at = tick.now
    state.last_tail = _tail_of(tick, node)
    detected = _event(state, tick, "detected", reason, node=node, details=tuple(state.last_tail))
    if state.attempts >= settings.max_restarts:
        return [detected, *_give_up(state, tick, settings, reason)]
    _enter(state, "stopping", tick.now)
    what = f"stopping every node ({_names(list(settings.nodes))}) before restart {state.attempts + 1}"
    return [detected, _event(state, tick, "stopping", what)]


def _give_up(state: State, tick: Tick, settings: Settings, reason: str) -> list[Event]:
    state.final_reason = reason
    _enter(state, "giving-up", tick.now)
    return _giving_up(state, tick, settings)


# ---- helpers ------------------------------------------------------------------------------------


def _ready(verdicts: Sequence[Verdict], settings: Settings) -> bool:
    states = {v.engine: v.state for v in verdicts}
    if any(s == "api-down" for s in states.values()):
        return False
    return all(states.get(engine) not in (None, "dead") for engine in settings.engines)


def _missing(tick: Tick, settings: Settings) -> list[str]:
    return [
        n
        for n in settings.nodes
        if n not in tick.agents
        or tick.now - tick.agents[n].t > settings.agent_timeout_s
        or tick.agents[n].report.exiting
    ]


def _all_stopped(tick: Tick, settings: Settings, *, exiting: bool) -> bool:
    """Every node that still reports has nothing running (and, when exiting, has said goodbye);
    a node that stopped reporting has nothing to wait for."""
    for node in settings.nodes:
        seen = tick.agents.get(node)
        if seen is None or tick.now - seen.t > settings.agent_timeout_s:
            continue
        if not seen.report.stopped or (exiting and not seen.report.exiting):
            return False
    return True


def _cause_of(state: State, tick: Tick, node: str | None) -> str | None:
    """The first error in this generation's serve log (kit.supervise.cause, read by the agents):
    the failing node's, else the first node's that has one (the failure seen on one node is often
    caused on another: the head's API goes down when a worker's rank fails)."""
    for name in (node, *sorted(tick.agents, key=lambda n: n != "head")):
        seen = tick.agents.get(name) if name else None
        if seen is not None and seen.report.cause and seen.report.generation == state.generation:
            return seen.report.cause
    return None


def _tail_of(tick: Tick, node: str | None) -> list[str]:
    for name in (node, "head"):
        seen = tick.agents.get(name) if name else None
        if seen is not None and seen.report.log_tail:
            return list(seen.report.log_tail)
    return []


def _enter(state: State, phase: str, now: float) -> None:
    state.phase, state.phase_since = phase, now


def _event(
    state: State,
    tick: Tick,
    kind: str,
    reason: str,
    *,
    node: str | None = None,
    data: Mapping[str, Any] | None = None,
    details: tuple[str, ...] = (),
) -> Event:
    return Event(
        ts=tick.wall,
        kind=kind,
        reason=reason,
        generation=state.generation,
        restarts=state.restarts,
        node=node,
        data=dict(data or {}),
        details=details,
    )


def _names(nodes: Sequence[str]) -> str:
    return ", ".join(nodes) if nodes else "no node"


def _count(items: Sequence[str], word: str) -> str:
    return f"{len(items)} {word}{'s' if len(items) != 1 else ''}"
