"""The coordinator's decision logic (kit/supervise/policy.py), pure: a simulated clock, agents'
reports and liveness verdicts in, events and orders out. Every failure kind of issue 18 is driven
through the whole cycle: detected -> stopping -> waiting -> (backoff) -> restarting -> ready, and
a loop that never gets ready gives up at the limit."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kit.health.liveness import Verdict
from kit.supervise import policy
from kit.supervise.policy import Seen, Settings, State, Tick
from kit.supervise.protocol import EngineProc, Report

SETTINGS = Settings(
    nodes=("head", "worker-1"),
    engines=("0", "1"),
    liveness_s=10,
    ready_s=100,
    max_restarts=2,
    backoff_s=4,
    stable_s=60,
    node_wait_s=50,
)
OK = [Verdict("0", "idle-ok", "idle"), Verdict("1", "idle-ok", "idle")]


class Sim:
    """Agents that obey their orders at once, a clock, and the coordinator's state."""

    def __init__(self, settings: Settings = SETTINGS) -> None:
        self.settings = settings
        self.state = State()
        self.now = 0.0
        self.events: list[Any] = []
        self.agents: dict[str, dict[str, Any]] = {
            node: {
                "instance": f"{node}-a",
                "boot": f"{node}-boot",
                "generation": 0,
                "running": False,
                "exit_code": None,
                "engines": (),
                "up": True,
                "exiting": False,
            }
            for node in settings.nodes
        }
        self.seen: dict[str, Seen] = {}
        self.verdicts: list[Verdict] | None = None
        self.ray: bool | None = None

    def report(self, node: str) -> Report:
        a = self.agents[node]
        return Report(
            node=node,
            instance=a["instance"],
            boot=a["boot"],
            generation=a["generation"],
            running=a["running"],
            exit_code=a["exit_code"],
            stopped=not a["running"],
            engines=a["engines"],
            exiting=a["exiting"],
            log_tail=(f"{node} log line",),
            cause=a.get("cause"),
        )

    def obey(self) -> None:
        for node, a in self.agents.items():
            if not a["up"]:
                continue
            order = policy.order_for(self.state, node, a["instance"])
            if order.action == "run" and a["generation"] != order.generation:
                title = f"VLLM::EngineCore_DP{node[-1:] if node != 'head' else 0}"
                a.update(
                    generation=order.generation, running=True, exit_code=None, engines=(EngineProc(1, "S", title),)
                )
            elif order.action in ("stop", "exit") and a["running"]:
                a.update(running=False, exit_code=-15, engines=())
            if order.action == "exit":
                a["exiting"] = True
            self.seen[node] = Seen(self.report(node), self.now)

    def tick(self, seconds: float = 1.0, verdicts: list[Verdict] | None = None) -> list[Any]:
        self.now += seconds
        self.obey()
        running = any(a["running"] for a in self.agents.values())
        tick = Tick(
            now=self.now,
            wall=1_800_000_000 + self.now,
            agents=dict(self.seen),
            verdicts=verdicts if verdicts is not None else (OK if running else None),
            ray_complete=self.ray,
        )
        new = policy.step(self.state, tick, self.settings)
        self.events += new
        return new

    def run_until(self, kind: str, limit: int = 400, **kw: Any) -> Any:
        for _ in range(limit):
            for event in self.tick(**kw):
                if event.kind == kind:
                    return event
        raise AssertionError(f"no {kind} event; phase {self.state.phase}; events {[e.kind for e in self.events]}")

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]


def ready_sim(settings: Settings = SETTINGS) -> Sim:
    sim = Sim(settings)
    sim.run_until("ready")
    assert sim.state.phase == "serving" and sim.state.generation == 1 and sim.state.restarts == 0
    sim.events.clear()
    return sim


def test_first_start_waits_for_every_node_then_starts_generation_1_without_counting_a_restart() -> None:
    sim = Sim()
    sim.agents["worker-1"]["up"] = False
    sim.tick()
    assert sim.state.phase == "waiting" and sim.kinds() == ["waiting"]
    assert "worker-1" in sim.events[0].reason
    sim.agents["worker-1"]["up"] = True
    ready = sim.run_until("ready")
    assert sim.kinds() == ["waiting", "started", "ready"]
    assert ready.generation == 1 and ready.restarts == 0 and "recovery_s" not in ready.data
    assert {n: a["generation"] for n, a in sim.agents.items()} == {"head": 1, "worker-1": 1}


def test_a_dead_node_is_detected_the_group_stops_and_restarts_once_it_is_back() -> None:
    sim = ready_sim()
    sim.agents["worker-1"]["up"] = False  # docker kill: no more reports
    detected = sim.run_until("detected")
    assert detected.node == "worker-1" and "stopped reporting" in detected.reason
    assert sim.now - 1 <= SETTINGS.agent_timeout_s + 2  # detection within the agent timeout
    sim.run_until("waiting")
    assert not sim.agents["head"]["running"], "the head's rank is stopped with the group"
    for _ in range(10):
        sim.tick()
    assert sim.state.phase == "waiting" and sim.agents["head"]["generation"] == 1
    # The container comes back: a new agent (and boot) on worker-1.
    sim.agents["worker-1"].update(up=True, instance="worker-1-b", boot="worker-1-boot2", running=False, engines=())
    ready = sim.run_until("ready")
    assert sim.kinds() == ["detected", "stopping", "waiting", "restarting", "started", "ready"]
    assert ready.generation == 2 and ready.restarts == 1 and ready.data["recovery_s"] > 10
    assert {n: a["generation"] for n, a in sim.agents.items()} == {"head": 2, "worker-1": 2}


def test_a_node_that_does_not_come_back_gives_up_after_node_wait() -> None:
    sim = ready_sim()
    sim.agents["worker-1"]["up"] = False
    given_up = sim.run_until("given-up")
    assert "worker-1 did not come back within 50 s" in given_up.reason
    assert sim.state.phase == "given-up" and sim.state.exit_code == policy.GIVE_UP_EXIT
    assert sim.agents["head"]["exiting"] and not sim.agents["head"]["running"]


def test_a_restarted_container_is_a_failure_even_before_it_misses_a_report() -> None:
    sim = ready_sim()
    sim.agents["head"].update(instance="head-b", boot="head-boot2", running=False, generation=0, engines=())
    detected = sim.run_until("detected")
    assert detected.reason == "node head restarted (its container started again)"
    assert policy.order_for(sim.state, "head", "head-b").action == "stop"  # never a lone rank
    ready = sim.run_until("ready")
    assert ready.generation == 2


def test_vllm_serve_exiting_carries_its_log_tail() -> None:
    sim = ready_sim()
    sim.agents["head"].update(running=False, exit_code=1)
    detected = sim.run_until("detected")
    assert detected.reason == "vllm serve exited on node head (code 1)"
    assert detected.details == ("head log line",)


def test_a_failure_names_the_first_error_of_its_generation_even_from_another_node() -> None:
    """Issue 25: the cause is the first error (the agents classify their logs), not the shutdown
    noise; the failing node's own, else another node's (a worker's rank takes the head down)."""
    sim = ready_sim()
    sim.agents["worker-1"]["cause"] = "ValueError: bad tensor shape"
    sim.agents["head"].update(running=False, exit_code=1)
    detected = sim.run_until("detected")
    assert detected.reason == "vllm serve exited on node head (code 1); first error: ValueError: bad tensor shape"
    assert sim.state.last_failure == detected.reason


def test_an_engine_process_gone_while_vllm_serve_runs_is_confirmed_then_restarted() -> None:
    sim = ready_sim()
    sim.agents["worker-1"]["engines"] = ()  # kill -9 of the engine; the serve process lives on
    first = sim.tick()
    assert first == [] and sim.state.phase == "serving"  # one look is not enough (confirm_s)
    detected = sim.run_until("detected")
    assert detected.reason == "process VLLM::EngineCore_DP1 is gone from node worker-1"


def test_api_down_is_confirmed_for_confirm_s_and_a_recovered_blip_is_forgotten() -> None:
    sim = ready_sim()
    down = [Verdict("0", "api-down", "/health: refused"), Verdict("1", "api-down", "/health: refused")]
    assert sim.tick(verdicts=down) == []
    sim.tick(verdicts=OK)  # it answered again: the suspicion goes
    assert sim.tick(verdicts=down) == []
    assert sim.tick(seconds=0.5, verdicts=None) == []  # a tick without observation keeps it
    detected = sim.run_until("detected", verdicts=down)
    assert detected.reason == "the API server is down: /health: refused"


def test_a_hung_engine_is_acted_on_at_once() -> None:
    sim = ready_sim()
    hung = [Verdict("0", "idle-ok", "idle"), Verdict("1", "hung", "2 running, 0 waiting and no token for 10 s")]
    detected = sim.tick(verdicts=hung)[0]
    assert detected.kind == "detected" and detected.reason.startswith("engine 1 hung: 2 running")


def test_a_start_that_never_gets_ready_gives_up_at_the_limit_with_backoff() -> None:
    sim = Sim()
    down = [Verdict("0", "api-down", "/health: refused")]
    given_up = sim.run_until("given-up", verdicts=down)
    starts = [e for e in sim.events if e.kind == "started"]
    assert [e.generation for e in starts] == [1, 2, 3]  # the first start and max_restarts=2 restarts
    restarting = [e for e in sim.events if e.kind == "restarting"]
    assert [(e.generation, e.data["backoff_s"]) for e in restarting] == [(2, 0.0), (3, 4.0)]
    assert "not ready after 100 s" in given_up.reason and given_up.restarts == 2
    assert sim.state.exit_code == 6 and all(a["exiting"] for a in sim.agents.values())
    assert policy.order_for(sim.state, "head", "head-a").action == "exit"
    assert policy.order_for(sim.state, "head", "head-a").exit_code == 6


def test_restarts_in_a_row_count_from_zero_again_after_stable_serving() -> None:
    sim = ready_sim()
    for expected_attempts in (1, 2):
        sim.agents["head"].update(running=False, exit_code=1)
        sim.run_until("ready")
        assert sim.state.attempts == expected_attempts
    for _ in range(int(SETTINGS.stable_s) + 2):
        sim.tick()
    assert sim.state.attempts == 0 and sim.state.restarts == 2
    sim.agents["head"].update(running=False, exit_code=1)
    sim.run_until("ready")  # a third failure restarts again instead of giving up
    assert sim.state.restarts == 3


def test_backoff_doubles_from_the_second_restart_and_is_capped() -> None:
    settings = dataclasses.replace(SETTINGS, backoff_s=5, backoff_cap_s=60)
    assert [policy.backoff_delay(n, settings) for n in range(1, 7)] == [0, 5, 10, 20, 40, 60]


def test_ray_waits_for_the_ray_cluster_before_restarting_the_serve_step() -> None:
    settings = dataclasses.replace(SETTINGS, nodes=("head",), engines=("0",), needs_ray=True)
    sim = Sim(settings)
    sim.ray = False
    sim.tick()
    assert sim.state.phase == "waiting" and "Ray cluster" in sim.events[-1].reason
    sim.ray = True
    sim.run_until("ready", verdicts=[Verdict("0", "idle-ok", "idle")])
    sim.agents["head"].update(running=False, exit_code=1)
    sim.ray = False  # a worker is gone: the restart waits for it
    sim.run_until("waiting", verdicts=[Verdict("0", "idle-ok", "idle")])
    for _ in range(5):
        sim.tick()
    assert sim.state.phase == "waiting" and sim.state.generation == 1
    sim.ray = True
    ready = sim.run_until("ready", verdicts=[Verdict("0", "idle-ok", "idle")])
    assert ready.generation == 2


def test_a_stop_request_ends_every_agent_with_code_0() -> None:
    sim = ready_sim()
    tick = Tick(now=sim.now, wall=0, agents=dict(sim.seen))
    policy.request_stop(sim.state, tick, "kit serve was interrupted")
    stopped = sim.run_until("stopped")
    assert stopped.reason == "kit serve was interrupted" and sim.state.exit_code == 0
    assert policy.order_for(sim.state, "worker-1", "worker-1-a").to_dict() == {
        "generation": 1,
        "action": "exit",
        "exit_code": 0,
        "reason": "kit serve was interrupted",
    }


@pytest.mark.parametrize("phase", ["serving", "starting", "backoff", "stopping", "given-up"])
def test_a_resumed_coordinator_goes_on_from_its_state(phase: str) -> None:
    doc = State(phase=phase, generation=3, restarts=2, instances={"head": "head-a"}).to_dict()
    state = State.resumed(doc, now=100.0)
    assert (state.generation, state.restarts, state.instances) == (3, 2, {"head": "head-a"})
    assert state.phase == {"backoff": "stopping", "stopping": "stopping"}.get(phase, phase)
    assert state.phase_since == 100.0


def test_a_resumed_coordinator_counts_an_unseen_agent_from_its_own_start() -> None:
    state = State.resumed(State(phase="serving", generation=1, instances={"head": "h"}).to_dict(), now=1000.0)
    tick = Tick(now=1003.0, wall=0, agents={}, verdicts=None, started=1000.0)
    assert policy.step(state, tick, dataclasses.replace(SETTINGS, nodes=("head",))) == []
    tick = dataclasses.replace(tick, now=1006.0)
    [detected, _] = policy.step(state, tick, dataclasses.replace(SETTINGS, nodes=("head",)))
    assert "node head stopped reporting 6 s ago" in detected.reason
