"""The SLURM launcher's supervision (issue 18), pure: with supervise.enabled every node's container
runs kit's supervisor around its serve script instead of the serve script itself (the agents in
the node step, the coordinator on the head node), the same code as `kit serve --supervise`.

Everything travels as data, as the launcher's other scripts do: the serve scripts, the bundle
(base64) and the settings (JSON) are exported as one single-quoted word each and reach the
container as its arguments; the container's entry (templates/slurm_supervise.sh.j2) hands them to
kit/supervise/boot.py, which writes them into the run directory and starts the bundle. The control token is
made inside the job and reaches each container as a file (the node step writes it into the job
directory mounted at /tmp/kit), never as an argument.

Under SLURM no node container comes back inside the job: a node that dies ends the step
(srun --kill-on-bad-exit), and with slurm.requeue the launcher requeues the job (it is the
failures inside the containers, an engine dead or hung, vllm serve exited, the API down, that the
group restart handles in place).
"""

from __future__ import annotations

from collections.abc import Mapping

from kit import __version__
from kit.config import KitConfig
from kit.plan.job_vars import job_var
from kit.plan.roles import Role
from kit.plan.supervise import RUN_DIR, supervise_json
from kit.render import render
from kit.resources import program_source
from kit.supervise import bundle


def entry_script() -> str:
    return render(
        "slurm_supervise.sh.j2", version=__version__, boot=program_source("supervise/boot.py"), run_dir=RUN_DIR
    )


def supervised(
    config: KitConfig,
    scripts: Mapping[str, str],
    head_args: tuple[str, ...],
    worker: Role,
    *,
    settings: str | None = None,
) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...]]:
    """The launcher's scripts and the head's and workers' container arguments with supervision:
    mp: every node's container runs the entry with its serve script; Ray: the head's entry runs
    it in place of `vllm serve` once the Ray cluster is whole (workers stay Ray nodes). `settings`:
    the supervisor's settings (JSON) when they are not the whole cluster's (a router replica's)."""
    out = dict(scripts)
    out["KIT_SUPERVISE_BUNDLE"] = bundle.encoded()
    out["KIT_SUPERVISE_JSON"] = settings if settings is not None else supervise_json(config)
    data = (job_var("KIT_SUPERVISE_BUNDLE"), job_var("KIT_SUPERVISE_JSON"))
    if config.backend == "ray":
        out["KIT_SUPERVISE_SERVE_SCRIPT"] = out["KIT_HEAD_SERVE_SCRIPT"]
        out["KIT_HEAD_SERVE_SCRIPT"] = entry_script()
        return out, (*head_args, job_var("KIT_SUPERVISE_SERVE_SCRIPT"), *data), ()
    out["KIT_HEAD_SERVE_SCRIPT"] = scripts["KIT_HEAD_SCRIPT"]  # the serve script (its image check too)
    out["KIT_HEAD_SCRIPT"] = entry_script()
    worker_args: tuple[str, ...] = ()
    if "KIT_WORKER_SCRIPT" in out:
        out["KIT_WORKER_SERVE_SCRIPT"] = scripts["KIT_WORKER_SCRIPT"]
        out["KIT_WORKER_SCRIPT"] = entry_script()
        worker_args = (job_var("KIT_WORKER_SERVE_SCRIPT"), *data)
    return out, (*head_args, job_var("KIT_HEAD_SERVE_SCRIPT"), *data), worker_args
