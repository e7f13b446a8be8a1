"""SLURM job control for `kit slurm --submit`, `kit status --slurm` and `kit down --slurm`:
sbatch, squeue, scontrol and scancel through kit.proc (a missing binary is RuntimeUnavailable)."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kit import proc
from kit.errors import CommandError, UsageError
from kit.plan.scripts import READY_MARK
from kit.plan.slurm import JOB_LABEL, SERVER_READY_MARK, SERVER_TIMEOUT_MARK

JOB_RE = re.compile(r"^\d+(?:_\d+)?$")
SQUEUE_FORMAT = "%i|%T|%M|%L|%D|%R|%j|%P"
SQUEUE_FIELDS = ("job_id", "state", "elapsed", "time_left", "nodes", "nodelist_or_reason", "name", "partition")
_MARKS = (READY_MARK, SERVER_READY_MARK, SERVER_TIMEOUT_MARK, "kit: error:")


def check_job_id(job: str) -> str:
    if not JOB_RE.match(job):
        raise UsageError(f"{job!r} is not a SLURM job id", hint="pass the number sbatch printed, e.g. --slurm 12345")
    return job


def submit(path: str | Path) -> str:
    """`sbatch --parsable PATH` -> the job id."""
    result = proc.run(["sbatch", "--parsable", str(path)], what="sbatch")
    job = result.stdout.strip().splitlines()[-1].split(";")[0] if result.stdout.strip() else ""
    if not JOB_RE.match(job):
        raise CommandError(f"sbatch printed no job id: {result.stdout.strip()!r}", argv=["sbatch", str(path)])
    return job


def squeue(job: str) -> dict[str, str] | None:
    """The job's squeue row, or None once it has left the queue."""
    result = proc.run(["squeue", "-h", "-j", job, "-o", SQUEUE_FORMAT], check=False)
    if result.returncode != 0:
        if "Invalid job id" in result.stderr:
            return None  # finished jobs leave squeue (and then it calls the id invalid)
        raise CommandError(
            f"squeue failed (exit {result.returncode})",
            argv=["squeue", "-j", job],
            returncode=result.returncode,
            stderr=result.stderr,
            hint="is slurmctld reachable? try `sinfo`",
        )
    for line in result.stdout.splitlines():
        fields = line.split("|", len(SQUEUE_FIELDS) - 1)
        if len(fields) == len(SQUEUE_FIELDS) and fields[0] == job:
            return dict(zip(SQUEUE_FIELDS, fields, strict=True))
    return None


def job_files(job: str) -> dict[str, str]:
    """StdOut/StdErr/WorkDir of a job known to slurmctld (empty once it has been purged)."""
    result = proc.run(["scontrol", "show", "job", job], check=False)
    out: dict[str, str] = {}
    if result.returncode == 0:
        for key in ("StdOut", "StdErr", "WorkDir"):
            match = re.search(rf"\b{key}=(\S+)", result.stdout)
            if match:
                out[key.lower()] = match.group(1)
    return out


def output_marks(path: str) -> list[str]:
    """The lines of the job output that kit's launcher prints at each milestone."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    return [ln.strip() for ln in text.splitlines() if any(m in ln for m in _MARKS)]


def status(job: str) -> dict[str, Any]:
    check_job_id(job)
    row = squeue(job)
    files = job_files(job)
    marks = output_marks(files["stdout"]) if "stdout" in files else []
    ready = next((ln for ln in reversed(marks) if SERVER_READY_MARK in ln), None)
    return {
        "job_id": job,
        "in_queue": row is not None,
        "state": row["state"] if row else "finished (not in the queue)",
        "queue": row,
        "output": files.get("stdout"),
        "error": files.get("stderr"),
        "marks": marks,
        "server_ready": ready,
    }


def job_containers(job: str) -> list[str]:
    """Docker containers of this job on this host (label kit.slurm-job=JOB); [] without Docker."""
    if shutil.which("docker") is None:
        return []
    result = proc.run(
        ["docker", "ps", "-a", "--filter", f"label={JOB_LABEL}={job}", "--format", "{{.Names}}"], check=False
    )
    return [n for n in result.stdout.split() if n] if result.returncode == 0 else []


def cancel(job: str, *, timeout: float = 90, on_progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """scancel the job, wait until it has left the queue, then remove its Docker containers on
    this host (the launcher's own trap removes them on every node; this catches a killed client)."""
    check_job_id(job)
    before = squeue(job)
    if before is not None:
        proc.run(["scancel", job], what="scancel")
        on_progress(f"job {job}: scancel sent ({before['state']}); waiting for it to leave the queue")
    deadline = time.monotonic() + timeout
    row = squeue(job)
    while row is not None and time.monotonic() < deadline:
        time.sleep(1)
        row = squeue(job)
    removed = []
    for name in job_containers(job):
        if proc.run(["docker", "rm", "-f", name], check=False).returncode == 0:
            removed.append(name)
    return {
        "job_id": job,
        "was_in_queue": before is not None,
        "state_before": before["state"] if before else None,
        "gone": row is None,
        "state_after": row["state"] if row else None,
        "containers_removed": removed,
    }


def render_status(job: dict[str, Any]) -> str:
    out = [f"job {job['job_id']}: {job['state']}"]
    row = job.get("queue")
    if row:
        out.append(
            f"  nodes {row['nodes']} ({row['nodelist_or_reason']}), elapsed {row['elapsed']}, left {row['time_left']}"
        )
    if job.get("output"):
        out.append(f"  output: {job['output']}")
    out += [f"  {line}" for line in job.get("marks", [])]
    if job.get("in_queue") and not job.get("server_ready"):
        out.append("  the server is not ready yet")
    return "\n".join(out)


def render_cancel(done: dict[str, Any]) -> str:
    job = done["job_id"]
    if not done["was_in_queue"]:
        head = f"job {job}: not in the queue (already finished or cancelled)"
    elif done["gone"]:
        head = f"job {job}: cancelled ({done['state_before']}) and gone from the queue"
    else:
        head = f"job {job}: scancel sent, still {done['state_after']} (SLURM is stopping it)"
    removed = done["containers_removed"]
    return head + (f"; removed {len(removed)} container(s): {', '.join(removed)}" if removed else "")
