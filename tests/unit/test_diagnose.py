"""Failure-line classifier: every FIELD_NOTES section 1 message maps to a cause and a fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kit.commands.diagnose import command
from kit.verify.diagnose import RULES, classify_lines

RECORDED_NCCL = Path(__file__).parents[1] / "fixtures" / "recorded" / "nccl"  # see its README.md
RECORDED = Path(__file__).parents[1] / "fixtures" / "verify"

SAMPLES = {
    "placement-group-ip": "(autoscaler) No available node types can fulfill resource request "
    "{'node:10.0.0.2': 0.001, 'GPU': 1.0}. Add suitable node types to this cluster",
    "node-registered-by-hostname": "No available node types can fulfill resource request "
    "{'node:gpu-node-2': 0.001, 'GPU': 1.0}",
    "raylet-ip-mismatch": "This node has an IP address of 172.17.0.2, but we cannot find a local "
    "Raylet with the same address.",
    "gloo-interface": "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/"
    "transport/tcp/pair.cc:144] no error",
    "nccl-bootstrap-interface": "n1:1:1 [0] NCCL INFO Bootstrap : no socket interface found",
    "nccl-unhandled-system-error": "torch.distributed.DistBackendError: NCCL error in: "
    "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details)",
    "shm-exhausted": "n1:1:1 [0] include/alloc.h:99 NCCL WARN Error while creating shared memory "
    "segment /dev/shm/nccl-1Ab2 (size 9637888)",
    "ray-version-mismatch": "RuntimeError: Version mismatch: The cluster was started with:\n",
    "gpu-count-mismatch": "ValueError: The number of required GPUs exceeds the total number of "
    "available GPUs in the placement group.",
    "hf-gated-or-missing": "huggingface_hub.errors.GatedRepoError: 401 Client Error.",
    "collective-deadlock": "[rank0]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE)",
    "engine-start-timeout": "TimeoutError: Timed out waiting for engines to send initial message on input socket.",
    "ray-temp-dir": "OSError: AF_UNIX path length cannot exceed 107 bytes: '/long/tmp/ray/...'",
    "gcs-unreachable": "Failed to connect to GCS at address 10.0.0.1:6379 within 5 seconds.",
    "cuda-oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
}


def test_every_rule_has_a_sample() -> None:
    assert set(SAMPLES) == {r.id for r in RULES}


@pytest.mark.parametrize("rule", sorted(SAMPLES))
def test_rule_matches_its_sample(rule: str) -> None:
    found = classify_lines(["unrelated line", SAMPLES[rule]]).findings
    assert rule in [f.rule for f in found]
    finding = next(f for f in found if f.rule == rule)
    assert finding.first_line == 2
    assert finding.cause and finding.fix


def test_ray_prefixed_lines_and_counts() -> None:
    lines = [f"(RayWorkerWrapper pid={p}, ip=10.0.0.2) {SAMPLES['shm-exhausted']}" for p in (1, 2, 3)]
    (finding,) = classify_lines(lines).findings
    assert (finding.rule, finding.count, finding.row) == ("shm-exhausted", 3, 6)


def test_symmetric_memory_knobs_named() -> None:
    (finding,) = classify_lines(["RuntimeError: symm_mem rendezvous timeout after 600s"]).findings
    assert "VLLM_ALLREDUCE_USE_SYMM_MEM=0" in finding.fix
    assert "--disable-custom-all-reduce" in finding.fix


def test_inter_node_socket_fallback() -> None:
    lines = [
        "(RayWorkerWrapper pid=9, ip=10.0.0.2) b:9:9 [0] NCCL INFO NET/IB : No device found.",
        "a:1:1 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 0 nranks 2 cudaDev 0 busId 60 commId 0x7 - Init START",
        "(RayWorkerWrapper pid=9, ip=10.0.0.2) b:9:9 [0] NCCL INFO ncclCommInitRank comm 0x2 "
        "rank 1 "
        "nranks 2 cudaDev 0 busId 60 commId 0x7 - Init START",
        "a:1:5 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
    ]
    diag = classify_lines(lines)
    assert [f.rule for f in diag.findings] == ["nccl-socket-fallback"]
    assert diag.findings[0].first_line == 4
    assert diag.transport is not None and diag.transport.inter == {"socket": 1}


def test_real_logs_have_no_failures_and_a_transport() -> None:
    for path in [*RECORDED_NCCL.glob("*.log"), *RECORDED.glob("h200x2_collective_*.log")]:
        diag = classify_lines(path.read_text().splitlines())
        assert diag.findings == [], path
        assert diag.transport is not None and diag.transport.intra, path


def test_cli_json_and_text(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text(SAMPLES["placement-group-ip"] + "\n" + SAMPLES["engine-start-timeout"] + "\n")
    runner = CliRunner()
    res = runner.invoke(command, [str(log), str(RECORDED / "h200x2_collective_shm.log"), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)["result"]
    assert [f["rule"] for f in data[str(log)]["findings"]] == [
        "placement-group-ip",
        "engine-start-timeout",
    ]
    assert data[str(RECORDED / "h200x2_collective_shm.log")]["transport"]["intra"] == {"shm": 8}
    res = runner.invoke(command, [str(log)])
    assert "placement-group-ip" in res.output and "fix:" in res.output
