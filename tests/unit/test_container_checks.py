"""`kit verify` of a pyxis/EDF job (issue 20): the probe's container facts, the enroot checks
(kit/verify/container_checks.py, reached through the policy's node checks) and `kit verify
--job-output` on a job output holding KIT_PROBE lines. The facts come from the real probe run on
this host (no enroot container can be started here: the runtime name is set the way kit's node
entry sets it) and from edited copies of them for what this host does not have (RDMA devices,
a small /dev/shm)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kit.cli import main
from kit.verify import probe
from kit.verify.container_checks import check_container
from kit.verify.job_output import probe_lines, verify_job_output
from kit.verify.policy import FAIL, PASS, WARN, check_node

PROBE = Path(probe.__file__)


@pytest.fixture(scope="module")
def facts() -> dict[str, Any]:
    """This host's facts, probed as kit's node entry runs the probe in a pyxis container."""
    env = {**os.environ, "KIT_CONTAINER_RUNTIME": "pyxis", "SLURM_GPUS_ON_NODE": "0"}
    out = subprocess.run([sys.executable, "-c", PROBE.read_text(), "--no-torch"], env=env, capture_output=True,
                         text=True, check=True, timeout=120)  # fmt: skip
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def kit_main(args: list[str]) -> tuple[int, str]:
    """`kit ARGS` through kit.cli.main (exit codes as the CLI gives them), its output."""
    out = io.StringIO()
    code: int | str | None = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main(args)
        except SystemExit as exc:
            code = exc.code
    return int(code or 0), out.getvalue()


def by_name(checks: list[Any]) -> dict[str, Any]:
    return {c.name: c for c in checks}


def test_the_probe_reports_what_the_container_was_given(facts: dict[str, Any], tmp_path: Path) -> None:
    box = facts["container"]
    assert box["runtime"] == "pyxis" and box["slurm_gpus"] == "0"
    assert isinstance(box["host_rdma_devices"], list)
    assert facts["memlock"]["unlimited"] in (True, False) and facts["shm"]["size_bytes"]
    # The host's RDMA devices come from the PCI driver (enroot's mellanox hook hides
    # /sys/class/infiniband but not /sys/bus/pci/drivers).
    dev = tmp_path / "bus" / "pci" / "drivers" / "mlx5_core" / "0000:81:00.0" / "infiniband_verbs" / "uverbs0"
    dev.mkdir(parents=True)
    assert probe.container_facts(str(tmp_path))["host_rdma_devices"] == ["uverbs0"]


def test_not_an_enroot_container_adds_nothing(facts: dict[str, Any]) -> None:
    docker = copy.deepcopy(facts)
    docker["container"]["runtime"] = None
    assert check_container("node0", docker) == []
    assert not any(c.name.startswith("enroot.") for c in check_node("node0", docker))


def test_the_policy_runs_the_enroot_checks(facts: dict[str, Any]) -> None:
    checks = by_name(check_node("node0", facts))
    assert {"enroot.gpus", "enroot.rdma", "enroot.memlock", "enroot.shm"} <= set(checks)
    assert checks["enroot.rdma"].status == PASS  # no RDMA devices on this host
    assert checks["enroot.shm"].status == (PASS if facts["shm"]["size_bytes"] >= 1 << 30 else FAIL)


def test_what_the_hooks_did_not_do_fails_with_the_enroot_fix(facts: dict[str, Any]) -> None:
    bad = copy.deepcopy(facts)
    bad["container"].update(host_rdma_devices=["uverbs0", "uverbs1"], slurm_gpus="4")
    bad["infiniband"]["dev_infiniband"] = []
    bad["memlock"] = {"soft": 65536, "hard": 65536, "unlimited": False}
    bad["shm"]["size_bytes"] = 64 << 20
    bad["gpu"]["gpus"] = []
    checks = by_name(check_container("node1", bad))
    assert all(c.status == FAIL and c.node == "node1" for c in checks.values()), checks
    assert "MELLANOX_VISIBLE_DEVICES" in checks["enroot.rdma"].fix
    assert "LimitMEMLOCK" in checks["enroot.memlock"].fix
    assert "0 GPUs visible" in checks["enroot.gpus"].reason and "allocated 4" in checks["enroot.gpus"].reason
    good = copy.deepcopy(bad)
    good["infiniband"]["dev_infiniband"] = ["uverbs0", "uverbs1"]
    good["memlock"] = {"soft": None, "hard": None, "unlimited": True}
    good["shm"]["size_bytes"] = 32 << 30
    good["gpu"]["gpus"] = [{"index": i, "name": "H100", "memory_mib": 81559, "driver": "570"} for i in range(4)]
    assert {c.status for c in check_container("node1", good)} == {PASS}
    good["container"]["slurm_gpus"] = None
    good["gpu"]["gpus"] = []
    assert by_name(check_container("node1", good))["enroot.gpus"].status == WARN


def lines(facts: dict[str, Any], rank: int, label: str = "") -> list[str]:
    """What a container's entry prints (probe --lines), as srun --label shows it."""
    return [label + line for line in probe.as_lines(json.dumps(facts), f"KIT_PROBE rank={rank}")]


def test_job_output_lines_are_read_with_or_without_srun_labels(facts: dict[str, Any]) -> None:
    """Short lines (srun --label cuts a line every 1024 bytes); a node whose lines were cut by the
    job's end is reported missing, not misread."""
    node0, node1, node2 = lines(facts, 0, "0: "), lines(facts, 1), lines(facts, 2, "1: ")
    assert len(node0) > 1 and all(len(line) < 1000 for line in node0)
    text = "\n".join(["kit: job 12: 3 node(s)", *node1, *node0, *node2[:-1], "KIT_SERVER_READY url=x"])
    assert list(probe_lines(text)) == ["node0", "node1"]
    assert probe_lines(text)["node0"] == facts
    result = verify_job_output(text, nodes=3)
    names = [c.name for c in result.checks]
    assert names.count("enroot.rdma") == 2 and "job.probes" in names  # 2 of 3 nodes printed their probe
    assert result.status == FAIL


def test_kit_verify_job_output(facts: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "kit-12.out"
    out.write_text("\n".join(["kit: waiting", *lines(facts, 0, "0: "), "KIT_SERVER_READY url=http://x:8000\n"]))
    code, output = kit_main(["verify", "--job-output", str(out), "--json"])
    data = json.loads(output)
    document = data["result"] if "result" in data else data["error"]["result"]
    assert document["mode"] == "job" and document["target"] == str(out)
    assert {"enroot.gpus", "enroot.rdma", "enroot.memlock", "enroot.shm"} <= {c["name"] for c in document["checks"]}
    assert code == (7 if document["status"] == "fail" else 0)
    empty = tmp_path / "empty.out"
    empty.write_text("kit: error: a node could not find its address\n")
    code, output = kit_main(["verify", "--job-output", str(empty)])
    assert code == 7 and "no KIT_PROBE line" in output
    code, output = kit_main(["verify", "--job-output", str(empty), "--host"])
    assert code == 2 and "Traceback" not in output
