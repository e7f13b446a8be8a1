"""kit/health/prometheus.py: the Prometheus text parser (real vLLM 0.32 scrapes from tests/fixtures/metrics/
and hand-written edge cases), per-engine summaries, rates from two scrapes, file_sd targets."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kit.errors import ExitCode
from kit.health import prometheus as metrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"


def fixture(name: str) -> metrics.Scrape:
    return metrics.parse((FIXTURES / f"vllm-0.32.0-cpu-dp2-{name}.prom").read_text())


# ---------------------------------------------------------------- parser


def test_a_real_scrape_parses_completely() -> None:
    text = (FIXTURES / "vllm-0.32.0-cpu-dp2-after-32-requests.prom").read_text()
    scrape = metrics.parse(text)
    sample_lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(scrape.samples) == len(sample_lines) == 693
    assert scrape.types["vllm:time_to_first_token_seconds"] == "histogram"
    assert scrape.types["vllm:num_requests_running"] == "gauge"
    assert scrape.types["vllm:generation_tokens_total"] == "counter"
    bucket = next(s for s in scrape.series("vllm:time_to_first_token_seconds_bucket") if s.labels["le"] == "+Inf")
    count = next(s for s in scrape.series("vllm:time_to_first_token_seconds_count") if s.labels["engine"] == "0")
    assert bucket.labels["engine"] == "0" and bucket.value == count.value == 21
    # a label value with many labels and punctuation (cache_config_info) arrives whole
    info = scrape.series("vllm:cache_config_info")[0]
    assert info.labels["kv_cache_dtype_skip_layers"] == "[]" and info.labels["gpu_memory_utilization"] == "0.92"


def test_escapes_nan_inf_timestamps_comments_and_odd_spacing() -> None:
    text = "\n".join(
        [
            "# HELP x_total a help text with \\\\ and \\n escapes",
            "# TYPE x_total counter",
            "# a free comment { not a sample",
            'x_total{path="C:\\\\dir",quote="say \\"hi\\"",nl="a\\nb",brace="} 9",} 3 1700000000000',
            "x_gauge NaN",
            'x_gauge2{a="1"} -Inf',
            "x_gauge3 +Inf",
            "x_sci  1.5e-3",
            "x_empty{} 7",
            '  spaced { a = "1" , b="2" }   4  ',
            "",
        ]
    )
    s = metrics.parse(text)
    assert [x.name for x in s.samples] == ["x_total", "x_gauge", "x_gauge2", "x_gauge3", "x_sci", "x_empty", "spaced"]
    first = s.samples[0]
    assert first.labels == {"path": "C:\\dir", "quote": 'say "hi"', "nl": "a\nb", "brace": "} 9"}
    assert first.value == 3
    assert math.isnan(s.samples[1].value) and s.samples[2].value == -math.inf and s.samples[3].value == math.inf
    assert s.samples[4].value == 0.0015 and s.samples[5].labels == {} and s.samples[6].labels == {"a": "1", "b": "2"}
    assert s.types == {"x_total": "counter"}


@pytest.mark.parametrize(
    "line",
    [
        "x 1_000",  # Python's float() takes underscores; Prometheus does not
        "x 0x10",
        "x one",
        "x",
        "x 1 2 3",
        "x 1 12.5",  # a timestamp is an integer
        'x{a="1" 1',
        'x{a="unterminated} 1',
        "x{a=1} 1",
        'x{1a="b"} 1',
        'x{a="1" b="2"} 1',
        "9x 1",
        '{"utf8.name"} 1',
    ],
)
def test_malformed_lines_are_refused_with_the_line_number(line: str) -> None:
    with pytest.raises(metrics.MetricsParseError) as info:
        metrics.parse(f"# TYPE ok gauge\nok 1\n{line}\n", source="http://h:8000/metrics")
    assert "http://h:8000/metrics line 3" in info.value.message
    assert info.value.exit_code == ExitCode.SERVER


def test_input_size_is_bounded() -> None:
    with pytest.raises(metrics.MetricsParseError, match="over 100 bytes"):
        metrics.parse("x 1\n" * 30, max_bytes=100)
    assert len(metrics.parse("x 1\n" * 20, max_bytes=100).samples) == 20


# ---------------------------------------------------------------- engines and rates


def test_engines_of_the_real_dp2_scrape() -> None:
    engines = metrics.engines(fixture("after-32-requests"))
    assert list(engines) == ["0", "1"]
    zero, one = engines["0"], engines["1"]
    assert (zero.prompt_tokens, zero.generation_tokens, one.prompt_tokens, one.generation_tokens) == (309, 364, 160, 84)
    assert zero.request_success["length"] == 20 and zero.request_success["stop"] == 1 and zero.requests_finished == 21
    assert one.requests_finished == 11
    assert (zero.running, zero.waiting, zero.kv_cache_usage, zero.awake, zero.model_name) == (0, 0, 0, True, "tiny")
    assert zero.histograms[metrics.TTFT][1] == 21 and one.histograms[metrics.E2E][1] == 11


def test_rates_between_the_real_idle_and_busy_scrapes() -> None:
    rates = metrics.rates(100.0, fixture("idle"), 110.0, fixture("after-32-requests"))
    assert list(rates) == ["0", "1"]
    zero, one = rates["0"], rates["1"]
    assert zero.prompt_tokens_per_s == pytest.approx(30.9) and zero.generation_tokens_per_s == pytest.approx(36.4)
    assert one.generation_tokens_per_s == pytest.approx(8.4) and one.requests_per_s == pytest.approx(1.1)
    assert zero.mean_ttft_s == pytest.approx(0.49342918395996094 / 21)
    assert not zero.reset and not one.reset and zero.preemptions == 0


def test_a_stopped_engine_shows_frozen_gauges_in_the_real_scrape() -> None:
    """The fixture behind kit/health/liveness.py's pinned probe: engine 1 holds 5 queued requests but
    reports 0 running, 0 waiting (its process was SIGSTOPped while idle)."""
    stopped = metrics.engines(fixture("engine1-stopped"))["1"]
    after = metrics.engines(fixture("after-cont"))["1"]
    assert (stopped.running, stopped.waiting) == (0, 0)
    assert after.requests_finished - stopped.requests_finished == 5


def test_counter_reset_counts_from_zero_like_prometheus() -> None:
    before = metrics.parse('vllm:generation_tokens_total{engine="0"} 500\nvllm:num_requests_running{engine="0"} 3\n')
    after = metrics.parse('vllm:generation_tokens_total{engine="0"} 40\nvllm:num_requests_running{engine="0"} 1\n')
    rate = metrics.rates(0.0, before, 2.0, after)["0"]
    assert rate.reset and rate.generation_tokens_per_s == 20.0 and rate.running == 1
    assert metrics.increase(5, 5) == (0, False) and metrics.increase(None, 5) == (None, False)


def test_v0_style_scrape_without_engine_label_is_engine_0_with_the_old_kv_name() -> None:
    text = "\n".join(
        [
            'vllm:num_requests_running{model_name="m"} 2.0',
            'vllm:num_requests_waiting{model_name="m"} 1.0',
            'vllm:gpu_cache_usage_perc{model_name="m"} 0.25',
            'vllm:generation_tokens_total{model_name="m"} 10.0',
        ]
    )
    engines = metrics.engines(metrics.parse(text))
    assert list(engines) == ["0"]
    assert engines["0"].kv_cache_usage == 0.25 and engines["0"].running == 2 and engines["0"].prompt_tokens is None


def test_nan_gauges_are_unknown_and_missing_series_are_none() -> None:
    text = 'vllm:num_requests_running{engine="3"} NaN\nvllm:kv_cache_usage_perc{engine="3"} NaN\n'
    text += 'vllm:num_requests_waiting{engine="10"} 0\nvllm:engine_sleep_state{engine="10",sleep_state="awake"} 0\n'
    engines = metrics.engines(metrics.parse(text))
    assert list(engines) == ["3", "10"]  # numeric order
    assert engines["3"].running is None and engines["3"].kv_cache_usage is None and engines["3"].waiting is None
    assert engines["10"].awake is False and engines["10"].generation_tokens is None


def test_an_engine_new_in_the_second_scrape_has_no_rates_and_time_must_advance() -> None:
    one = metrics.parse('vllm:generation_tokens_total{engine="0"} 1\n')
    two = metrics.parse('vllm:generation_tokens_total{engine="0"} 3\nvllm:generation_tokens_total{engine="1"} 9\n')
    rates = metrics.rates(0, one, 1, two)
    assert rates["0"].generation_tokens_per_s == 2 and rates["1"].generation_tokens_per_s is None
    with pytest.raises(ValueError):
        metrics.rates(5, one, 5, two)


# ---------------------------------------------------------------- file_sd


def test_scrape_targets_mp_lists_only_the_head_api_server() -> None:
    nodes = [metrics.NodeAddress("head", 0, "10.0.0.10"), metrics.NodeAddress("worker", 1, "10.0.0.11")]
    groups = metrics.scrape_targets(
        cluster="c", backend="mp", api_port=8000, ray_metrics_port=6382, head_ip="10.0.0.10", nodes=nodes
    )
    assert groups == [
        {
            "targets": ["10.0.0.10:8000"],
            "labels": {"cluster": "c", "node": "head", "role": "head", "rank": "0", "component": "vllm"},
        }
    ]


def test_scrape_targets_ray_adds_each_known_node_exporter() -> None:
    nodes = [metrics.NodeAddress("worker", 2, "10.0.0.12"), metrics.NodeAddress("worker", 1, "10.0.0.11")]
    groups = metrics.scrape_targets(
        cluster="c", backend="ray", api_port=9000, ray_metrics_port=6382, head_ip="10.0.0.10", nodes=nodes
    )
    assert [(g["targets"], g["labels"]["node"], g["labels"]["component"]) for g in groups] == [  # type: ignore[index]
        (["10.0.0.10:9000"], "head", "vllm"),
        (["10.0.0.10:6382"], "head", "ray"),
        (["10.0.0.11:6382"], "worker-1", "ray"),
        (["10.0.0.12:6382"], "worker-2", "ray"),
    ]
    assert all(isinstance(v, str) for g in groups for v in g["labels"].values())  # type: ignore[attr-defined]
