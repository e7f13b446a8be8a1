"""The SLURM launcher's supervision (issue 18), pure: with supervise.enabled every node's container
runs kit's supervisor around its serve script instead of the serve script itself (the agents in
the node step, the coordinator on the head node), the same code as `kit serve --supervise`.

Everything travels as data, as the launcher's other scripts do: the serve scripts, the bundle
(base64) and the settings (JSON) are exported as one single-quoted word each and reach the
container as its arguments; the container's entry (templates/slurm_supervise.sh.j2) hands them to
BOOT_PY, which writes them into the run directory and starts the bundle. The control token is
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
from kit.plan.roles import Role
from kit.render import render
from kit.supervise import bundle
from kit.supervise.plan import RUN_DIR, supervise_json

# Writes the run's files from its arguments (run dir, serve script, bundle, settings), then
# becomes the bundle's `entry`. kit's own text: no value is ever part of it.
BOOT_PY = r"""
import base64, json, os, sys
run_dir, serve, packed, settings = sys.argv[1:5]
def put(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "wb") as handle:
        handle.write(data)
    os.replace(path + ".tmp", path)
put(json.loads(settings)["serve_script"], serve.encode())
put(os.path.join(run_dir, "kit-supervise.pyz"), base64.b64decode(packed))
put(os.path.join(run_dir, "supervise.json"), settings.encode())
pyz = os.path.join(run_dir, "kit-supervise.pyz")
os.execv(sys.executable, [sys.executable, pyz, "entry", run_dir])
"""


def entry_script() -> str:
    return render("slurm_supervise.sh.j2", version=__version__, boot=BOOT_PY, run_dir=RUN_DIR)


def supervised(
    config: KitConfig, scripts: Mapping[str, str], head_args: tuple[str, ...], worker: Role
) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...]]:
    """The launcher's scripts and the head's and workers' container arguments with supervision:
    mp: every node's container runs the entry with its serve script; Ray: the head's entry runs
    it in place of `vllm serve` once the Ray cluster is whole (workers stay Ray nodes)."""
    from kit.plan.slurm import job_var

    out = dict(scripts)
    out["KIT_SUPERVISE_BUNDLE"] = bundle.encoded()
    out["KIT_SUPERVISE_JSON"] = supervise_json(config)
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
