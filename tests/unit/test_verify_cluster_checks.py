"""kit verify, cluster mode: Gloo transport, Ray view, pip trees, HF snapshots, config wiring.

The facts are those the probes printed on the real 2-node CPU container cluster
(tests/integration/test_verify_cluster.py), trimmed to what the policy reads.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kit.cluster import status
from kit.commands.verify import command
from kit.errors import UsageError
from kit.runtime.base import ExecResult, NodeHandle
from kit.verify import collective, policy, probe, runner
from kit.verify.image import check_image
from kit.verify.nccl import gloo_summary
from kit.verify.report import VerificationFailed, render_text
from tests.conftest import FakeRuntime

HEAD, WORKER = "kit-c-head", "kit-c-worker-1"
IPS = {HEAD: "10.214.5.10", WORKER: "10.214.5.11"}
DIGEST = "sha256:72964799b32913d2a24e31a0d895ee760edd0a5513facb8b6a7ffaf5530dc117"
PACKAGES = {"packaging": "26.3", "ray": "2.60.0", "six": "1.17.0", "torch": "2.13.0+cpu", "vllm": "0.32.0+cpu"}


def cpu_facts(node: str, **over: Any) -> dict[str, Any]:
    ip = IPS[node]
    f: dict[str, Any] = {
        "probe": "node",
        "versions": {
            "python": "3.11.2",
            "torch": "2.13.0+cpu",
            "cuda": None,
            "vllm": "0.32.0+cpu",
            "ray": "2.60.0",
            "kit_probe": probe.PROBE_VERSION,
            "packages": probe.packages_fingerprint(PACKAGES),
            "image_digest": DIGEST,
        },
        "packages": dict(PACKAGES),
        "gpu": {"nvidia_smi": False, "gpus": []},
        "torch": {"importable": True, "version": "2.13.0+cpu", "cuda": None, "cuda_available": False},
        "shm": {"path": "/dev/shm", "size_bytes": 1 << 30, "free_bytes": 1 << 30},
        "memlock": {"soft": 8388608, "hard": 8388608, "unlimited": False},
        "infiniband": {"devices": [], "dev_infiniband": [], "gdr_module": False, "userland": {}},
        "network": {
            "hostname": node,
            "node_ip": ip,
            "interface": "eth0",
            "vllm_host_ip": ip,
            "interfaces": {"lo": "127.0.0.1", "eth0": ip},
            "ray_node_ip": ip,
            "nccl_socket_ifname": "eth0",
            "gloo_socket_ifname": "eth0",
        },
        "hf_cache": {
            "home": "/root/.cache/huggingface",
            "hub": "/root/.cache/huggingface/hub",
            "present": True,
            "model": "kit-test/tiny",
            "revision": "0123abcd",
            "files": 1,
            "fingerprint": "3f1a9c0e5b7d2a44",
        },
    }
    for path, value in over.items():
        cur = f
        keys = path.split("__")
        for k in keys[:-1]:
            cur = cur.setdefault(k, {})
        cur[keys[-1]] = value
    return f


def gloo_result(rank: int, **over: Any) -> dict[str, Any]:
    out = {
        "probe": "collective",
        "backend": "gloo",
        "node_rank": rank,
        "nnodes": 2,
        "nproc": 1,
        "world_size": 2,
        "master": f"{IPS[HEAD]}:29500",
        "ok": True,
        "error": None,
        "correct": True,
        "ranks": [{"rank": rank, "local_rank": 0, "device": "cpu", "correct": True, "error": None}],
        "nccl_lines": [],
        "results": [
            {"bytes": 1 << 20, "iters": 106, "time_us": 5283.25, "algbw_gbps": 0.2, "busbw_gbps": 0.2},
            {"bytes": 16 << 20, "iters": 13, "time_us": 32759.57, "algbw_gbps": 0.51, "busbw_gbps": 0.51},
        ],
    }
    out.update(over)
    return out


def ray_rows(**vllm_ip: str | None) -> list[dict[str, Any]]:
    return [
        {
            "node_id": f"{i:056x}",
            "alive": True,
            "lost": False,
            "ip": IPS[n],
            "cpus": 2.0,
            "gpus": 0,
            "vllm_host_ip": vllm_ip.get(n.replace("-", "_"), IPS[n]),
            "ip_matches": True,
        }
        for i, n in enumerate((HEAD, WORKER))
    ]


def by_name(checks: Sequence[policy.Check]) -> dict[tuple[str, str | None], policy.Check]:
    return {(c.name, c.node): c for c in checks}


def judge(expect: str = "auto", nodes: dict[str, Any] | None = None, **kw: Any) -> list[policy.Check]:
    nodes = nodes or {HEAD: cpu_facts(HEAD), WORKER: cpu_facts(WORKER)}
    coll = runner.merge_collective([gloo_result(0), gloo_result(1)])
    result = runner.judge(
        "cluster",
        nodes,
        coll,
        runner.Expectations(expect, 2, 1, "cpu"),
        planned_ips=IPS,
        started=0,
        **kw,
    )
    return result.checks


# --- Gloo: the transport is TCP, said explicitly ------------------------------------------------


def test_gloo_summary_counts_pairs() -> None:
    s = gloo_summary(2, 1)
    assert (s.backend, s.inter, s.intra, s.networks) == ("gloo", {"socket": 2}, {}, ["Socket"])
    assert s.inter_worst is not None and s.inter_worst.value == "socket"
    s = gloo_summary(2, 2)  # 4 ranks: 4 ordered pairs within nodes, 8 across
    assert (s.intra, s.inter) == ({"socket": 4}, {"socket": 8})
    assert gloo_summary(1, 1).inter == {}


def test_cpu_cluster_passes_with_auto() -> None:
    checks = judge("auto", ray=ray_rows())
    assert policy.overall(checks) == "pass", [c for c in checks if c.status != "pass"]
    got = by_name(checks)
    assert got[("transport.inter", None)].reason == "inter-node: Socket (Gloo over TCP) across 2 nodes"
    assert got[("gpu.count", HEAD)].reason == "accelerator cpu: no GPUs expected (collective on Gloo)"
    assert got[("node.ray_ip", WORKER)].reason == f"Ray registered {IPS[WORKER]} = VLLM_HOST_IP"
    assert got[("cluster.hf_snapshot", None)].status == "pass"


@pytest.mark.parametrize(
    ("expect", "name", "reason"),
    [
        (
            "ib-gdr",
            "transport.inter",
            "inter-node links use Socket (Gloo over TCP, no GPUs) but --expect ib-gdr needs InfiniBand with "
            "GPUDirect RDMA",
        ),
        (
            "ib",
            "transport.inter",
            "inter-node links use Socket (Gloo over TCP, no GPUs) but --expect ib needs InfiniBand/RoCE",
        ),
        ("nvlink", "transport.intra", "--expect nvlink needs NVLinked GPUs, but the collective ran on Gloo (no GPUs)"),
    ],
)
def test_gloo_fails_policies_that_ask_for_more(expect: str, name: str, reason: str) -> None:
    failed = [c for c in judge(expect) if c.status == "fail"]
    assert [(c.name, c.reason) for c in failed] == [(name, reason)]
    assert "socket-ok" in (failed[0].fix or "")
    assert policy.overall(judge("socket-ok")) == "pass"


def test_gpu_count_still_enforced_on_gpu_clusters() -> None:
    checks = policy.check_node(HEAD, cpu_facts(HEAD), expected_gpus=1, accelerator="gpu")
    assert by_name(checks)[("gpu.count", HEAD)].status == "fail"


# --- Ray view: the IP Ray registered equals the node's VLLM_HOST_IP ----------------------------


def test_ray_view_mismatches() -> None:
    rows = ray_rows(kit_c_worker_1="172.17.0.3")
    c = by_name(judge(ray=rows))[("node.ray_ip", WORKER)]
    assert (c.status, c.reason) == ("fail", f"Ray registered {IPS[WORKER]}, VLLM_HOST_IP is 172.17.0.3")
    assert f"--node-ip-address {IPS[WORKER]}" in (c.fix or "")
    # The worker missing from Ray: the node check and the cluster count both fail.
    rows = ray_rows()[:1]
    nodes = {HEAD: cpu_facts(HEAD, ray=rows[0]), WORKER: cpu_facts(WORKER, ray=None)}
    got = by_name(judge(nodes=nodes, ray=rows))
    assert got[("node.ray_ip", WORKER)].reason == f"Ray has no alive node registered as {IPS[WORKER]}"
    assert got[("cluster.ray", None)].reason == f"Ray sees 1 alive node(s) ({IPS[HEAD]}), the plan expects 2"
    # Unreadable view: one cluster-level failure that says so.
    got = by_name(judge(ray_error="cannot read the Ray view from the head: boom"))
    assert got[("cluster.ray", None)].status == "fail"


def test_session_file_check_yields_to_the_ray_view() -> None:
    f = cpu_facts(WORKER, network__ray_node_ip="10.9.9.9", ray=ray_rows()[1])
    checks = policy.check_node(WORKER, f, planned_ip=IPS[WORKER], accelerator="cpu")
    assert [c.status for c in checks if c.name == "node.ray_ip"] == ["pass"]
    del f["ray"]
    checks = policy.check_node(WORKER, f, planned_ip=IPS[WORKER], accelerator="cpu")
    assert [c.status for c in checks if c.name == "node.ray_ip"] == ["fail"]


# --- versions: digest and pip tree -------------------------------------------------------------


def test_a_node_with_another_image_is_named() -> None:
    pkgs = {**PACKAGES, "six": "1.16.0"}
    other = cpu_facts(
        WORKER,
        packages=pkgs,
        versions__packages=probe.packages_fingerprint(pkgs),
        versions__image_digest="sha256:0ther",
    )
    failed = {c.name: c.reason for c in judge(nodes={HEAD: cpu_facts(HEAD), WORKER: other}) if c.status == "fail"}
    assert set(failed) == {"versions.packages", "versions.image_digest"}
    assert failed["versions.packages"] == f"packages differs: six ({HEAD} 1.17.0, {WORKER} 1.16.0)"
    many = {f"p{i}": "1" for i in range(8)}
    diff = policy.package_differences({"a": {"packages": many}, "b": {"packages": {}}}, limit=5)
    assert diff[0] == "p0 (a 1, b absent)" and diff[-1] == "and 3 more"


def test_probe_lists_packages_and_fingerprints_them() -> None:
    pkgs = probe.packages()
    assert pkgs["click"] and list(pkgs) == sorted(pkgs)
    assert probe.packages_fingerprint({"a": "1"}) != probe.packages_fingerprint({"a": "2"})


# --- HF cache and model snapshot ---------------------------------------------------------------


def test_hf_snapshot_missing_everywhere_warns_somewhere_fails() -> None:
    gone = {"hf_cache__fingerprint": None}
    got = by_name(judge(nodes={HEAD: cpu_facts(HEAD, **gone), WORKER: cpu_facts(WORKER, **gone)}))
    assert got[("cluster.hf_snapshot", None)].status == "warn"
    got = by_name(judge(nodes={HEAD: cpu_facts(HEAD), WORKER: cpu_facts(WORKER, **gone)}))
    c = got[("cluster.hf_snapshot", None)]
    assert c.status == "fail" and c.reason.startswith(
        f"kit-test/tiny not in the HF cache on {WORKER}; {HEAD}: revision"
    )
    got = by_name(judge(nodes={HEAD: cpu_facts(HEAD), WORKER: cpu_facts(WORKER, hf_cache__present=False)}))
    assert got[("node.hf_cache", WORKER)].status == "warn"


def test_hf_fingerprint_of_a_model_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    info = probe.hf_cache(str(tmp_path / "m"))
    assert info["present"] and info["files"] == 1 and info["fingerprint"]
    (tmp_path / "m" / "config.json").write_text("{ }")
    assert probe.hf_cache(str(tmp_path / "m"))["fingerprint"] != info["fingerprint"]


# --- collective defaults, image mode on a CPU image --------------------------------------------


def test_collective_sizes_default_by_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KIT_SIZES", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cfg = collective.config([])
    assert cfg["backend"] == "gloo" and cfg["sizes"] == [1 << 20, 16 << 20]
    assert collective.config(["--backend", "nccl"])["sizes"][-1] == 1 << 30
    assert "KIT_SIZES" not in runner.CollectiveSpec().env(master_addr="h", node_rank=0, nnodes=2, nproc=None)


def test_cpu_image_needs_no_rdma_userland() -> None:
    f = {
        "versions": {"torch": "2.13.0+cpu"},
        "torch": {"importable": True, "version": "2.13.0+cpu", "cuda": None},
        "infiniband": {"userland": {"libibverbs": None, "libmlx5": None}},
        "image": {"probe_files": {"probe.py": True, "collective.py": True}},
    }
    assert {c.name: c.status for c in check_image(f)}["rdma.userland"] == "pass"
    f["torch"]["cuda"] = "12.8"
    assert {c.name: c.status for c in check_image(f)}["rdma.userland"] == "warn"


# --- the command: resolved config in, runtime and Ray view through kit's own code --------------


def cpu_cluster() -> FakeRuntime:
    """The two CPU nodes, worker first (head first is the runner's job, not the runtime's), whose
    probes print cpu_facts (for the model asked for) and gloo_result."""

    def answer(node: NodeHandle, argv: list[str], env: dict[str, str]) -> ExecResult:
        if "--head-ip" in argv:
            f = cpu_facts(node.name, hf_cache__model=argv[argv.index("--model") + 1])
            return ExecResult(0, "warning: noise\n" + json.dumps(f) + "\n", "")
        return ExecResult(0, json.dumps(gloo_result(int(env["KIT_NODE_RANK"]))), "")

    return FakeRuntime(
        NodeHandle(WORKER, "c", "worker", 1, "running", ip=IPS[WORKER], image_digest=DIGEST),
        NodeHandle(HEAD, "c", "head", 0, "running", ip=IPS[HEAD], image_digest=DIGEST),
        answer=answer,
    )


def test_cli_cluster_mode_uses_the_resolved_config(
    monkeypatch: pytest.MonkeyPatch, use_runtime: Callable[[Any], None]
) -> None:
    rt = cpu_cluster()
    views: list[tuple[str, int, float]] = []

    def fake_view(runtime: Any, head: NodeHandle, gcs_port: int, timeout: float = 4) -> list[dict[str, Any]]:
        views.append((head.name, gcs_port, timeout))
        return [{k: v for k, v in r.items() if k != "lost"} for r in ray_rows()]

    use_runtime(rt)
    monkeypatch.setattr(status, "ray_view", fake_view)
    env = {
        "KIT_CLUSTER": "c",
        "KIT_ACCELERATOR": "cpu",
        "KIT_NODES": "2",
        "KIT_MODEL_ID": "kit-test/tiny",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    res = CliRunner().invoke(
        command, ["--set", "backend=ray", "--set", "ports.verify=29999", "--set", "ports.ray_gcs=7000", "--json"]
    )
    assert res.exit_code == 0, res.output  # warnings do not change the exit code
    doc = json.loads(res.output)["result"]
    # Closed by default (issue 16): no API key and no Ray token are findings, warnings only.
    open_checks = {c["name"]: c for c in doc["checks"] if c["status"] != "pass"}
    assert doc["status"] == "warn" and set(open_checks) == {"security.api_key", "security.ray_token"}, open_checks
    assert "port 8000" in open_checks["security.api_key"]["reason"] and open_checks["security.api_key"]["fix"]
    assert "GCS port 7000" in open_checks["security.ray_token"]["reason"]
    # The view's deadline is for the whole look (issue 25): Python, joining Ray, a task per node.
    assert set(rt.clusters) == {"c"} and views == [(HEAD, 7000, 25.0)]
    closed = ["--set", "api_key_file=/etc/kit/api_key", "--set", "ray_token_file=/etc/kit/ray_token", "--json"]
    doc_closed = json.loads(CliRunner().invoke(command, closed).output)["result"]
    assert doc_closed["status"] == "pass", [c for c in doc_closed["checks"] if c["status"] != "pass"]
    rt.calls.clear()
    res = CliRunner().invoke(
        command, ["--set", "backend=ray", "--set", "ports.verify=29999", "--set", "ports.ray_gcs=7000", "--json"]
    )
    probes = [c for c in rt.calls if "--head-ip" in c[1]]
    assert all(c[1][c[1].index("--model") + 1] == "kit-test/tiny" for c in probes)
    assert all(c[2]["KIT_RAY_TEMP_DIR"] and c[2]["KIT_IMAGE_DIGEST"] == DIGEST for c in probes)
    coll = {c[2]["KIT_NODE_RANK"]: c for c in rt.calls if "--head-ip" not in c[1]}
    assert coll["0"][0] == HEAD and coll["1"][0] == WORKER
    assert {c[2]["MASTER_ADDR"] for c in coll.values()} == {IPS[HEAD]}
    assert {c[2]["MASTER_PORT"] for c in coll.values()} == {"29999"}
    assert doc["transport"]["backend"] == "gloo" and doc["ray"][1]["ip"] == IPS[WORKER]
    # --nodes / --gpus-per-node override the config: 3 nodes expected, 2 found.
    res = CliRunner().invoke(command, ["--nodes", "3", "--no-collective", "--json"])
    assert isinstance(res.exception, VerificationFailed) and res.exception.exit_code == 7
    assert "first: 2 nodes found, the plan expects 3" in res.exception.message


def test_text_report_names_gloo_and_ray() -> None:
    coll = runner.merge_collective([gloo_result(0), gloo_result(1)])
    nodes = {HEAD: cpu_facts(HEAD), WORKER: cpu_facts(WORKER)}
    result = runner.judge(
        "cluster", copy.deepcopy(nodes), coll, runner.Expectations("auto", 2, 1, "cpu"), ray=ray_rows(), started=0
    )
    text = render_text(result)
    assert "Gloo (TCP, no NCCL): intra-node none; inter-node socket x2" in text
    assert "Ray (head's view)" in text and IPS[WORKER] in text


def test_host_and_image_modes_reject_cluster_flags() -> None:
    res = CliRunner().invoke(command, ["--host", "--cluster", "x"])
    assert isinstance(res.exception, UsageError) and "not --host" in res.exception.message
