"""`kit verify --job-output FILE` (issue 20): the node probes a pyxis/EDF job printed (KIT_PROBE
lines, kit.verify.probe.as_lines), judged by every node check (kit.verify.policy, the enroot checks
of kit.verify.container_checks included) and the versions across nodes."""

from __future__ import annotations

import base64
import json
import re
import time
import zlib
from typing import Any

from kit.verify.checks import FAIL, Check
from kit.verify.policy import check_node, check_versions
from kit.verify.report import VerifyResult

PROBE_LINE = re.compile(r"KIT_PROBE rank=(\d+) part=(\d+)/(\d+) ([A-Za-z0-9+/=]*)\s*$")


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
