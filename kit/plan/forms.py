"""The same ContainerSpec in each runtime's terms: docker-py kwargs, a `docker run` argv (what
--dry-run prints, runnable as is), and `apptainer instance start` + `exec` argv."""

from __future__ import annotations

from typing import Any

from kit.plan.node import ContainerSpec


def to_docker_kwargs(spec: ContainerSpec) -> dict[str, Any]:
    """Keyword arguments for docker-py's `containers.run` (plain data; the adapter turns
    `device_requests`/`ulimits` dicts into docker.types and attaches the fixed IP)."""
    kwargs: dict[str, Any] = {
        "image": spec.image,
        "name": spec.name,
        "entrypoint": ["/bin/bash"],
        "command": spec.command,
        "detach": True,
        "init": True,  # signals reach the script; `docker stop` is quick
        "labels": dict(spec.labels),
        "environment": dict(spec.env),
        "volumes": {m.source: {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in spec.mounts},
    }
    if spec.network == "host":
        kwargs["network_mode"] = "host"
    else:
        kwargs["network"] = spec.network
        kwargs["hostname"] = spec.name
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


def to_docker_argv(spec: ContainerSpec) -> list[str]:
    """The equivalent `docker run` command line."""
    argv = ["docker", "run", "--detach", "--init", "--name", spec.name]
    if spec.network == "host":
        argv += ["--network", "host"]
    else:
        argv += ["--network", spec.network, "--hostname", spec.name]
        if spec.ip:
            argv += ["--ip", spec.ip]
    argv += ["--ipc", "host"] if spec.ipc_host else ["--shm-size", str(spec.shm_size)]
    if spec.gpus == "all":
        argv += ["--gpus", "all"]
    elif spec.gpus:
        argv += ["--gpus", '"device=' + ",".join(spec.gpus) + '"']
    for device in spec.devices:
        argv += ["--device", device]
    for cap in spec.cap_add:
        argv += ["--cap-add", cap]
    for name, soft, hard in spec.ulimits:
        argv += ["--ulimit", f"{name}={soft}:{hard}"]
    for m in spec.mounts:
        argv += ["--volume", f"{m.source}:{m.target}" + (":ro" if m.read_only else "")]
    for key, value in spec.env.items():
        argv += ["--env", f"{key}={value}"]
    for key, value in spec.labels.items():
        argv += ["--label", f"{key}={value}"]
    argv += ["--entrypoint", "/bin/bash", spec.image, *spec.command]
    return argv


def apptainer_instance_name(spec: ContainerSpec) -> str:
    return spec.name


def to_apptainer_start_argv(spec: ContainerSpec, image: str) -> list[str]:
    """`apptainer instance start`: host network and host /dev (so /dev/shm and /dev/infiniband)
    are Apptainer's defaults; never --contain (Ray breaks in its 64 MB /tmp), never -e
    (--cleanenv drops SLURM_*). FIELD_NOTES §4."""
    argv = ["apptainer", "instance", "start"]
    if spec.gpus is not None:
        argv.append("--nv")
    for m in spec.mounts:
        argv += ["--bind", f"{m.source}:{m.target}" + (":ro" if m.read_only else "")]
    for key, value in spec.env.items():
        argv += ["--env", f"{key}={value}"]
    argv += [image, apptainer_instance_name(spec)]
    return argv


def to_apptainer_exec_argv(spec: ContainerSpec) -> list[str]:
    """Run the node script inside the instance."""
    return ["apptainer", "exec", f"instance://{apptainer_instance_name(spec)}", "/bin/bash", *spec.command]
