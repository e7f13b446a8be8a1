"""Two models on one host, one command each (issue 28, FIELD_NOTES §8 "several models on one
machine"): `kit serve MODEL --gpus G --port P` with no kit.yaml, twice, side by side on the host's
network with the CPU image, both answering; a third on a port one of them holds is refused before
anything starts. The CPU engine ignores the GPU selections (--gpus 0 / --gpus 1 stand for the
guide's 0,1 and 2,3); the GPU overlap refusal is unit-tested (tests/unit/test_one_host_plan.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.integration.clusters import IMAGE


def test_two_servers_side_by_side_both_answer_and_a_clash_is_refused(
    docker_client: Any, tmp_path: Path, kit_state: Path
) -> None:
    env = {**os.environ, "KIT_STATE_DIR": str(kit_state)}
    for name in [n for n in env if n.startswith("KIT_") and n not in ("KIT_STATE_DIR", "KIT_REQUIRE_DOCKER")]:
        del env[name]

    def kit(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "kit", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
        )

    prep = kit("demo", "--prepare-only", "--json", timeout=900)
    assert prep.returncode == 0, prep.stderr
    hf_cache = json.loads(prep.stdout)["result"]["hf_cache"]
    base = 18000 + (os.getpid() % 400) * 2
    common = [
        "kit/tiny-llama",
        "--accelerator", "cpu", "--image", IMAGE, "--max-model-len", "512", "--timeout", "600",
        "--set", f"hf_cache={hf_cache}", "--set", "ipc_host=false", "--set", "shm_size=1g",
        "--set", "model.extra_args=[--enforce-eager]",
        "--set", "env={HF_HUB_OFFLINE: '1', VLLM_CPU_KVCACHE_SPACE: '1'}",
    ]  # fmt: skip
    servers = {"first": (base, "0"), "second": (base + 1, "1")}
    clusters = [f"{name}-{port}" for name, (port, _) in servers.items()]
    started = time.monotonic()
    try:
        runs = {
            name: subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "kit",
                    "serve",
                    *common,
                    "--served-name",
                    name,
                    "--port",
                    str(port),
                    "--gpus",
                    gpus,
                    "--json",
                ],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name, (port, gpus) in servers.items()
        }
        urls = {}
        for name, proc in runs.items():
            out, err = proc.communicate(timeout=900)
            assert proc.returncode == 0, err
            urls[name] = json.loads(out)["result"]["url"]
        print(f"two servers healthy {time.monotonic() - started:.0f} s after `kit serve` (both at once)")
        for name, url in urls.items():
            assert url.endswith(f":{servers[name][0]}")
            answer = kit("query", "--url", url, "--json", "--max-tokens", "3", "--prompt", "Hello")
            assert answer.returncode == 0, answer.stderr
            doc = json.loads(answer.stdout)["result"]
            assert doc["models"] == [name] and doc["usage"]["completion_tokens"] == 3
        heads = [docker_client.containers.get(f"kit-{cluster}-head") for cluster in clusters]
        assert [h.labels["kit.host-ports"] for h in heads] == [str(base), str(base + 1)]
        assert all(h.attrs["HostConfig"]["NetworkMode"] == "host" for h in heads)
        # a third server on the first one's port: refused before anything starts, dry run included
        for extra in (["--dry-run"], []):
            third = kit("serve", *common, "--served-name", "third", "--port", str(base), *extra)
            assert third.returncode == 3, third.stderr
            assert f"port {base} (ports.api) is held by cluster {clusters[0]}" in third.stderr
        assert not docker_client.containers.list(all=True, filters={"label": f"kit.cluster=third-{base}"})
    finally:
        for cluster in clusters:
            kit("down", "--cluster", cluster)
    print(f"test took {time.monotonic() - started:.0f} s")
