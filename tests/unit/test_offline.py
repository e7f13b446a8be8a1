"""Serve from the fetched copy (issue 19): the offline decision (kit.cluster.model), the env it
puts in the planned containers (up, serve, slurm --dry-run show it), the warning line, and the
model-files row of `kit verify` (the stdlib probe on a real snapshot on disk, then the policy on
probe JSON of two nodes)."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest

from kit.cluster.model import (
    COMPLETE,
    FORCED,
    INCOMPLETE,
    LOCAL,
    MISSING,
    check_model_cache,
    decide_offline,
    with_offline,
)
from kit.config import KitConfig, defaults
from kit.models.fetch import check_snapshot
from kit.verify import probe
from kit.verify.checks import FAIL, PASS, WARN
from kit.verify.checks.cluster import check_hf_snapshots, model_files
from kit.verify.facts import nodes_from_probe
from kit.verify.report import VerifyResult
from tests.conftest import run_kit
from tests.unit.test_fetch_plan import SHA, fake_snapshot

pytestmark = pytest.mark.usefixtures("kit_env")

SHARD1 = "model-00001-of-00002.safetensors"


def config(hf_cache: Path, model: str = "org/m", offline: str = "auto", **env: str) -> KitConfig:
    base = defaults()
    return base.replace(
        hf_cache=str(hf_cache), model=dataclasses.replace(base.model, id=model, offline=offline), env=env
    )


def complete_cache(tmp_path: Path) -> Path:
    """A complete snapshot of org/m at SHA, refs/main naming it (as `kit fetch` leaves it)."""
    snap, _ = fake_snapshot(tmp_path)
    refs = tmp_path / "hub" / "models--org--m" / "refs"
    refs.mkdir()
    (refs / "main").write_text(SHA)
    return snap


# --------------------------------------------------------------------------- the decision


def test_complete_model_runs_offline_without_a_warning(tmp_path: Path) -> None:
    complete_cache(tmp_path)
    cfg = config(tmp_path)
    decision = decide_offline(cfg, check_model_cache(cfg))
    assert (decision.state, decision.offline, decision.warning, decision.sha) == (COMPLETE, True, None, SHA)
    assert decision.env == {"HF_HUB_OFFLINE": "1"}
    assert with_offline(cfg, decision).env == {"HF_HUB_OFFLINE": "1"}
    assert decision.describe() == "vLLM runs offline (HF_HUB_OFFLINE=1): the model is complete in hf_cache on this host"


def test_incomplete_model_stays_online_and_names_the_file_and_the_fix(tmp_path: Path) -> None:
    snap = complete_cache(tmp_path)
    os.truncate((snap / SHARD1).resolve(), 60)
    cfg = config(tmp_path)
    decision = decide_offline(cfg, check_model_cache(cfg))
    assert (decision.state, decision.offline, decision.env) == (INCOMPLETE, False, {})
    assert decision.warning is not None
    assert decision.warning.startswith("org/m is incomplete in hf_cache on this host (1 of the wrong size")
    assert f"{SHARD1}: 60 of 100 bytes" in decision.warning
    assert decision.warning.endswith(
        "every node downloads it at start: run `kit fetch org/m` first (then vLLM runs offline)"
    )
    assert with_offline(cfg, decision) is cfg  # online behaviour as before: nothing added


def test_missing_model_warns_and_local_paths_are_not_hub_models(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    decision = decide_offline(cfg, check_model_cache(cfg))
    assert (decision.state, decision.offline) == (MISSING, False)
    assert decision.warning == (
        "org/m is not in hf_cache on this host; every node downloads it at start: "
        "run `kit fetch org/m` first (then vLLM runs offline)"
    )
    local = config(tmp_path, model="/models/m")
    assert check_model_cache(local) is None
    decision = decide_offline(local, None)
    assert (decision.state, decision.offline, decision.warning) == (LOCAL, False, None)


def test_model_offline_key_forces_either_way(tmp_path: Path) -> None:
    forced_on = decide_offline(config(tmp_path, offline="true"), None)
    assert forced_on.offline and forced_on.warning is not None and "model.offline is true" in forced_on.warning
    assert forced_on.describe().startswith("vLLM runs offline (HF_HUB_OFFLINE=1): model.offline is true")
    assert decide_offline(config(tmp_path, model="/m", offline="true"), None).offline
    complete_cache(tmp_path)
    off = config(tmp_path, offline="false")
    assert check_model_cache(off) is None  # not even read
    decision = decide_offline(off, None)
    assert (decision.state, decision.offline, decision.warning) == (FORCED, False, None)


def test_a_value_the_user_set_in_env_wins(tmp_path: Path) -> None:
    complete_cache(tmp_path)
    cfg = config(tmp_path, HF_HUB_OFFLINE="0")
    assert with_offline(cfg, decide_offline(cfg, check_model_cache(cfg))).env == {"HF_HUB_OFFLINE": "0"}


def test_bad_model_offline_value_is_refused_naming_the_key() -> None:
    code, out, err = run_kit(["up", "--dry-run", "--set", "model.offline=maybe"])
    assert code == 3 and out == "" and len(err.strip().splitlines()) == 1
    assert "model.offline" in err and "auto" in err


# --------------------------------------------------------------------------- what the verbs plan


def env_words(argv: list[str]) -> list[str]:
    return [word.removeprefix("--env=") for word in argv if word.startswith("--env=")]


def test_up_dry_run_plans_offline_env_when_complete_and_warns_when_not(tmp_path: Path) -> None:
    complete_cache(tmp_path)
    args = ["up", "--head", "--dry-run", "--json", "--model", "org/m", "--set", f"hf_cache={tmp_path}"]
    code, out, err = run_kit(args)
    doc = json.loads(out)["result"]
    assert code == 0, err
    assert "HF_HUB_OFFLINE=1" in env_words(doc["docker_argv"])
    assert doc["docker_kwargs"]["environment"]["HF_HUB_OFFLINE"] == "1"
    assert doc["model_cache"]["offline"] is True and doc["model_cache"]["sha"] == SHA
    assert not [w for w in doc["warnings"] if "kit fetch" in w]
    # Text mode: the command shown is the command run.
    code, out, err = run_kit([word for word in args if word != "--json"])
    assert code == 0 and "HF_HUB_OFFLINE=1" in out and "kit fetch" not in err

    other = ["up", "--head", "--dry-run", "--model", "org/absent", "--set", f"hf_cache={tmp_path}"]
    code, out, err = run_kit(other)
    assert code == 0 and "HF_HUB_OFFLINE" not in out
    lines = [ln for ln in err.splitlines() if "kit fetch" in ln]
    assert lines == [
        "warning: org/absent is not in hf_cache on this host; every node downloads it at start: "
        "run `kit fetch org/absent` first (then vLLM runs offline)"
    ]
    code, out, err = run_kit([*other, "--json"])
    assert code == 0 and any("kit fetch org/absent" in w for w in json.loads(out)["result"]["warnings"])


def test_serve_dry_run_exports_offline_in_every_serving_node(tmp_path: Path) -> None:
    complete_cache(tmp_path)
    base = ["serve", "--dry-run", "--json", "--model", "org/m", "--set", f"hf_cache={tmp_path}"]
    code, out, err = run_kit([*base, "--set", "backend=mp", "--set", "nodes=2", "--set", "model.tp=1"])
    assert code == 0, err
    doc = json.loads(out)["result"]
    assert len(doc["nodes"]) == 2
    for node in doc["nodes"]:
        assert "\nexport HF_HUB_OFFLINE=1\n" in node["script"]
    code, out, err = run_kit([*base, "--set", "model.offline=false"])
    doc = json.loads(out)["result"]
    assert code == 0 and "HF_HUB_OFFLINE" not in doc["nodes"][0]["script"]


def test_slurm_launcher_carries_offline_and_its_line_says_which(tmp_path: Path) -> None:
    complete_cache(tmp_path)
    base = ["slurm", "--nodes", "2", "--gpus-per-node", "1", "--tp", "1", "--pp", "2", "--model", "org/m"]
    code, out, err = run_kit([*base, "--set", f"hf_cache={tmp_path}"])
    assert code == 0, err
    assert (
        err.strip()
        .splitlines()[0]
        .endswith("; vLLM runs offline (HF_HUB_OFFLINE=1): the model is complete in hf_cache on this host")
    )
    assert "--env=HF_HUB_OFFLINE=1" in shlex.split(out, comments=True)
    code, out, err = run_kit([*base, "--set", f"hf_cache={tmp_path / 'empty'}", "--json"])
    assert code == 0 and "HF_HUB_OFFLINE" not in out.replace('"HF_HUB_OFFLINE=1"', "")
    doc = json.loads(out)["result"]
    assert doc["model_cache"]["offline"] is False and doc["model_cache"]["cache"] == MISSING
    assert any("kit fetch org/m" in w for w in doc["warnings"])


# --------------------------------------------------------------------------- kit verify: the probe


def test_probe_reports_revision_sizes_and_completeness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = complete_cache(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    info = probe.hf_cache("org/m")
    total = check_snapshot(snap).total
    assert (info["revision"], info["complete"], info["manifest"], info["total_bytes"]) == (SHA, True, True, total)
    assert info["sizes"][SHARD1] == 100 and info["missing"] == [] and info["mismatched"] == []
    os.truncate((snap / SHARD1).resolve(), 60)
    info = probe.hf_cache("org/m")
    assert info["complete"] is False and info["mismatched"] == [{"path": SHARD1, "expected": 100, "actual": 60}]
    (snap / "model-00002-of-00002.safetensors").resolve().unlink()  # a dangling link: missing
    info = probe.hf_cache("org/m")
    assert info["missing"] == ["model-00002-of-00002.safetensors"]
    # The same verdict as kit.models.fetch's check, which the probe cannot import.
    report = check_snapshot(snap)
    assert list(report.missing) == info["missing"] and [m.path for m in report.mismatched] == [SHARD1]


def test_probe_without_manifest_checks_the_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = complete_cache(tmp_path)
    (tmp_path / "hub" / "models--org--m" / "kit" / f"{SHA}.json").unlink()
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert probe.hf_cache("org/m")["complete"] is True
    (snap / SHARD1).unlink()
    info = probe.hf_cache("org/m")
    assert (info["manifest"], info["complete"], info["missing"]) == (False, False, [SHARD1])


# --------------------------------------------------------------------------- kit verify: the row


def node_cache(**over: Any) -> dict[str, Any]:
    cache: dict[str, Any] = {
        "home": "/root/.cache/huggingface",
        "present": True,
        "model": "org/m",
        "revision": SHA,
        "files": 4,
        "fingerprint": "3f1a9c0e5b7d2a44",
        "manifest": True,
        "total_bytes": 2_500_000_000,
        "sizes": {"config.json": 2, SHARD1: 2_000_000_000},
        "complete": True,
        "missing": [],
        "mismatched": [],
    }
    return {"hf_cache": {**cache, **over}}


def row(head: dict[str, Any], worker: dict[str, Any]) -> Any:
    return check_hf_snapshots(nodes_from_probe({"head": head, "worker-1": worker}))


def test_row_passes_with_the_revision_and_size() -> None:
    c = row(node_cache(), node_cache())
    assert c.status == PASS
    assert c.reason == (
        f"org/m identical on 2 node(s): revision {SHA[:12]}, 4 files, 2.50 GB "
        "(sizes checked against kit fetch's manifest)"
    )


def test_row_fails_naming_the_node_and_the_short_file() -> None:
    short = node_cache(complete=False, mismatched=[{"path": SHARD1, "expected": 2_000_000_000, "actual": 5}])
    c = row(node_cache(), short)
    assert c.status == FAIL
    assert c.reason == f"org/m incomplete on worker-1: worker-1: {SHARD1} is 5 of 2000000000 bytes"
    assert c.fix is not None and "kit fetch org/m" in c.fix
    c = row(node_cache(complete=False, missing=["config.json"]), node_cache())
    assert c.status == FAIL and c.reason == "org/m incomplete on head: head: config.json is missing"


def test_row_fails_when_revisions_or_sizes_differ() -> None:
    other = "b" * 40
    c = row(node_cache(), node_cache(revision=other, fingerprint="0000"))
    assert c.status == FAIL and "revision differs" in c.reason
    assert f"head: revision {SHA[:12]}" in c.reason and f"worker-1: revision {other[:12]}" in c.reason
    # Same revision, no manifest on the nodes (complete unknown), one shard of another size.
    differ = node_cache(fingerprint="0000", complete=None, sizes={"config.json": 2, SHARD1: 7})
    c = row(node_cache(complete=None), differ)
    assert c.status == FAIL
    assert (
        c.reason == f"org/m files differ across nodes at the same revision: worker-1: {SHARD1} 7 bytes, head 2000000000"
    )


def test_row_missing_everywhere_warns_with_kit_fetch_and_json_field() -> None:
    gone = node_cache(fingerprint=None, revision=None, files=0, sizes={}, total_bytes=None, complete=None)
    c = row(gone, gone)
    assert c.status == WARN and c.fix == "download it once into the shared HF cache: kit fetch org/m"
    nodes = {"head": node_cache(), "worker-1": node_cache(complete=False, missing=["config.json"])}
    files = model_files(nodes_from_probe(nodes))
    assert files is not None and files["worker-1"]["missing"] == ["config.json"]
    assert files["head"] == {
        "revision": SHA,
        "files": 4,
        "total_bytes": 2_500_000_000,
        "complete": True,
        "sizes_checked": True,
        "missing": [],
        "mismatched": [],
        "fingerprint": "3f1a9c0e5b7d2a44",
    }
    doc = VerifyResult(mode="cluster", checks=[], nodes=nodes).to_dict()
    assert doc["model_files"] == json.loads(json.dumps(files))
    assert model_files(nodes_from_probe({"head": {"hf_cache": {"model": None}}})) is None
