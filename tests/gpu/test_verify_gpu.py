"""`kit verify --host` on real GPUs: P2P by default, SHM and Socket when forced.

Skipped without at least two NVIDIA GPUs. The outputs of these runs on 2x H200 are recorded in
tests/fixtures/verify/ so the unit tests keep covering them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gpu_count() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return sum(1 for ln in out.stdout.splitlines() if ln.startswith("GPU "))


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_gpu_count() < 2, reason="needs at least 2 NVIDIA GPUs"),
]


def verify(*args: str, **env: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "kit", "verify", "--host", "--json", "--sizes", "1M,32M", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
        timeout=300,
        check=False,
    )
    doc = json.loads(proc.stdout)
    result = doc["result"] if doc["ok"] else doc["error"]["result"]
    return proc.returncode, result


def test_default_is_p2p_and_correct() -> None:
    rc, result = verify()
    assert rc == 0, result["checks"]
    assert result["transport"]["intra_worst"] == "p2p"
    assert result["collective"]["correct"] is True
    assert result["collective"]["world_size"] == _gpu_count()


def test_p2p_disabled_gives_shm() -> None:
    rc, result = verify("--expect", "socket-ok", NCCL_P2P_DISABLE="1")
    assert rc == 0
    assert result["transport"]["intra_worst"] == "shm"


def test_p2p_and_shm_disabled_gives_socket_and_nvlink_fails() -> None:
    rc, result = verify("--expect", "nvlink", NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1")
    assert rc == 7
    assert result["transport"]["intra_worst"] == "socket"
    failed = {c["name"] for c in result["checks"] if c["status"] == "fail"}
    assert "transport.intra" in failed


def test_decode_latency_runs_nccl_in_cuda_graphs() -> None:
    """Issue 30: beside the bandwidth, the all-reduce's latency at decode sizes, by NCCL called
    directly in CUDA graphs, out of place and in place, each a plausible NVLink/PCIe figure."""
    rc, result = verify()
    assert rc == 0, result["checks"]
    latency = result["latency"]
    assert latency["method"] == "nccl-graph", latency.get("fallback_reason")
    assert latency["correct"] is True and latency["dtype"] == "bfloat16" and latency["graph_ops"] == 64
    assert [r["bytes"] for r in latency["results"]] == [4096 << i for i in range(9)]
    for row in latency["results"]:
        assert 1.0 < row["out_of_place_us"] < 200.0 and 1.0 < row["in_place_us"] < 200.0, row
    # The transport verdict reads torch's communicator only: the same counts as without latency.
    rc, plain = verify("--latency", "off")
    assert plain["transport"]["intra"] == result["transport"]["intra"]
    assert "latency" not in plain["collective"]["collectives"]["all-reduce"]
