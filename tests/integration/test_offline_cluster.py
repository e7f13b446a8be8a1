"""Serve from the fetched copy on the 2-node CPU cluster (issue 19), with real components only:

- kit/tiny-llama (made by `kit demo --prepare-only`) is published on the loopback Hub
  (tests/infra/hub_server.py) and fetched with `kit fetch` (the real huggingface_hub client) into
  the head's hf_cache; the worker gets its own copy of that cache (nodes on one host otherwise
  share the mount, and the point is to see two nodes' copies);
- `kit up` on both nodes (head + worker on one Docker network, no HF_HUB_OFFLINE in the config)
  puts HF_HUB_OFFLINE=1 in both containers' environment (docker inspect), `kit serve` answers a
  completion, and its serve script exports the same;
- `kit verify` passes with one revision and size on both nodes, then fails (exit 7) once the
  worker's copy of the weights is cut short, naming the worker and the file.
One cluster start for all of it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from tests.infra.hub_server import HubServer, make_repo
from tests.integration.clusters import make_kit, two_node_mp_env

MODEL = "kit/tiny-llama"


def container_env(docker_client: Any, name: str) -> dict[str, str]:
    env = docker_client.containers.get(name).attrs["Config"]["Env"]
    return dict(item.split("=", 1) for item in env)


def hf_check(doc: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in doc["checks"] if c["name"] == "cluster.hf_snapshot")


def test_fetched_model_serves_offline_and_verify_catches_a_differing_copy(docker_client: Any, tmp_path: Path) -> None:
    state = tmp_path / "state"
    base_env: dict[str, str] = {}
    kit = make_kit(state, base_env)
    prep = kit("demo", "--prepare-only", "--json")
    assert prep.returncode == 0, prep.stderr
    demo_hub = Path(json.loads(prep.stdout)["result"]["hf_cache"]) / "hub" / "models--kit--tiny-llama"
    source = next((demo_hub / "snapshots").iterdir())

    head_cache, worker_cache = tmp_path / "hf-head", tmp_path / "hf-worker"
    hub_env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    with HubServer([make_repo(MODEL, source)]) as hub:
        fetched = kit(
            "fetch", MODEL, "--json", "--set", f"hf_cache={head_cache}", env={**hub_env, "HF_ENDPOINT": hub.url}
        )
    assert fetched.returncode == 0, fetched.stderr
    sha = (head_cache / "hub" / "models--kit--tiny-llama" / "refs" / "main").read_text().strip()
    shutil.copytree(head_cache, worker_cache, symlinks=True)  # its own blobs, the same snapshot links

    name = f"ko{os.getpid() % 100000}"
    base_env.update(two_node_mp_env(name, str(head_cache), None, second_octet=216))
    # No HF_HUB_OFFLINE from the config: kit decides it from the cache.
    base_env["KIT_ENV"] = "{VLLM_CPU_KVCACHE_SPACE: '1'}"
    head, worker = f"kit-{name}-head", f"kit-{name}-worker-1"
    try:
        started = time.monotonic()
        up = kit("up", "--worker", "--json", env={"KIT_HF_CACHE": str(worker_cache)})
        assert up.returncode == 0, up.stderr
        assert json.loads(up.stdout)["result"]["model_cache"]["offline"] is True
        up = kit("up", "--head")
        assert up.returncode == 0, up.stderr
        assert "kit fetch" not in up.stderr  # complete: no warning
        for node in (head, worker):
            assert container_env(docker_client, node).get("HF_HUB_OFFLINE") == "1", node
        serve = kit("serve", "--json")
        assert serve.returncode == 0, serve.stderr
        assert json.loads(serve.stdout)["result"]["model_cache"]["sha"] == sha
        print(f"up + serve (offline): {time.monotonic() - started:.1f} s")
        query = kit("query", "--json", "--max-tokens", "5", "--prompt", "Hello")
        assert query.returncode == 0, query.stderr
        assert json.loads(query.stdout)["result"]["usage"]["completion_tokens"] == 5
        for node in (head, worker):
            script = docker_client.containers.get(node).exec_run(["cat", "/tmp/kit/serve.sh"]).output.decode()
            assert "\nexport HF_HUB_OFFLINE=1\n" in script, node

        verify = kit("verify", "--no-collective", "--json")
        assert verify.returncode == 0, verify.stdout + verify.stderr
        doc = json.loads(verify.stdout)["result"]
        assert hf_check(doc)["status"] == "pass" and sha[:12] in hf_check(doc)["reason"]
        files = doc["model_files"]
        assert {f["revision"] for f in files.values()} == {sha} and all(f["complete"] for f in files.values())
        assert len({f["total_bytes"] for f in files.values()}) == 1

        # The worker's copy of the weights cut short (the running engine has them loaded already).
        snap = worker_cache / "hub" / "models--kit--tiny-llama" / "snapshots" / sha
        weights = sorted(p for p in snap.iterdir() if p.name.endswith(".safetensors"))[0]
        size = weights.stat().st_size
        os.truncate(weights.resolve(), size // 2)
        verify = kit("verify", "--no-collective", "--json")
        assert verify.returncode == 7, verify.stdout + verify.stderr
        doc = json.loads(verify.stdout)["error"]["result"]
        row = hf_check(doc)
        assert row["status"] == "fail"
        assert (
            f"incomplete on {worker}" in row["reason"]
            and f"{weights.name} is {size // 2} of {size} bytes" in row["reason"]
        ), row
        assert doc["model_files"][worker]["complete"] is False and doc["model_files"][head]["complete"] is True
    finally:
        kit("down")
