"""kit/health/liveness.py: every state and edge of the per-engine judgement, on synthetic series and on
the real scrapes of a DP=2 cluster whose engine 1 was SIGSTOPped (tests/fixtures/metrics/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kit.health import liveness
from kit.health import prometheus as metrics
from kit.health.liveness import EngineSample, Observation, Probe, Verdict, judge

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
LIVENESS = 30.0


def busy(tokens: float | None, running: float = 2, waiting: float = 1, prompt: float | None = 0) -> EngineSample:
    return EngineSample(running=running, waiting=waiting, generation_tokens=tokens, prompt_tokens=prompt)


def idle(tokens: float = 100) -> EngineSample:
    return EngineSample(running=0, waiting=0, generation_tokens=tokens, prompt_tokens=50)


def series(*points: tuple[float, dict[str, EngineSample]]) -> list[Observation]:
    return [Observation(t=t, engines=engines) for t, engines in points]


def states(verdicts: list[Verdict]) -> dict[str, str]:
    return {v.engine: v.state for v in verdicts}


def test_serving_while_tokens_advance() -> None:
    history = series((0, {"0": busy(10)}), (10, {"0": busy(20)}), (20, {"0": busy(35)}))
    [verdict] = judge(history, expected=["0"], liveness_s=LIVENESS)
    assert verdict == Verdict("0", "serving", "2 running, 1 waiting; tokens advancing")


def test_busy_without_progress_is_serving_until_liveness_then_hung() -> None:
    history = series((0, {"0": busy(10)}), (10, {"0": busy(20)}), (20, {"0": busy(20)}), (35, {"0": busy(20)}))
    [verdict] = judge(history, expected=["0"], liveness_s=LIVENESS)
    assert verdict.state == "serving" and "no new token for 25 s (liveness 30 s)" in verdict.reason
    history.append(Observation(t=40, engines={"0": busy(20)}))
    [verdict] = judge(history, expected=["0"], liveness_s=LIVENESS)
    assert verdict.state == "hung"
    assert verdict.reason == "2 running, 1 waiting and no token generated for 30 s (liveness 30 s)"


def test_a_long_prefill_is_progress_even_without_generated_tokens() -> None:
    history = series(*((t, {"0": busy(5, prompt=1000 + t)}) for t in range(0, 100, 10)))
    assert states(judge(history, expected=["0"], liveness_s=LIVENESS)) == {"0": "serving"}


def test_work_that_just_arrived_on_an_idle_engine_starts_the_clock_then() -> None:
    # idle for a long time with a flat counter, then requests: not hung at once
    history = series(*((t, {"0": idle(100)}) for t in range(0, 100, 10)), (100, {"0": busy(100)}))
    [verdict] = judge(history, expected=["0"], liveness_s=LIVENESS)
    assert verdict.state == "serving" and "no new token for 0 s" not in verdict.reason


def test_counter_reset_after_a_restart_is_progress_then_a_flat_zero_hangs() -> None:
    history = series((0, {"0": busy(500)}), (20, {"0": busy(500)}), (29, {"0": busy(0)}))
    assert states(judge(history, expected=["0"], liveness_s=LIVENESS)) == {"0": "serving"}
    history += series((45, {"0": busy(0)}), (59, {"0": busy(0)}))
    [verdict] = judge(history, expected=["0"], liveness_s=LIVENESS)
    assert verdict.state == "hung" and "for 30 s" in verdict.reason


def test_a_gap_in_the_metrics_restarts_the_stall_clock() -> None:
    history = series((0, {"0": busy(5)}), (20, {"0": busy(5)}))
    history.append(Observation(t=25, engines={}, metrics_error="timed out"))
    history += series((40, {"0": busy(5)}), (50, {"0": busy(5)}))
    assert states(judge(history, expected=["0"], liveness_s=LIVENESS)) == {"0": "serving"}


def test_idle_states_depend_on_the_latest_recent_probe() -> None:
    history = series((0, {"0": idle(), "1": idle()}), (10, {"0": idle(), "1": idle()}))
    assert {v.reason for v in judge(history, expected=["0", "1"], liveness_s=LIVENESS)} == {"idle; not probed yet"}
    probes = [
        Probe(t=1, engine="1", error="did not answer within 5 s"),
        Probe(t=8, engine=None, error=None, latency_s=0.02),
        Probe(t=9, engine="1", error=None, latency_s=0.5),
    ]
    verdicts = judge(history, expected=["0", "1"], liveness_s=LIVENESS, probes=probes)
    assert [v.reason for v in verdicts] == [
        "idle; a one-token request (engine chosen by the server) answered in 0.02 s",
        "idle; a one-token request pinned to engine 1 answered in 0.50 s",
    ]
    # a pinned failure wins over a later server-wide success: it says which engine is stuck
    probes += [Probe(t=9.5, engine="1", error="did not answer within 5 s"), Probe(t=9.8, engine=None, error=None)]
    assert states(judge(history, expected=["0", "1"], liveness_s=LIVENESS, probes=probes)) == {
        "0": "idle-ok",
        "1": "hung",
    }
    # a probe older than the liveness window no longer counts
    old = [Probe(t=-100, engine=None, error="refused")]
    assert states(judge(history, expected=["0", "1"], liveness_s=LIVENESS, probes=old)) == {
        "0": "idle-ok",
        "1": "idle-ok",
    }


def test_a_failed_probe_does_not_overrule_an_engine_that_generates() -> None:
    history = series((0, {"0": busy(1)}), (10, {"0": busy(9)}))
    probes = [Probe(t=9, engine=None, error="did not answer within 5 s")]
    assert states(judge(history, expected=["0"], liveness_s=LIVENESS, probes=probes)) == {"0": "serving"}


def test_real_scrapes_of_a_stopped_idle_engine_need_the_pinned_probe() -> None:
    """Engine 1 was SIGSTOPped with 5 requests queued on it, yet its frozen gauges say idle
    (tests/fixtures/metrics/README.md). Four identical scrapes 5 s apart, as recorded."""
    stopped = metrics.engines(metrics.parse((FIXTURES / "vllm-0.32.0-cpu-dp2-engine1-stopped.prom").read_text()))
    samples = {engine: EngineSample.from_stats(stats) for engine, stats in stopped.items()}
    history = [Observation(t=t, engines=samples) for t in (5.0, 10.0, 15.0, 20.0)]
    assert liveness.idle_engines(history[-1]) == ["0", "1"]
    # gauges alone: both look fine, /health said 200 throughout
    assert states(judge(history, expected=["0", "1"], liveness_s=10)) == {"0": "idle-ok", "1": "idle-ok"}
    probes = [Probe(t=18.0, engine="0", error=None, latency_s=0.015), Probe(t=18.0, engine="1", error="timed out")]
    verdicts = judge(history, expected=["0", "1"], liveness_s=10, probes=probes)
    assert states(verdicts) == {"0": "idle-ok", "1": "hung"}
    assert verdicts[1].reason == "idle, but a one-token request pinned to engine 1 failed: timed out"


def test_dead_when_the_plan_expects_an_engine_the_metrics_lack_or_the_caller_knows_it_gone() -> None:
    history = series((0, {"0": idle()}))
    verdicts = judge(history, expected=["0", "1"], liveness_s=LIVENESS)
    assert verdicts[1] == Verdict("1", "dead", "engine 1 is missing from /metrics (the plan expects engines 0,1)")
    gone = {"0": "no VLLM::EngineCore_DP0 process in kit-c-head"}
    assert judge(history, expected=["0"], liveness_s=LIVENESS, gone=gone)[0] == Verdict("0", "dead", gone["0"])


def test_api_down_for_every_engine_when_health_or_metrics_fail() -> None:
    history = series((0, {"0": busy(1), "1": busy(1)}))
    history.append(Observation(t=5, engines={}, health_error="cannot reach http://h:8000/health: connection refused"))
    verdicts = judge(history, expected=["0", "1"], liveness_s=LIVENESS)
    assert states(verdicts) == {"0": "api-down", "1": "api-down"}
    assert verdicts[0].reason == "/health: cannot reach http://h:8000/health: connection refused"
    history.append(Observation(t=6, engines={}, metrics_error="http://h:8000/metrics answered 500"))
    assert (
        judge(history, expected=["0"], liveness_s=LIVENESS)[0].reason == "/metrics: http://h:8000/metrics answered 500"
    )
    assert liveness.idle_engines(history[-1]) == []


def test_single_engine_server_without_engine_label_is_engine_0() -> None:
    scrape = metrics.parse('vllm:num_requests_running{model_name="m"} 0\nvllm:generation_tokens_total 5\n')
    samples = {e: EngineSample.from_stats(s) for e, s in metrics.engines(scrape).items()}
    history = [Observation(t=0, engines=samples)]
    assert states(judge(history, expected=list(liveness.plan_engines(1, 1, "mp")), liveness_s=LIVENESS)) == {
        "0": "idle-ok"
    }


def test_nan_gauges_leave_the_load_unknown_and_the_probe_decides() -> None:
    unknown = EngineSample(running=None, waiting=None, generation_tokens=7)
    history = series((0, {"0": unknown}), (40, {"0": unknown}))
    [verdict] = judge(history, expected=["0"], liveness_s=LIVENESS)
    assert verdict == Verdict("0", "idle-ok", "load not reported; not probed yet")
    probes = [Probe(t=39, engine=None, error="did not answer within 5 s")]
    assert judge(history, expected=["0"], liveness_s=LIVENESS, probes=probes)[0].state == "hung"
    no_counter = series((0, {"0": busy(None, prompt=None)}), (100, {"0": busy(None, prompt=None)}))
    [verdict] = judge(no_counter, expected=["0"], liveness_s=LIVENESS)
    assert verdict.state == "serving" and "progress not measurable" in verdict.reason


def test_an_engine_asleep_on_purpose_and_an_engine_outside_the_plan() -> None:
    asleep = EngineSample(running=0, waiting=3, generation_tokens=1, awake=False)
    history = series((0, {"0": asleep, "7": idle()}), (100, {"0": asleep, "7": idle()}))
    verdicts = judge(history, expected=["0"], liveness_s=LIVENESS)
    assert verdicts == [
        Verdict("0", "idle-ok", "asleep (vLLM sleep mode)"),
        Verdict("7", "idle-ok", "idle; not probed yet (an engine the plan does not have)"),
    ]


def test_worst_orders_states_and_plan_engines_places_ranks() -> None:
    make = [Verdict("0", "idle-ok", ""), Verdict("1", "hung", ""), Verdict("2", "serving", "")]
    assert liveness.worst(make) == "hung" and liveness.worst([]) is None
    assert liveness.worst([*make, Verdict("3", "dead", "")]) == "dead"
    assert liveness.plan_engines(4, 2, "mp") == {"0": 0, "1": 0, "2": 1, "3": 1}
    assert liveness.plan_engines(2, 1, "ray") == {"0": None, "1": None}
    assert liveness.plan_engines(1, 1, "mp") == {"0": 0}


def test_judge_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        judge([], expected=["0"], liveness_s=LIVENESS)
    with pytest.raises(ValueError):
        judge(series((0, {})), expected=["0"], liveness_s=0)
