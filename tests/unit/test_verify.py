"""kit verify: probe parsers, the policy gate, the command layer (host, cluster, image).

Driven by what the probes really printed: on 2x H200 (tests/gpu, recorded in
tests/fixtures/verify/) and in a Debian image without torch.
"""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kit.commands.verify import command
from kit.runtime.base import ExecResult, NodeHandle
from kit.verify import collective, policy, probe, runner
from kit.verify.image import check_image, image_probe_argv
from kit.verify.nccl import summarize_lines
from kit.verify.report import VerificationFailed, junit_xml, render_text
from tests.conftest import FakeRuntime

RECORDED_SMI = Path(__file__).parents[1] / "fixtures" / "recorded" / "nvidia-smi"  # see its README.md
RECORDED = Path(__file__).parents[1] / "fixtures" / "verify"


def recorded(name: str) -> dict[str, Any]:
    doc = json.loads((RECORDED / f"h200x2_verify_{name}.json").read_text())
    result: dict[str, Any] = doc["result"] if doc["ok"] else doc["error"]["result"]
    return result


def statuses(checks: Sequence[policy.Check]) -> dict[str, str]:
    return {c.name: c.status for c in checks}


# --- probe parsers ------------------------------------------------------------------------


def test_parse_query_gpu_real_output() -> None:
    path = RECORDED_SMI / "h200x2_query_gpu.csv"
    gpus = probe.parse_query_gpu(path.read_text())
    assert [g["name"] for g in gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert gpus[0]["memory_mib"] == 143771 and gpus[1]["driver"] == "580.159.04"


def test_parse_topo_real_output_with_ansi() -> None:
    path = RECORDED_SMI / "h200x2_topo_m.txt"
    assert probe.parse_topo(path.read_text()) == {"links": {"0-1": "NV18"}, "all_nvlink": True}
    pcie = "GPU0\t X \tPIX\t0-31\nGPU1\tPIX\t X \t0-31\n"
    assert probe.parse_topo(pcie)["all_nvlink"] is False


def test_infiniband_from_sysfs(tmp_path: Path) -> None:
    port = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "link_layer").write_text("Ethernet\n")
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    (tmp_path / "sys" / "module" / "nvidia_peermem").mkdir(parents=True)
    ib = probe.infiniband(str(tmp_path / "sys"), str(tmp_path / "dev"))
    assert ib["devices"] == [
        {
            "device": "mlx5_0",
            "port": 1,
            "state": "ACTIVE",
            "link_layer": "Ethernet",
            "rate": "200 Gb/sec (4X HDR)",
        }
    ]
    assert ib["dev_infiniband"] == [] and ib["gdr_module"] is True
    assert policy.ib_ports({"infiniband": ib}) == ["mlx5_0:1/RoCE"]


def test_hf_snapshot_fingerprint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "blobs").mkdir()
    (repo / "blobs" / "sha-1").write_text("{}")
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to(repo / "blobs" / "sha-1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    info = probe.hf_cache("org/tiny")
    assert info["revision"] == "abc123" and info["files"] == 1 and info["fingerprint"]
    assert probe.hf_cache("org/missing")["fingerprint"] is None


def test_probe_runs_as_source_and_prints_json() -> None:
    out = runner._local(["python3", "-c", runner.probe_source(), "--no-torch"], None, 60)
    facts = runner.parse_probe_output("node", out)
    assert facts["probe"] == "node" and facts["versions"]["kit_probe"] == probe.PROBE_VERSION
    assert "size_bytes" in facts["shm"] and "node_ip" in facts["network"]


def test_collective_helpers() -> None:
    assert collective.parse_size("32M") == 32 << 20
    assert collective.parse_size("1GiB") == 1 << 30
    assert collective.parse_size("4096") == 4096
    assert collective.busbw(100.0, 2) == 100.0
    assert collective.busbw(100.0, 8) == 175.0


# --- policy on the recorded 2x H200 runs ----------------------------------------------------


def judge(name: str, expect: str) -> list[policy.Check]:
    r = recorded(name)
    summary = summarize_lines(r["collective"]["nccl_lines"])
    return policy.evaluate(r["nodes"], r["collective"], summary, expect=expect)


def test_recorded_p2p_passes_every_expectation_within_a_node() -> None:
    for expect in ("auto", "nvlink", "socket-ok"):
        checks = judge("p2p", expect)
        assert policy.overall(checks) == "pass", checks
    got = statuses(judge("p2p", "auto"))
    assert got["transport.intra"] == got["collective.correct"] == got["bandwidth"] == "pass"


@pytest.mark.parametrize("name", ["shm", "socket"])
def test_recorded_forced_transports_fail_nvlink(name: str) -> None:
    checks = judge(name, "nvlink")
    intra = next(c for c in checks if c.name == "transport.intra")
    assert intra.status == "fail"
    assert "NCCL_P2P_DISABLE" in (intra.fix or "")
    # On an NVLinked machine auto wants P2P too.
    assert statuses(judge(name, "auto"))["transport.intra"] == "fail"


def test_recorded_socket_is_accepted_by_socket_ok_and_its_bandwidth_floor() -> None:
    got = statuses(judge("socket", "socket-ok"))
    assert got["transport.intra"] == "pass" and got["bandwidth"] == "pass"


def test_recorded_runs_kept_their_verdicts() -> None:
    assert recorded("p2p")["status"] == "pass"
    assert recorded("socket_nvlink")["status"] == "fail"
    bench = json.loads((RECORDED / "h200x2_bench.json").read_text())
    assert all(row["meets_target"] for row in bench["rows"])


def test_bandwidth_floor_warns() -> None:
    r = copy.deepcopy(recorded("p2p"))
    for row in r["collective"]["results"]:
        row["busbw_gbps"] = 20.0
    checks = policy.evaluate(r["nodes"], r["collective"], summarize_lines(r["collective"]["nccl_lines"]))
    assert statuses(checks)["bandwidth"] == "warn"


# --- policy on synthetic facts --------------------------------------------------------------


def facts(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = copy.deepcopy(recorded("p2p")["nodes"]["vm"])
    for path, value in over.items():
        cur = base
        keys = path.split("__")
        for k in keys[:-1]:
            cur = cur.setdefault(k, {})
        cur[keys[-1]] = value
    return base


IB_DEVICES = [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "link_layer": "InfiniBand", "rate": "400"}]


def test_node_checks() -> None:
    got = statuses(policy.check_node("n", facts(shm__size_bytes=64 << 20)))
    assert got["node.shm"] == "fail"
    got = statuses(
        policy.check_node(
            "n",
            facts(
                infiniband__devices=IB_DEVICES,
                memlock__unlimited=False,
                infiniband__gdr_module=False,
            ),
        )
    )
    assert got["node.memlock"] == got["node.rdma"] == "fail" and got["node.gdr"] == "warn"
    got = statuses(policy.check_node("n", facts(network__ray_node_ip="10.9.9.9")))
    assert got["node.ray_ip"] == "fail"
    got = statuses(policy.check_node("n", facts(), expected_gpus=8, planned_ip="10.0.0.1"))
    assert got["gpu.count"] == got["node.ip"] == "fail"
    got = statuses(policy.check_node("n", facts(network__node_ip="172.17.0.5")))
    assert got["node.ip"] == "fail"  # VLLM_HOST_IP on no interface: container vs host IP
    got = statuses(policy.check_node("n", facts(torch__cuda_available=False)))
    assert got["gpu.cuda"] == "fail"


def test_versions_table_and_differences() -> None:
    nodes = {"a": facts(), "b": facts(versions__ray="2.44.1", versions__image_digest="sha256:x")}
    checks = policy.check_cluster(nodes, expected_nodes=3)
    got = statuses(checks)
    assert got["versions.ray"] == got["versions.image_digest"] == got["cluster.nodes"] == "fail"
    assert policy.version_table(nodes)["ray"] == {"a": None, "b": "2.44.1"}


def test_hf_snapshot_compared() -> None:
    a = facts(hf_cache={"model": "org/m", "fingerprint": "aa"})
    assert (
        statuses(policy.check_cluster({"a": a, "b": facts(hf_cache={"model": "org/m", "fingerprint": "bb"})}))[
            "cluster.hf_snapshot"
        ]
        == "fail"
    )
    assert statuses(policy.check_cluster({"a": a, "b": copy.deepcopy(a)}))["cluster.hf_snapshot"] == "pass"


def two_node_lines(via: str) -> list[str]:
    init = "NCCL INFO ncclCommInitRankConfig comm 0x{c} rank {r} nranks 2 cudaDev 0 busId 60 commId 0x9 - Init START"
    return [
        "a:1:1 [0] " + init.format(c=1, r=0),
        "b:2:2 [0] " + init.format(c=2, r=1),
        f"a:1:7 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via {via}",
        f"b:2:8 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [send] via {via}",
    ]


def inter_check(via: str, expect: str, node: dict[str, Any]) -> policy.Check:
    coll = {
        "ok": True,
        "correct": True,
        "backend": "nccl",
        "nnodes": 2,
        "world_size": 2,
        "results": [],
    }
    checks = policy.check_collective(
        coll, summarize_lines(two_node_lines(via)), expect=expect, nodes={"a": node, "b": node}
    )
    return next(c for c in checks if c.name == "transport.inter")


def test_inter_node_policy() -> None:
    ib = facts(infiniband__devices=IB_DEVICES, infiniband__dev_infiniband=[])
    c = inter_check("NET/Socket/0", "auto", ib)
    assert c.status == "fail"
    assert c.reason.startswith("inter-node links use NET/Socket although mlx5_0:1/IB is present")
    assert "/dev/infiniband, IPC_LOCK and memlock=unlimited" in (c.fix or "")
    ib_ok = facts(
        infiniband__devices=IB_DEVICES,
        infiniband__dev_infiniband=["uverbs0"],
        infiniband__gdr_module=False,
    )
    c = inter_check("NET/IB/0", "auto", ib_ok)
    assert c.status == "fail" and "nvidia_peermem" in (c.fix or "")
    assert inter_check("NET/IB/0", "ib", ib_ok).status == "pass"
    assert inter_check("NET/IB/0/GDRDMA", "ib-gdr", ib_ok).status == "pass"
    assert inter_check("NET/IBext_v8/0/GDRDMA", "ib-gdr", ib_ok).status == "pass"
    plain = facts()
    assert inter_check("NET/Socket/0", "auto", plain).status == "warn"  # no RDMA on the nodes
    assert inter_check("NET/Socket/0", "socket-ok", plain).status == "pass"
    assert inter_check("NET/Socket/0", "ib", plain).status == "fail"


# --- report ---------------------------------------------------------------------------------


def test_text_and_junit() -> None:
    r = recorded("socket_nvlink")
    result = runner.judge("host", r["nodes"], r["collective"], runner.Expectations("nvlink"), started=0)
    text = render_text(result)
    assert "NET/Socket" in text and "FAIL" in text and "fix: unset NCCL_P2P_DISABLE" in text
    suite = ET.fromstring(junit_xml(result))
    assert suite.get("failures") == "1"
    assert suite.find("testcase[@name='transport.intra']/failure") is not None
    err = VerificationFailed(result)
    assert err.exit_code == 7 and err.to_dict()["result"]["status"] == "fail"  # type: ignore[index]


# --- command layer --------------------------------------------------------------------------


def fake_local(name: str) -> Any:
    r = recorded(name)

    def _local(argv: list[str], env: Mapping[str, str] | None, timeout: float) -> ExecResult:
        if argv[1].endswith("probe.py"):
            return ExecResult(0, "noise\n" + json.dumps(r["nodes"]["vm"]) + "\n", "")
        assert env is not None and env["KIT_NPROC"] == "2" and env["KIT_NNODES"] == "1"
        return ExecResult(0, json.dumps(r["collective"]) + "\n", "")

    return _local


def test_cli_host_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "_local", fake_local("p2p"))
    res = CliRunner().invoke(command, ["--host", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["ok"] and doc["result"]["status"] == "pass"
    assert doc["result"]["transport"]["intra"] == {"p2p": 48}


def test_cli_host_fail_exits_7_with_one_json_document(monkeypatch: pytest.MonkeyPatch) -> None:
    from kit.cli import main

    monkeypatch.setattr(runner, "_local", fake_local("socket"))
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--host", "--expect", "nvlink", "--json"])
    assert exc.value.code == 7


def test_cli_host_fail_text(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(runner, "_local", fake_local("shm"))
    junit = tmp_path / "verify.xml"
    res = CliRunner().invoke(command, ["--host", "--expect", "nvlink", "--junit", str(junit)])
    assert isinstance(res.exception, VerificationFailed)
    assert "intra-node links use SHM" in res.output
    assert ET.parse(junit).getroot().get("failures") == "1"


def cluster_runtime(reported_ip: Mapping[str, str] | None = None) -> FakeRuntime:
    """Two running nodes whose probes print the recorded H200 node's facts (with the IP the probe
    finds: reported_ip, else the planned one) and whose collective ran over NET/IB/GDRDMA."""

    def answer(node: NodeHandle, argv: list[str], env: dict[str, str]) -> ExecResult:
        if "--head-ip" in argv:
            ip = (reported_ip or {}).get(node.name, node.ip)
            f = facts(network__node_ip=ip, network__interfaces={"eth0": ip})
            return ExecResult(0, json.dumps(f), "")
        host = "a" if node.rank == 0 else "b"
        lines = [ln for ln in two_node_lines("NET/IB/0/GDRDMA") if ln.startswith(host)]
        out = {
            "ok": True,
            "correct": True,
            "backend": "nccl",
            "nnodes": 2,
            "world_size": 2,
            "error": None,
            "ranks": [{"rank": node.rank}],
            "nccl_lines": lines,
            "results": [
                {
                    "bytes": 1 << 30,
                    "iters": 10,
                    "time_us": 1.0,
                    "algbw_gbps": 40.0,
                    "busbw_gbps": 40.0,
                }
            ],
        }
        return ExecResult(0, json.dumps(out), "")

    return FakeRuntime(
        NodeHandle("kit-head", "c", "head", 0, "running", ip="192.0.2.2", image_digest="sha256:d"),
        NodeHandle("kit-w1", "c", "worker", 1, "running", ip="192.0.2.3", image_digest="sha256:d"),
        answer=answer,
    )


def test_cluster_mode_through_a_runtime() -> None:
    rt = cluster_runtime()
    result = runner.verify_cluster(rt, "c", runner.Expectations("auto", 2, 2), runner.CollectiveSpec())
    assert result.status == "pass", [c for c in result.checks if c.status != "pass"]
    coll = [c for c in rt.calls if "--head-ip" not in c[1]]
    assert {c[2]["KIT_NODE_RANK"] for c in coll} == {"0", "1"}
    assert {c[2]["MASTER_ADDR"] for c in coll} == {"192.0.2.2"}
    assert all(c[2]["MASTER_PORT"] == "29512" and c[1][:2] == ["python3", "-c"] for c in coll)
    assert result.transport is not None and result.transport.inter == {"ib-gdr": 2}
    assert result.nodes["kit-w1"]["versions"]["image_digest"] == "sha256:d"


def test_cluster_mode_planned_ip_mismatch() -> None:
    rt = cluster_runtime(reported_ip={"kit-w1": "172.17.0.2"})  # container IP instead of the planned host IP
    rt.nodes[1] = NodeHandle("kit-w1", "c", "worker", 1, "running", ip="10.1.1.1")
    result = runner.verify_cluster(rt, "c", runner.Expectations(), runner.CollectiveSpec(), collective=False)
    assert {(c.name, c.node) for c in result.checks if c.status == "fail"} >= {
        ("node.ip", "kit-w1"),
        ("versions.image_digest", None),
    }


# --- image mode -----------------------------------------------------------------------------


def test_image_argv_runs_the_probe_with_python() -> None:
    argv = image_probe_argv("vllm/vllm-openai:v0.32.0")
    assert argv[:7] == ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3"]
    assert argv[7:9] == ["vllm/vllm-openai:v0.32.0", "-c"] and argv[-1] == "--image-checks"


def test_image_checks_on_a_plain_debian_image() -> None:
    f = json.loads((RECORDED / "image_debian_base_probe.json").read_text())
    got = statuses(check_image(f))
    assert got["import.torch"] == got["import.vllm"] == got["vllm.serve_help"] == "fail"
    assert got["import.ray"] == got["rdma.userland"] == got["kit.probe_files"] == "warn"


def test_image_checks_on_a_good_image() -> None:
    ok = {"ok": True, "error": None}
    f = {
        "versions": {"python": "3.12.3", "torch": "2.9.0", "vllm": "0.32.0", "ray": "2.49.0"},
        "infiniband": {"userland": {"libibverbs": "libibverbs.so.1", "libmlx5": "libmlx5.so.1"}},
        "image": {
            "imports": {"torch": ok, "vllm": ok, "ray": ok},
            "vllm_serve_help": ok,
            "probe_files": {"probe.py": True, "collective.py": True},
        },
    }
    assert policy.overall(check_image(f)) == "pass"


def test_usage_errors() -> None:
    res = CliRunner().invoke(command, ["--host", "--image", "x"])
    assert res.exit_code != 0
    res = CliRunner().invoke(command, ["--nnodes", "2"])
    assert res.exit_code != 0
