"""Real serving without GPUs: two container "nodes", vLLM's CPU build, TP=2 across them, a tiny
model made offline, real OpenAI-style requests; plus the failure paths and secret handling.

The nodes run the way Apptainer runs them on an HPC site (issue 28, FIELD_NOTES §9): as a user
that is not root and owns the HF cache and the secret files, on a read-only image (the vLLM
image's /root, mode 0700, is out of its reach). Apptainer cannot be installed here, so Docker's
`--user UID:GID --read-only` (kit's docker.user and docker.read_only) stands in for it."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.conftest import write_secret
from tests.integration.clusters import listening, make_kit, two_node_mp_env

SECRET_KEY = "sk-kit-test-" + "9c" * 12
SECRET_TOKEN = "hf_" + "Qx7" * 11
USER = 4242  # no such user in the image: like an HPC user's uid under Apptainer


def owned_by_user(path: Any) -> None:
    """What the user owns on an HPC site: their HF cache, their secret files (mode 600)."""
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(root, name), USER, USER)
    os.lchown(path, USER, USER)


@pytest.fixture(scope="module")
def served(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One 2-node mp cluster for the module, serving kit/tiny-llama as 'tiny' with an API key."""

    root = tmp_path_factory.mktemp("serve")
    state = root / "state"
    outputs: list[str] = []
    base_env: dict[str, str] = {}
    kit = make_kit(state, base_env, outputs)

    key = root / "api_key"
    write_secret(key, SECRET_KEY + "\n")
    token = root / "hf_token"
    write_secret(token, SECRET_TOKEN + "\n")
    name = f"ks{os.getpid() % 100000}"
    prep = kit("demo", "--prepare-only", "--json")
    assert prep.returncode == 0, prep.stderr
    hf_cache = root / "hf"  # the user's own copy of the tiny model (5 MB)
    shutil.copytree(json.loads(prep.stdout)["result"]["hf_cache"], hf_cache, symlinks=True)
    for path in (hf_cache, key, token):
        owned_by_user(path)
        if path.is_file():
            path.chmod(0o600)
    base_env.update(two_node_mp_env(name, str(hf_cache), key, second_octet=215))
    base_env.update({"KIT_IMAGE": "kit/vllm-cpu:0.32.0", "KIT_HF_TOKEN_FILE": str(token)})
    base_env.update({"KIT_DOCKER_USER": f"{USER}:{USER}", "KIT_DOCKER_READ_ONLY": "true"})
    try:
        for role in ("--worker", "--head"):
            up = kit("up", role)
            assert up.returncode == 0, up.stderr
        started = time.monotonic()
        serve = kit("serve", "--json")
        assert serve.returncode == 0, serve.stderr
        info = json.loads(serve.stdout)["result"]
        yield {
            "kit": kit,
            "url": info["url"],
            "key": key,
            "root": root,
            "name": name,
            "outputs": outputs,
            "time_to_ready": time.monotonic() - started,
        }
    finally:
        kit("down")


def test_two_nodes_answer_openai_requests(served: dict[str, Any]) -> None:
    kit = served["kit"]
    result = kit(
        "query", "--json", "--max-tokens", "7", "--prompt", "Hello there", "--api-key-file", str(served["key"])
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)["result"]
    assert doc["models"] == ["tiny"]
    assert doc["finish_reason"] in ("length", "stop")
    assert doc["usage"]["completion_tokens"] == 7
    assert doc["answer"] and doc["tokens_per_s"] > 0
    # straight through the API too, streaming
    headers = {"Authorization": f"Bearer {SECRET_KEY}"}
    models = requests.get(f"{served['url']}/v1/models", headers=headers, timeout=30).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    stream = kit("query", "--stream", "--max-tokens", "5", "--api-key-file", str(served["key"]))
    assert stream.returncode == 0 and "5 tokens" in stream.stdout, stream.stdout + stream.stderr
    print(f"time to ready (kit serve): {served['time_to_ready']:.1f} s")


def test_nodes_run_as_a_user_on_a_read_only_image(served: dict[str, Any], docker_client: Any) -> None:
    """Apptainer's semantics (Docker standing in): not root, nothing of the image writable, and
    every path kit mounts or writes reachable for that user; the two nodes served above."""
    for node in (f"kit-{served['name']}-head", f"kit-{served['name']}-worker-1"):
        container = docker_client.containers.get(node)
        assert container.attrs["Config"]["User"] == f"{USER}:{USER}"
        assert container.attrs["HostConfig"]["ReadonlyRootfs"] is True
        assert container.exec_run(["id", "-u"]).output.decode().strip() == str(USER)
        image_write = container.exec_run(["bash", "-c", "touch /usr/local/kit-probe || touch /opt/kit-probe"])
        assert image_write.exit_code != 0 and b"Read-only file system" in image_write.output
        uids = container.exec_run(["ps", "-eo", "uid=,args="]).output.decode().splitlines()
        assert any("vllm serve" in line for line in uids), uids  # vLLM's processes among them
        assert {line.split()[0] for line in uids} == {str(USER)}, uids  # every process of the node
        assert container.exec_run(["test", "-r", "/kit/hf-cache/hub"]).exit_code == 0


def test_both_nodes_serve_the_engine(served: dict[str, Any], docker_client: Any) -> None:
    for node in (f"kit-{served['name']}-head", f"kit-{served['name']}-worker-1"):
        ps = docker_client.containers.get(node).exec_run(["bash", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])
        assert b"vllm serve kit/tiny-llama" in ps.output
    worker = docker_client.containers.get(f"kit-{served['name']}-worker-1")
    assert b"--headless" in worker.exec_run(["cat", "/tmp/kit/serve.sh"]).output


def test_wrong_api_key_is_a_clear_error(served: dict[str, Any]) -> None:
    wrong = served["root"] / "wrong_key"
    write_secret(wrong, "not-the-key")  # mode 600: no warning line about it
    result = served["kit"]("query", "--api-key-file", str(wrong))
    assert result.returncode == 8, result.stderr
    assert "401 Unauthorized" in result.stderr and "--api-key-file" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_second_serve_is_refused(served: dict[str, Any]) -> None:
    result = served["kit"]("serve")
    assert result.returncode == 6
    assert "a server is already running" in result.stderr and "--replace" in result.stderr


def test_no_secret_in_inspect_argv_or_kit_output(served: dict[str, Any], docker_client: Any) -> None:
    for node in (f"kit-{served['name']}-head", f"kit-{served['name']}-worker-1"):
        container = docker_client.containers.get(node)
        inspect = json.dumps(docker_client.api.inspect_container(container.id))
        assert SECRET_KEY not in inspect and SECRET_TOKEN not in inspect
        # Mounted as a file, read-only, and only where the API server runs (issue 16).
        assert ("/run/kit/secrets/api_key" in inspect) == node.endswith("-head")
        argv = container.exec_run(["bash", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"]).output.decode()
        assert SECRET_KEY not in argv and SECRET_TOKEN not in argv
        assert "vllm serve" in argv or node.endswith("worker-1")
        log = container.exec_run(["cat", "/tmp/kit/serve.log"]).output.decode() + container.logs().decode()
        assert SECRET_KEY not in log and SECRET_TOKEN not in log
    assert not any(SECRET_KEY in o or SECRET_TOKEN in o for o in served["outputs"])


def test_the_api_listens_on_the_head_node_ip_only(served: dict[str, Any], docker_client: Any) -> None:
    """Closed by default (issue 16): vllm serve --host is the head's node IP, not 0.0.0.0."""
    head = docker_client.containers.get(f"kit-{served['name']}-head")
    ip = served["url"].split("://", 1)[1].rsplit(":", 1)[0]
    assert listening(head, 8000) == {ip}


def test_engine_crash_fails_serve_fast_with_the_log_tail(served: dict[str, Any]) -> None:
    # An option the image's vLLM does not have never reaches it (issue 24): one line, exit 3.
    refused = served["kit"](
        "serve", "--replace", env={"KIT_MODEL_EXTRA_ARGS": "[--enforce-eager, --no-such-vllm-flag]"}
    )
    assert refused.returncode == 3 and "has no option --no-such-vllm-flag" in refused.stderr, refused.stderr
    # An option it has, with a value the engine fails on at start: vLLM's own complaint.
    start = time.monotonic()
    bad = "[--enforce-eager, --tokenizer, /nonexistent/kit-tokenizer]"
    result = served["kit"]("serve", "--replace", env={"KIT_MODEL_EXTRA_ARGS": bad})
    took = time.monotonic() - start
    assert result.returncode == 6, result.stderr
    assert "vllm serve exited" in result.stderr and "before the server became healthy" in result.stderr
    assert "kit-tokenizer" in result.stderr  # vLLM's own complaint, from the log tail
    assert took < 120, f"serve took {took:.0f} s to notice a crash (deadline 600 s)"
