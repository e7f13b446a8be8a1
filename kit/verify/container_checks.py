"""What the site's enroot hooks gave a pyxis/EDF container (issue 20), from the node probe's facts.

Under pyxis and the CSCS Container Engine kit passes no --gpus, --device or --ulimit: the site's
enroot hooks decide what the container gets (98-nvidia/99-nvidia: the GPUs SLURM allocated,
through NVIDIA_VISIBLE_DEVICES; 99-mellanox: /dev/infiniband when MELLANOX_VISIBLE_DEVICES is
set; /dev/shm is the host's, bound in; memlock is the task's limit, which slurmd hands down). These
checks say which of those did not happen, with the fix in enroot's and SLURM's terms.

The probe runs in every container of a `kit slurm --runtime pyxis|edf` job (the node entry prints
a KIT_PROBE line); `kit verify --job-output FILE` reads those lines (kit/verify/job_output.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kit.verify.checks import FAIL, PASS, WARN, Check
from kit.verify.checks.node import SHM_MIN_BYTES

ENROOT_RUNTIMES = ("pyxis", "edf")


def check_container(node: str, facts: Mapping[str, Any]) -> list[Check]:
    """The enroot checks of one node; none unless the probe ran in a pyxis/EDF container."""
    box = facts.get("container") or {}
    if box.get("runtime") not in ENROOT_RUNTIMES:
        return []
    return [_gpus(node, facts, box), _rdma(node, facts, box), _memlock(node, facts, box), _shm(node, facts)]


def _gpus(node: str, facts: Mapping[str, Any], box: Mapping[str, Any]) -> Check:
    seen = len((facts.get("gpu") or {}).get("gpus") or [])
    allocated = str(box.get("slurm_gpus") or "")
    expected = int(allocated) if allocated.isdigit() else None
    if expected is not None and seen != expected:
        return Check(
            "enroot.gpus",
            FAIL,
            f"{seen} GPUs visible in the container, SLURM allocated {expected} to the task",
            "the enroot nvidia hook exposes NVIDIA_VISIBLE_DEVICES (here "
            f"{box.get('nvidia_visible_devices')!r}): the image must be a CUDA image (it sets it), "
            "and the site's hook enabled (/etc/enroot/hooks.d/98-nvidia.sh)",
            node,
        )
    if not seen:
        return Check("enroot.gpus", WARN, "no GPUs visible in the container", "request GPUs (--gpus-per-task)", node)
    return Check("enroot.gpus", PASS, f"{seen} GPUs visible, as SLURM allocated", node=node)


def _rdma(node: str, facts: Mapping[str, Any], box: Mapping[str, Any]) -> Check:
    host = list(box.get("host_rdma_devices") or [])
    opened = list((facts.get("infiniband") or {}).get("dev_infiniband") or [])
    if not host:
        return Check("enroot.rdma", PASS, "no RDMA devices on this host", node=node)
    if not opened:
        return Check(
            "enroot.rdma",
            FAIL,
            f"the host has {len(host)} RDMA devices but /dev/infiniband is empty in the container "
            "(NCCL falls back to TCP sockets)",
            "enroot's 99-mellanox hook mounts them when MELLANOX_VISIBLE_DEVICES is set: add "
            "MELLANOX_VISIBLE_DEVICES: all to env (or ask the site to enable the hook)",
            node,
        )
    what = f"{len(opened)} of the host's {len(host)} RDMA devices in the container"
    return Check("enroot.rdma", PASS, what, node=node)


def _memlock(node: str, facts: Mapping[str, Any], box: Mapping[str, Any]) -> Check:
    lock = facts.get("memlock") or {}
    if lock.get("unlimited"):
        return Check("enroot.memlock", PASS, "memlock unlimited", node=node)
    if box.get("host_rdma_devices"):
        return Check(
            "enroot.memlock",
            FAIL,
            f"memlock limit {lock.get('soft')} bytes in the container with RDMA devices on the host",
            "tasks inherit slurmd's limit: the site sets LimitMEMLOCK=infinity for slurmd "
            "(PropagateResourceLimits lets srun pass yours: ulimit -l unlimited before sbatch)",
            node,
        )
    return Check("enroot.memlock", PASS, f"memlock {lock.get('soft')} bytes (no RDMA on this host)", node=node)


def _shm(node: str, facts: Mapping[str, Any]) -> Check:
    size = (facts.get("shm") or {}).get("size_bytes")
    if size is None:
        return Check("enroot.shm", FAIL, "no /dev/shm in the container", "enroot binds the host's /dev/shm", node)
    if size < SHM_MIN_BYTES:
        return Check(
            "enroot.shm",
            FAIL,
            f"/dev/shm is {size / 2**30:.2f} GiB (NCCL and Ray need more)",
            "enroot binds the host's /dev/shm: the node's /dev/shm is too small (a site setting)",
            node,
        )
    return Check("enroot.shm", PASS, f"/dev/shm {size / 2**30:.1f} GiB", node=node)
