"""`kit slurm`: write (and optionally submit) an sbatch launcher rendered from the same plan as `kit up`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from kit.commands._common import check_plan, check_secret_files, config_options, json_option, overrides_from, resolve
from kit.commands._params import KitCommand, writable
from kit.errors import ConfigError
from kit.output import emit, progress
from kit.plan.slurm import SERVER_READY_MARK, check_slurm_config, plan_launcher
from kit.render import shell_words

FLAG_KEYS = {
    "cluster": "cluster",
    "image": "image",
    "runtime": "runtime",
    "backend": "backend",
    "accelerator": "accelerator",
    "nodes": "nodes",
    "gpus_per_node": "gpus_per_node",
    "tp": "model.tp",
    "pp": "model.pp",
    "dp": "model.dp",
    "ep": "model.ep",
    "model": "model.id",
    "interface": "interface",
    "account": "slurm.account",
    "partition": "slurm.partition",
    "qos": "slurm.qos",
    "time": "slurm.time",
    "cpus_per_task": "slurm.cpus_per_task",
    "job_name": "slurm.job_name",
    "job_output": "slurm.output",
    "job_error": "slurm.error",
    "supervise": "supervise.enabled",
    "requeue": "slurm.requeue",
}


@click.command(name="slurm", cls=KitCommand)
@click.option("--nodes", type=int, help="Nodes (#SBATCH --nodes).")
@click.option("--gpus-per-node", type=int, help="GPUs per node (#SBATCH --gpus-per-task, one task per node).")
@click.option("--runtime", type=click.Choice(["docker", "apptainer"]), help="Container runtime on the nodes.")
@click.option("--backend", type=click.Choice(["ray", "mp"]), help="Ray cluster, or vLLM's mp backend.")
@click.option("--accelerator", type=click.Choice(["gpu", "cpu"]), help="gpu, or cpu (vLLM CPU build).")
@click.option("--image", help="Image reference, or a SIF path with --runtime apptainer.")
@click.option("--model", help="Model id or path.")
@click.option("--tp", help="Tensor parallel size, or auto.")
@click.option("--pp", help="Pipeline parallel size, or auto.")
@click.option("--dp", help="Data parallel size (engine replicas), or auto.")
@click.option(
    "--ep/--no-ep", default=None, help="Expert parallelism for MoE layers over TP×DP GPUs (--enable-expert-parallel)."
)
@click.option("--interface", help="Interface every node uses (e.g. ib0); default: the route to the head.")
@click.option("--account", help="#SBATCH --account (slurm.account).")
@click.option("--partition", help="#SBATCH --partition (slurm.partition).")
@click.option("--qos", help="#SBATCH --qos (slurm.qos).")
@click.option("--time", help="#SBATCH --time walltime, e.g. 02:00:00 (slurm.time).")
@click.option("--cpus-per-task", type=int, help="#SBATCH --cpus-per-task (slurm.cpus_per_task).")
@click.option("--job-name", help="#SBATCH --job-name (slurm.job_name).")
@click.option("--job-output", help="#SBATCH --output file, %j = job id (slurm.output).")
@click.option("--job-error", help="#SBATCH --error file (slurm.error).")
@click.option("--exclusive", is_flag=True, help="#SBATCH --exclusive (whole nodes; advisable with Docker).")
@click.option(
    "--supervise/--no-supervise", default=None, help="Restart the whole group on a failure (supervise.enabled)."
)
@click.option(
    "--requeue/--no-requeue", default=None, help="#SBATCH --requeue; requeue when the nodes fail (slurm.requeue)."
)
@click.option("-o", "--out", "out_path", type=click.Path(dir_okay=False), help="Write the launcher here.")
@click.option("--submit", is_flag=True, help="Write the launcher (default kit-CLUSTER.sbatch) and run sbatch.")
@config_options
@json_option
def command(
    config_path: str | None,
    set_values: tuple[str, ...],
    exclusive: bool,
    out_path: str | None,
    submit: bool,
    as_json: bool,
    **flags: Any,
) -> None:
    """Write an sbatch launcher for N nodes x G GPUs from the same plan `kit up` uses: #SBATCH
    resources, the head's IP found inside the job, node rank from SLURM_NODEID, one srun step that
    starts every node's container (Apptainer or Docker; Ray or mp backend), a readiness wait bounded
    by the walltime, and a KIT_SERVER_READY line with the URL and SSH tunnel in the job output.
    Secrets stay in their files (hf_token_file, api_key_file, ray_token_file), read at run time, never written.

    \b
    Examples:
      kit slurm --nodes 2 --gpus-per-node 4 --runtime apptainer --image ~/images/vllm.sif \\
                --backend mp --partition gpu --account p200 -o serve.sbatch
      kit slurm --submit                     # write kit-CLUSTER.sbatch, sbatch it, print the job id
      kit status --slurm JOBID               # queue state and the ready line
      kit down --slurm JOBID                 # scancel, and nothing is left running
    """
    resolved = resolve(config_path, overrides_from(flags, FLAG_KEYS, set_values))
    config, sources = resolved.config, resolved.sources
    check_plan(resolved)
    check_slurm_config(config, sources)
    if submit:
        check_secret_files(config, sources)  # the launcher checks again on every node
    text = plan_launcher(config, exclusive=exclusive)
    if out_path is None and not submit:
        emit("slurm", {"launcher": text}, as_json=as_json, text=text.rstrip("\n"))
        return
    path = Path(out_path or f"kit-{config.cluster}.sbatch")
    writable(path, "--out")  # one line before anything is written (a missing folder, a folder)
    _write_atomically(path, text)
    result: dict[str, Any] = {"path": str(path), "nodes": config.nodes, "runtime": config.runtime}
    if not submit:
        emit("slurm", result, as_json=as_json, text=f"wrote {path} (submit it with: {shell_words(['sbatch', path])})")
        return
    from kit import slurm_ctl

    progress(f"wrote {path}; submitting", as_json=as_json)
    job = slurm_ctl.submit(path)
    result["job_id"] = job
    result["job_output"] = config.slurm.output.replace("%j", job)
    emit(
        "slurm",
        result,
        as_json=as_json,
        text=(
            f"submitted job {job}\n"
            f"  output: {result['job_output']} (look for {SERVER_READY_MARK}: the URL and the SSH tunnel)\n"
            f"  status: kit status --slurm {job}\n"
            f"  stop:   kit down --slurm {job}"
        ),
    )


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(path)
    except OSError as exc:  # checked above; a full disk or a race still gets one line
        raise ConfigError(f"cannot write {path}: {exc.strerror}", key="--out", hint="write somewhere else") from None
    finally:
        tmp.unlink(missing_ok=True)
