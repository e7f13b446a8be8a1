"""deploy/grafana/vllm-kit.json against a real vLLM 0.32 scrape (tests/fixtures/metrics/): every
metric its PromQL uses exists (histograms with _bucket, _sum and _count), every label it groups
or filters by exists on those series (or comes from kit's file_sd targets), and it is a
well-formed Grafana dashboard on a Prometheus datasource variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from kit.health import prometheus as metrics
from tests import promql

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
SCRAPE = FIXTURES / "vllm-0.32.0-cpu-dp2-after-32-requests.prom"


@pytest.fixture(scope="module")
def scrape() -> metrics.Scrape:
    return metrics.parse(SCRAPE.read_text())


def test_every_metric_and_label_of_the_dashboard_is_in_a_real_scrape(scrape: metrics.Scrape) -> None:
    dashboard = promql.load_dashboard()
    assert promql.dashboard_problems(dashboard, scrape) == []
    used = {name for expr in promql.expressions(dashboard) for name in promql.metric_names(expr)}
    # What the issue asks the dashboard to show, by vLLM's names.
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:request_time_per_output_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:request_success_total",
    ):
        assert name in used, name


def test_the_check_fails_on_a_renamed_metric_a_fake_histogram_and_a_missing_label(scrape: metrics.Scrape) -> None:
    dashboard = promql.load_dashboard()
    panel = promql.panels(dashboard)[4]
    target = panel["targets"][0]
    for broken, words in (
        # vLLM V0's name: gone in 0.32
        (target["expr"].replace("vllm:num_requests_running", "vllm:gpu_cache_usage_perc"), "not in the scrape"),
        ("histogram_quantile(0.9, sum by (le) (rate(vllm:num_requests_running_bucket[5m])))", "not in the scrape"),
        ("histogram_quantile(0.9, sum by (le) (rate(http_requests_total_bucket[5m])))", "not in the scrape"),
        ("sum by (gpu) (vllm:num_requests_running)", "label 'gpu'"),
        ('vllm:num_requests_running{reason="x"}', "label 'reason'"),
    ):
        target["expr"] = broken
        problems = promql.dashboard_problems(dashboard, scrape)
        assert len(problems) == 1 and words in problems[0], (broken, problems)


def test_promql_names_are_extracted_not_guessed() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (cluster, engine, le) (rate(vllm:time_to_first_token_seconds_bucket"
        '{cluster=~"$cluster", engine!="x{y}"}[$__rate_interval])))'
        " / on (engine) group_left sum without (le) (vllm:a_total offset 5m) > bool 0.5 unless up"
    )
    assert promql.metric_names(expr) == {"vllm:time_to_first_token_seconds_bucket", "vllm:a_total", "up"}
    assert promql.grouping_labels(expr) == {"cluster", "engine", "le"}
    assert promql.matcher_labels(expr) == {"cluster", "engine"}
    assert promql.split_label_values('label_values(vllm:x{a="b"}, engine)') == ('vllm:x{a="b"}', "engine")


def test_the_dashboard_is_grafana_json_on_a_prometheus_variable() -> None:
    dashboard = promql.load_dashboard()
    assert dashboard["uid"] == "kit-vllm" and isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"cluster", "model_name", "engine"} <= set(variables)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in promql.panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        # Every per-engine panel filters by the variables, so picking one cluster/engine works everywhere.
        if "vllm:" in "".join(t["expr"] for t in panel["targets"]):
            assert all('engine=~"$engine"' in t["expr"] for t in panel["targets"]), panel["title"]
