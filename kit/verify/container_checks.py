"""What the site's enroot hooks gave a pyxis/EDF container (issue 20), from the node probe's facts.

Under pyxis and the CSCS Container Engine kit passes no --gpus, --device or --ulimit: the site's
enroot hooks decide what the container gets (98-nvidia/99-nvidia: the GPUs SLURM allocated,
through NVIDIA_VISIBLE_DEVICES; 99-mellanox: /dev/infiniband when MELLANOX_VISIBLE_DEVICES is
set; /dev/shm is the host's, bound in; memlock is the task's limit, which slurmd hands down). These
checks say which of those did not happen, with the fix in enroot's and SLURM's terms.

The probe runs in every container of a `kit slurm --runtime pyxis|edf` job (the node entry prints
a KIT_PROBE line); `kit verify --job-output FILE` reads those lines (verify_job_output).
"""

from __future__ import annotations

import base64
import json
import re
import time
import zlib
from collections.abc import Mapping
from typing import Any

from kit.verify.policy import FAIL, PASS, SHM_MIN_BYTES, WARN, Check, check_node, check_versions
from kit.verify.report import VerifyResult

ENROOT_RUNTIMES = ("pyxis", "edf")
PROBE_LINE = re.compile(r"KIT_PROBE rank=(\d+) part=(\d+)/(\d+) ([A-Za-z0-9+/=]*)\s*$")


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


def probe_lines(text: str) -> dict[str, dict[str, Any]]:
    """The node probes in a job's output, by node (node0, node1, ...): the `KIT_PROBE rank=R
    part=I/N DATA` lines each container's entry prints (kit.verify.probe.as_lines; srun --label
    may prefix them). A node whose parts are incomplete or garbled is left out."""
    parts: dict[int, dict[int, str]] = {}
    counts: dict[int, int] = {}
    for line in text.splitlines():
        found = PROBE_LINE.search(line)
        if found:
            rank, part, total = (int(found.group(i)) for i in (1, 2, 3))
            parts.setdefault(rank, {})[part] = found.group(4)
            counts[rank] = total
    nodes: dict[str, dict[str, Any]] = {}
    for rank in sorted(parts):
        if sorted(parts[rank]) != list(range(1, counts[rank] + 1)):
            continue  # cut by the job's end: reported as a missing node
        data = "".join(parts[rank][i] for i in sorted(parts[rank]))
        try:
            facts = json.loads(zlib.decompress(base64.b64decode(data, validate=True)))
        except (ValueError, zlib.error):
            continue
        if isinstance(facts, dict):
            nodes[f"node{rank}"] = facts
    return nodes


def verify_job_output(text: str, *, nodes: int | None = None, target: str | None = None) -> VerifyResult:
    """Judge the node probes a pyxis/EDF job printed: every node check (kit.verify.policy,
    these enroot checks included) and the versions across nodes."""
    started = time.monotonic()
    found = probe_lines(text)
    checks: list[Check] = []
    if not found:
        checks.append(
            Check(
                "job.probes",
                FAIL,
                "no KIT_PROBE line in the job output",
                "is it the output of a kit slurm --runtime pyxis|edf job that started its containers?",
            )
        )
    elif nodes is not None and len(found) != nodes:
        what = f"{len(found)} of {nodes} nodes printed their probe"
        checks.append(Check("job.probes", FAIL, what, "see the job output"))
    for node, facts in found.items():
        checks += check_node(node, facts, accelerator="gpu" if (facts.get("gpu") or {}).get("gpus") else "cpu")
    if len(found) > 1:
        checks += check_versions(found)
    return VerifyResult("job", checks, nodes=found, wall_s=round(time.monotonic() - started, 3), target=target)
