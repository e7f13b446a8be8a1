"""The sbatch launcher: pure text, rendered from the same plan `kit up` uses.

Every node's container command comes from `plan_node` and the forms in kit.plan.container_args. What is
only known inside the job (this node's IP and interface, its rank, the head's address, the job
id) is planned as sentinel strings; `runtime_word` turns each sentinel into a `"${VAR}"`
expansion that the launcher computes at run time, and every other byte into literal text, quoted
by kit.render.shell_quote like every value kit writes into shell.

No user value is ever inside a here-document, a comment or a double-quoted message (issue 16):
the scripts each container runs travel as data (one quoted word each, nested scripts the same),
values the launcher prints are variables assigned from one quoted word. Secrets never enter the
text: the tokens and the API key stay files, bind-mounted read-only.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass

from kit import __version__
from kit.config import READY_AUTO_S, KitConfig
from kit.errors import ConfigError
from kit.plan import slurm_enroot
from kit.plan.container_args import to_apptainer_env, to_apptainer_start_argv, to_docker_argv
from kit.plan.job_vars import argv_text, job_var, runtime_word
from kit.plan.network import NodeNet
from kit.plan.node import ContainerSpec, Mount, compile_cache_env, local_model_dir, plan_node
from kit.plan.roles import HEAD, Role
from kit.plan.scripts import READY_MARK, node_script, ray_token_enabled, serve_script
from kit.plan.slurm_keys import check_slurm_keys
from kit.plan.slurm_supervise import supervised
from kit.plan.vllm import serves_api
from kit.render import render, shell_quote

# A worker's rank is an int in Role: plan_node gets this one, slurm_spec puts job_var("KIT_NODE_RANK")
# where plan_node wrote it (name, label, env); it is never a real rank.
RANK_SENTINEL = 2147483641
SLURM_NET = NodeNet(job_var("VLLM_HOST_IP"), job_var("KIT_INTERFACE"), job_var("KIT_HEAD_ADDRESS"))
JOB = job_var("SLURM_JOB_ID")
JOB_TMP = job_var("KIT_JOB_TMP")

SERVER_READY_MARK = "KIT_SERVER_READY"
SERVER_TIMEOUT_MARK = "KIT_SERVER_TIMEOUT"
JOB_LABEL = "kit.slurm-job"
# Seconds of walltime kept free after the readiness wait (the job must still be able to report).
WALLTIME_MARGIN_S = 120

_BAD_SBATCH_CHARS = re.compile(r"[\x00-\x1f\x7f\"'\\]")


def walltime_seconds(value: str) -> int:
    """SLURM --time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    text = value.strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return 0
    match = re.match(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$", text)
    if not match:
        raise ConfigError(
            f"{value!r} is not a SLURM time", key="slurm.time", hint="write it like 01:00:00, 90 or 2-00:00:00"
        )
    days, a, b, c = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        h, m, s = int(a), int(b or 0), int(c or 0)
        return ((int(days) * 24 + h) * 60 + m) * 60 + s
    if c is not None:  # HH:MM:SS
        return (int(a) * 60 + int(b)) * 60 + int(c)
    if b is not None:  # MM:SS
        return int(a) * 60 + int(b)
    return int(a) * 60  # MM


@dataclass(frozen=True)
class SbatchResources:
    """What the `#SBATCH` lines ask for. From config `slurm.*` plus nodes/GPUs."""

    job_name: str
    nodes: int
    gpus_per_task: int | None
    time: str
    output: str
    error: str
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    cpus_per_task: int | None = None
    exclusive: bool = False
    requeue: bool = False  # issue 18: the launcher requeues the job when its nodes fail for good
    array: str | None = None  # issue 29: one task per replica (kit.plan.slurm_replicas)

    def directives(self) -> list[tuple[str, str | None]]:
        items: list[tuple[str, str | None]] = [
            ("job-name", self.job_name),
            ("nodes", str(self.nodes)),
            ("ntasks-per-node", "1"),
        ]
        if self.gpus_per_task:
            items.append(("gpus-per-task", str(self.gpus_per_task)))
        if self.cpus_per_task:
            items.append(("cpus-per-task", str(self.cpus_per_task)))
        items.append(("time", self.time))
        for key in ("account", "partition", "qos"):
            value = getattr(self, key)
            if value:
                items.append((key, value))
        if self.array:
            items.append(("array", self.array))
        items += [("output", self.output), ("error", self.error)]
        if self.exclusive:
            items.append(("exclusive", None))
        if self.requeue:
            items.append(("requeue", None))
        return items


def sbatch_resources(config: KitConfig) -> SbatchResources:
    s = config.slurm
    return SbatchResources(
        job_name=s.job_name,
        nodes=config.nodes,
        gpus_per_task=config.gpus_per_node if config.accelerator == "gpu" else None,
        time=s.time,
        output=s.output,
        error=s.error,
        account=s.account,
        partition=s.partition,
        qos=s.qos,
        cpus_per_task=s.cpus_per_task,
        exclusive=s.exclusive,
        requeue=s.requeue,
    )


def sbatch_line(key: str, value: str | None) -> str:
    """One `#SBATCH --key=value` line. sbatch strips one pair of double quotes; bash never runs the
    line (a comment), but a newline would start a new one: control characters and quotes are refused."""
    if value is None:
        return f"#SBATCH --{key}"
    if _BAD_SBATCH_CHARS.search(value):
        raise ConfigError(
            f"{value!r} cannot go into an #SBATCH line (control characters, quotes or backslashes)",
            key=f"slurm.{key.replace('-', '_')}",
            hint="use a plain value",
        )
    return f'#SBATCH --{key}="{value}"' if re.search(r"\s", value) else f"#SBATCH --{key}={value}"


# ---- the per-node container commands --------------------------------------------------------


def slurm_spec(config: KitConfig, role: Role, script: str, script_args: tuple[str, ...] = ()) -> ContainerSpec:
    """The node's ContainerSpec from plan_node, with job-specific name/labels and the script (and
    its arguments) replaced by sentinels: the launcher passes each script's text in a variable."""
    spec = plan_node(config, role, SLURM_NET, has_infiniband=config.infiniband == "on")
    labels = {**spec.labels, JOB_LABEL: JOB}
    env = dict(spec.env)
    name = spec.name
    if role.rank == RANK_SENTINEL:  # any worker: its rank is SLURM_NODEID, known in the job
        rank = job_var("KIT_NODE_RANK")
        labels["kit.rank"] = env["KIT_NODE_RANK"] = rank
        # per-node compile caches: the node's subfolder, by SLURM_NODEID (a value the user's env set stays)
        planned = compile_cache_env(config, str(RANK_SENTINEL))
        env.update({k: v for k, v in compile_cache_env(config, rank).items() if env[k] == planned[k]})
        name = name.removesuffix(str(RANK_SENTINEL)) + rank
    mounts = spec.mounts
    gpus = spec.gpus
    if docker_takes_allocated_gpus(config):
        # Docker's daemon sees every GPU of the host: the step's own (SLURM_STEP_GPUS, the
        # physical ids), never --gpus=all on a node other jobs share (issue 28).
        gpus = (job_var("KIT_GPUS"),)
    if config.runtime == "apptainer":
        # Apptainer shares the host's /tmp: give Ray and kit's scratch a job-private directory
        # (FIELD_NOTES §1 row 14: per-job Ray temp dir under SLURM).
        mounts = (
            *mounts,
            Mount(f"{JOB_TMP}/ray", config.ray.temp_dir),
            Mount(f"{JOB_TMP}/kit", "/tmp/kit"),
        )
    elif config.supervise.enabled:  # issue 18: the supervisor's token file arrives through it
        mounts = (*mounts, Mount(f"{JOB_TMP}/kit", "/tmp/kit"))
    return dataclasses.replace(
        spec,
        name=f"{name}-{JOB}",
        labels=labels,
        env=env,
        mounts=mounts,
        gpus=gpus,
        script=script,
        script_args=script_args,
    )


def docker_takes_allocated_gpus(config: KitConfig) -> bool:
    """Docker GPU nodes of a job not given whole nodes (slurm.exclusive) take only the GPUs SLURM
    allocated to the step. Apptainer's --nv needs nothing: SLURM's CUDA_VISIBLE_DEVICES reaches
    the container (never --cleanenv), and kit sets none under SLURM (`gpus` is refused there)."""
    return config.runtime == "docker" and config.accelerator == "gpu" and not config.slurm.exclusive


def node_argv(config: KitConfig, spec: ContainerSpec) -> list[str]:
    """The node's container as one foreground command that srun tracks for the life of the job:
    `docker run --rm` (not --detach) or `apptainer exec` (not an instance daemon)."""
    if config.runtime == "apptainer":
        return to_apptainer_start_argv(spec, spec.image, foreground=True)
    return to_docker_argv(spec, foreground=True)


def node_exports(config: KitConfig, spec: ContainerSpec) -> list[str]:
    """The words the node step exports before the container command: with Apptainer, the
    container's environment (APPTAINERENV_NAME=value, one quoted word each)."""
    if config.runtime != "apptainer":
        return []
    return [shell_quote(runtime_word(f"{k}={v}")) for k, v in to_apptainer_env(spec.env).items()]


def ray_head_entry() -> str:
    """Inside the head container: the Ray head node script (barrier included), then `vllm serve`.
    Both scripts arrive as its arguments ("$1", "$2"), so no script is nested in another."""
    return render("slurm_ray_head.sh.j2", version=__version__, ready_mark=READY_MARK)


def container_scripts(config: KitConfig) -> dict[str, str]:
    """The scripts the launcher carries, by the variable that holds each: KIT_HEAD_SCRIPT (with
    Ray, the entry that runs KIT_RAY_HEAD_NODE_SCRIPT then KIT_HEAD_SERVE_SCRIPT) and, with more
    than one node, KIT_WORKER_SCRIPT."""
    worker = Role("worker", RANK_SENTINEL)
    # Without a record of the image's parser kit could not check the plan against it: each
    # container checks first, in seconds, before Ray or vLLM starts (issue 24).
    check = config.image_options is None
    if config.backend == "ray":
        scripts = {
            "KIT_HEAD_SCRIPT": ray_head_entry(),
            "KIT_RAY_HEAD_NODE_SCRIPT": node_script(config, HEAD, precheck=check),
            "KIT_HEAD_SERVE_SCRIPT": serve_script(config, HEAD, precheck=check),
            "KIT_WORKER_SCRIPT": node_script(config, worker, precheck=check),
        }
    else:  # mp: every node runs `vllm serve` for its rank (head rank 0 without --headless)
        scripts = {
            "KIT_HEAD_SCRIPT": serve_script(config, HEAD, precheck=check),
            "KIT_WORKER_SCRIPT": serve_script(config, worker, precheck=check),
        }
    if config.nodes == 1:
        del scripts["KIT_WORKER_SCRIPT"]
    return scripts


def check_slurm_config(config: KitConfig, sources: Mapping[str, str]) -> None:
    """What a launcher cannot carry, refused before it is written (and every key a job cannot
    honour: kit.plan.slurm_keys)."""
    if config.runtime == "enroot":
        raise ConfigError(
            "enroot is for kit pull: under SLURM, pyxis or the Container Engine start the containers",
            key="runtime",
            source=sources.get("runtime"),
            hint="use runtime pyxis (srun --container-image) or edf (srun --environment)",
        )
    if config.supervise.enabled and config.runtime in ("pyxis", "edf"):
        raise ConfigError(
            f"supervision (supervise.enabled) is not available with runtime {config.runtime} yet",
            key="supervise.enabled",
            source=sources.get("supervise.enabled"),
            hint="use runtime docker or apptainer for a supervised job, or slurm.requeue to requeue a failed job",
        )
    if config.model.dp_lb == "router":
        # Issue 29: SLURM requeues a whole job or one task of a job array, never one node or step
        # of a running job: one array task per replica, and the router as a job of its own
        # (kit.plan.slurm_replicas; docs/architecture.md, "Replicas under SLURM").
        check_slurm_router(config, sources)
    if config.network:
        raise ConfigError(
            "a Docker simulation network cannot be used under SLURM",
            key="network",
            source=sources.get("network"),
            hint="unset network: SLURM nodes use host networking",
        )
    walltime_seconds(config.slurm.time)
    check_slurm_keys(config, sources)


def check_slurm_router(config: KitConfig, sources: Mapping[str, str]) -> None:
    """What the replicas' launchers cannot do yet, refused in one line each."""
    if config.runtime not in ("docker", "apptainer"):
        raise ConfigError(
            "replicas behind a router (model.dp_lb: router) under SLURM run with runtime docker or apptainer, "
            f"not {config.runtime}",
            key="runtime",
            source=sources.get("runtime"),
            hint="set runtime: docker or apptainer, or model.dp_lb: internal or hybrid (one DP group in one job)",
        )
    router = config.router.image
    if config.runtime == "apptainer" and not (router.startswith("/") or router.endswith(".sif") or "://" in router):
        raise ConfigError(
            f"with runtime apptainer the router runs from a SIF file (or a URI Apptainer takes), not {router!r}",
            key="router.image",
            source=sources.get("router.image"),
            hint="where Docker and Apptainer run: `kit build router`, then `kit build router --runtime apptainer` "
            "(it prints the SIF it writes); set router.image to that path",
        )
    taken = {v: k for k, v in vars(config.ports).items() if k not in ("ray_min_worker", "ray_max_worker")}
    # SLURM may put every task on one node: each replica has its own port from each base (its
    # supervisor's too, when supervised).
    for name in ("replica", "mp_master", *(("supervisor",) if config.supervise.enabled else ())):
        base = getattr(config.ports, name)
        for port in range(base + 1, base + config.dp):
            if port in taken or port > 65535:
                raise ConfigError(
                    f"{config.dp} replicas use ports.{name} {base}-{base + config.dp - 1} (SLURM may put them on "
                    f"one node), and port {port} "
                    + (f"is ports.{taken[port]}" if port in taken else "is out of range"),
                    key=f"ports.{name}",
                    source=sources.get(f"ports.{name}"),
                    hint=f"move ports.{name} so that the {config.dp} ports from it are free",
                )


def secret_files(config: KitConfig, role: Role) -> list[str]:
    """The secret files a node of this role mounts (the launcher checks each is readable there)."""
    files = [config.hf_token_file, config.api_key_file if serves_api(config, role) else None]
    if ray_token_enabled(config):
        files.append(config.ray_token_file)
    return [path for path in files if path]


def plan_launcher(config: KitConfig, *, edf_paths: Mapping[str, str] | None = None) -> str:
    """The whole sbatch script for config (nodes × gpus_per_node, runtime, backend). With runtime
    edf, `edf_paths` says where the environment definition files are (by role: head, worker;
    kit.plan.slurm_enroot.edf_paths; default: next to kit-CLUSTER.sbatch)."""
    scripts = container_scripts(config)
    worker = Role("worker", RANK_SENTINEL)
    head_args = default_head_args(scripts)
    worker_args: tuple[str, ...] = ()
    if config.supervise.enabled:  # issue 18: kit's supervisor runs each node's serve script
        scripts, head_args, worker_args = supervised(supervised_config(config), scripts, head_args, worker)
    head_spec, worker_spec = node_specs(config, scripts, head_args=head_args, worker_args=worker_args)
    has_workers = "KIT_WORKER_SCRIPT" in scripts
    context = launcher_context(config, scripts)
    if config.runtime in ("pyxis", "edf"):
        return slurm_enroot.render_launcher(config, context, enroot_specs(config), edf_paths)
    return render(
        "sbatch.sh.j2",
        **context,
        head_cmd=argv_text(node_argv(config, head_spec)),
        worker_cmd=argv_text(node_argv(config, worker_spec)) if has_workers else None,
        head_exports=node_exports(config, head_spec),
        worker_exports=node_exports(config, worker_spec) if has_workers else [],
        head_name=shell_quote(runtime_word(head_spec.name)),
        worker_name=shell_quote(runtime_word(worker_spec.name)),
        apptainer=config.runtime == "apptainer",
        job_tmp=True,
        node_function="kit_node_step",
    )


def launcher_context(config: KitConfig, scripts: Mapping[str, str]) -> dict[str, object]:
    """What every launcher template (Docker/Apptainer, pyxis/EDF) is rendered with."""
    worker = Role("worker", RANK_SENTINEL)
    image = config.image
    return {
        "version": __version__,
        "config": config,
        "sbatch_lines": [sbatch_line(k, v) for k, v in sbatch_resources(config).directives()],
        "scripts": scripts,
        "head_secrets": secret_files(config, HEAD),
        "worker_secrets": secret_files(config, worker),
        "interface": None if config.interface == "auto" else config.interface,
        "api_port": config.ports.api,
        "served_name": config.served_name,
        # timeouts.ready auto: the job's remaining walltime alone bounds the wait (issue 28)
        "ready_timeout": None if config.timeouts.ready == "auto" else config.timeouts.ready_s,
        "walltime_s": walltime_seconds(config.slurm.time),
        "margin_s": WALLTIME_MARGIN_S,
        "ready_mark": READY_MARK,
        "server_ready_mark": SERVER_READY_MARK,
        "server_timeout_mark": SERVER_TIMEOUT_MARK,
        "supervise": config.supervise.enabled,
        "requeue": config.slurm.requeue,
        # the job that requeues itself (an array task: only itself, never its whole array)
        "this_job": "${SLURM_JOB_ID}",
        "compile_cache": config.compile_cache.dir,
        # issue 28: the site's prologue, what every node checks before anything starts, the GPUs
        "prologue": config.slurm.prologue,
        "runtime_bin": {"docker": "docker", "apptainer": "apptainer"}.get(config.runtime),
        "docker_image": image if config.runtime == "docker" else None,
        "image_file": image if is_image_file(config, image) else None,
        "model_dir": local_model_dir(config),
        "allocated_gpus": docker_takes_allocated_gpus(config),
        "gpus": config.accelerator == "gpu",
        "infiniband_auto": config.runtime == "docker" and config.infiniband == "auto",
        # where the login host reaches the API: the head's node IP, or (api_listen all) its name
        "tunnel_target": "KIT_HEAD_HOST" if config.api_listen == "all" else "KIT_HEAD_ADDRESS",
        "login_host": config.tunnel.login_host,
        "login_user": "@" in (config.tunnel.login_host or ""),
        "ssh_port": config.tunnel.ssh_port,
        "ready_auto_s": READY_AUTO_S,
    }


def is_image_file(config: KitConfig, image: str) -> bool:
    """An image (the engine's, or the router's) that is a file every node must be able to read
    (a SIF, a squashfs)."""
    if config.runtime == "apptainer":
        return "://" not in image
    return config.runtime in ("pyxis", "edf") and image.startswith("/")


def supervised_config(config: KitConfig) -> KitConfig:
    """The config the job's supervisor is told: timeouts.ready auto waits as long as the walltime
    leaves (the launcher's own readiness wait is bounded the same way)."""
    walltime = walltime_seconds(config.slurm.time)
    if config.timeouts.ready != "auto" or walltime <= 0:
        return config
    ready = max(1, walltime - WALLTIME_MARGIN_S)
    return config.replace(timeouts=dataclasses.replace(config.timeouts, ready=ready))


def plan_slurm_files(config: KitConfig, launcher: str) -> dict[str, str]:
    """Every file `kit slurm` writes, {path: text}: the launcher first, then (runtime edf) the
    environment definition files it names, beside it (kit.plan.slurm_enroot.edf_paths)."""
    if config.runtime != "edf":
        return {launcher: plan_launcher(config)}
    paths = slurm_enroot.edf_paths(launcher, config.nodes)
    text = plan_launcher(config, edf_paths=paths)
    return {launcher: text, **slurm_enroot.plan_edfs(config, enroot_specs(config), paths)}


def default_head_args(scripts: Mapping[str, str]) -> tuple[str, ...]:
    """With Ray, the head's entry gets the node and serve scripts as its arguments."""
    return tuple(job_var(var) for var in ("KIT_RAY_HEAD_NODE_SCRIPT", "KIT_HEAD_SERVE_SCRIPT") if var in scripts)


def node_specs(
    config: KitConfig,
    scripts: Mapping[str, str],
    *,
    head_args: tuple[str, ...] | None = None,
    worker_args: tuple[str, ...] = (),
) -> tuple[ContainerSpec, ContainerSpec]:
    """The head's and the workers' ContainerSpec, each running its script with its arguments
    (the head's default: default_head_args)."""
    worker = Role("worker", RANK_SENTINEL)
    head_args = default_head_args(scripts) if head_args is None else head_args
    return slurm_spec(config, HEAD, job_var("KIT_HEAD_SCRIPT"), head_args), slurm_spec(
        config, worker, job_var("KIT_WORKER_SCRIPT"), worker_args
    )


def enroot_specs(config: KitConfig) -> dict[Role, ContainerSpec]:
    """The specs the enroot launchers start, by role: the head, and the workers when there are."""
    head, worker = node_specs(config, container_scripts(config))
    return {head.role: head, **({worker.role: worker} if config.nodes > 1 else {})}
