"""`kit demo`, the README's main job, end to end: two container nodes, vLLM CPU engine, TP=2
across them, a real answer, and nothing left behind."""

from __future__ import annotations

import json
from typing import Any

from tests.integration.clusters import Cli


def test_demo_answers_and_cleans_up(kit_cli: Cli, docker_client: Any, cluster_name: str) -> None:
    result = kit_cli("demo", "--json", "--cluster", cluster_name, "--max-tokens", "9", timeout=1800)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)["result"]
    query = doc["query"]
    assert query["models"] == ["tiny"]
    assert query["completion_tokens"] == 9 and query["finish_reason"] == "length" and query["answer"]
    assert [c["role"] for c in doc["status"]["containers"]] == ["head", "worker"]
    assert all(c["state"] == "running" for c in doc["status"]["containers"])
    assert len({c["node_ip"] for c in doc["status"]["containers"]}) == 2
    assert doc["kept"] is False
    label = {"label": f"kit.cluster={cluster_name}"}
    assert docker_client.containers.list(all=True, filters=label) == []
    assert docker_client.networks.list(filters=label) == []
    assert doc["serve"]["url"].endswith(":8000") and doc["serve"]["model"] == "tiny"
    assert "[1/5]" not in result.stderr  # --json: one document on stdout, no progress lines
