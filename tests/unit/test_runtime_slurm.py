"""SLURM job control (kit/runtime/slurm.py, formerly kit/slurm_ctl.py): the pure parsers on output
recorded from this machine's real SLURM (slurm-wlm, tests/infra/slurm.sh), and the adapter's
submit/status/cancel flow against scripted fake sbatch/squeue/scontrol/scancel on PATH (a job
that leaves the queue after scancel; the real SLURM runs in tests/slurm/test_slurm_real.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kit.errors import CommandError, RuntimeUnavailable, UsageError
from kit.runtime import get_job_control
from kit.runtime.slurm import (
    CancelResult,
    JobStatus,
    Slurm,
    check_job_id,
    output_marks,
    parse_job_files,
    parse_sbatch,
    parse_squeue,
)

# Recorded 2026-11-25 on this machine: `squeue -h -j 3 -o SQUEUE_FORMAT` and `scontrol show job 3`
# of a one-node batch job (slurm-wlm 22.05.8, Debian 12.13).
SQUEUE_RUNNING = "3|RUNNING|0:03|1:57|1|vm|kit-rt-capture|debug\n"
SCONTROL_RUNNING = """JobId=3 JobName=kit-rt-capture
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   Partition=debug AllocNode:Sid=localhost:12277
   NodeList=vm
   Command=/tmp/rt-slurm/job.sh
   WorkDir=/tmp/rt-slurm
   StdErr=/tmp/rt-slurm/job-3.out
   StdIn=/dev/null
   StdOut=/tmp/rt-slurm/job-3.out
   Power=
"""


def test_parsers_on_recorded_output() -> None:
    assert parse_squeue(SQUEUE_RUNNING, "3") == {
        "job_id": "3",
        "state": "RUNNING",
        "elapsed": "0:03",
        "time_left": "1:57",
        "nodes": "1",
        "nodelist_or_reason": "vm",
        "name": "kit-rt-capture",
        "partition": "debug",
    }
    assert parse_squeue(SQUEUE_RUNNING, "4") is None and parse_squeue("", "3") is None
    assert parse_squeue("3|PENDING|0:00|1:00|2|(Resources)|a|b|c\n", "3") == {
        **parse_squeue(SQUEUE_RUNNING, "3"),  # type: ignore[dict-item]
        "state": "PENDING",
        "elapsed": "0:00",
        "time_left": "1:00",
        "nodes": "2",
        "nodelist_or_reason": "(Resources)",
        "name": "a",
        "partition": "b|c",  # the last field keeps any further '|'
    }
    assert parse_job_files(SCONTROL_RUNNING) == {
        "stdout": "/tmp/rt-slurm/job-3.out",
        "stderr": "/tmp/rt-slurm/job-3.out",
        "workdir": "/tmp/rt-slurm",
    }
    assert parse_sbatch("4242\n") == "4242" and parse_sbatch("4242;cluster\n") == "4242"
    assert parse_sbatch("Submitted batch job 3\n") is None and parse_sbatch("") is None
    assert output_marks(["noise", "  KIT_READY role=head rank=0", "kit: error: x"]) == [
        "KIT_READY role=head rank=0",
        "kit: error: x",
    ]


@pytest.mark.parametrize("job", ["", "12a", "1;rm", "-1", "1_"])
def test_bad_job_ids_are_usage_errors(job: str) -> None:
    with pytest.raises(UsageError, match="is not a SLURM job id"):
        check_job_id(job)
    with pytest.raises(UsageError):
        Slurm().status(job)


FAKE_SLURM = {
    "sbatch": 'echo "4242;local"\n',
    # the job is queued until scancel touches $KIT_FAKE_DIR/cancelled; then squeue calls it invalid
    "squeue": """if [ -e "$KIT_FAKE_DIR/cancelled" ]; then
  echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1
fi
if [ -e "$KIT_FAKE_DIR/down" ]; then echo "squeue: error: Unable to contact slurm controller" >&2; exit 1; fi
echo "4242|RUNNING|0:10|9:50|1|vm|kit|debug"
""",
    "scontrol": """echo "JobId=4242 JobName=kit"
echo "   StdErr=$KIT_FAKE_DIR/job.out"
echo "   StdOut=$KIT_FAKE_DIR/job.out"
""",
    "scancel": 'echo "$@" >> "$KIT_FAKE_DIR/scancel.log"; touch "$KIT_FAKE_DIR/cancelled"\n',
}


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in FAKE_SLURM.items():
        (bindir / name).write_text("#!/bin/sh\n" + body)
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("KIT_FAKE_DIR", str(tmp_path))
    return tmp_path


def test_submit_status_cancel(fake_slurm: Path) -> None:
    removed: list[str] = []

    def remove_containers(job: str) -> list[str]:
        removed.append(job)
        return ["kit-c-head"]

    slurm = Slurm(remove_containers=remove_containers)
    assert slurm.submit(fake_slurm / "x.sbatch") == "4242"
    (fake_slurm / "job.out").write_text("noise\nKIT_READY role=head rank=0\nKIT_SERVER_READY url=http://vm:8000\n")
    status = slurm.status("4242")
    assert isinstance(status, JobStatus) and status.in_queue and status.state == "RUNNING"
    assert status.server_ready == "KIT_SERVER_READY url=http://vm:8000"
    assert status.to_dict()["marks"] == ["KIT_READY role=head rank=0", "KIT_SERVER_READY url=http://vm:8000"]
    assert json.loads(json.dumps(status.to_dict()))["queue"]["nodelist_or_reason"] == "vm"
    assert status.render().splitlines()[:2] == ["job 4242: RUNNING", "  nodes 1 (vm), elapsed 0:10, left 9:50"]

    lines: list[str] = []
    done = slurm.cancel("4242", timeout=5, on_progress=lines.append)
    assert isinstance(done, CancelResult)
    assert (done.was_in_queue, done.state_before, done.gone, done.containers_removed) == (
        True,
        "RUNNING",
        True,
        ("kit-c-head",),
    )
    assert (fake_slurm / "scancel.log").read_text() == "4242\n" and removed == ["4242"]
    assert lines == ["job 4242: scancel sent (RUNNING); waiting for it to leave the queue"]
    assert done.render() == "job 4242: cancelled (RUNNING) and gone from the queue; removed 1 container(s): kit-c-head"

    again = slurm.cancel("4242", timeout=5)  # idempotent: no second scancel
    assert not again.was_in_queue and (fake_slurm / "scancel.log").read_text() == "4242\n"
    assert again.render().startswith("job 4242: not in the queue")
    assert slurm.status("4242").state == "finished (not in the queue)"


def test_squeue_failure_is_a_command_error_with_a_hint(fake_slurm: Path) -> None:
    (fake_slurm / "down").touch()
    with pytest.raises(CommandError) as err:
        Slurm().status("4242")
    assert err.value.hint == "is slurmctld reachable? try `sinfo`"
    assert "Unable to contact slurm controller" in err.value.details[-1]


def test_without_slurm_binaries_is_runtime_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeUnavailable, match="sbatch"):
        get_job_control().submit(tmp_path / "x.sbatch")
