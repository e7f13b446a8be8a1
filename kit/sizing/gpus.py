"""Byte sizes and GPU memory: `40GiB` and `H100-80GB` as bytes, and the per-GPU budget defaults."""

from __future__ import annotations

import re

from kit.errors import ConfigError

KiB = 1024
MiB = 1024**2
GiB = 1024**3

# Fixed per-GPU memory that is neither weights nor KV cache: the activation peak vLLM profiles
# with `max_num_batched_tokens`, CUDA graphs, and the CUDA context / NCCL buffers (which live
# outside PyTorch's allocator). Measured vLLM runs land between 1 and 3 GiB per GPU for
# 7B-400B models at default batching; 2 GiB is the middle. Override with `overhead_bytes=`.
DEFAULT_OVERHEAD_BYTES = 2 * GiB
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9

# Total memory per GPU as the driver reports it (nvidia-smi "MiB" / rocm-smi), which is what
# vLLM multiplies by gpu_memory_utilization. Marketing "GB" differs: an A100-40GB has 40 GiB.
KNOWN_GPUS: dict[str, int] = {
    "A100-40GB": 40960 * MiB,
    "A100-80GB": 81920 * MiB,
    "H100-80GB": 81559 * MiB,
    "H100-94GB": 95830 * MiB,  # H100 NVL
    "H200": 143771 * MiB,  # 141 GB HBM3e
    "GH200": 97871 * MiB,  # 96 GB HBM3 variant
    "B200": 183359 * MiB,
    "L40S": 46068 * MiB,
    "L40": 46068 * MiB,
    "L4": 23034 * MiB,
    "A10": 23028 * MiB,
    "A40": 46068 * MiB,
    "V100-16GB": 16384 * MiB,
    "V100-32GB": 32768 * MiB,
    "RTX-4090": 24564 * MiB,
    "MI250X": 64 * GiB,
    "MI300X": 192 * GiB,
}

_GPU_ALIASES: dict[str, str] = {
    "A100": "A100-80GB",
    "H100": "H100-80GB",
    "H200-141GB": "H200",
    "MI300": "MI300X",
}


MAX_SIZE = 1 << 60  # 1 EiB: no GPU or overhead comes near; keeps every size a plain finite number
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")
_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": 1024**4,
}


def parse_size(text: str, *, key: str = "size") -> int:
    """`40GiB` -> 42949672960, `80GB` -> 80e9, `141e9` -> 141000000000 (bytes)."""
    match = _SIZE_RE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _SIZE_UNITS:
        raise ConfigError(
            f"cannot read {text!r} as a size",
            key=key,
            hint="write a number with an optional unit: 40GiB, 80GB, 141e9 (bytes)",
        )
    number = float(match.group(1)) * _SIZE_UNITS[unit]
    if not number < MAX_SIZE:  # also inf: `--overhead 1e999` (issue 16)
        raise ConfigError(f"{text!r} is larger than 1 EiB", key=key, hint="e.g. 40GiB")
    value = int(number)
    if value <= 0:
        raise ConfigError(f"{text!r} is not a positive size", key=key, hint="e.g. 40GiB")
    return value


def gpu_memory_bytes(name_or_size: str, *, key: str = "gpu") -> int:
    """A known GPU name (`A100-40GB`, `H100-80GB`, `H200`, …) or a size (`40GiB`)."""
    wanted = name_or_size.strip().upper().replace("_", "-").replace(" ", "-")
    wanted = _GPU_ALIASES.get(wanted, wanted)
    for name, size in KNOWN_GPUS.items():
        if name.upper() == wanted:
            return size
    if _SIZE_RE.match(name_or_size):
        return parse_size(name_or_size, key=key)
    raise ConfigError(
        f"unknown GPU {name_or_size!r}",
        key=key,
        hint=f"use one of {', '.join(KNOWN_GPUS)} or give its memory, e.g. --gpu-memory 40GiB",
    )


def format_bytes(n: float) -> str:
    """Human text for a byte count: GiB/MiB/KiB, two decimals."""
    for unit, size in (("TiB", 1024**4), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
