"""The same ContainerSpec in each runtime's terms: docker-py kwargs and the `docker run` argv
derived from them (what --dry-run prints is what the Docker adapter starts), and the
`apptainer` argv the Apptainer adapter and the SLURM launcher run.

Detached (`kit up`) or foreground (one SLURM step per node, which srun must track for the life of
the job) is a parameter of each builder. Every option value is attached as `--flag=value`, so a
value that starts with `-` can never be read as an option; the image, the one positional
argument before the command, is refused if it looks like an option.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kit.plan.node import ContainerSpec
from kit.render import positional


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
    if spec.network == "host":
        kwargs["network_mode"] = "host"
    else:
        kwargs["network"] = spec.network
        kwargs["hostname"] = spec.name
        if spec.ip:
            kwargs["networking_config"] = {spec.network: {"ipv4_address": spec.ip}}
    if spec.ipc_host:
        kwargs["ipc_mode"] = "host"
    else:
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
    for volume in kw["volumes"]:
        path, mode = volume.rsplit(":", 1)
        argv.append(f"--volume={path}" + (":ro" if mode == "ro" else ""))
    argv += [f"--env={key}={value}" for key, value in kw["environment"].items()]
    argv += [f"--label={key}={value}" for key, value in kw["labels"].items()]
    [entrypoint] = kw["entrypoint"]
    argv += [f"--entrypoint={entrypoint}", kw["image"], *kw["command"]]
    return argv


def apptainer_instance_name(spec: ContainerSpec) -> str:
    return spec.name


def to_apptainer_start_argv(spec: ContainerSpec, image: str, *, foreground: bool = False) -> list[str]:
    """Start the node: `apptainer instance start` (`kit up`; the node script then runs inside it
    through `to_apptainer_exec_argv`), or, foreground, one `apptainer exec` of the node script
    (SLURM: an instance daemon would escape srun's process tracking). Host network and host /dev
    (so /dev/shm and /dev/infiniband) are Apptainer's defaults; never --contain (Ray breaks in its
    64 MB /tmp), never -e (--cleanenv drops SLURM_*). FIELD_NOTES §4."""
    options = ["--nv"] if spec.gpus is not None else []
    for m in spec.mounts:
        options.append(f"--bind={m.source}:{m.target}" + (":ro" if m.read_only else ""))
    options += [f"--env={key}={value}" for key, value in spec.env.items()]
    image = positional(image, key="image")
    if foreground:
        return ["apptainer", "exec", *options, image, "/bin/bash", *spec.command]
    return ["apptainer", "instance", "start", *options, image, apptainer_instance_name(spec)]


def to_apptainer_exec_argv(spec: ContainerSpec) -> list[str]:
    """Run the node script inside the instance."""
    return ["apptainer", "exec", f"instance://{apptainer_instance_name(spec)}", "/bin/bash", *spec.command]
