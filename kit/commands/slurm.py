"""`kit slurm`: write (and optionally submit) an sbatch launcher rendered from the same plan as `kit up`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from kit.cluster.model import ModelCache, check_model_cache, decide_offline, with_offline
from kit.cluster.resolve import (
    Resolution,
    check_local_model,
    check_plan,
    check_prologue,
    check_secret_files,
    refuse_guessed,
    resolve,
)
from kit.cluster.warnings import launcher_warnings
from kit.commands._options import config_flag, config_options, json_option, layout_options, overrides_from
from kit.commands._params import KitCommand, writable
from kit.errors import ConfigError
from kit.output import emit, progress, warn
from kit.plan.replicas import router_mode
from kit.plan.slurm import SERVER_READY_MARK, check_slurm_config, plan_slurm_files
from kit.plan.slurm_replicas import plan_router_files
from kit.render import shell_words
from kit.safe import files as safefile


@click.command(name="slurm", cls=KitCommand)
@config_flag("nodes", "--nodes", note="#SBATCH --nodes")
@config_flag("gpus_per_node", "--gpus-per-node", note="#SBATCH --gpus-per-task, one task per node")
@config_flag(
    "runtime",
    "--runtime",
    choices=("docker", "apptainer", "pyxis", "edf"),
    help="Container runtime on the nodes: docker, apptainer, pyxis (srun --container-image, enroot), "
    "or edf (srun --environment: an environment definition file written beside the launcher)",
)
@config_flag("backend", "--backend")
@config_flag("accelerator", "--accelerator")
@config_flag("image", "--image", help="Image reference, or a SIF path (apptainer) or squashfs path (pyxis, edf)")
@config_flag("model.id", "--model")
@layout_options
@config_flag("interface", "--interface", help="Interface every node uses (e.g. ib0); default: the route to the head")
@config_flag("slurm.account", "--account")
@config_flag("slurm.partition", "--partition")
@config_flag("slurm.qos", "--qos")
@config_flag("slurm.time", "--time", help="#SBATCH --time walltime, e.g. 02:00:00")
@config_flag("slurm.cpus_per_task", "--cpus-per-task")
@config_flag("slurm.job_name", "--job-name")
@config_flag("slurm.output", "--job-output", help="#SBATCH --output file, %j = job id")
@config_flag("slurm.error", "--job-error", help="#SBATCH --error file")
@config_flag("slurm.exclusive", "--exclusive")
@config_flag("slurm.prologue", "--prologue")
@config_flag("api_listen", "--api-listen")
@config_flag("tunnel.login_host", "--login-host")
@config_flag("tunnel.ssh_port", "--ssh-port")
@config_flag("supervise.enabled", "--supervise/--no-supervise")
@config_flag("slurm.requeue", "--requeue/--no-requeue", help="#SBATCH --requeue; requeue when the nodes fail")
@click.option("-o", "--out", "out_path", type=click.Path(dir_okay=False), help="Write the launcher here.")
@click.option("--submit", is_flag=True, help="Write the launcher (default kit-CLUSTER.sbatch) and run sbatch.")
@config_options
@json_option
def command(
    config_path: str | None,
    set_values: tuple[str, ...],
    out_path: str | None,
    submit: bool,
    as_json: bool,
    **flags: Any,
) -> None:
    """Write an sbatch launcher for N nodes x G GPUs from the same plan `kit up` uses: #SBATCH
    resources, the head's IP found inside the job, node rank from SLURM_NODEID, one srun step that
    starts every node's container (Apptainer or Docker; Ray or mp backend), a readiness wait bounded
    by the walltime, and a KIT_SERVER_READY line with the URL and SSH tunnel in the job output.
    With pyxis/edf (enroot sites) srun starts the containers: each prints a KIT_PROBE line that
    `kit verify --job-output FILE` judges (GPUs, /dev/infiniband, memlock, /dev/shm).
    Secrets stay in their files (hf_token_file, api_key_file, ray_token_file), read at run time, never written.
    With model.dp_lb router (Docker): a job array, one task per replica, and vLLM's router as a job of
    its own (FILE-router.sbatch beside it); --submit submits both, and the router's job id is the one
    `kit status/down --slurm` take.
    model.tp/model.pp `auto` needs the model's config.json on this host (else set them): every
    node of the job must run the same layout.

    \b
    Examples:
      kit slurm --nodes 2 --gpus-per-node 4 --tp 4 --pp 2 --runtime apptainer \\
                --image ~/images/vllm.sif --backend mp --partition gpu --account p200 -o serve.sbatch
      kit slurm --runtime pyxis --image /shared/images/vllm.sqsh -o serve.sbatch
      kit slurm --submit                     # write kit-CLUSTER.sbatch, sbatch it, print the job id
      kit status --slurm JOBID               # queue state and the ready line
      kit down --slurm JOBID                 # scancel, and nothing is left running
    """
    resolution = resolve(config_path, overrides_from(flags, set_values))
    sources = resolution.resolved.sources
    # The nodes' cache cannot be seen from here: the login node's view of the shared hf_cache
    # decides offline or not for every node (issue 19), and a line says which.
    cache = decide_offline(resolution.config, check_model_cache(resolution.config))
    config = with_offline(resolution.config, cache)
    # Every node of the job must run the same layout, and the nodes' files are not the files of
    # this host: `auto` that this host could only guess is refused (issue 17).
    refuse_guessed(resolution.layout, "slurm")
    check_slurm_config(config, sources)  # a key a job cannot honour, before what it would plan
    check_plan(resolution)
    check_prologue(config, sources)
    if submit:
        check_secret_files(config, sources)  # the launcher checks again on every node
        check_local_model(config, sources)
    path = Path(out_path or f"kit-{config.cluster}.sbatch")
    router = router_mode(config)  # issue 29: the replicas' array launcher, then the router's job
    files = plan_router_files(config, str(path)) if router else plan_slurm_files(config, str(path))
    launcher, *others = files
    text = files[launcher]
    # The files beside the launcher: the router's job (one), or the enroot sites' EDFs (any).
    what = "the router's job" if router else "environment definition"
    shown_extra: dict[str, Any] = {}
    written_extra: dict[str, Any] = {}
    if router:
        shown_extra = {"router_launcher": files[others[0]]}
        written_extra = {"router_launcher": others[0]}
    elif others:
        shown_extra = {"edf": {p: files[p] for p in others}}
        written_extra = {"edf": others}
    warnings = launcher_warnings(config, resolution.layout, cache).lines
    layout = {**layout_fields(resolution), "model_cache": cache.to_dict(), "warnings": warnings}
    if out_path is None and not submit:
        progress(layout_line(resolution, cache), as_json=as_json)
        warn(warnings, as_json=as_json)
        shown = "".join([text, *(f"# ---- kit: {p} ({what}) ----\n{files[p]}" for p in others)])
        emit(Launcher(text, shown_extra, layout, shown), as_json=as_json)
        return
    for name in files:  # one line before anything is written (a missing folder, a folder)
        writable(Path(name), "--out")
    for name in reversed(files):  # the launcher last: it names the others
        _write_atomically(Path(name), files[name], mode=0o755 if name == launcher else 0o644)
    written = Written(str(path), config.nodes, config.runtime, {**layout, **written_extra})
    progress(layout_line(resolution, cache), as_json=as_json)
    warn(warnings, as_json=as_json)
    if not submit:
        emit(written, as_json=as_json)
        return
    from kit.runtime import get_job_control

    progress(f"wrote {path}; submitting", as_json=as_json)
    jobs = get_job_control()
    job = jobs.submit(path)
    replicas_job = None
    if router:  # the replicas' array first; the router's job is given its id (and is the job to follow)
        replicas_job = job
        job = jobs.submit(others[0], [job])
    emit(Submitted(written, job, config.slurm.output.replace("%j", job), replicas_job), as_json=as_json)


@dataclass(frozen=True)
class Launcher:
    """`kit slurm` (no --out): the launcher, the files beside it, the layout; shown as one text."""

    launcher: str
    extra: dict[str, Any]  # router_launcher (the router's job) or edf (path: text)
    layout: dict[str, Any]  # parallel, layout_from, model_cache, warnings
    shown: str  # the launcher and the files beside it, each under a `# ---- kit:` line
    command = "slurm"

    def to_dict(self) -> dict[str, Any]:
        return {"launcher": self.launcher, **self.extra, **self.layout}

    def text(self) -> str:
        return self.shown.rstrip("\n")


@dataclass(frozen=True)
class Written:
    """`kit slurm --out FILE`: the launcher written, its nodes and runtime, the layout and the
    files beside it (router_launcher or edf)."""

    path: str
    nodes: int
    runtime: str
    layout: dict[str, Any]
    command = "slurm"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "nodes": self.nodes, "runtime": self.runtime, **self.layout}

    def text(self) -> str:
        return f"wrote {self.path} (submit it with: {shell_words(['sbatch', self.path])})"


@dataclass(frozen=True)
class Submitted:
    """`kit slurm --submit`: the launcher written and its job (with a router: the router's job,
    after the replicas' array job)."""

    written: Written
    job_id: str
    job_output: str
    replicas_job: str | None = None
    command = "slurm"

    def to_dict(self) -> dict[str, Any]:
        replicas = {"replicas_job": self.replicas_job} if self.replicas_job is not None else {}
        return {**self.written.to_dict(), **replicas, "job_id": self.job_id, "job_output": self.job_output}

    def text(self) -> str:
        job = self.job_id
        return (
            f"submitted job {job}"
            + (f" (vLLM's router; the replicas: array job {self.replicas_job})" if self.replicas_job else "")
            + "\n"
            f"  output: {self.job_output} (look for {SERVER_READY_MARK}: the URL and the SSH tunnel)\n"
            f"  status: kit status --slurm {job}\n"
            f"  stop:   kit down --slurm {job}"
        )


def layout_fields(resolution: Resolution) -> dict[str, Any]:
    """The launcher's layout for --json: the numbers and how they were decided."""
    layout = resolution.layout
    return {
        "parallel": {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep},
        "layout_from": layout.decided_by,
    }


def layout_line(resolution: Resolution, cache: ModelCache) -> str:
    """One stderr line: the layout the launcher runs and how it was decided, and whether its
    nodes run vLLM offline, decided by this host's view of the shared hf_cache (kit's own words
    and numbers: nothing a user wrote)."""
    layout = resolution.layout
    return f"kit slurm: layout {layout.describe()} (decided by: {layout.decided_by}); {cache.describe()}"


def _write_atomically(path: Path, text: str, *, mode: int = 0o755) -> None:
    try:
        safefile.write_atomic(path, text, mode=mode)
    except OSError as exc:  # checked above; a full disk or a race still gets one line
        raise ConfigError(f"cannot write {path}: {exc.strerror}", key="--out", hint="write somewhere else") from None
