"""The KIT_* environment of two-node CPU clusters (vLLM's mp backend, kit's default; and Ray, on the
Ray-layered image) on a private Docker network, shared by the integration tests (each passes its
own second octet so concurrent modules never share a subnet)."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

IMAGE = os.environ.get("KIT_TEST_IMAGE", "kit/vllm-cpu:test")
# The CPU image with Ray layered on by kit itself (`kit build ray`, issue 24: kit's images, like
# vLLM's since 0.18.0, carry no Ray). Built once, cached by tag: tests/run.sh, or the `ray_image`
# fixture (conftest.py) when a Ray test runs without it.
RAY_IMAGE = os.environ.get("KIT_TEST_RAY_IMAGE", "kit/vllm-cpu:test-ray")
# What the kit_cli fixture (conftest.py) returns: kit_cli(*args, env=..., timeout=...) runs kit.
Cli = Callable[..., subprocess.CompletedProcess[str]]


def two_node_ray_env(name: str, hf_cache: Path, *, second_octet: int) -> dict[str, str]:
    hf_cache.mkdir(parents=True, exist_ok=True)
    third = zlib.crc32(name.encode()) % 250 + 2
    return {
        "KIT_CLUSTER": name,
        "KIT_IMAGE": RAY_IMAGE,
        "KIT_ACCELERATOR": "cpu",
        "KIT_BACKEND": "ray",
        "KIT_NODES": "2",
        "KIT_GPUS_PER_NODE": "1",
        "KIT_NETWORK": f"{name}-net",
        "KIT_NETWORK_SUBNET": f"10.{second_octet}.{third}.0/24",
        "KIT_IPC_HOST": "false",
        "KIT_SHM_SIZE": "1g",
        "KIT_HF_CACHE": str(hf_cache),
        "KIT_TIMEOUTS_JOIN": "180",
    }


# kit's record of the test images' facts, probed once per session (conftest.py `facts_seed`): a
# state folder make_kit creates starts with it, so each module does not probe the same image again.
FACTS_SEED: list[Path] = []


def seed_state(state: Path) -> None:
    import shutil

    if FACTS_SEED and not state.exists():
        shutil.copytree(FACTS_SEED[0], state)


def make_kit(state: Path, base_env: dict[str, str], outputs: list[str] | None = None) -> Any:
    """`kit ...` in a subprocess with its own state dir and the KIT_* environment `base_env` (read
    at each call, so a fixture can fill it in after making the runner); `outputs` collects every
    stdout and stderr (the secret-leak checks read them)."""

    seed_state(state)

    def kit(*args: str, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "kit", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "KIT_STATE_DIR": str(state), **base_env, **(env or {})},
        )
        if outputs is not None:
            outputs.extend([result.stdout, result.stderr])
        return result

    return kit


def two_node_mp_env(name: str, hf_cache: str, api_key_file: Path | None, *, second_octet: int) -> dict[str, str]:
    """The KIT_* environment of the 2-node mp-backend CPU cluster serving kit/tiny-llama as
    'tiny' with TP=2 across the nodes (as `kit demo` and test_serve.py run it); no API key when
    `api_key_file` is None."""
    third = zlib.crc32(name.encode()) % 250 + 2
    env = {
        "KIT_CLUSTER": name,
        "KIT_IMAGE": IMAGE,
        "KIT_BACKEND": "mp",
        "KIT_ACCELERATOR": "cpu",
        "KIT_NODES": "2",
        "KIT_GPUS_PER_NODE": "1",
        "KIT_MODEL_TP": "2",
        "KIT_MODEL_PP": "1",
        "KIT_MODEL_ID": "kit/tiny-llama",
        "KIT_MODEL_SERVED_NAME": "tiny",
        "KIT_MODEL_MAX_MODEL_LEN": "2048",
        "KIT_MODEL_EXTRA_ARGS": "[--enforce-eager]",
        "KIT_NETWORK": f"{name}-net",
        "KIT_NETWORK_SUBNET": f"10.{second_octet}.{third}.0/24",
        "KIT_IPC_HOST": "false",
        "KIT_SHM_SIZE": "2g",
        "KIT_HF_CACHE": hf_cache,
        "KIT_ENV": "{HF_HUB_OFFLINE: '1', VLLM_CPU_KVCACHE_SPACE: '1'}",
        "KIT_TIMEOUTS_READY": "600",
    }
    if api_key_file is not None:
        env["KIT_API_KEY_FILE"] = str(api_key_file)
    return env


def listening(container: Any, port: int) -> set[str]:
    """The IPv4 addresses the container listens on at `port` (from /proc/net/tcp, LISTEN rows)."""
    table = container.exec_run(["cat", "/proc/net/tcp"]).output.decode().splitlines()[1:]
    out = set()
    for row in table:
        local, state = row.split()[1], row.split()[3]
        address, _, hex_port = local.partition(":")
        if state == "0A" and int(hex_port, 16) == port:
            out.add(".".join(str(b) for b in reversed(bytes.fromhex(address))))
    return out
