"""kit tune against real vLLM CPU servers: TP=1 (one node) and DP=2 (two nodes) ranked, leaving no
container behind, resumable, interrupted cleanly. kit bench itself is measured on test_serve.py's
two-node TP=2 server (one bring-up for both, CI time: issue 26)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.conftest import write_secret
from tests.integration.clusters import make_kit, two_node_mp_env

SECOND_OCTET = 231  # this module's subnets: 10.231.X.0/24
SECRET_KEY = "sk-kit-bench-" + "7d" * 12


@pytest.fixture(scope="module")
def prepared(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The engine image and the tiny model (kit demo --prepare-only), an API key file."""
    root = tmp_path_factory.mktemp("bench")
    key = root / "api_key"
    write_secret(key, SECRET_KEY + "\n")
    kit = make_kit(root / "state", {})
    prep = kit("demo", "--prepare-only", "--json", "--image", "kit/vllm-cpu:test")
    assert prep.returncode == 0, prep.stderr
    return {"root": root, "key": key, "hf_cache": json.loads(prep.stdout)["result"]["hf_cache"]}


def test_tune_ranks_tp1_and_dp2_and_leaves_nothing(prepared: dict[str, Any], docker_client: Any) -> None:
    """Two layouts (one node, two nodes): TP=2 over both nodes is what tests/integration/test_serve.py
    serves and benches, so bringing it up here would test nothing new (CI time, issue 26)."""
    name = f"kt{os.getpid() % 100000}"
    state = prepared["root"] / "tune-state"
    env = two_node_mp_env(name, prepared["hf_cache"], prepared["key"], second_octet=SECOND_OCTET)
    kit = make_kit(state, env)
    png = prepared["root"] / "tune.png"
    args = ["tune", "--layouts", "tp1,tp1-dp2", "--budget", "12m", "-n", "4", "-c", "2", "--output-len", "8"]
    try:
        result = kit(*args, "--plot", str(png), "--json", timeout=1200)
        assert result.returncode == 0, result.stderr[-3000:]
        doc = json.loads(result.stdout)["result"]
        ranking = {r["layout"]: r for r in doc["ranking"]}
        assert set(ranking) == {"tp1", "tp1-dp2"} and all(r["status"] == "done" for r in ranking.values())
        assert [ranking[k]["nodes"] for k in ("tp1", "tp1-dp2")] == [1, 2]
        # the fastest, or one within --tie (5%) of it on fewer nodes/GPUs
        fastest, chosen = doc["ranking"][0], ranking[doc["recommendation"]]
        assert chosen["output_throughput"] >= fastest["output_throughput"] * (1 - doc["tie"])
        assert (chosen["nodes"], chosen["gpus"]) <= (fastest["nodes"], fastest["gpus"])
        assert all(p["metrics"]["total_output_tokens"] == 32 for p in doc["points"])
        plans = {(p["cluster"]["plan"]["tp"], p["cluster"]["plan"].get("dp", 1)) for p in doc["points"]}
        assert plans == {(1, 1), (1, 2)}
        assert png.stat().st_size > 10_000
        assert not docker_client.containers.list(all=True, filters={"label": f"kit.cluster={name}"})
        # resumable: a second run keeps both measured layouts and starts nothing
        again = kit(*args)
        assert again.returncode == 0, again.stderr
        assert again.stderr.count("in an earlier run") == 2 and "serving at" not in again.stderr
        assert "recommended: tp" in again.stdout
    finally:
        kit("down")
    assert not docker_client.containers.list(all=True, filters={"label": f"kit.cluster={name}"})


def test_tune_with_no_budget_starts_nothing(prepared: dict[str, Any]) -> None:
    name = f"kz{os.getpid() % 100000}"
    env = two_node_mp_env(name, prepared["hf_cache"], prepared["key"], second_octet=SECOND_OCTET)
    kit = make_kit(prepared["root"] / "z-state", env)
    result = kit("tune", "--layouts", "tp1", "--budget", "5s", "--json")
    doc = json.loads(result.stdout)["result"]
    assert doc["ranking"][0]["status"] == "skipped" and doc["recommendation"] is None


def test_tune_interrupted_tears_down_and_resumes(prepared: dict[str, Any], docker_client: Any) -> None:
    """SIGTERM (or Ctrl-C) while a layout is coming up: exit 130, nothing left running, and the
    layout is measured again by the next run."""
    name = f"ki{os.getpid() % 100000}"
    state = prepared["root"] / "i-state"
    env = {
        **os.environ,
        "KIT_STATE_DIR": str(state),
        **two_node_mp_env(name, prepared["hf_cache"], prepared["key"], second_octet=SECOND_OCTET),
    }
    argv = [sys.executable, "-m", "kit", "tune", "--layouts", "tp1", "--budget", "5m", "-n", "2"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    label = {"label": f"kit.cluster={name}"}
    try:
        deadline = time.monotonic() + 120
        while not docker_client.containers.list(filters=label) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert docker_client.containers.list(filters=label), "kit tune started no container"
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 130, stderr
        assert not docker_client.containers.list(all=True, filters=label)
        saved = json.loads((state / "tune" / f"{name}.json").read_text())
        assert saved["layouts"]["tp1"]["status"] == "interrupted"
        written = list((state / "bench").glob(f"tune-{name}-*.json"))  # the results file, even interrupted
        assert len(written) == 1 and json.loads(written[0].read_text())["error"] == "interrupted"
    finally:
        if proc.poll() is None:
            proc.kill()
        make_kit(state, {k: v for k, v in env.items() if k.startswith("KIT_")})("down")
