"""kit bench's pure pieces: metric math on hand-made timelines (checked against the formulas of
`vllm bench serve`), percentiles against numpy's, the dataset parsers, the schedule, compare;
and the runner against a small real HTTP server that streams like vLLM (SSE, usage last)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kit.bench import dataset, metrics, results, schedule
from kit.bench.metrics import RequestRecord
from kit.bench.runner import Runner, SSEBuffer, Target
from kit.errors import ConfigError
from tests.conftest import FakeRuntime, make_config, run_kit, write_secret
from tests.unit.fake_stream import FakeVLLM, closed_port_url

# ---------------------------------------------------------------- metrics


def rec(i: int, ttft: float, gaps: list[float], out: int | None, prompt: int = 10, ok: bool = True) -> RequestRecord:
    r = RequestRecord(index=i, success=ok, ttft=ttft, itl=list(gaps), output_tokens=out, prompt_tokens=prompt)
    r.latency = ttft + sum(gaps)
    r.chunks = 1 + len(gaps)
    return r


def test_metrics_follow_vllm_definitions() -> None:
    a = rec(0, 0.100, [0.010, 0.020, 0.030], 4)  # latency 0.16, TPOT = 0.06 / 3
    b = rec(1, 0.200, [0.050], 2)  # latency 0.25, TPOT = 0.05
    c = rec(2, 0.300, [], 1)  # one token: no TPOT, no ITL
    d = RequestRecord(index=3, success=False, error="HTTP 500")
    m = metrics.compute([a, b, c, d], duration_s=2.0)
    assert m["completed"] == 3 and m["failed"] == 1 and m["errors"] == {"HTTP 500": 1}
    assert m["total_output_tokens"] == 7 and m["total_input_tokens"] == 30
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["output_throughput"] == pytest.approx(3.5)
    assert m["total_token_throughput"] == pytest.approx(18.5)
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["mean_tpot_ms"] == pytest.approx((20.0 + 50.0) / 2)  # c excluded: one token only
    assert m["mean_itl_ms"] == pytest.approx((10 + 20 + 30 + 50) / 4)
    assert m["mean_e2el_ms"] == pytest.approx((160 + 250 + 300) / 3)
    assert m["std_ttft_ms"] == pytest.approx(math.sqrt(((100 - 200) ** 2 + 0 + 100**2) / 3))


def test_output_tokens_come_from_usage_not_chunks() -> None:
    r = rec(0, 0.1, [0.1], 5)  # 2 chunks (a chunk may carry several tokens), usage says 5
    m = metrics.compute([r], duration_s=1.0)
    assert m["total_output_tokens"] == 5
    assert m["mean_tpot_ms"] == pytest.approx(100 / 4)
    no_usage = rec(0, 0.1, [0.1, 0.1], None)
    assert metrics.compute([no_usage], 1.0)["total_output_tokens"] == 3  # fallback: chunks


def test_percentiles_match_numpy_linear() -> None:
    np = pytest.importorskip("numpy")
    values = [0.3, 0.1, 0.7, 0.2, 0.9, 0.05, 0.4]
    for p in (0, 1, 50, 90, 99, 100):
        assert metrics.percentile(values, p) == pytest.approx(float(np.percentile(values, p)))
    assert metrics.std(values) == pytest.approx(float(np.std(values)))
    assert metrics.percentile([], 99) == 0.0


def test_no_success_gives_zeros_not_crashes() -> None:
    m = metrics.compute([RequestRecord(index=0, error="x")], duration_s=1.0)
    assert m["completed"] == 0 and m["median_ttft_ms"] == 0.0 and m["output_throughput"] == 0.0


# ---------------------------------------------------------------- schedule


def test_arrivals_poisson_rescaled_like_vllm() -> None:
    times = schedule.arrivals(50, rate=5.0, seed=1)
    assert times == sorted(times) and times[-1] == pytest.approx(50 / 5.0)
    assert schedule.arrivals(3, float("inf")) == [0.0, 0.0, 0.0]
    assert schedule.arrivals(4, 2.0, seed=3) == schedule.arrivals(4, 2.0, seed=3)


def test_more_in_flight_than_kit_runs_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """kit keeps at most MAX_IN_FLIGHT requests in flight (a connection each): a load that needs more
    is one line, exit 3, before any request, instead of a silent cap recorded as unlimited."""
    from kit.bench.runner import MAX_IN_FLIGHT
    from kit.cli import main

    base = ["bench", "--url", "http://127.0.0.1:9"]
    for extra, what in (
        (["-n", "400", "-c", "1,300"], "--concurrency 300 would put 300 requests in flight"),
        (["-n", str(MAX_IN_FLIGHT + 1), "--rate", "5"], f"-n {MAX_IN_FLIGHT + 1} with no --concurrency would put"),
    ):
        with pytest.raises(SystemExit) as info:
            main([*base, *extra])
        err = capsys.readouterr().err
        assert info.value.code == 3 and err.count("\n") == 1, err
        assert what in err and f"at most {MAX_IN_FLIGHT}" in err
    from kit.bench.load import build_load

    flags = {"dataset": "fixed", "num_prompts": 400, "input_len": 2, "output_len": 2, "range_ratio": 0.5}
    flags.update({"rate": "5", "concurrency": str(MAX_IN_FLIGHT), "burstiness": 1.0, "warmup": 0, "seed": 0})
    load = build_load({**flags, "ignore_eos": True})
    assert [p.concurrency for p in load.points] == [MAX_IN_FLIGHT]


def test_sweep_points() -> None:
    assert [p.concurrency for p in schedule.sweep(None, "1,2,4")] == [1, 2, 4]
    pts = schedule.sweep("1,inf", None)
    assert [p.rate for p in pts] == [1.0, float("inf")] and pts[0].concurrency is None
    assert schedule.sweep(None, None)[0].concurrency == 1
    with pytest.raises(ConfigError, match="--concurrency"):
        schedule.sweep(None, "2,x")
    with pytest.raises(ConfigError, match="must be > 0"):
        schedule.sweep("0", None)


# ---------------------------------------------------------------- datasets


def test_fixed_and_random_datasets() -> None:
    fixed = dataset.fixed(4, 12, 8)
    assert [p.output_len for p in fixed] == [8] * 4
    assert all(len(p.messages[0]["content"].split()) == 12 for p in fixed)
    assert len({p.messages[0]["content"].split()[0] for p in fixed}) == 4  # no shared prefix
    rnd = dataset.random_lengths(30, 20, 10, 0.5, seed=2)
    assert all(5 <= p.output_len <= 15 and 10 <= p.input_len <= 30 for p in rnd)
    assert rnd == dataset.random_lengths(30, 20, 10, 0.5, seed=2)


def test_jsonl_and_sharegpt_files(tmp_path: Path) -> None:
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(
        '{"prompt": "hi there", "output_len": 5}\n\n'
        '{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "x"}]}\n'
    )
    got = dataset.load_file(jsonl, 3, default_output=7)
    assert [p.output_len for p in got] == [5, 7, 5]
    assert got[1].messages[0] == {"role": "system", "content": "be brief"}
    share = tmp_path / "s.json"
    share.write_text(json.dumps([{"conversations": [{"from": "human", "value": "q?"}, {"from": "gpt", "value": "a"}]}]))
    assert dataset.load_file(share, None, 4)[0].messages == ({"role": "user", "content": "q?"},)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"prompt": "ok"}\n{"prompt": \n', r"p\.jsonl:2: not valid JSON"),
        ('{"text": "no prompt"}\n', r"p\.jsonl:1: no \"prompt\""),
        ('{"prompt": "x", "output_len": 0}\n', "output_len must be a positive integer"),
        ('{"messages": [{"role": "user"}]}\n', '"messages" must be'),
        ("[1, 2]", "expected a JSON object"),
        ("\n\n", "no prompts"),
        ("[" * 100_000, r"p\.jsonl: not valid JSON \(nested too deeply\)"),  # RecursionError in json
        ('{"prompt": "ok"}\n' + "[" * 100_000 + "\n", r"p\.jsonl:2: not valid JSON \(nested too deeply\)"),
    ],
)
def test_malformed_dataset_is_one_config_error(tmp_path: Path, text: str, match: str) -> None:
    bad = tmp_path / "p.jsonl"
    bad.write_text(text)
    with pytest.raises(ConfigError, match=match) as info:
        dataset.load_file(bad, 2, 4)
    assert "\n" not in info.value.message


# ---------------------------------------------------------------- SSE parsing


def test_sse_buffer_splits_across_chunks() -> None:
    buf = SSEBuffer()
    assert buf.add(b'data: {"a": 1}\n\nda') == ['data: {"a": 1}']
    assert buf.add(b'ta: {"b": 2}\n\n: ping\n\ndata: [DONE]\n\n') == ['data: {"b": 2}', ": ping", "data: [DONE]"]
    assert buf.add("data: é".encode()[:-1]) == [] and buf.add("é".encode()[-1:] + b"\n\n") == ["data: é"]


# ---------------------------------------------------------------- a real streaming server


def test_runner_measures_a_streaming_server(fake_server: str) -> None:
    runner = Runner(Target(fake_server, "tiny", api_key="sk-test"))
    prompts = dataset.fixed(6, 4, 5)
    run = runner.run(prompts, schedule.LoadPoint(float("inf"), 2))
    assert run.stopped is None and run.not_sent == 0
    m = metrics.compute(run.records, run.duration)
    assert m["completed"] == 6 and m["total_output_tokens"] == 30 and m["total_input_tokens"] == 54
    for r in run.records:
        assert 0 < r.ttft <= r.latency and len(r.itl) == 5  # the role chunk is the first "token"
        assert r.latency == pytest.approx(r.ttft + sum(r.itl))
    assert 4.0 <= m["median_itl_ms"] < 30.0


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "until-close"])
def test_runner_times_each_token_as_it_arrives(fake_server: str, chunked: bool) -> None:
    """TTFT, ITL and E2E come from when each SSE event arrives, whether the body is chunked or
    ends at connection close (read as a whole, TTFT == E2E and every ITL ~0)."""
    FakeVLLM.chunked = chunked
    FakeVLLM.token_delay = 0.04
    run = Runner(Target(fake_server, "tiny", api_key="sk-test")).run(
        dataset.fixed(2, 4, 6), schedule.LoadPoint(float("inf"), 1)
    )
    assert run.stopped is None and len(run.records) == 2
    for r in run.records:
        assert r.success and r.output_tokens == 6 and len(r.itl) == 6
        assert r.ttft < 0.5 * r.latency  # the role chunk comes at once, the 6 tokens ~0.24 s later
        assert all(0.02 < gap < 0.2 for gap in r.itl), r.itl


def test_runner_stops_when_the_server_dies(fake_server: str) -> None:
    FakeVLLM.die_after = 3
    runner = Runner(Target(fake_server, "tiny", api_key="sk-test"))
    run = runner.run(dataset.fixed(10, 4, 3), schedule.LoadPoint(float("inf"), 1))
    assert run.stopped and "stopped answering" in run.stopped
    assert sum(r.success for r in run.records) == 3 and run.not_sent >= 5


def test_cli_bench_saves_and_compares(fake_server: str, tmp_path: Path) -> None:
    from kit.cli import cli

    key = tmp_path / "key"
    key.write_text("sk-test\n")
    env = {"KIT_STATE_DIR": str(tmp_path / "state")}
    runner = CliRunner()
    base = ["bench", "--url", fake_server, "--api-key-file", str(key), "-n", "4", "--output-len", "3", "--json"]
    a = runner.invoke(cli, [*base, "-o", str(tmp_path / "a.json")], env=env)
    assert a.exit_code == 0, a.output
    doc = json.loads(a.output)["result"]
    assert doc["complete"] and doc["points"][0]["metrics"]["total_output_tokens"] == 12
    assert doc["cluster"]["versions"]["vllm"] == "0.32.0-fake"
    # no kit cluster serves that URL: the default kit.yaml's plan is not what was measured
    assert doc["cluster"]["plan"] is None and doc["cluster"]["name"] is None
    assert (doc["cluster"]["url"], doc["cluster"]["served_model"]) == (fake_server, "tiny")
    assert "sk-test" not in (tmp_path / "a.json").read_text()
    b = runner.invoke(cli, [*base, "-o", str(tmp_path / "b.json")], env=env)
    assert b.exit_code == 0
    cmp = runner.invoke(cli, ["bench", "--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    assert cmp.exit_code == 0 and "B/A" in cmp.output and "median_ttft_ms" in cmp.output
    assert f"tiny @ {fake_server} (external server, no kit plan" in cmp.output
    tune_doc = {**GOOD_RESULT, "kind_detail": "tune", "cluster": {"versions": {}}}  # no top-level plan
    assert "(kit tune: each point has its layout's plan" in results.describe(tune_doc)
    rows = results.compare(results.load(tmp_path / "a.json"), results.load(tmp_path / "b.json"))
    assert {r["metric"] for r in rows} >= {"output_throughput", "p99_e2el_ms"}


# ---------------------------------------------------------------- failures through the CLI: one line, exit code


@pytest.fixture
def bench_args(tmp_path: Path, kit_state_dir: Path) -> list[str]:
    write_secret(tmp_path / "key", "sk-test\n")
    return ["bench", "--api-key-file", str(tmp_path / "key"), "-n", "6", "-c", "1", "--output-len", "4"]


def test_cli_unreachable_url_is_one_line_exit_8_and_saves_nothing(bench_args: list[str], tmp_path: Path) -> None:
    url = closed_port_url()
    code, _, err = run_kit([*bench_args, "--url", url, "-o", str(tmp_path / "r.json")])
    assert code == 8 and err.count("\n") == 1 and err.startswith(f"kit: error: cannot reach {url}/v1/models"), err
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "state" / "bench").exists()


def test_cli_wrong_key_is_one_line_exit_8(fake_server: str, bench_args: list[str], tmp_path: Path) -> None:
    write_secret(tmp_path / "key", "not-the-key\n")
    code, _, err = run_kit([*bench_args, "--url", fake_server, "-o", str(tmp_path / "r.json")])
    assert code == 8 and err.count("\n") == 1 and "answered 401 Unauthorized" in err, err
    assert "--api-key-file" in err and "not-the-key" not in err
    assert FakeVLLM.served == 0 and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("mid_stream", [False, True], ids=["before-answering", "mid-stream"])
def test_cli_server_dying_mid_run_saves_partial_results(
    fake_server: str, bench_args: list[str], tmp_path: Path, mid_stream: bool
) -> None:
    """The server drops its connections from the 4th request on (warm-up + 2 measured answered):
    one line that says how many requests were not answered and where the partial results are,
    exit 8, and the saved document says complete: false."""
    FakeVLLM.die_after = 3
    FakeVLLM.die_mid_stream = mid_stream
    out = tmp_path / "r.json"
    code, _, err = run_kit([*bench_args, "--url", fake_server, "-o", str(out)])
    lines = [ln for ln in err.splitlines() if ln.startswith("kit: ")]
    assert code == 8 and len(lines) == 1, err
    assert "the server stopped answering" in lines[0] and "(4 of 6 requests not answered)" in lines[0]
    assert f"partial results saved to {out}" in lines[0]
    cause = "(connection broken mid-response)" if mid_stream else "(connection closed before the response)"
    assert cause in lines[0]
    doc = json.loads(out.read_text())
    m = doc["points"][0]["metrics"]
    assert doc["complete"] is False and "stopped answering" in doc["error"]
    assert (m["completed"], m["failed"], m["not_sent"]) == (2, 1, 3)


def test_cli_malformed_dataset_is_one_line_exit_3_before_any_request(
    fake_server: str, bench_args: list[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": "broken"\n')
    code, _, err = run_kit([*bench_args, "--url", fake_server, "--dataset", str(bad)])
    assert code == 3 and err.count("\n") == 1 and f"{bad}:2: not valid JSON" in err, err
    assert FakeVLLM.served == 0


def test_cluster_info_has_the_plan_only_for_a_kit_cluster_at_that_url(use_runtime: Callable[[Any], None]) -> None:
    from kit.bench.target import cluster_info
    from kit.cluster import Cluster
    from kit.runtime.base import NodeHandle

    config = make_config(**{"model.tp": 8, "model.pp": 2})  # cluster "llama", 2 nodes x 8, port 8000
    head = NodeHandle("kit-llama-head", "llama", "head", 0, "running", ip="10.0.0.5", image_digest="sha256:d")
    use_runtime(FakeRuntime(head))
    ours = cluster_info(Cluster.from_config(config), "http://10.0.0.5:8000", "0.32.0", "llama-70b")
    assert ours["plan"]["tp"] == 8 and ours["plan"]["pp"] == 2 and ours["image_digest"] == "sha256:d"
    assert ours["name"] == "llama" and [n["name"] for n in ours["nodes"]] == ["kit-llama-head"]
    other = cluster_info(Cluster.from_config(config), "http://10.0.0.9:8000", "0.11.0", "served-elsewhere")
    assert other["plan"] is None and other["nodes"] == [] and other["image_digest"] is None
    assert other["served_model"] == "served-elsewhere" and other["versions"]["vllm"] == "0.11.0"
    # no node on this host: the configured head_address is the cluster's, anything else is not
    use_runtime(FakeRuntime())
    remote = config.replace(head_address="10.0.0.7")
    assert cluster_info(Cluster.from_config(remote), "http://10.0.0.7:8000", None, "llama-70b")["plan"]["nodes"] == 2
    assert cluster_info(Cluster.from_config(remote), "http://127.0.0.1:8000", None, "x")["plan"] is None
    assert cluster_info(Cluster.from_config(config), "http://127.0.0.1:8000", None, "x")["plan"] is None


def test_cluster_info_reads_the_layout_the_head_was_started_with(use_runtime: Callable[[Any], None]) -> None:
    """A server started with other settings than this kit.yaml (kit demo, --set on up) is saved
    as it runs: the head's labels (written by kit up, kit.labels) win over the config."""
    from kit.bench.target import cluster_info
    from kit.cluster import Cluster
    from kit.plan.network import NodeNet
    from kit.plan.node import node_labels
    from kit.plan.roles import HEAD
    from kit.runtime.base import NodeHandle

    config = make_config(**{"model.tp": 8, "model.pp": 2})  # what kit.yaml says: 2 x 8, ray, gpu
    served = make_config(**{"backend": "mp", "accelerator": "cpu", "nodes": 2, "gpus_per_node": 1, "model.tp": 2,
                            "model.pp": 1, "model.id": "kit/tiny-llama", "model.max_model_len": 2048})  # fmt: skip
    labels = node_labels(served, HEAD, NodeNet("10.0.0.5", "eth0", "10.0.0.5"))
    nodes = [
        NodeHandle("kit-llama-head", "llama", "head", 0, "running", ip="10.0.0.5", labels=labels),
        NodeHandle("kit-llama-worker-1", "llama", "worker", 1, "running", ip="10.0.0.6", labels=labels),
    ]

    runtime = FakeRuntime(*nodes)
    use_runtime(runtime)
    plan = cluster_info(Cluster.from_config(config), "http://10.0.0.5:8000", "0.32.0", "tiny")["plan"]
    # Everything the nodes were started with (issue 25: their labels carry the size too).
    assert plan == {"tp": 2, "pp": 1, "dp": 1, "ep": False, "nodes": 2, "gpus_per_node": 1, "backend": "mp",
                    "accelerator": "cpu", "model": "kit/tiny-llama", "max_model_len": 2048}  # fmt: skip
    # A node started by an older kit (no layout labels): the config's layout.
    runtime.nodes = [NodeHandle("kit-llama-head", "llama", "head", 0, "running", ip="10.0.0.5")]
    plan = cluster_info(Cluster.from_config(config), "http://10.0.0.5:8000", "0.32.0", "tiny")["plan"]
    assert (plan["tp"], plan["pp"], plan["model"]) == (8, 2, "meta-llama/Llama-3.1-70B-Instruct")


def test_compare_ratios_and_direction() -> None:
    def doc(tput: float, ttft: float) -> dict[str, Any]:
        return {
            "kind": "kit-bench",
            "target": {},
            "points": [
                {"rate": None, "concurrency": 2, "metrics": {"output_throughput": tput, "median_ttft_ms": ttft}}
            ],
        }

    rows = {r["metric"]: r for r in results.compare(doc(100, 50), doc(150, 25))}
    assert rows["output_throughput"]["ratio"] == pytest.approx(1.5) and rows["output_throughput"]["b_better"]
    assert rows["median_ttft_ms"]["ratio"] == pytest.approx(0.5) and rows["median_ttft_ms"]["b_better"]
    assert results.compare(doc(1, 1), {**doc(1, 1), "points": []}) == []


GOOD_RESULT = {
    "kind": "kit-bench",
    "target": {"url": "http://x", "model": "m"},
    "points": [{"rate": None, "concurrency": 1, "metrics": {"completed": 1, "output_throughput": 5.0}}],
}


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"kind": "kit-bench", "points": [{"rate": None, "concurrency": 1}]}, 'point 1 has no "metrics" object'),
        ({"kind": "other", "points": []}, 'not a kit bench result (no "kind": "kit-bench")'),
        ({"kind": "kit-bench", "points": {}}, '"points" is not a list'),
        ({"kind": "kit-bench", "points": [1]}, "point 1 is not an object"),
        ({"kind": "kit-bench", "target": "x", "points": []}, '"target" is not an object'),
        ({"kind": "kit-bench", "points": [{"rate": "fast", "metrics": {}}]}, "point 1: rate 'fast' is not a number"),
        ({"kind": "kit-bench", "points": [{"concurrency": 1.5, "metrics": {}}]}, "concurrency 1.5 is not an integer"),
        (
            {"kind": "kit-bench", "points": [{"metrics": {"median_ttft_ms": "1", "output_throughput": [1]}}]},
            "point 1: metrics median_ttft_ms, output_throughput not a number",
        ),
        ({"kind": "kit-bench", "points": [{"metrics": {"errors": []}}]}, 'point 1: metrics "errors" is not an object'),
        ("[" * 100_000, "nested deeper than 64 levels"),  # kit.safeload refuses before json.loads
    ],
)
def test_bad_results_file_is_one_line_exit_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: Any, problem: str
) -> None:
    """--compare and --plot --from check what they load: one line naming the file and the
    problem, exit 3 (a bad input file, like a bad kit.yaml), never a KeyError traceback."""
    from kit.cli import main

    bad, good = tmp_path / "m1.json", tmp_path / "good.json"
    bad.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    good.write_text(json.dumps(GOOD_RESULT))
    for argv, flag in (
        (["bench", "--compare", str(bad), str(good)], "--compare"),
        (["bench", "--compare", str(good), str(bad)], "--compare"),
        (["bench", "--plot", str(tmp_path / "p.png"), "--from", str(good), "--from", str(bad)], "--from"),
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        err = capsys.readouterr().err
        assert info.value.code == 3, err
        assert err.count("\n") == 1 and err.startswith(f"kit: error: {flag}: {bad}")
        assert problem in err and "Traceback" not in err
    assert results.load(good) == GOOD_RESULT


# ---------------------------------------------------------------- kit tune's pure pieces


def facts(heads: int, kv_heads: int, experts: int | None = None) -> Any:
    """A model's facts as kit.cluster.resolve reads them from a config.json kit.sizing refused:
    head counts (and experts) only."""
    from kit.plan.layout import ModelFacts

    return ModelFacts("config.json", heads, kv_heads, experts, None)


def test_layout_parsing_and_candidates() -> None:
    from kit.bench.tune import candidates, check_fits, parse_layouts
    from kit.layout import Layout

    assert parse_layouts("tp1, tp2,tp2-pp2,tp1") == [Layout(1), Layout(2), Layout(2, 2)]
    assert parse_layouts("tp1-dp2,tp2_dp8-ep") == [Layout(1, 1, 2), Layout(2, 1, 8, ep=True)]
    assert Layout(2, 2).name == "tp2-pp2" and Layout(4).nodes(2) == 2
    assert Layout(1, 1, 16, ep=True).name == "tp1-dp16-ep" and Layout(1, 1, 16).nodes(8) == 2
    assert Layout(2).overrides(1) == {
        "nodes": 2,
        "gpus_per_node": 1,
        "model.tp": 2,
        "model.pp": 1,
        "model.dp": 1,
        "model.ep": False,
    }
    with pytest.raises(ConfigError, match="not a layout"):
        parse_layouts("tp")
    with pytest.raises(ConfigError, match="not a layout"):
        parse_layouts("tp1-ep-dp2")
    # CPU: no PP (vLLM asserts), no EP (fails on the first request); DP=2 over the two nodes is in
    assert candidates(2, 1, accelerator="cpu") == [Layout(1), Layout(2), Layout(1, 1, 2)]
    assert candidates(2, 1, accelerator="cpu", backend="ray") == [Layout(1), Layout(2)]  # kit refuses Ray DP on CPU
    assert candidates(2, 1) == [Layout(1), Layout(2), Layout(1, 1, 2), Layout(1, 2)]
    assert Layout(8) not in candidates(2, 4, model=facts(12, 4))  # 8 does not divide 12
    assert Layout(4) in candidates(2, 2, model=facts(32, 2))  # 2 KV heads replicated over TP 4 (kit.sizing's rule)
    moe = candidates(2, 8, model=facts(128, 128, experts=256))
    assert Layout(1, 1, 16, ep=True) in moe and Layout(2, 1, 8, ep=True) in moe
    assert Layout(16, 1, 1) in moe and Layout(16, 1, 1, ep=True) not in moe  # EP comes with DP
    assert all(lay.tp <= 8 for lay in moe if lay.dp > 1)  # a replica stays inside a node
    assert not any(lay.ep for lay in candidates(2, 8, model=facts(128, 128, experts=0)))  # dense: no EP
    assert not any(lay.ep for lay in candidates(2, 8, model=facts(128, 128, experts=6)) if lay.dp * lay.tp == 16)
    with pytest.raises(ConfigError, match="needs 4 GPUs"):
        check_fits([Layout(4)], 2, 1)


def test_tune_refuses_a_layout_kit_up_would_refuse(tmp_path: Path) -> None:
    from kit.bench.trials import check_layout
    from kit.cluster import Cluster
    from kit.layout import Layout
    from tests.conftest import make_config

    config = make_config(**{"model.tp": 8, "nodes": 2, "gpus_per_node": 8})
    check_layout(Cluster.from_config(config), Layout(8, 2))
    check_layout(Cluster.from_config(config), Layout(1, 1, 16, ep=True))
    with pytest.raises(ConfigError, match=r"layout tp16-dp2: .*GPUs does not fit"):
        check_layout(Cluster.from_config(config.replace(nodes=4)), Layout(16, 1, 2))


def test_tune_ranking_and_state(tmp_path: Path) -> None:
    from kit.bench.tune import load_state, rank, recommendation, state_key

    def entry(tput: float, e2e: float, failed: int = 0, status: str = "done") -> dict[str, Any]:
        m = {"output_throughput": tput, "request_throughput": 1.0, "median_ttft_ms": 1.0, "median_tpot_ms": 1.0}
        return {"status": status, "nodes": 1, "point": {"metrics": {**m, "median_e2el_ms": e2e, "failed": failed}}}

    ranking = rank(
        {
            "tp1": entry(100, 50),
            "tp2": entry(120, 80),
            "tp4": entry(500, 10, failed=2),
            "tp8": {"status": "failed", "error": "did not start"},
        }
    )
    assert [r["layout"] for r in ranking] == ["tp2", "tp1", "tp4", "tp8"]
    assert recommendation(ranking)["layout"] == "tp2"  # type: ignore[index]
    assert recommendation(rank({"tp8": {"status": "failed"}})) is None
    key = state_key({"load": 1})
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"key": key, "layouts": {"tp1": {"status": "done"}}}))
    assert load_state(path, key)["layouts"] == {"tp1": {"status": "done"}}
    assert load_state(path, state_key({"load": 2}))["layouts"] == {}  # another load: start over


def _entry(tput: float, e2e: float = 100.0, *, status: str = "done", nodes: int = 1, failed: int = 0) -> dict[str, Any]:
    m = {"output_throughput": tput, "request_throughput": 1.0, "median_ttft_ms": 1.0, "median_tpot_ms": 1.0}
    return {"status": status, "nodes": nodes, "point": {"metrics": {**m, "median_e2el_ms": e2e, "failed": failed}}}


def test_tune_ranks_unmeasured_layouts_last_and_never_recommends_them() -> None:
    """After a budget cut: a layout measured in part ranks above layouts with no data, whatever
    its failed-request count, and only a clean finished layout is recommended."""
    from kit.bench.tune import rank, recommendation

    ranking = rank(
        {
            "tp1": {"status": "skipped", "nodes": 1, "error": "time budget used up"},
            "tp2": _entry(80, failed=3, status="partial", nodes=2),
            "tp1-dp2": {"status": "failed", "nodes": 2, "error": "did not start"},
            "tp4": {"status": "interrupted", "nodes": 4, "error": "interrupted"},
        }
    )
    assert ranking[0]["layout"] == "tp2"
    assert {r["layout"] for r in ranking[1:]} == {"tp1", "tp1-dp2", "tp4"}
    assert recommendation(ranking, 0.05) is None
    clean = rank({"tp1": {"status": "skipped", "nodes": 1}, "tp2": _entry(50, nodes=2), "tp4": _entry(90, failed=1)})
    assert [r["layout"] for r in clean] == ["tp2", "tp4", "tp1"]
    assert recommendation(clean, 0.05)["layout"] == "tp2"  # type: ignore[index]


def test_tune_tie_goes_to_fewer_nodes_then_gpus() -> None:
    from kit.bench.tune import rank, recommendation, recommendation_line

    # 2 GPUs per node: tp2 fits one node, tp1-dp4 needs two
    ranking = rank({"tp1-dp4": _entry(115.5, nodes=2), "tp2": _entry(115.4, nodes=1), "tp1": _entry(60.0, nodes=1)})
    assert [r["layout"] for r in ranking] == ["tp1-dp4", "tp2", "tp1"]
    best = recommendation(ranking, 0.05)
    assert best is not None and best["layout"] == "tp2" and best["over"] == "tp1-dp4"
    line = recommendation_line(best, ranking, 0.05)
    assert line.startswith("recommended: tp2 (115.4 output tokens/s; tp1-dp4 made 115.5, within the 5% tie")
    assert "fewer nodes/GPUs: 1 node(s), 2 GPU(s) vs 2, 4" in line
    no_tie = recommendation(ranking, 0.0)
    assert no_tie is not None and no_tie["layout"] == "tp1-dp4" and no_tie["over"] is None
    assert recommendation_line(no_tie, ranking, 0.0) == "recommended: tp1-dp4 (115.5 output tokens/s)"
    # same nodes: fewer GPUs wins the tie; outside the tolerance the fastest stays
    same_nodes = rank({"tp1-dp2": _entry(100.0, nodes=1), "tp1": _entry(97.0, nodes=1)})
    assert recommendation(same_nodes, 0.05)["layout"] == "tp1"  # type: ignore[index]
    assert recommendation(same_nodes, 0.02)["layout"] == "tp1-dp2"  # type: ignore[index]


def test_budget_parsing() -> None:
    from kit.bench.trials import parse_budget

    assert parse_budget("20m") == 1200 and parse_budget("90") == 90 and parse_budget("1.5h") == 5400
    with pytest.raises(ConfigError, match="--budget"):
        parse_budget("soon")


def test_runner_paces_a_request_rate(fake_server: str) -> None:
    runner = Runner(Target(fake_server, "tiny", api_key="sk-test"))
    run = runner.run(dataset.fixed(8, 2, 2), schedule.LoadPoint(40.0, None), seed=5, burstiness=0.5)
    starts = sorted(r.start for r in run.records)
    offsets = schedule.arrivals(8, 40.0, 0.5, seed=5)
    assert len(run.records) == 8 and all(r.success for r in run.records)
    assert starts[-1] - starts[0] == pytest.approx(offsets[-1] - offsets[0], abs=0.05)  # sent on schedule
    assert run.duration >= 8 / 40.0


def test_sigterm_saves_the_partial_point(fake_server: str, tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    key = tmp_path / "key"
    key.write_text("sk-test\n")
    out = tmp_path / "partial.json"
    argv = [sys.executable, "-m", "kit", "bench", "--url", fake_server, "--api-key-file", str(key), "-n", "500"]
    env = {**os.environ, "KIT_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen([*argv, "-c", "1", "--output-len", "20", "-o", str(out)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 30
    while FakeVLLM.served < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    doc = json.loads(out.read_text())
    m = doc["points"][0]["metrics"]
    assert doc["error"] == "interrupted" and not doc["complete"]
    assert m["completed"] >= 2 and m["completed"] + m["failed"] + m["not_sent"] == 500


def test_plot_without_matplotlib_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without matplotlib, --plot is one usage line (exit 2): before a run (nothing is sent to
    the unreachable URL) and when plotting saved results."""
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    needs = "kit: error: --plot needs matplotlib, which is not installed (fix: pip install 'kit[plot]'"
    code, _, err = run_kit(["bench", "--url", "http://127.0.0.1:9", "--plot", str(tmp_path / "x.png")])
    assert code == 2 and err.count("\n") == 1 and err.startswith(needs), err
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(GOOD_RESULT))
    code, _, err = run_kit(["bench", "--plot", str(tmp_path / "x.png"), "--from", str(saved)])
    assert code == 2 and err.count("\n") == 1 and err.startswith(needs), err
    assert not (tmp_path / "x.png").exists()


def test_plot_from_saved_results(tmp_path: Path) -> None:
    mpimg = pytest.importorskip("matplotlib.image")
    from kit.bench.plot import plot

    def doc(layout: str, scale: float) -> dict[str, Any]:
        points = []
        for c in (1, 2, 4):
            m = {"completed": 4, "output_throughput": 10.0 * c * scale}
            m.update({"median_ttft_ms": 5.0 * c, "median_tpot_ms": 2.0 + c, "median_e2el_ms": 50.0 * c / scale})
            points.append({"rate": None, "concurrency": c, "layout": layout, "metrics": m})
        return {"kind": "kit-bench", "points": points}

    png = plot([doc("tp1", 1.0), doc("tp2", 2.0)], ["a", "b"], tmp_path / "p.png")
    image = mpimg.imread(str(png))
    assert image.shape[:2] == (380, 1200) and image.std() > 0.01


# ---------------------------------------------------------------- kit tune's budget is one deadline


def test_warm_up_and_measurement_end_at_the_deadline(fake_server: str) -> None:
    """A server that stalls mid-stream (5 s between tokens): the warm-up request and the
    measured ones are cut at the deadline, not at the 600 s request timeout or the next token."""
    from kit.bench.measure import Load, run_load
    from kit.bench.runner import BUDGET_STOP
    from kit.output import LiveLine

    FakeVLLM.token_delay = 5.0
    target = Target(fake_server, "tiny", api_key="sk-test")
    for warmup in (1, 0):
        load = Load(prompts=dataset.fixed(2, 2, 4), points=[schedule.LoadPoint(float("inf"), 2)], warmup=warmup)
        doc: dict[str, Any] = {"points": []}
        start = time.monotonic()
        stopped = run_load(target, load, doc, save_to=None, live=LiveLine(as_json=True), deadline=start + 1.0)
        assert stopped == BUDGET_STOP
        assert time.monotonic() - start < 1.6
        if warmup:
            assert doc["points"] == []  # cut during the warm-up: nothing measured
        else:
            (point,) = doc["points"]
            assert point["stopped"] == BUDGET_STOP and point["metrics"]["failed"] == 2
            assert {r["error"] for r in point["requests"]} == {"stopped"}


class SlowNodes:
    """A runtime whose nodes become ready `ready_s` after they start (each wait sleeps, at most
    its timeout) and whose server never answers /health: a bring-up that eats the budget."""

    name = "docker"

    def __init__(self, ready_s: float) -> None:
        from tests.unit.recorded_parsers import RecordedStore

        self.ready_s = ready_s
        self.images = RecordedStore()  # kit probes the image once before the bring-up (issue 24)
        self.specs: dict[str, Any] = {}
        self.launched: set[str] = set()
        self.waits: list[float] = []
        self.removed: list[str] = []

    def find_nodes(self, cluster: str) -> list[Any]:
        from kit.runtime.base import NodeHandle

        return [
            NodeHandle(name, cluster, spec.role.kind, spec.role.rank, "running", ip="127.0.0.1")
            for name, spec in self.specs.items()
        ]

    def state(self, name: str) -> str | None:
        return "running" if name in self.specs else None

    def ensure_network(self, name: str, subnet: str, cluster: str) -> None:
        pass

    def start(self, spec: Any) -> None:
        self.specs[spec.name] = spec

    def remove(self, name: str) -> bool:
        return self.specs.pop(name, None) is not None

    def wait_for_mark(self, name: str, marks: Any, *, timeout: float, on_progress: Any, what: str) -> str:
        from kit.errors import StartError

        self.waits.append(timeout)
        time.sleep(min(timeout, self.ready_s))
        if timeout < self.ready_s:
            raise StartError(f"{name}: timed out after {timeout:.0f} s waiting for {what}")
        return marks[0]

    def exec(self, node: Any, argv: Any, **_: Any) -> Any:
        from kit.runtime.base import ExecResult

        return ExecResult(0 if node.name in self.launched else 1, "", "")

    def exec_detached(self, node: Any, argv: Any) -> None:
        self.launched.add(node.name)

    def remove_cluster(self, cluster: str) -> dict[str, list[str]]:
        self.removed.append(cluster)
        self.specs.clear()
        self.launched.clear()
        return {}


def test_serve_cluster_stops_waiting_for_health_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    import kit.net.openai
    from kit.cluster import Cluster
    from kit.errors import StartError
    from kit.plan.roles import HEAD
    from tests.conftest import make_config
    from tests.unit.recorded_parsers import recorded_facts

    config = make_config(nodes=1)
    assert config.timeouts.ready_s >= 60
    runtime = SlowNodes(ready_s=0)
    runtime.start(SimpleNamespace(name="kit-llama-head", role=HEAD))
    monkeypatch.setattr(kit.net.openai, "health", lambda url, timeout=3: False)  # never healthy
    start = time.monotonic()
    with pytest.raises(StartError, match=r"the time budget ran out \d+ s into waiting for http://127\.0\.0\.1:8000"):
        Cluster.from_config(config, runtime=runtime, image=recorded_facts(ray="2.60.0")).serve(  # type: ignore[arg-type]
            deadline=start + 1.0
        )
    assert time.monotonic() - start < 2.0


def test_tune_budget_bounds_the_whole_bring_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Worker wait, head wait and /health wait of a 2-node layout share the budget's end: each
    node takes 1.5 s, the server never gets healthy, the budget is 3 s. Each wait used to get the
    whole remainder (1.5 + 1.5 + ~2 s here; up to ~3x the budget on a real cluster)."""
    import kit.bench.trials
    import kit.net.openai
    from kit.cli import main

    runtime = SlowNodes(ready_s=1.5)
    two_nodes = {"KIT_NODES": "2", "KIT_GPUS_PER_NODE": "1", "KIT_NETWORK": "kt-net"}
    tune_env(monkeypatch, tmp_path, runtime, KIT_NETWORK_SUBNET="10.251.7.0/24", **two_nodes)
    monkeypatch.setattr(kit.net.openai, "health", lambda url, timeout=3: False)
    monkeypatch.setattr(kit.bench.trials, "MIN_LAYOUT_S", 0)
    start = time.monotonic()
    with pytest.raises(SystemExit) as info:
        main(["tune", "--layouts", "tp1-dp2", "--budget", "3s", "-o", str(tmp_path / "t.json"), "--json"])
    elapsed = time.monotonic() - start
    assert info.value.code == 0, capsys.readouterr().err
    assert elapsed < 3 + 1.3, (elapsed, runtime.waits)
    assert runtime.waits[0] <= 3 and runtime.waits[1] <= 1.6  # the head's wait got what the worker left
    doc = json.loads(capsys.readouterr().out)["result"]
    assert doc["ranking"][0]["status"] == "skipped" and "time budget" in doc["ranking"][0]["error"]
    assert runtime.removed == ["kt"] and not runtime.specs  # torn down


def tune_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, runtime: Any, **more: str) -> None:
    """kit tune in-process on a fake runtime: the cluster's KIT_* environment, no SIGTERM
    handler left behind in pytest's process."""
    import kit.bench.measure
    import kit.runtime

    monkeypatch.setattr(kit.runtime, "get_runtime", lambda config: runtime)
    monkeypatch.setattr(kit.bench.measure, "interrupt_on_sigterm", lambda: None)
    env = {
        "KIT_STATE_DIR": str(tmp_path / "state"),
        "KIT_CLUSTER": "kt",
        "KIT_BACKEND": "mp",
        "KIT_ACCELERATOR": "cpu",
        "KIT_MODEL_ID": "kit/tiny-llama",
        "KIT_HF_CACHE": str(tmp_path / "hf"),
        **more,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def test_tune_interrupted_keeps_what_it_measured(
    fake_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C during a layout's second load point: exit 130, the first point and the part of the
    second that was measured stay in the state file (marked interrupted) and in the -o file."""
    import kit.bench.trials
    from kit.cli import main
    from kit.cluster import ServeResult

    runtime = SlowNodes(ready_s=0)
    write_secret(tmp_path / "key", "sk-test\n")
    tune_env(
        monkeypatch, tmp_path, runtime, KIT_NODES="1", KIT_GPUS_PER_NODE="1", KIT_API_KEY_FILE=str(tmp_path / "key")
    )
    monkeypatch.setattr(kit.bench.trials, "serve_layout", lambda *a: ServeResult(fake_server, "tiny", [], 0.0))
    FakeVLLM.token_delay = 0.02
    FakeVLLM.interrupt_at = 1 + 3 + 2  # warm-up, point 1 (3 requests), 2nd request of point 2
    out = tmp_path / "t.json"
    with pytest.raises(SystemExit) as info:
        main(["tune", "--layouts", "tp1", "-n", "3", "-c", "1,2", "--output-len", "4", "-o", str(out)])
    err = capsys.readouterr().err
    assert info.value.code == 130, err
    assert f"results so far saved to {out}" in err
    doc = json.loads(out.read_text())
    assert doc["error"] == "interrupted" and not doc["complete"] and doc["recommendation"] is None
    assert [p["concurrency"] for p in doc["points"]] == [1, 2]
    assert doc["points"][0]["metrics"]["completed"] == 3
    assert doc["points"][1]["stopped"] == "interrupted" and doc["points"][1]["metrics"]["num_requests"] >= 1
    state = json.loads((tmp_path / "state" / "tune" / "kt.json").read_text())["layouts"]["tp1"]
    assert state["status"] == "interrupted" and len(state["points"]) == 2
    assert doc["ranking"][0]["layout"] == "tp1" and doc["ranking"][0]["output_throughput"] is not None
    assert runtime.removed == ["kt"]
