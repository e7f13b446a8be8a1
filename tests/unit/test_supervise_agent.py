"""The node agent's process handling (kit/supervise/procs.py, agent.py) with stub serve scripts:
real processes, real process groups and signals, real /proc scans. The stub stands in for
`vllm serve`: it starts "engine" children titled like vLLM's (`exec -a VLLM::EngineCore_DP0`),
in its process group as vLLM's are (measured on vLLM 0.32, procs.py's docstring). The coordinator
is a function here (its HTTP side is in test_supervise_control.py)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kit.supervise import procs, protocol
from kit.supervise.agent import Agent, AgentConfig, boot_id
from kit.supervise.protocol import Order

# A stand-in for `vllm serve`: two engines in its process group, then it waits on them.
STUB = """#!/bin/bash
(exec -a VLLM::EngineCore_DP0 sleep 300) &
(exec -a VLLM::Worker_TP1 sleep 300) &
echo "stub serve $$ up"
wait
"""
# One whose engine ignores SIGTERM: only SIGKILL ends it.
STUBBORN = """#!/bin/bash
(trap '' TERM; exec -a VLLM::EngineCore_DP0 sleep 300) &
wait
"""


def wait_for(check: Any, seconds: float = 10.0) -> Any:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "serve.sh").write_text(STUB)
    yield tmp_path
    for line in os.popen("ps -eo pid=,args=").read().splitlines():  # never leave a stub behind
        pid, _, args = line.strip().partition(" ")
        if str(tmp_path) in args:
            os.kill(int(pid), signal.SIGKILL)


def group(workdir: Path, script: str = "serve.sh") -> procs.ServeGroup:
    return procs.ServeGroup(str(workdir / script), str(workdir / "serve.log"))


def in_group_engines(pgid: int) -> list[procs.ProcInfo]:
    return [p for p in procs.engines(procs.all_procs()) if p.pgid == pgid]


def titles(members: list[procs.ProcInfo]) -> set[str]:
    return {p.title for p in members}


def test_the_serve_group_and_its_engines_share_one_process_group(workdir: Path) -> None:
    g = group(workdir)
    pid = g.start(7)
    assert os.getpgid(pid) == pid, "the serve script leads a group of its own"
    engines = wait_for(lambda: len(found := in_group_engines(pid)) == 2 and found)
    assert {p.title for p in engines} == {"VLLM::EngineCore_DP0", "VLLM::Worker_TP1"}
    assert g.running() and len(g.members()) >= 3
    g.stop(grace_s=5)
    assert not g.running() and g.members() == [] and g.exit_code is not None
    log = (workdir / "serve.log").read_text()
    assert "generation 7: starting" in log and "stub serve" in log and "generation 7: stopped" in log


def test_a_stopped_engine_is_seen_as_such_and_still_stopped_with_its_group(workdir: Path) -> None:
    g = group(workdir)
    pid = g.start(1)
    engine = wait_for(lambda: next(iter(in_group_engines(pid)), None))
    os.kill(engine.pid, signal.SIGSTOP)  # the hang of issue 18: /health cannot see it
    assert wait_for(lambda: procs.read_proc(engine.pid).state == "T")  # type: ignore[union-attr]
    killed = g.stop(grace_s=5)
    assert killed == [] and g.members() == [], "SIGCONT first: the stopped engine handles SIGTERM"


def test_a_member_that_ignores_sigterm_is_killed_after_the_grace(workdir: Path) -> None:
    (workdir / "stubborn.sh").write_text(STUBBORN)
    g = group(workdir, "stubborn.sh")
    pid = g.start(1)
    wait_for(lambda: in_group_engines(pid))
    started = time.monotonic()
    killed = g.stop(grace_s=1)
    assert killed and g.members() == []
    assert 1 <= time.monotonic() - started < 8
    assert "1 process(es) killed" in (workdir / "serve.log").read_text()


def test_engines_left_behind_by_a_dead_serve_process_are_still_members(workdir: Path) -> None:
    g = group(workdir)
    pid = g.start(1)
    wait_for(lambda: len(in_group_engines(pid)) == 2)
    os.kill(pid, signal.SIGKILL)  # the leader dies, its engines live on (orphaned)
    wait_for(lambda: not g.running())
    assert g.exit_code == -signal.SIGKILL
    assert titles(g.members()) >= {"VLLM::EngineCore_DP0", "VLLM::Worker_TP1"}
    assert not g.poll_stop()  # not stopped until they are gone
    g.stop(grace_s=5)
    assert g.members() == []


def test_read_proc_keeps_a_title_with_spaces_and_parens(tmp_path: Path) -> None:
    proc = tmp_path / "42"
    proc.mkdir()
    (proc / "stat").write_text("42 (we ird) name)) T 7 42 42 0 -1 4194560 0 0 0 0")
    (proc / "cmdline").write_bytes(b"VLLM::EngineCore_DP3\0")
    assert procs.read_proc(42, str(tmp_path)) == procs.ProcInfo(42, 7, 42, "T", "VLLM::EngineCore_DP3")
    (proc / "cmdline").write_bytes(b"")  # a kernel thread: no cmdline, the comm name
    assert procs.read_proc(42, str(tmp_path)).title == "we ird) name)"  # type: ignore[union-attr]


def test_boot_id_changes_with_the_containers_pid_1(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "sys/kernel/random").mkdir(parents=True)
    (tmp_path / "sys/kernel/random/boot_id").write_text("b00t\n")
    fields = " ".join(["S", *map(str, range(4, 42))])  # each field holds its number: starttime is 22
    (tmp_path / "1/stat").write_text(f"1 (docker-init) {fields}")
    first = boot_id(str(tmp_path))
    (tmp_path / "1/stat").write_text(f"1 (docker-init) {fields.replace(' 22 ', ' 99 ')}")
    assert first == "b00t:22" and boot_id(str(tmp_path)) == "b00t:99"


class FakeCoordinator:
    """Answers each report with the order it is given, and keeps the reports."""

    def __init__(self) -> None:
        self.order = Order(1, "run")
        self.reports: list[dict[str, Any]] = []
        self.down = False

    def __call__(self, doc: dict[str, Any]) -> dict[str, Any]:
        if self.down:
            raise ConnectionRefusedError("refused")
        self.reports.append(protocol.report_from(doc).to_dict())  # what the coordinator would accept
        return self.order.to_dict()


def make_agent(workdir: Path, coordinator: FakeCoordinator, **config: Any) -> Agent:
    cfg = AgentConfig(
        url="http://127.0.0.1:9",
        token="t",
        node="worker-1",
        serve_script=str(workdir / "serve.sh"),
        serve_log=str(workdir / "serve.log"),
        pid_file=str(workdir / "serve.pid"),
        **config,
    )
    return Agent(cfg, post=coordinator, log=lambda _: None, only_own=True)


def test_the_agent_runs_stops_and_reruns_only_on_orders(workdir: Path) -> None:
    coordinator = FakeCoordinator()
    agent = make_agent(workdir, coordinator, grace_s=5)
    assert agent.tick() is None
    pid = agent.group.pid
    assert pid and (workdir / "serve.pid").read_text().strip() == str(pid)
    wait_for(lambda: len(in_group_engines(pid)) == 2)
    agent.tick()
    last = coordinator.reports[-1]
    assert last["generation"] == 1 and last["running"] and not last["stopped"]
    assert {"VLLM::EngineCore_DP0", "VLLM::Worker_TP1"} <= {e["title"] for e in last["engines"]}

    os.kill(pid, signal.SIGKILL)  # the serve process dies: the agent reports it, restarts nothing
    wait_for(lambda: (agent.tick() or True) and not coordinator.reports[-1]["running"])
    assert coordinator.reports[-1]["exit_code"] == -9 and agent.group.pid == pid

    coordinator.order = Order(1, "stop")
    wait_for(lambda: (agent.tick() or True) and coordinator.reports[-1]["stopped"])
    assert not (workdir / "serve.pid").exists()

    coordinator.order = Order(2, "run")  # the coordinator's restart: a new generation
    agent.tick()
    assert agent.group.generation == 2 and agent.group.pid != pid and agent.group.running()

    coordinator.order = Order(2, "exit", 6, "gave up")
    assert agent.tick() == 6
    assert coordinator.reports[-1]["exiting"] and coordinator.reports[-1]["stopped"]
    assert agent.group.members() == []


def test_an_agent_without_its_coordinator_stops_its_group_after_orphan_s_and_resumes_on_orders(
    workdir: Path,
) -> None:
    coordinator = FakeCoordinator()
    now = [0.0]
    agent = make_agent(workdir, coordinator, grace_s=5, orphan_s=30)
    agent.clock = lambda: now[0]
    agent.last_contact = 0.0
    agent.tick()
    assert agent.group.running()
    coordinator.down = True
    now[0] = 20.0
    agent.tick()
    assert agent.group.running(), "a short outage keeps the rank"
    now[0] = 31.0
    agent.tick()
    wait_for(lambda: agent.group.poll_stop())
    assert agent.orphaned
    coordinator.down = False
    coordinator.order = Order(2, "run")
    agent.tick()
    assert agent.group.generation == 2 and agent.group.running()
    agent.shutdown()


def test_the_log_tail_leaves_out_the_coordinators_own_polls(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    lines = [
        "(APIServer pid=11) ERROR EngineCore encountered an issue",
        'INFO:     10.0.0.10:36048 - "GET /health HTTP/1.1" 200 OK',
        'INFO:     10.0.0.10:36052 - "GET /metrics HTTP/1.1" 200 OK',
        'INFO:     10.0.0.10:36060 - "POST /v1/completions HTTP/1.1" 200 OK',
        'INFO:     10.0.0.10:36070 - "GET /health HTTP/1.1" 503 Service Unavailable',
    ]
    log.write_text("\n".join(lines) + "\n\n")
    assert procs.tail(str(log), 10) == [lines[0], lines[3], lines[4]]
    assert procs.tail(str(log), 2, skip=None) == lines[3:]


# ---- issue 25: supervision closes its edges -------------------------------------------------

FAILING = """#!/bin/bash
echo "INFO 11-26 02:21:20 [api_server.py:1] vLLM API server version 0.32.0"
echo "(EngineCore_DP0 pid=12) ERROR 11-26 02:21:21 [core.py:708] EngineCore failed to start."
echo "(EngineCore_DP0 pid=12) ERROR 11-26 02:21:21 [core.py:708] Traceback (most recent call last):"
echo "(EngineCore_DP0 pid=12) ERROR 11-26 02:21:21 [core.py:708] ValueError: max_model_len 99999 is too large"
echo "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
exit 1
"""


def test_each_generation_has_its_own_log_and_its_first_error_is_reported(workdir: Path) -> None:
    (workdir / "serve.sh").write_text(FAILING)
    coordinator = FakeCoordinator()
    agent = make_agent(workdir, coordinator, grace_s=5)
    agent.tick()
    wait_for(lambda: (agent.tick() or True) and coordinator.reports[-1]["stopped"])
    assert coordinator.reports[-1]["cause"] == "ValueError: max_model_len 99999 is too large"
    first = (workdir / "serve.log").read_text()
    assert "generation 1: starting" in first and "generation 1: exited (code 1)" in first
    (workdir / "serve.sh").write_text(STUB)
    coordinator.order = Order(2, "run")
    agent.tick()
    wait_for(lambda: "stub serve" in (workdir / "serve.log").read_text())
    now = (workdir / "serve.log").read_text()
    assert "generation 1" not in now and "generation 2: starting" in now  # the previous run's lines are gone
    assert (workdir / "serve.prev.log").read_text() == first
    agent.tick()
    assert coordinator.reports[-1]["cause"] is None  # this generation has no error
    agent.shutdown()


def test_an_exit_order_and_a_long_silence_end_the_agent_and_its_resume_mark(workdir: Path) -> None:
    """A container started again after supervision gave up (or was stopped) must not bring back
    an agent that waits forever for a coordinator that is gone."""
    resume = workdir / "resume"
    resume.touch()
    coordinator = FakeCoordinator()
    agent = make_agent(workdir, coordinator, grace_s=5, resume_file=str(resume))
    agent.tick()
    coordinator.order = Order(1, "exit", 6, "gave up")
    assert agent.tick() == 6 and not resume.exists()

    resume.touch()  # a resumed agent whose coordinator never answers
    coordinator = FakeCoordinator()
    coordinator.down = True
    now = [0.0]
    agent = make_agent(workdir, coordinator, grace_s=5, orphan_s=30, abandon_s=100, resume_file=str(resume))
    agent.clock = lambda: now[0]
    agent.last_contact = 0.0
    now[0] = 99.0
    assert agent.tick() is None and resume.exists()  # still waiting: a head restart takes time
    now[0] = 101.0
    assert agent.tick() == 0 and not resume.exists()
