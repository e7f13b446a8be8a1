"""The KIT_* environment of a two-node CPU Ray cluster on a private Docker network, shared by the
integration tests (each passes its own second octet so concurrent modules never share a subnet)."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

IMAGE = os.environ.get("KIT_TEST_IMAGE", "kit/vllm-cpu:test")


def two_node_ray_env(name: str, hf_cache: Path, *, second_octet: int) -> dict[str, str]:
    hf_cache.mkdir(parents=True, exist_ok=True)
    third = zlib.crc32(name.encode()) % 250 + 2
    return {
        "KIT_CLUSTER": name,
        "KIT_IMAGE": IMAGE,
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
