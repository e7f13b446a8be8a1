"""`kit verify` on a real two-node cluster: two containers of the CPU engine image (real Ray,
real torch.distributed over Gloo) with distinct IPs on a private Docker network (issue 5).

- a good cluster passes: identical versions/digest table, a correct all-reduce over 2 ranks on
  2 nodes, inter-node transport Socket (Gloo over TCP), the all-reduce's latency at decode sizes
  (Gloo: back to back), Ray registered each node's own IP, the model snapshot identical on both
  nodes;
- a policy that asks for more (--expect ib-gdr) exits 7 with a one-line reason;
- a worker started from a different image (other digest, one package at another version) is
  caught by name.
"""

from __future__ import annotations

import io
import json
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.clusters import RAY_IMAGE, Cli, two_node_ray_env

MODEL = "kit-test/tiny"
MODEL_CONFIG = Path(__file__).parents[1] / "data" / "models" / "qwen2.5-7b" / "config.json"


@pytest.fixture
def cluster_env(cluster_name: str, tmp_path: Path) -> dict[str, str]:
    """The environment of conftest's `cluster` fixture here: the tiny model's snapshot in the HF cache."""
    hf = tmp_path / "hf"
    add_snapshot(hf, MODEL)
    return {**two_node_ray_env(cluster_name, hf, second_octet=214), "KIT_MODEL_ID": MODEL}


def add_snapshot(hf: Path, model: str) -> None:
    """A hub-cache layout (refs/main, blobs, snapshot symlinks) holding one real config.json."""
    repo = hf / "hub" / ("models--" + model.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text("0123abcd")
    (repo / "blobs").mkdir(exist_ok=True)
    shutil.copy(MODEL_CONFIG, repo / "blobs" / "c0ffee")
    snap = repo / "snapshots" / "0123abcd"
    snap.mkdir(parents=True, exist_ok=True)
    if not (snap / "config.json").is_symlink():
        (snap / "config.json").symlink_to("../../blobs/c0ffee")


def bring_up(kit: Cli, env: dict[str, str], *, worker_image: str | None = None) -> None:
    worker_env = {**env, "KIT_IMAGE": worker_image} if worker_image else env
    worker = kit("up", "--worker", "--no-wait", env=worker_env)
    assert worker.returncode == 0, worker.stderr
    head = kit("up", "--head", env=env)
    assert head.returncode == 0, head.stderr


def verify(kit: Cli, env: dict[str, str], *args: str) -> tuple[int, dict[str, Any], float]:
    """(exit code, the result document, wall seconds) of `kit verify --json ARGS`."""
    start = time.monotonic()
    proc = kit("verify", "--json", *args, env=env, timeout=300)
    took = time.monotonic() - start
    doc = json.loads(proc.stdout)
    return proc.returncode, doc, took


def test_verify_passes_on_a_good_two_node_cluster(cluster: tuple[dict[str, str], Cli], tmp_path: Path) -> None:
    env, kit = cluster
    # A good cluster is a closed one (issue 16): an API key and Ray's token authentication, each
    # from a file; without them verify warns (security.api_key, security.ray_token).
    for name in ("api_key", "ray_token"):
        (tmp_path / name).write_text(secrets.token_hex(32))
        (tmp_path / name).chmod(0o600)
    env = {**env, "KIT_API_KEY_FILE": str(tmp_path / "api_key"), "KIT_RAY_TOKEN_FILE": str(tmp_path / "ray_token")}
    bring_up(kit, env)
    code, doc, took = verify(kit, env)
    print(f"kit verify on the 2-node CPU cluster: {took:.1f} s (result wall_s {doc['result']['wall_s']})")
    assert code == 0, doc
    result = doc["result"]
    assert result["status"] == "pass", [c for c in result["checks"] if c["status"] != "pass"]
    name = env["KIT_CLUSTER"]
    nodes = [f"kit-{name}-head", f"kit-{name}-worker-1"]
    assert list(result["nodes"]) == nodes

    # Versions/digest table: one value per key, the same on both nodes, the digest known.
    table = result["versions"]
    assert all(list(values) == nodes for values in table.values())
    assert all(len(set(values.values())) == 1 for values in table.values()), table
    assert table["image_digest"][nodes[0]] and table["vllm"][nodes[0]] and table["packages"][nodes[0]]

    # One all-reduce across 2 ranks on 2 nodes (rank 0 on the head), correct, over Gloo/TCP.
    coll = result["collective"]
    assert (coll["backend"], coll["nnodes"], coll["world_size"]) == ("gloo", 2, 2)
    assert coll["ok"] and coll["correct"] and sorted(r["rank"] for r in coll["ranks"]) == [0, 1]
    prefix = env["KIT_NETWORK_SUBNET"].rsplit(".", 1)[0]
    assert coll["master"].startswith(f"{prefix}.10:")
    assert result["transport"]["inter_worst"] == "socket" and result["transport"]["backend"] == "gloo"
    checks = {(c["name"], c["node"]): c for c in result["checks"]}
    assert "Socket" in checks[("transport.inter", None)]["reason"]

    # Latency at decode sizes (issue 30): the probe sent with -c (collective.py + latency.py as
    # one program) measured it on Gloo back to back, in place only, and says so.
    lat = result["latency"]
    assert (lat["method"], lat["dtype"], lat["graph_ops"], lat["correct"], lat["error"]) == (
        "gloo-eager",
        "float32",
        None,
        True,
        None,
    )
    assert [r["bytes"] for r in lat["results"]] == [4096 << i for i in range(9)]
    assert all(r["out_of_place_us"] is None and r["in_place_us"] > 0 for r in lat["results"])

    # Ray registered each node's own IP; the model snapshot is the same on both nodes.
    assert [(r["ip"], r["vllm_host_ip"]) for r in result["ray"]] == [(f"{prefix}.10",) * 2, (f"{prefix}.11",) * 2]
    assert all(checks[("node.ray_ip", n)]["status"] == "pass" for n in nodes)
    # The same snapshot (add_snapshot: one config.json of 679 bytes at 0123abcd) on both nodes.
    assert checks[("cluster.hf_snapshot", None)]["reason"] == (
        f"{MODEL} identical on 2 node(s): revision 0123abcd, 1 files, 679 bytes"
    )
    fingerprints = {result["nodes"][n]["hf_cache"]["fingerprint"] for n in nodes}
    assert len(fingerprints) == 1 and None not in fingerprints

    # Expert parallelism's collective (issue 10): an all-to-all across both nodes over Gloo,
    # every chunk checked against the rank it came from (element-exact), timed per size.
    code, doc, took = verify(kit, env, "--collective", "both", "--sizes", "1M,4M")
    print(f"kit verify --collective both: {took:.1f} s")
    assert code == 0, doc
    result = doc["result"]
    a2a = result["collective"]["collectives"]["all-to-all"]
    assert a2a["correct"] is True and a2a["method"] == "all_to_all_single" and a2a["fallback_reason"] is None
    assert [r["bytes"] for r in a2a["results"]] == [1 << 20, 4 << 20]
    for row in a2a["results"]:  # alltoall_perf's busbw: algbw * (n-1)/n with n = 2 ranks
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] / 2, abs=0.011)
    assert result["collective"]["collectives"]["all-reduce"]["correct"] is True
    checks = {(c["name"], c["node"]): c for c in result["checks"]}
    assert checks[("collective.all_to_all.correct", None)]["reason"] == (
        "all-to-all over 2 ranks (gloo) delivered every chunk to its rank (all_to_all_single)"
    )
    assert result["transport"]["inter_worst"] == "socket"  # the same transport policy

    # A policy asking for more than TCP fails with exit 7 and one line saying why.
    code, doc, _ = verify(kit, env, "--expect", "ib-gdr")
    assert code == 7, doc
    message = doc["error"]["message"]
    assert "\n" not in message
    assert message == (
        "verification failed: 1 check(s) failed; first: inter-node links use Socket (Gloo over TCP, no GPUs) "
        "but --expect ib-gdr needs InfiniBand with GPUDirect RDMA"
    )
    assert doc["error"]["exit_code"] == 7


def test_verify_catches_a_node_with_another_image(
    cluster: tuple[dict[str, str], Cli], docker_client: Any, test_labels: dict[str, str]
) -> None:
    env, kit = cluster
    # Same base, one layer more (a new digest) and one package at another version: what a node
    # left on an older pull or a hand-patched pip tree looks like (FIELD_NOTES §1 row 7).
    dockerfile = (
        f"FROM {RAY_IMAGE}\n"
        "RUN sed -i 's/^Version: .*/Version: 1.16.0/' /opt/venv/lib/python3*/site-packages/six-*.dist-info/METADATA\n"
    )
    other = f"kit/vllm-cpu:verify-{test_labels['kit.test-run']}"
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=other, labels=test_labels, rm=True)
    bring_up(kit, env, worker_image=other)
    code, doc, _ = verify(kit, env, "--no-collective")
    assert code == 7, doc
    failed = {c["name"]: c["reason"] for c in doc["error"]["result"]["checks"] if c["status"] == "fail"}
    assert set(failed) == {"versions.image_digest", "versions.packages"}, failed
    name = env["KIT_CLUSTER"]
    assert failed["versions.packages"] == (
        f"packages differs: six (kit-{name}-head 1.17.0, kit-{name}-worker-1 1.16.0)"
    )
    assert doc["error"]["details"][0].startswith("versions.packages: packages differs: six")
