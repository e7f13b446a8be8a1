"""The same ContainerSpec in each runtime's terms: docker-py kwargs and the `docker run` argv
derived from them (what --dry-run prints is what the Docker adapter starts), the `apptainer` argv
and environment the Apptainer adapter and the SLURM launcher run, and the pyxis `srun
--container-*` options and CSCS environment definition (EDF) of the enroot launchers.

Detached (`kit up`) or foreground (one SLURM step per node, which srun must track for the life of
the job) is a parameter of each builder. Every option value is attached as `--flag=value`, so a
value that starts with `-` can never be read as an option; the image, the one positional
argument before the command, is refused if it looks like an option.

Lists a runtime splits are built so no value can break them (issue 20): Apptainer reads `--env`
and `--bind` as comma-separated lists, so the environment goes through APPTAINERENV_ variables
instead, and a bind path holding ',' or ':' is refused; pyxis' `--container-mounts` is a comma
list of SRC:DST[:FLAGS] (enroot then splits each entry at blanks), so such paths are refused
there too, and `--container-env` carries only names (validated identifiers), the values staying
in the environment. Apptainer and the EDF expand `$` in environment values: refused there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from kit.errors import ConfigError
from kit.images.reference import familiar_repository, parse_ref
from kit.plan.node import ContainerSpec, Mount
from kit.plan.paths import API_KEY_PATH, COMPILE_CACHE, HF_HOME, HF_TOKEN_PATH, RAY_TOKEN_PATH
from kit.render import positional

RESTART_POLICY = "unless-stopped"


def to_docker_kwargs(spec: ContainerSpec, *, foreground: bool = False) -> dict[str, Any]:
    """Keyword arguments for docker-py's `containers.run`, as plain data (the adapter turns the
    `device_requests`/`ulimits`/`networking_config` dicts into docker.types unchanged).
    Foreground: attached and removed on exit (`--rm`) instead of detached."""
    kwargs: dict[str, Any] = {
        "image": positional(spec.image, key="image"),
        "name": spec.name,
        "entrypoint": ["/bin/bash"],
        "command": spec.command,
        "detach": not foreground,
        "init": True,  # signals reach the script; `docker stop` is quick
        "labels": dict(spec.labels),
        "environment": dict(spec.env),
        # A list, not docker-py's dict keyed by the host path: one host path may be mounted twice.
        "volumes": [f"{m.source}:{m.target}:{'ro' if m.read_only else 'rw'}" for m in spec.mounts],
    }
    if foreground:
        kwargs["auto_remove"] = True
    else:
        # A node whose container dies (its main process killed, OOM, the engine restarted) is
        # started again by Docker (issue 25); `docker stop`/`docker kill`/`kit down` are final.
        # Under SLURM (foreground) the job's requeue is the restart.
        kwargs["restart_policy"] = {"Name": RESTART_POLICY}
    if spec.network == "host":
        kwargs["network_mode"] = "host"
    else:
        kwargs["network"] = spec.network
        kwargs["hostname"] = spec.name
        if spec.ip:
            kwargs["networking_config"] = {spec.network: {"ipv4_address": spec.ip}}
    if spec.ipc_host:
        kwargs["ipc_mode"] = "host"
    elif spec.shm_size is not None:  # none for the router (issue 29): Docker's default /dev/shm
        kwargs["shm_size"] = spec.shm_size
    if spec.gpus == "all":
        kwargs["device_requests"] = [{"count": -1, "capabilities": [["gpu"]]}]
    elif spec.gpus:
        kwargs["device_requests"] = [{"device_ids": list(spec.gpus), "capabilities": [["gpu"]]}]
    if spec.devices:
        kwargs["devices"] = list(spec.devices)
    if spec.cap_add:
        kwargs["cap_add"] = list(spec.cap_add)
    if spec.ulimits:
        kwargs["ulimits"] = [{"name": n, "soft": s, "hard": h} for n, s, h in spec.ulimits]
    if spec.user:
        kwargs["user"] = spec.user
    if spec.read_only:
        kwargs["read_only"] = True
    if spec.tmpfs:
        kwargs["tmpfs"] = dict.fromkeys(spec.tmpfs, "")
    return kwargs


def to_docker_argv(spec: ContainerSpec, *, foreground: bool = False) -> list[str]:
    """The `docker run` command line of `to_docker_kwargs(spec)`: the same container, as the CLI
    starts it (what `kit up --dry-run` prints and the SLURM launcher runs)."""
    return docker_run_argv(to_docker_kwargs(spec, foreground=foreground))


def docker_run_argv(kw: Mapping[str, Any]) -> list[str]:
    """docker-py `containers.run` kwargs (as to_docker_kwargs makes them) -> `docker run` argv."""
    argv = ["docker", "run"]
    argv += ["--detach"] if kw["detach"] else []
    argv += ["--rm"] if kw.get("auto_remove") else []
    argv += ["--init"] if kw.get("init") else []
    if kw.get("restart_policy"):
        argv.append(f"--restart={kw['restart_policy']['Name']}")
    argv.append(f"--name={kw['name']}")
    if "network_mode" in kw:
        argv.append(f"--network={kw['network_mode']}")
    else:
        argv += [f"--network={kw['network']}", f"--hostname={kw['hostname']}"]
        argv += [f"--ip={e['ipv4_address']}" for e in (kw.get("networking_config") or {}).values()]
    if "ipc_mode" in kw:
        argv.append(f"--ipc={kw['ipc_mode']}")
    if "shm_size" in kw:
        argv.append(f"--shm-size={kw['shm_size']}")
    for request in kw.get("device_requests", []):
        # The CLI reads --gpus as CSV: a device list needs literal double quotes around it.
        ids = request.get("device_ids")
        argv.append("--gpus=all" if ids is None else '--gpus="device=' + ",".join(ids) + '"')
    argv += [f"--device={d}" for d in kw.get("devices", [])]
    argv += [f"--cap-add={c}" for c in kw.get("cap_add", [])]
    argv += [f"--ulimit={u['name']}={u['soft']}:{u['hard']}" for u in kw.get("ulimits", [])]
    argv += [f"--user={kw['user']}"] if kw.get("user") else []
    argv += ["--read-only"] if kw.get("read_only") else []
    argv += [f"--tmpfs={path}" for path in kw.get("tmpfs", {})]
    for volume in kw["volumes"]:
        path, mode = volume.rsplit(":", 1)
        argv.append(f"--volume={path}" + (":ro" if mode == "ro" else ""))
    argv += [f"--env={key}={value}" for key, value in kw["environment"].items()]
    argv += [f"--label={key}={value}" for key, value in kw["labels"].items()]
    [entrypoint] = kw["entrypoint"]
    argv += [f"--entrypoint={entrypoint}", kw["image"], *kw["command"]]
    return argv


# ---- Apptainer --------------------------------------------------------------------------------

# Apptainer sets NAME in the container for every APPTAINERENV_NAME of its own environment: one
# variable each, whatever the value holds (FIELD_NOTES §4). The `singularity` binary reads
# SINGULARITYENV_ (SingularityCE, and Apptainer's alias).
APPTAINER_ENV_PREFIX = "APPTAINERENV_"
SINGULARITY_ENV_PREFIX = "SINGULARITYENV_"


def apptainer_instance_name(spec: ContainerSpec) -> str:
    return spec.name


def to_apptainer_start_argv(spec: ContainerSpec, image: str, *, foreground: bool = False) -> list[str]:
    """Start the node: `apptainer instance start` (`kit up`; the node script then runs inside it
    through `to_apptainer_exec_argv`), or, foreground, one `apptainer exec` of the node script
    (SLURM: an instance daemon would escape srun's process tracking). Host network and host /dev
    (so /dev/shm and /dev/infiniband) are Apptainer's defaults; never --contain (Ray breaks in its
    64 MB /tmp), never -e (--cleanenv drops SLURM_*). FIELD_NOTES §4. GPUs: apptainer.gpu_args
    (--nv, which shows every GPU of the host: CUDA_VISIBLE_DEVICES selects them by their physical
    ids), then apptainer.extra_args, each one option word (kit.plan.checks).

    The environment is not in the argv: it goes with `to_apptainer_env(spec.env)` in the process
    environment of this command (and of the exec: an instance's start environment does not reach
    the processes later exec'd into it)."""
    check_paths(spec.mounts, "Apptainer's --bind", ",:")
    to_apptainer_env(spec.env)  # refused here too: the argv and its environment go together
    options = [*(spec.apptainer_gpu_args if spec.gpus is not None else ()), *spec.apptainer_args]
    for m in spec.mounts:
        options.append(f"--bind={m.source}:{m.target}" + (":ro" if m.read_only else ""))
    image = positional(image, key="image")
    if foreground:
        return ["apptainer", "exec", *options, image, "/bin/bash", *spec.command]
    return ["apptainer", "instance", "start", *options, image, apptainer_instance_name(spec)]


def to_apptainer_exec_argv(spec: ContainerSpec) -> list[str]:
    """Run the node script inside the instance (with `to_apptainer_env(spec.env)` again)."""
    return ["apptainer", "exec", f"instance://{apptainer_instance_name(spec)}", "/bin/bash", *spec.command]


def to_apptainer_env(env: Mapping[str, str], *, prefix: str = APPTAINER_ENV_PREFIX) -> dict[str, str]:
    """The container's environment as the variables Apptainer turns into it: {PREFIX + NAME: value}.
    Unlike `--env` (a comma list: NCCL_IB_HCA=mlx5_0,mlx5_1 would become two variables, and
    `x,LD_PRELOAD=...` one more), every value arrives whole. Apptainer writes each into a
    double-quoted `export` that its shell evaluates, so `$` and backticks are refused."""
    check_env_values(env, "Apptainer", "$`")
    return {f"{prefix}{name}": value for name, value in env.items()}


# ---- enroot: pyxis (srun --container-*) and CSCS EDF (srun --environment) --------------------

# The container's working directory: exists in every image, writable (enroot mounts a tmpfs).
ENROOT_WORKDIR = "/tmp"


def enroot_image(image: str) -> str:
    """The image as pyxis and the EDF take it: a squashfs path as it is (`kit pull --runtime
    enroot` writes one), a Docker reference in enroot's URI form [REGISTRY#]IMAGE[:TAG|@DIGEST]
    (`#` separates the registry: enroot 3 reads `nvcr.io/nvidia/x` as an image on Docker Hub)."""
    if image.startswith("/"):
        return image
    ref = parse_ref(image.removeprefix("docker://"))
    repository = ref.repository
    first, _, rest = repository.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        name = familiar_repository(repository)
        if name == repository:  # not Docker Hub: REGISTRY#PATH
            name = f"{first}#{rest}"
    else:
        name = repository
    return f"{name}@{ref.digest}" if ref.digest else f"{name}:{ref.tag or 'latest'}"


def to_pyxis_options(spec: ContainerSpec, image: str) -> list[str]:
    """The pyxis options of `srun` that start this node's container: the image, the bind mounts,
    the names of its environment variables (their values come from srun's environment: the
    launcher exports them; listed, they win over the image's own values), no home directory, no
    image entrypoint (vLLM images have one: it would run before kit's command), root inside the
    container like Docker (the image's own files, e.g. under /root, stay reachable), and a working
    directory every image has. The network is the host's: pyxis never unshares it (no
    --container-unshare here). GPUs and /dev/infiniband are what the site's enroot hooks expose
    (`kit verify --job-output` checks them)."""
    check_paths(spec.mounts, "pyxis' --container-mounts", ",:", absolute=True, blanks=True)
    options = [f"--container-image={enroot_image(positional(image, key='image'))}"]
    if spec.mounts:
        options.append("--container-mounts=" + ",".join(_mount_entry(m) for m in spec.mounts))
    if spec.env:
        options.append("--container-env=" + ",".join(spec.env))
    return [
        *options,
        "--no-container-mount-home",
        "--no-container-entrypoint",
        "--container-remap-root",
        f"--container-workdir={ENROOT_WORKDIR}",
    ]


def to_edf(spec: ContainerSpec, image: str) -> dict[str, Any]:
    """The CSCS environment definition (a TOML file: see kit.render.toml) of this node's container:
    the same image, mounts and environment as pyxis, no entrypoint, a writable root. Values are
    data in a file, not shell; `$` is refused (the Container Engine may expand ${VAR})."""
    check_paths(spec.mounts, "the EDF's mounts", ",:$", absolute=True, blanks=True)
    check_env_values(spec.env, "the EDF", "$")
    if "$" in image:
        raise ConfigError(f"{image!r} holds '$', which the Container Engine expands", key="image", hint="rename it")
    for name, value in spec.env.items():
        if value == "":
            raise ConfigError(
                f"{name} is empty: an empty value in an EDF unsets the variable",
                key="env",
                hint="give it a value, or leave it out",
            )
    return {
        "image": enroot_image(positional(image, key="image")),
        "workdir": ENROOT_WORKDIR,
        "entrypoint": False,
        "writable": True,
        "mounts": [_mount_entry(m) for m in spec.mounts],
        "env": dict(spec.env),
    }


def _mount_entry(m: Mount) -> str:
    return f"{m.source}:{m.target}" + (":ro" if m.read_only else "")


# ---- what each runtime's syntax cannot carry ------------------------------------------------

_MOUNT_KEYS = {
    HF_HOME: "hf_cache",
    COMPILE_CACHE: "compile_cache.dir",
    HF_TOKEN_PATH: "hf_token_file",
    API_KEY_PATH: "api_key_file",
    RAY_TOKEN_PATH: "ray_token_file",
}


def mount_key(m: Mount) -> str:
    """The config key a mount comes from (for the one-line refusal)."""
    if m.key is not None:
        return m.key
    if m.target in _MOUNT_KEYS:
        return _MOUNT_KEYS[m.target]
    if m.source.startswith("\x00"):  # the SLURM launcher's per-job folder, mounted at ray.temp_dir
        return "ray.temp_dir"
    return "mounts"


def check_paths(
    mounts: Iterable[Mount], where: str, forbidden: str, *, absolute: bool = False, blanks: bool = False
) -> None:
    """Refuse a mount whose host or container path holds a character `where` splits on (with
    `blanks`, any whitespace: enroot splits its mount entries at blanks), and, with `absolute`, a
    relative host path (pyxis takes a word that is not a path for a mount type)."""
    bad = re.compile("[" + re.escape(forbidden) + (r"\s" if blanks else "") + "]")
    for m in mounts:
        for side, path in (("host", m.source), ("container", m.target)):
            found = bad.search(path.replace("\x00", ""))
            if found:
                raise ConfigError(
                    f"the {side} path {path!r} holds {found.group(0)!r}, which {where} cannot carry",
                    key=mount_key(m),
                    hint=f"use a path without {' '.join(repr(c) for c in forbidden)}{' or blanks' if blanks else ''}"
                    " (a symlink to it works)",
                )
        if absolute and not m.source.startswith(("/", "\x00")):
            raise ConfigError(
                f"the host path {m.source!r} is not absolute: {where} needs one",
                key=mount_key(m),
                hint="give an absolute path",
            )


def check_env_values(env: Mapping[str, str], runtime: str, forbidden: str) -> None:
    bad = re.compile("[" + re.escape(forbidden) + "]")
    for name, value in env.items():
        found = bad.search(value)
        if found:
            raise ConfigError(
                f"{name}: {runtime} expands {found.group(0)!r} in environment values: it would not arrive as written",
                key="env",
                hint=f"remove {found.group(0)!r} from the value, or use runtime docker or pyxis",
            )
