"""Is each engine serving? A pure judgement over what kit/health/observe.py saw: /health, per-engine
samples of vLLM's metrics over time, and one-token probes.

States, per engine (= DP rank):
- `api-down`: /health or /metrics did not answer (or answered nonsense) at the latest observation;
- `dead`: the plan expects the engine but the metrics do not show it (or the caller knows its
  process is gone, e.g. from a process scan of its node);
- `hung`: requests running or waiting and no token progress for `liveness_s` seconds; or idle and
  the latest one-token probe got no answer in time;
- `serving`: requests in flight and tokens advancing (or not yet stalled for `liveness_s`);
- `idle-ok`: no requests, and the latest probe (if any) answered.

Why both rules for `hung`, measured on vLLM 0.32's CPU build with DP=2 (the scrapes are in
tests/fixtures/metrics/): an engine's gauges are published by the engine itself, so when it stops
(SIGSTOP) they freeze at their last values. Stopped while busy, it shows `running > 0` with a flat
token counter (the first rule). Stopped while idle, it keeps showing 0 running, 0 waiting while the
API server's load balancer queues requests on it, and /health still answers 200: only a request
pinned to that engine (the `X-data-parallel-rank` header, kit/health/observe.py) can tell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from kit.health.prometheus import EngineStats

State = Literal["api-down", "dead", "hung", "serving", "idle-ok"]
# Worst first: the state a group takes when its engines disagree.
SEVERITY: tuple[State, ...] = ("api-down", "dead", "hung", "serving", "idle-ok")


@dataclass(frozen=True)
class EngineSample:
    """What liveness needs of one engine at one scrape (None: not reported, or NaN)."""

    running: float | None
    waiting: float | None
    generation_tokens: float | None  # counters: progress is any change (a reset too)
    prompt_tokens: float | None = None  # a long prefill advances this one only
    awake: bool | None = None

    @classmethod
    def from_stats(cls, stats: EngineStats) -> EngineSample:
        return cls(stats.running, stats.waiting, stats.generation_tokens, stats.prompt_tokens, stats.awake)

    @property
    def busy(self) -> bool | None:
        """Requests running or waiting; None when the engine reports neither gauge."""
        if self.running is None and self.waiting is None:
            return None
        return (self.running or 0) + (self.waiting or 0) > 0


@dataclass(frozen=True)
class Observation:
    """One look at the server at time t (seconds, one monotonic clock for a whole history)."""

    t: float
    engines: Mapping[str, EngineSample]
    health_error: str | None = None  # None: /health answered 200
    metrics_error: str | None = None  # None: /metrics answered and parsed


@dataclass(frozen=True)
class Probe:
    """A one-token generation sent at time t. `engine`: the DP rank it was pinned to, None when
    the server's load balancer chose. `error`: None when the token came back before the deadline."""

    t: float
    engine: str | None
    error: str | None
    latency_s: float | None = None


@dataclass(frozen=True)
class Verdict:
    engine: str
    state: State
    reason: str  # one line

    def to_dict(self) -> dict[str, str]:
        return {"engine": self.engine, "state": self.state, "reason": self.reason}


def plan_engines(dp: int, dp_local: int, backend: str) -> dict[str, int | None]:
    """The engines the plan runs (DP ranks as vLLM labels them) and the node rank of each: with
    the mp backend node k runs ranks k×dp_local … (k+1)×dp_local−1; with Ray, Ray places them (None)."""
    return {str(rank): (rank // max(1, dp_local) if backend == "mp" else None) for rank in range(max(1, dp))}


def idle_engines(observation: Observation) -> list[str]:
    """Engines to probe now: reachable, and reporting no request running or waiting."""
    if observation.health_error or observation.metrics_error:
        return []
    return [engine for engine, sample in observation.engines.items() if sample.busy is False]


def judge(
    history: Sequence[Observation],
    *,
    expected: Sequence[str],
    liveness_s: float,
    probes: Sequence[Probe] = (),
    gone: Mapping[str, str] | None = None,
) -> list[Verdict]:
    """A verdict for every expected engine and every engine the latest metrics show (the plan's
    first). `history` is oldest first; only its last `liveness_s` seconds and the latest probe
    (per engine, else server-wide) within them count. `gone`: engine -> why it is known dead."""
    if not history:
        raise ValueError("judge needs at least one observation")
    if liveness_s <= 0:
        raise ValueError(f"liveness_s must be positive, got {liveness_s}")
    latest = history[-1]
    seen = [e for e in latest.engines if e not in expected]
    names = list(expected) + seen
    return [_judge_one(e, history, list(expected), liveness_s, probes, gone or {}, e in seen) for e in names]


def _judge_one(
    engine: str,
    history: Sequence[Observation],
    expected: list[str],
    liveness_s: float,
    probes: Sequence[Probe],
    gone: Mapping[str, str],
    unplanned: bool,
) -> Verdict:
    latest = history[-1]
    if latest.health_error or latest.metrics_error:
        what = f"/health: {latest.health_error}" if latest.health_error else f"/metrics: {latest.metrics_error}"
        return Verdict(engine, "api-down", what)
    if engine in gone:
        return Verdict(engine, "dead", gone[engine])
    sample = latest.engines.get(engine)
    if sample is None:
        return Verdict(engine, "dead", f"engine {engine} is missing from /metrics (the plan expects {_list(expected)})")
    state, reason = _state(engine, sample, history, liveness_s, probes)
    return Verdict(engine, state, reason + (" (an engine the plan does not have)" if unplanned else ""))


def _state(
    engine: str, sample: EngineSample, history: Sequence[Observation], liveness_s: float, probes: Sequence[Probe]
) -> tuple[State, str]:
    load = f"{_num(sample.running)} running, {_num(sample.waiting)} waiting"
    if sample.awake is False:
        return "idle-ok", "asleep (vLLM sleep mode)"
    now = history[-1].t
    if sample.busy:
        if sample.generation_tokens is None and sample.prompt_tokens is None:
            return "serving", f"{load}; no token counter, progress not measurable"
        stalled = now - _stalled_since(engine, history)
        if stalled >= liveness_s:
            return "hung", f"{load} and no token generated for {stalled:.0f} s (liveness {liveness_s:g} s)"
        if stalled > 0:
            return "serving", f"{load}; no new token for {stalled:.0f} s (liveness {liveness_s:g} s)"
        return "serving", f"{load}; tokens advancing"
    probe = _latest_probe(engine, probes, since=now - liveness_s)
    idle = "idle" if sample.busy is False else "load not reported"
    if probe is None:
        return "idle-ok", f"{idle}; not probed yet"
    pinned = f"pinned to engine {engine}" if probe.engine is not None else "(engine chosen by the server)"
    if probe.error is not None:
        return "hung", f"{idle}, but a one-token request {pinned} failed: {probe.error}"
    took = f" in {probe.latency_s:.2f} s" if probe.latency_s is not None else ""
    return "idle-ok", f"{idle}; a one-token request {pinned} answered{took}"


def _stalled_since(engine: str, history: Sequence[Observation]) -> float:
    """The time of the oldest sample of the trailing run in which the engine stayed busy with its
    token counters unchanged (a counter reset is a change: the engine restarted)."""
    latest = history[-1].engines[engine]
    since = history[-1].t
    for obs in reversed(history[:-1]):
        sample = obs.engines.get(engine)
        if obs.metrics_error or obs.health_error or sample is None:
            break
        if not sample.busy or _progress(sample) != _progress(latest):
            break
        since = obs.t
    return since


def _progress(sample: EngineSample) -> tuple[float | None, float | None]:
    return sample.generation_tokens, sample.prompt_tokens


def _latest_probe(engine: str, probes: Sequence[Probe], *, since: float) -> Probe | None:
    """The latest recent probe pinned to this engine, else the latest recent server-wide one."""
    for pinned in (True, False):
        mine = [p for p in probes if p.t >= since and (p.engine == engine if pinned else p.engine is None)]
        if mine:
            return max(mine, key=lambda p: p.t)
    return None


def worst(verdicts: Sequence[Verdict]) -> State | None:
    """The most severe state among the verdicts (None for none)."""
    states = {v.state for v in verdicts}
    return next((s for s in SEVERITY if s in states), None)


def _num(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def _list(engines: Sequence[str]) -> str:
    return "engines " + ",".join(engines) if engines else "no engine"
