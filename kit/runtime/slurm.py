"""SLURM job control for `kit slurm --submit`, `kit status --slurm` and `kit down --slurm`:
a small interface (JobControl: submit, status, cancel) and its SLURM adapter, which runs
sbatch, squeue, scontrol and scancel through kit.proc (a missing binary is RuntimeUnavailable).
What the commands print is parsed by pure functions (parse_squeue, parse_job_files).
"""

from __future__ import annotations

import abc
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit import proc
from kit.errors import CommandError, RuntimeUnavailable, UsageError
from kit.plan.scripts import READY_MARK
from kit.plan.slurm import JOB_LABEL, SERVER_READY_MARK, SERVER_TIMEOUT_MARK
from kit.plan.slurm_replicas import REPLICA_READY_MARK, REPLICAS_COMMENT

JOB_RE = re.compile(r"^\d+(?:_\d+)?\Z")
SQUEUE_FORMAT = "%i|%T|%M|%L|%D|%R|%j|%P"
SQUEUE_FIELDS = ("job_id", "state", "elapsed", "time_left", "nodes", "nodelist_or_reason", "name", "partition")
_MARKS = (READY_MARK, SERVER_READY_MARK, SERVER_TIMEOUT_MARK, REPLICA_READY_MARK, "kit: error:")
REPLICA_FIELDS = ("task", "state", "url")


def check_job_id(job: str) -> str:
    if not JOB_RE.match(job):
        raise UsageError(f"{job!r} is not a SLURM job id", hint="pass the number sbatch printed, e.g. --slurm 12345")
    return job


# ---- results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    in_queue: bool
    state: str
    queue: Mapping[str, str] | None  # the squeue row (SQUEUE_FIELDS)
    output: str | None  # the job's stdout file
    error: str | None
    marks: tuple[str, ...] = ()  # kit's milestone lines in the job output
    server_ready: str | None = None  # the KIT_SERVER_READY line, once printed
    # model.dp_lb router (issue 29): the router's job names its replicas' array job; each task's row
    replicas_job: str | None = None
    replicas: tuple[Mapping[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "replicas_job": self.replicas_job,
            "replicas": [dict(r) for r in self.replicas],
            "job_id": self.job_id,
            "in_queue": self.in_queue,
            "state": self.state,
            "queue": dict(self.queue) if self.queue is not None else None,
            "output": self.output,
            "error": self.error,
            "marks": list(self.marks),
            "server_ready": self.server_ready,
        }

    def render(self) -> str:
        out = [f"job {self.job_id}: {self.state}"]
        row = self.queue
        if row:
            out.append(
                f"  nodes {row['nodes']} ({row['nodelist_or_reason']}), elapsed {row['elapsed']}, "
                f"left {row['time_left']}"
            )
        if self.output:
            out.append(f"  output: {self.output}")
        out += [f"  {line}" for line in self.marks]
        if self.replicas_job:
            out.append(f"  replicas: job {self.replicas_job}")
            out += [f"    {r['task']}: {r['state']} {r['url']}" for r in self.replicas]
        if self.in_queue and not self.server_ready:
            out.append("  the server is not ready yet")
        return "\n".join(out)


@dataclass(frozen=True)
class CancelResult:
    job_id: str
    was_in_queue: bool
    state_before: str | None
    gone: bool
    state_after: str | None
    containers_removed: tuple[str, ...] = field(default_factory=tuple)
    replicas: CancelResult | None = None  # the router job's replicas (model.dp_lb router, issue 29)

    def to_dict(self) -> dict[str, Any]:
        return {
            "replicas": self.replicas.to_dict() if self.replicas else None,
            "job_id": self.job_id,
            "was_in_queue": self.was_in_queue,
            "state_before": self.state_before,
            "gone": self.gone,
            "state_after": self.state_after,
            "containers_removed": list(self.containers_removed),
        }

    def render(self) -> str:
        job = self.job_id
        if not self.was_in_queue:
            head = f"job {job}: not in the queue (already finished or cancelled)"
        elif self.gone:
            head = f"job {job}: cancelled ({self.state_before}) and gone from the queue"
        else:
            head = f"job {job}: scancel sent, still {self.state_after} (SLURM is stopping it)"
        removed = self.containers_removed
        text = head + (f"; removed {len(removed)} container(s): {', '.join(removed)}" if removed else "")
        return text + (f"\nreplicas: {self.replicas.render()}" if self.replicas else "")


# ---- the interface ------------------------------------------------------------------------------


class JobControl(abc.ABC):
    """A batch scheduler, as kit's verbs use it."""

    name: str

    @abc.abstractmethod
    def submit(self, script: str | Path, args: Sequence[str] = ()) -> str:
        """Submit a launcher script (with its arguments); the job id."""

    @abc.abstractmethod
    def status(self, job: str) -> JobStatus:
        """The job's queue state and kit's milestone lines from its output (UsageError for a bad id)."""

    @abc.abstractmethod
    def cancel(
        self, job: str, *, timeout: float = 90, on_progress: Callable[[str], None] | None = None
    ) -> CancelResult:
        """Cancel the job, wait (at most timeout) until it has left the queue, then remove its
        containers on this host. Idempotent: a job no longer queued is reported, not an error."""


# ---- pure parsers ------------------------------------------------------------------------------


def parse_squeue(stdout: str, job: str) -> dict[str, str] | None:
    """The row of `squeue -h -j JOB -o SQUEUE_FORMAT` for job, or None; of a job array, its first
    task's (JOB_0, or JOB_[0-1] while pending)."""
    for line in stdout.splitlines():
        fields = line.split("|", len(SQUEUE_FIELDS) - 1)
        if len(fields) == len(SQUEUE_FIELDS) and (fields[0] == job or fields[0].startswith(f"{job}_")):
            return dict(zip(SQUEUE_FIELDS, fields, strict=True))
    return None


def parse_job_files(stdout: str) -> dict[str, str]:
    """StdOut/StdErr/WorkDir of `scontrol show job JOB`, keys lowercased."""
    out: dict[str, str] = {}
    for key in ("StdOut", "StdErr", "WorkDir"):
        match = re.search(rf"\b{key}=(\S+)", stdout)
        if match:
            out[key.lower()] = match.group(1)
    return out


def output_marks(lines: Sequence[str]) -> list[str]:
    """The lines of the job output that kit's launcher prints at each milestone."""
    return [ln.strip() for ln in lines if any(m in ln for m in _MARKS)]


def parse_replicas_job(comment: str) -> str | None:
    """The replicas' array job a router job's comment names (kit.plan.slurm_replicas), or None."""
    text = comment.strip()
    if not text.startswith(REPLICAS_COMMENT):
        return None
    job = text.removeprefix(REPLICAS_COMMENT)
    return job if re.fullmatch(r"\d+", job) else None


def parse_replica_rows(stdout: str) -> list[dict[str, str]]:
    """`squeue -h -j ARRAY -o %i|%T|%k`: each task, its state and its replica's URL (its comment)."""
    rows = []
    for line in stdout.splitlines():
        fields = line.strip().split("|", 2)
        if len(fields) == 3:
            task, state, url = fields
            rows.append(dict(zip(REPLICA_FIELDS, (task, state, url if url.startswith("http://") else ""), strict=True)))
    return rows


def parse_sbatch(stdout: str) -> str | None:
    """The job id `sbatch --parsable` printed (`ID` or `ID;CLUSTER`), or None."""
    job = stdout.strip().splitlines()[-1].split(";")[0] if stdout.strip() else ""
    return job if JOB_RE.match(job) else None


# ---- the SLURM adapter --------------------------------------------------------------------------


def remove_job_containers(job: str) -> list[str]:
    """The job's Docker containers on this host (label kit.slurm-job=JOB), removed; [] without
    a Docker engine. The launcher's own trap removes them on every node: this catches a client
    killed before its trap ran."""
    from kit.runtime.docker import DockerRuntime

    try:
        return DockerRuntime().remove_labelled(JOB_LABEL, job)
    except RuntimeUnavailable:
        return []


class Slurm(JobControl):
    name = "slurm"

    def __init__(self, *, remove_containers: Callable[[str], list[str]] = remove_job_containers) -> None:
        self.remove_containers = remove_containers

    def submit(self, script: str | Path, args: Sequence[str] = ()) -> str:
        """`sbatch --parsable SCRIPT [ARGS]` -> the job id."""
        result = proc.run(["sbatch", "--parsable", str(script), *args], what="sbatch")
        job = parse_sbatch(result.stdout)
        if job is None:
            raise CommandError(f"sbatch printed no job id: {result.stdout.strip()!r}", argv=["sbatch", str(script)])
        return job

    def squeue(self, job: str) -> dict[str, str] | None:
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
        return parse_squeue(result.stdout, job)

    def replicas_job(self, job: str) -> str | None:
        """The replicas' array job a router job names in its comment (model.dp_lb router), or None."""
        result = proc.run(["squeue", "-h", "-j", job, "-o", "%k"], check=False)
        lines = result.stdout.splitlines() if result.returncode == 0 else []
        return parse_replicas_job(lines[0]) if lines else None

    def replica_rows(self, job: str) -> list[dict[str, str]]:
        result = proc.run(["squeue", "-h", "-j", job, "-o", "%i|%T|%k"], check=False)
        return parse_replica_rows(result.stdout) if result.returncode == 0 else []

    def job_files(self, job: str) -> dict[str, str]:
        """StdOut/StdErr/WorkDir of a job known to slurmctld (empty once it has been purged)."""
        result = proc.run(["scontrol", "show", "job", job], check=False)
        return parse_job_files(result.stdout) if result.returncode == 0 else {}

    def status(self, job: str) -> JobStatus:
        check_job_id(job)
        row = self.squeue(job)
        found = self.job_files(job)
        marks = output_marks(_read_lines(found["stdout"])) if "stdout" in found else []
        replicas = self.replicas_job(job) if row is not None else None
        return JobStatus(
            replicas_job=replicas,
            replicas=tuple(self.replica_rows(replicas)) if replicas else (),
            job_id=job,
            in_queue=row is not None,
            state=row["state"] if row else "finished (not in the queue)",
            queue=row,
            output=found.get("stdout"),
            error=found.get("stderr"),
            marks=tuple(marks),
            server_ready=next((ln for ln in reversed(marks) if SERVER_READY_MARK in ln), None),
        )

    def cancel(
        self, job: str, *, timeout: float = 90, on_progress: Callable[[str], None] | None = None
    ) -> CancelResult:
        check_job_id(job)
        before = self.squeue(job)
        # A router job (model.dp_lb router) takes its replicas' array job with it.
        replicas = self.replicas_job(job) if before is not None else None
        if before is not None:
            proc.run(["scancel", job], what="scancel")
            if on_progress is not None:
                on_progress(f"job {job}: scancel sent ({before['state']}); waiting for it to leave the queue")
        deadline = time.monotonic() + timeout
        row = self.squeue(job)
        while row is not None and time.monotonic() < deadline:
            time.sleep(1)
            row = self.squeue(job)
        linked = None
        if replicas is not None:
            left = max(1.0, deadline - time.monotonic())
            linked = self.cancel(replicas, timeout=left, on_progress=on_progress)
        return CancelResult(
            replicas=linked,
            job_id=job,
            was_in_queue=before is not None,
            state_before=before["state"] if before else None,
            gone=row is None,
            state_after=row["state"] if row else None,
            containers_removed=tuple(self.remove_containers(job)),
        )


def _read_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return []
