"""kit bench and kit tune against real vLLM CPU servers: the two-node TP=2 cluster (one for the
module), metrics that agree with each other, save/compare/plot, the failure paths (401,
unreachable URL, malformed dataset, the server killed mid-run -> partial results saved), and
kit tune across TP=1 (one node), TP=2 and DP=2 (two nodes) leaving no container behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import write_secret
from tests.integration.clusters import make_kit, two_node_mp_env

SECOND_OCTET = 231  # this module's subnets: 10.231.X.0/24
SECRET_KEY = "sk-kit-bench-" + "7d" * 12
LOAD = ["-n", "8", "-c", "2", "--input-len", "8", "--output-len", "8"]


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


@pytest.fixture(scope="module")
def served(prepared: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One 2-node TP=2 server for the module, serving kit/tiny-llama as 'tiny' with an API key."""
    root, key, hf_cache = prepared["root"], prepared["key"], prepared["hf_cache"]
    state = root / "state"
    name = f"kb{os.getpid() % 100000}"
    base_env = two_node_mp_env(name, hf_cache, key, second_octet=SECOND_OCTET)
    kit = make_kit(state, base_env)
    try:
        for role in ("--worker", "--head"):
            up = kit("up", role)
            assert up.returncode == 0, up.stderr
        serve = kit("serve", "--json")
        assert serve.returncode == 0, serve.stderr
        yield {
            "kit": kit,
            "url": json.loads(serve.stdout)["result"]["url"],
            "key": key,
            "root": root,
            "name": name,
            "hf_cache": hf_cache,
            "state": state,
        }
    finally:
        kit("down")


def test_bench_two_node_tp2_metrics_are_consistent(served: dict[str, Any], docker_client: Any) -> None:
    kit, root = served["kit"], served["root"]
    out = root / "a.json"
    result = kit("bench", *LOAD, "--api-key-file", str(served["key"]), "-o", str(out), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert json.loads(result.stdout)["result"]["points"] == doc["points"]
    assert doc["complete"] and doc["error"] is None
    point = doc["points"][0]
    m = point["metrics"]
    assert (m["completed"], m["failed"], m["not_sent"]) == (8, 0, 0)
    assert m["total_output_tokens"] == doc["load"]["requested_output_tokens"] == 64  # ignore_eos: exact
    assert m["request_throughput"] * m["duration"] == pytest.approx(8)
    assert m["output_throughput"] * m["duration"] == pytest.approx(64)
    assert m["total_input_tokens"] > 8 * 8  # chat template + words, counted by the server
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < m[f"median_{name}_ms"] <= m[f"p90_{name}_ms"] <= m[f"p99_{name}_ms"]
    assert m["p99_ttft_ms"] <= m["p99_e2el_ms"] and m["mean_ttft_ms"] < m["mean_e2el_ms"]
    for r in point["requests"]:
        assert r["success"] and r["output_tokens"] == 8 and 0 < r["ttft"] <= r["latency"]
        assert r["latency"] == pytest.approx(r["ttft"] + sum(r["itl"]))
    # the cluster it measured: plan, versions, image digest (what kit status sees)
    cluster = doc["cluster"]
    assert cluster["plan"]["tp"] == 2 and cluster["plan"]["nodes"] == 2
    assert cluster["versions"]["vllm"].startswith("0.32")
    head = docker_client.containers.get(f"kit-{served['name']}-head")
    assert cluster["image_digest"] and cluster["image_digest"] in json.dumps(head.attrs) + head.image.id
    assert SECRET_KEY not in out.read_text() and SECRET_KEY not in result.stdout + result.stderr
    # the default path is under the state dir; compare and plot read saved results
    again = kit("bench", *LOAD, "--api-key-file", str(served["key"]))
    assert again.returncode == 0, again.stderr
    assert "TTFT p50" in again.stdout and "saved to" in again.stdout
    saved = sorted((served["state"] / "bench").glob(f"{served['name']}-*.json"))
    assert saved, again.stdout
    cmp = kit("bench", "--compare", str(out), str(saved[-1]), "--json")
    assert cmp.returncode == 0, cmp.stderr
    rows = {r["metric"]: r for r in json.loads(cmp.stdout)["result"]["rows"]}
    assert rows["output_throughput"]["ratio"] > 0 and rows["median_ttft_ms"]["a"] == m["median_ttft_ms"]
    text = kit("bench", "--compare", str(out), str(saved[-1]))
    assert "B/A" in text.stdout and "TP=2" in text.stdout


def test_bench_plot_is_a_png(served: dict[str, Any]) -> None:
    mpimg = pytest.importorskip("matplotlib.image")
    kit, root = served["kit"], served["root"]
    png = root / "curve.png"
    result = kit(
        "bench", "-n", "6", "-c", "1,3", "--output-len", "6", "--api-key-file", str(served["key"]),
        "-o", str(root / "sweep.json"), "--plot", str(png),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads((root / "sweep.json").read_text())
    assert [p["concurrency"] for p in doc["points"]] == [1, 3]
    image = mpimg.imread(str(png))
    assert image.shape[0] >= 300 and image.shape[1] >= 1000 and image.std() > 0.01  # decoded, not blank
    assert 10_000 < png.stat().st_size < 300_000


def test_wrong_key_is_one_line_exit_8(served: dict[str, Any]) -> None:
    wrong = served["root"] / "wrong"
    write_secret(wrong, "not-the-key\n")  # mode 600: no warning line about it
    result = served["kit"]("bench", *LOAD, "--api-key-file", str(wrong))
    assert result.returncode == 8, result.stderr
    assert "401 Unauthorized" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_unreachable_url_is_one_line_exit_8(served: dict[str, Any]) -> None:
    result = served["kit"]("bench", *LOAD, "--url", "http://127.0.0.1:9", "--api-key-file", str(served["key"]))
    assert result.returncode == 8, result.stderr
    assert "cannot reach http://127.0.0.1:9" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_malformed_dataset_is_one_line_exit_3(served: dict[str, Any]) -> None:
    bad = served["root"] / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": "broken"\n')
    result = served["kit"]("bench", "--dataset", str(bad), "--api-key-file", str(served["key"]))
    assert result.returncode == 3, result.stderr
    assert "bad.jsonl:2: not valid JSON" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_tune_ranks_tp1_and_dp2_and_leaves_nothing(served: dict[str, Any], docker_client: Any) -> None:
    """Two layouts (one node, two nodes): TP=2 over both nodes is the module's own server, so
    bringing it up a second time here would test nothing new (CI time, issue 26)."""
    name = f"kt{os.getpid() % 100000}"
    state = served["root"] / "tune-state"
    env = two_node_mp_env(name, served["hf_cache"], served["key"], second_octet=SECOND_OCTET)
    kit = make_kit(state, env)
    png = served["root"] / "tune.png"
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


def test_server_killed_mid_run_saves_partial_results(served: dict[str, Any], docker_client: Any) -> None:
    """Last in the module: it kills the module's server."""
    out = served["root"] / "partial.json"
    argv = [sys.executable, "-m", "kit", "bench", "-n", "400", "-c", "1", "--output-len", "16"]
    env = {**os.environ, "KIT_STATE_DIR": str(served["state"])}
    env.update(two_node_mp_env(served["name"], served["hf_cache"], served["key"], second_octet=SECOND_OCTET))
    proc = subprocess.Popen(
        [*argv, "--api-key-file", str(served["key"]), "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    time.sleep(8)  # some requests finish (a request takes well under a second)
    head = docker_client.containers.get(f"kit-{served['name']}-head")
    head.exec_run(["bash", "-c", 'kill -9 "$(cat /tmp/kit/serve.pid)"'])
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 8, stderr
    lines = [ln for ln in stderr.splitlines() if ln.startswith("kit: error")]
    assert len(lines) == 1 and "stopped answering" in lines[0] and f"partial results saved to {out}" in lines[0]
    doc = json.loads(out.read_text())
    m = doc["points"][0]["metrics"]
    assert not doc["complete"] and "stopped answering" in doc["error"]
    assert 0 < m["completed"] < 400 and m["completed"] + m["failed"] + m["not_sent"] == 400
