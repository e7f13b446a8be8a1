"""The enroot launchers of NVIDIA GPU SLURM sites (issue 20): `kit slurm --runtime pyxis` (srun
--container-image=... through the pyxis plugin) and `--runtime edf` (srun --environment=FILE,
the CSCS Container Engine's environment definition file). Pure text, from the same plan as
`kit up` and the Docker/Apptainer launchers (kit.plan.slurm.slurm_spec: plan_node's ContainerSpec).

Under pyxis srun itself starts the container, so nothing of the node step runs on the host
between srun and the container as it does for `docker run`/`apptainer exec`. The launcher runs
in two steps: a short one on the hosts (no container) finds every node's IP and interface and
checks its secret files, exactly as the Docker/Apptainer node step does, and prints the node
table; then the container steps (the head's, and the workers': only the head mounts the API key)
start each container with the node entry (templates/slurm_node_entry.sh.j2), which takes its
node's rank, IP and interface from the table, sets the node's own environment, prints the node
probe (`kit verify --job-output`) and runs the node script. The scripts, the entry and the probe
travel as data (one quoted word each), as in the Docker/Apptainer launcher.

The container environment goes where each runtime reads it: pyxis, exported in the step's own
subshell and named in --container-env (names only: no value is in a comma list); EDF, the [env]
table of its TOML file (kit.render.toml). Values only a node knows (its IP, interface, rank) are
set by the entry inside the container.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kit import __version__
from kit.config import KitConfig
from kit.errors import ConfigError
from kit.plan.container_args import to_edf, to_pyxis_options
from kit.plan.job_vars import argv_text, has_sentinel, job_var, runtime_word, sentinels
from kit.plan.node import ContainerSpec
from kit.plan.roles import Role
from kit.render import render, shell_quote
from kit.render.toml import to_toml
from kit.resources import program_source

ENROOT_RUNTIMES = ("pyxis", "edf")
PROBE_MARK = "KIT_PROBE"
# Sentinels (kit.plan.slurm.job_var) the node entry sets from the node table: only the node knows them.
NODE_VARS = ("VLLM_HOST_IP", "KIT_INTERFACE", "KIT_NODE_RANK")
# And those it finds in its environment: the job's (exported by the launcher, or set by SLURM).
JOB_VARS = ("KIT_HEAD_ADDRESS", "SLURM_JOB_ID")


@dataclass(frozen=True)
class Step:
    """One container step of the launcher: what its subshell exports, and the srun argv."""

    exports: list[str]
    argv: str


def edf_paths(launcher: str | Path, nodes: int) -> dict[str, str]:
    """Where `kit slurm --runtime edf` writes the environment definition files: next to the
    launcher, `NAME.head.toml` (and `NAME.worker.toml`), as the launcher path was given."""
    path = Path(launcher)
    roles = ("head", "worker") if nodes > 1 else ("head",)
    return {role: str(path.with_name(f"{path.stem}.{role}.toml")) for role in roles}


def split_env(env: Mapping[str, str], runtime: str) -> tuple[dict[str, str], dict[str, str]]:
    """(for the runtime, for the entry): values holding a node's own sentinel are set by the entry
    in the container; under EDF also those holding a job's (a file written before the job has no
    "${VAR}"); the rest go to pyxis' exports or the EDF's [env]."""
    names = NODE_VARS if runtime == "pyxis" else (*NODE_VARS, *JOB_VARS)
    in_entry = {k: v for k, v in env.items() if has_sentinel(v, names)}
    return {k: v for k, v in env.items() if k not in in_entry}, in_entry


def node_entry(runtime: str, env: Mapping[str, str]) -> str:
    """The entry a node's container runs first (see the module docstring)."""
    known = set(NODE_VARS) | set(JOB_VARS)
    for name, value in env.items():
        if not sentinels(value) <= known:  # the entry could not set it: a planning bug, not input
            raise AssertionError(f"{name} holds a value the node entry cannot know: {sorted(sentinels(value))}")
    exports = [shell_quote(runtime_word(f"{k}={v}")) for k, v in env.items()]
    return render("slurm_node_entry.sh.j2", version=__version__, runtime=runtime, exports=exports,
                  probe_mark=PROBE_MARK)  # fmt: skip


def enroot_steps(
    config: KitConfig, specs: Mapping[Role, ContainerSpec], edf_vars: Mapping[Role, str]
) -> tuple[dict[str, str], list[Step]]:
    """The entries (by the variable that carries each) and the container steps, head first."""
    entries: dict[str, str] = {}
    steps = []
    for role, spec in specs.items():
        static, in_entry = split_env(spec.env, config.runtime)
        var = f"KIT_{role.kind.upper()}_ENTRY"
        entries[var] = node_entry(config.runtime, in_entry)
        spec = dataclasses.replace(spec, env=static)
        if role.is_head:
            where = ["--nodes=1", "--ntasks=1", f"--nodelist={job_var('KIT_HEAD_HOST')}"]
        else:
            n = config.nodes - 1
            where = [f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1", f"--exclude={job_var('KIT_HEAD_HOST')}"]
        if config.slurm.cpus_per_task:
            where.append(f"--cpus-per-task={config.slurm.cpus_per_task}")
        where += ["--kill-on-bad-exit=1", "--export=ALL", "--label"]
        if config.runtime == "pyxis":
            container = to_pyxis_options(spec, config.image)
            # KIT_HEAD_ADDRESS="${KIT_HEAD_ADDRESS}": already in the environment the launcher exported
            exports = [shell_quote(runtime_word(f"{k}={v}")) for k, v in static.items() if v != job_var(k)]
        else:
            container = [f"--environment={job_var(edf_vars[role])}"]
            exports = []
        # One srun line starts every worker: the name (the scripts' $0) cannot hold a node's rank.
        name = spec.name.replace("-" + job_var("KIT_NODE_RANK"), "")
        command = ["/bin/bash", "-c", job_var(var), name, job_var("KIT_NODES"), job_var("KIT_PROBE")]
        argv = [*where, *container, *command, spec.script, *spec.script_args]
        if any(has_sentinel(word, NODE_VARS) for word in [*argv, *static.values()]):
            raise AssertionError(f"the {role.kind} step would need a value only its node knows")  # a planning bug
        steps.append(Step(exports, argv_text(argv, joined=0)))
    return entries, steps


def render_launcher(
    config: KitConfig,
    context: Mapping[str, object],
    specs: Mapping[Role, ContainerSpec],
    paths: Mapping[str, str] | None,
) -> str:
    """The pyxis or EDF launcher: kit.plan.slurm.plan_launcher's `context` (the #SBATCH lines, the
    scripts, the secrets each role checks, the readiness wait) and the role's specs."""
    check_enroot_config(config)
    edf_vars = {role: f"KIT_{role.kind.upper()}_EDF" for role in specs}
    entries, steps = enroot_steps(config, specs, edf_vars)
    scripts = {**dict(context["scripts"]), **entries, "KIT_PROBE": program_source("verify/probe.py")}  # type: ignore[call-overload]
    edf_files: dict[str, str] = {}
    if config.runtime == "edf":
        where = paths or edf_paths(f"kit-{config.cluster}.sbatch", config.nodes)
        edf_files = {var: where[role.kind] for role, var in edf_vars.items()}
    return render(
        "sbatch_enroot.sh.j2",
        **{**context, "scripts": scripts},
        runtime=config.runtime,
        steps=steps,
        edf_files=edf_files,
        job_tmp=False,
        node_function="kit_node_address",
    )


def plan_edfs(config: KitConfig, specs: Mapping[Role, ContainerSpec], paths: Mapping[str, str]) -> dict[str, str]:
    """The EDF files of `kit slurm --runtime edf`: {path: TOML text}, one per role."""
    out = {}
    for role, spec in specs.items():
        static, _ = split_env(spec.env, "edf")
        data = to_edf(dataclasses.replace(spec, env=static), config.image)
        head = "head node" if role.is_head else "worker nodes"
        comment = (
            f"# kit {__version__}: environment definition (CSCS Container Engine) of the {head} of a kit\n"
            "# cluster, for `srun --environment=FILE` in the launcher written beside it. Generated by\n"
            "# `kit slurm --runtime edf` from the same plan as `kit up`; do not edit, regenerate it.\n"
        )
        out[paths["head" if role.is_head else "worker"]] = comment + to_toml(data)
    return out


def check_enroot_config(config: KitConfig) -> None:
    """What the enroot launchers cannot carry: an interface with blanks (the node table's fields are
    words) and a relative image path (pyxis reads any other word as a Docker name)."""
    if re.search(r"\s", config.interface):  # the node table is one line of words per node
        raise ConfigError(
            f"{config.interface!r} holds a blank or a newline", key="interface", hint="use an interface name like ib0"
        )
    image = config.image
    if image.endswith((".sqsh", ".squashfs")) and not image.startswith("/"):
        raise ConfigError(
            f"{image!r} is a relative path: {config.runtime} would read it as an image name",
            key="image",
            hint="give the squashfs file's absolute path (on a filesystem every node sees)",
        )
