"""`kit verify --collective all-to-all|both` (issue 10, expert parallelism): the probe's options,
the bus-bandwidth formula, the policy's checks and the text report. The all-to-all itself runs
for real over Gloo in tests/integration/test_verify_cluster.py and over NCCL on 2x H200
(tests/fixtures/verify/h200x2_alltoall_*, when recorded).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kit.commands.verify import collectives_for, command
from kit.runtime.base import ExecResult
from kit.verify import collective, policy, runner
from kit.verify.diagnose import classify_lines
from kit.verify.nccl import summarize_lines
from kit.verify.report import render_text

RECORDED = Path(__file__).parents[1] / "fixtures" / "verify"


def test_alltoall_busbw_is_nccl_tests_formula() -> None:
    # alltoall_perf: busbw = algbw * (n-1)/n; all_reduce_perf: algbw * 2(n-1)/n
    assert collective.alltoall_busbw(100.0, 2) == 50.0
    assert collective.alltoall_busbw(100.0, 8) == 87.5
    assert collective.alltoall_busbw(100.0, 1) == 100.0
    assert collective.busbw(100.0, 8) == 175.0


def test_parse_collectives() -> None:
    assert collective.parse_collectives(None) == ["all-reduce"]
    assert collective.parse_collectives("both") == ["all-reduce", "all-to-all"]
    assert collective.parse_collectives("all-to-all,all-reduce") == ["all-reduce", "all-to-all"]
    with pytest.raises(ValueError, match="unknown collective alltoall"):
        collective.parse_collectives("alltoall")


def test_probe_config_reads_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIT_COLLECTIVES", "all-reduce,all-to-all")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cfg = collective.config([])
    assert cfg["collectives"] == ["all-reduce", "all-to-all"] and cfg["backend"] == "gloo"
    assert collective.config(["--collective", "all-to-all"])["collectives"] == ["all-to-all"]


def test_spec_passes_the_collectives() -> None:
    env = runner.CollectiveSpec(collectives=("all-reduce", "all-to-all")).env(
        master_addr="h", node_rank=0, nnodes=2, nproc=None
    )
    assert env["KIT_COLLECTIVES"] == "all-reduce,all-to-all"
    assert runner.CollectiveSpec().env(master_addr="h", node_rank=0, nnodes=2, nproc=None)["KIT_COLLECTIVES"] == (
        "all-reduce"
    )


def test_collectives_for_config() -> None:
    from tests.conftest import make_config

    ep = make_config(**{"model.tp": 1, "model.dp": 16, "model.ep": True})
    assert collectives_for(ep) == ("all-reduce", "all-to-all")
    assert collectives_for(make_config()) == ("all-reduce",)


def with_alltoall(name: str, *, correct: bool = True, busbw: float = 300.0, **extra: Any) -> dict[str, Any]:
    """A recorded 2x H200 run plus an all-to-all result in the probe's shape."""
    doc = json.loads((RECORDED / f"h200x2_verify_{name}.json").read_text())
    r: dict[str, Any] = copy.deepcopy(doc["result"] if doc["ok"] else doc["error"]["result"])
    coll = r["collective"]
    a2a = {
        "correct": correct,
        "method": "all_to_all_single",
        "fallback_reason": None,
        "results": [
            {"bytes": 1 << 30, "iters": 50, "time_us": 1.0, "algbw_gbps": busbw * 2, "busbw_gbps": busbw},
        ],
        **extra,
    }
    coll["collectives"] = {"all-reduce": {"correct": coll["correct"], "results": coll["results"]}, "all-to-all": a2a}
    return r


def checks_of(r: Mapping[str, Any], expect: str = "auto") -> dict[str, policy.Check]:
    summary = summarize_lines(r["collective"]["nccl_lines"])
    return {c.name: c for c in policy.evaluate(r["nodes"], r["collective"], summary, expect=expect)}


def test_policy_checks_both_collectives() -> None:
    got = checks_of(with_alltoall("p2p"))
    assert got["collective.correct"].status == "pass"
    assert got["collective.all_to_all.correct"].status == "pass"
    assert got["collective.all_to_all.correct"].reason == (
        "all-to-all over 2 ranks (nccl) delivered every chunk to its rank (all_to_all_single)"
    )
    assert got["bandwidth.all_to_all"].status == "pass"
    assert got["bandwidth.all_to_all"].reason == "all-to-all busbw 300.0 GB/s at 1 GiB over nvlink"
    assert got["transport.intra"].status == "pass"  # the transport policy is the same for both


def test_policy_wrong_alltoall_fails_and_slow_one_warns() -> None:
    got = checks_of(with_alltoall("p2p", correct=False))
    assert got["collective.all_to_all.correct"].status == "fail"
    assert got["collective.correct"].status == "pass"
    got = checks_of(with_alltoall("p2p", busbw=20.0))
    assert got["bandwidth.all_to_all"].status == "warn" and "100 GB/s floor" in got["bandwidth.all_to_all"].reason
    got = checks_of(with_alltoall("p2p", method="send/recv", fallback_reason="all_to_all_single refused: no alltoall"))
    assert "(send/recv; all_to_all_single refused: no alltoall)" in got["collective.all_to_all.correct"].reason


def test_failed_probe_names_both() -> None:
    r = with_alltoall("p2p")
    r["collective"].update(ok=False, error="RuntimeError: boom")
    (c,) = [
        c for c in policy.check_collective(r["collective"], None, expect="auto", nodes={}) if c.name == "collective"
    ]
    assert c.reason == "all-reduce and all-to-all failed: RuntimeError: boom"


def test_merge_collective_needs_every_node_correct() -> None:
    a = {"ok": True, "correct": True, "collectives": {"all-to-all": {"correct": True, "results": [1]}}}
    b = {"ok": True, "correct": True, "collectives": {"all-to-all": {"correct": False, "results": [2]}}}
    merged = runner.merge_collective([a, b])
    assert merged["collectives"]["all-to-all"] == {"correct": False, "results": [1]}


def test_text_report_has_an_alltoall_table() -> None:
    r = with_alltoall("p2p")
    result = runner.judge("host", r["nodes"], r["collective"], runner.Expectations(), started=0)
    text = render_text(result)
    assert "All-reduce bandwidth (2 ranks, nccl)" in text
    assert "All-to-all bandwidth (2 ranks, nccl)" in text


def test_cli_host_both(monkeypatch: pytest.MonkeyPatch) -> None:
    r = with_alltoall("p2p")
    seen: dict[str, str] = {}

    def _local(argv: list[str], env: Mapping[str, str] | None, timeout: float) -> ExecResult:
        if argv[1].endswith("probe.py"):
            return ExecResult(0, json.dumps(r["nodes"]["vm"]) + "\n", "")
        seen.update(env or {})
        return ExecResult(0, json.dumps(r["collective"]) + "\n", "")

    monkeypatch.setattr(runner, "_local", _local)
    res = CliRunner().invoke(command, ["--host", "--collective", "both", "--json"])
    assert res.exit_code == 0, res.output
    assert seen["KIT_COLLECTIVES"] == "all-reduce,all-to-all"
    names = {c["name"] for c in json.loads(res.output)["result"]["checks"]}
    assert {"collective.all_to_all.correct", "bandwidth.all_to_all"} <= names


# --- a real NCCL all-to-all on 2x H200 (tests/gpu/alltoall_device.sh) ------------------------

A2A_ROW = re.compile(r"KIT-A2A .* bytes=(\d+) time_us=([\d.]+) algbw_gbps=([\d.]+) busbw_gbps=([\d.]+) correct=(\w+)")


@pytest.mark.parametrize(
    ("name", "intra", "busbw_1g"),
    [("p2p", ["P2P/CUMEM"], 332.04), ("shm", ["SHM"], 24.14)],
)
def test_recorded_nccl_alltoall(name: str, intra: list[str], busbw_1g: float) -> None:
    text = (RECORDED / f"h200x2_alltoall_{name}.log").read_text()
    s = summarize_lines(text.splitlines())
    assert (s.cross_node, s.intra_node, s.version) == ([], intra, "2.28.9")
    rows = [A2A_ROW.search(ln) for ln in text.splitlines() if "KIT-A2A" in ln]
    results = [
        {"bytes": int(m[1]), "time_us": float(m[2]), "algbw_gbps": float(m[3]), "busbw_gbps": float(m[4])}
        for m in rows
        if m
    ]
    assert [r["bytes"] for r in results] == [1 << 20, 32 << 20, 256 << 20, 1 << 30]
    assert all(m and m[5] == "True" for m in rows)  # every chunk arrived at its rank
    for r in results:  # alltoall_perf's busbw for n = 2
        assert r["busbw_gbps"] == pytest.approx(collective.alltoall_busbw(r["algbw_gbps"], 2), abs=0.01)
    assert results[-1]["busbw_gbps"] == busbw_1g
    # The policy judges it like kit's own probe would: correct, above the floor for the link.
    coll = {
        "ok": True,
        "correct": True,
        "backend": "nccl",
        "nnodes": 1,
        "world_size": 2,
        "collectives": {"all-to-all": {"correct": True, "results": results, "method": "all_to_all_single"}},
    }
    nodes = {"vm": {"gpu": {"topology": {"all_nvlink": True}}}}
    got = {c.name: c for c in policy.check_collective(coll, s, expect="socket-ok", nodes=nodes)}
    assert got["collective.all_to_all.correct"].status == "pass"
    assert got["bandwidth.all_to_all"].status == "pass", got["bandwidth.all_to_all"]


def test_cluster_mode_asks_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --collective, cluster mode probes what collectives_for(config) says; a flag wins."""
    import kit.commands.verify as verify_cmd

    seen: list[tuple[str, ...]] = []
    r = with_alltoall("p2p")

    def fake_cluster(config: Any, expect: str, spec: runner.CollectiveSpec, **_: Any) -> Any:
        seen.append(spec.collectives)
        return runner.judge("cluster", r["nodes"], r["collective"], runner.Expectations(), started=0)

    monkeypatch.setattr(verify_cmd, "verify_cluster", fake_cluster)
    monkeypatch.setattr(verify_cmd, "collectives_for", lambda config: ("all-reduce", "all-to-all"))
    assert CliRunner().invoke(command, ["--json"]).exit_code == 0
    assert CliRunner().invoke(command, ["--json", "--collective", "all-reduce"]).exit_code == 0
    assert seen == [("all-reduce", "all-to-all"), ("all-reduce",)]


# --- kit's own probe on 2x H200 (the device run of 2026-11-22, see the report) ----------------


def probe_run(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDED / f"h200x2_probe_{name}.json").read_text())
    return data


def judge_probe(name: str, expect: str = "auto") -> dict[str, policy.Check]:
    nodes = with_alltoall("p2p")["nodes"]  # the same machine's node facts, recorded earlier
    result = runner.judge("host", nodes, probe_run(name), runner.Expectations(expect), started=0)
    return {c.name: c for c in result.checks}


def test_probe_both_on_h200() -> None:
    run = probe_run("both")
    assert (run["ok"], run["nccl"], run["world_size"]) == (True, "2.28.9", 2)
    a2a, ar = run["collectives"]["all-to-all"], run["collectives"]["all-reduce"]
    assert a2a["correct"] and ar["correct"] and a2a["method"] == "all_to_all_single"
    assert [r["bytes"] for r in a2a["results"]] == [1 << 20, 32 << 20, 256 << 20, 1 << 30]
    for r in a2a["results"]:
        assert r["busbw_gbps"] == pytest.approx(collective.alltoall_busbw(r["algbw_gbps"], 2), abs=0.011)
    assert a2a["results"][-1]["busbw_gbps"] > 300 and ar["results"][-1]["busbw_gbps"] > 300
    got = judge_probe("both")
    assert all(c.status == "pass" for c in got.values()), [c for c in got.values() if c.status != "pass"]
    assert got["bandwidth.all_to_all"].reason.startswith("all-to-all busbw 331.81 GB/s at 1 GiB")
    s = summarize_lines(run["nccl_lines"])
    assert (s.cross_node, s.intra_node, s.version) == ([], ["P2P/CUMEM"], "2.28.9")


def test_probe_alltoall_over_shm_and_send_recv_on_h200() -> None:
    got = judge_probe("alltoall_shm", "nvlink")
    assert got["collective.all_to_all.correct"].status == "pass"
    assert got["transport.intra"].status == "fail"  # NCCL_P2P_DISABLE=1: the policy is unchanged
    got = judge_probe("alltoall_sendrecv")
    assert "(send/recv)" in got["collective.all_to_all.correct"].reason
    assert got["bandwidth.all_to_all"].status == "pass"


def test_image_nccl_version_env_is_not_the_loaded_nccl() -> None:
    """The device image sets NCCL_VERSION=2.28.3-1 (its system libnccl); torch loads 2.28.9."""
    run = probe_run("both")
    assert run["nccl_env"]["NCCL_VERSION"] == "2.28.3-1"
    s = summarize_lines(["NCCL_VERSION=2.28.3-1", *run["nccl_lines"]])
    assert (s.version, s.version_source, s.versions) == ("2.28.9", "banner", ["2.28.9", "2.28.3"])
    assert classify_lines(["NCCL_VERSION=2.28.3-1", *run["nccl_lines"]]).findings == []
