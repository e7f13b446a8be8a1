"""The load `kit bench` and `kit tune` send: every load flag checked and the prompts built before
any request (nothing here talks to a server). The flags themselves are click options in
kit/commands/_options.py (`load_options`); this module takes their parsed values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kit.bench import dataset
from kit.bench.dataset import Prompt
from kit.bench.measure import Load
from kit.bench.runner import MAX_IN_FLIGHT
from kit.bench.schedule import sweep
from kit.errors import ConfigError, UsageError

# Bounds of a load (issue 16: -n 100000000 built every prompt up front and ran out of memory).
# vLLM's own benchmarks use -n in the thousands; prompts are words of ~5 bytes.
MAX_PROMPTS = 100_000
MAX_INPUT_LEN = 1_000_000
MAX_OUTPUT_LEN = 10_000_000
MAX_PROMPT_WORDS = 20_000_000


def build_load(flags: dict[str, Any]) -> Load:
    """Every load flag checked and the prompts built, before any request: nothing here talks to
    a server. The prompts are built up front, so their size is capped (-n × --input-len words)."""
    num, out_len = flags["num_prompts"], flags["output_len"]
    if num < 1 or out_len < 1 or flags["input_len"] < 1:
        raise UsageError("--num-prompts, --input-len and --output-len must be at least 1")
    kind = flags["dataset"]
    words = num * flags["input_len"] * (1 + flags["range_ratio"] if kind == "random" else 1)
    if kind in ("fixed", "random") and words > MAX_PROMPT_WORDS:
        raise ConfigError(
            f"-n {num} prompts of --input-len {flags['input_len']} words would be {int(words)} words; "
            f"kit bench builds at most {MAX_PROMPT_WORDS} up front",
            key="--num-prompts",
            hint="lower -n or --input-len",
        )
    prompts: list[Prompt]
    if kind == "fixed":
        prompts = dataset.fixed(num, flags["input_len"], out_len, seed=flags["seed"])
    elif kind == "random":
        prompts = dataset.random_lengths(num, flags["input_len"], out_len, flags["range_ratio"], seed=flags["seed"])
    else:
        prompts = dataset.load_file(Path(kind), num, out_len, seed=flags["seed"])
    description = {
        "dataset": kind,
        "input_len": flags["input_len"] if kind in ("fixed", "random") else None,
        "output_len": out_len,
        "range_ratio": flags["range_ratio"] if kind == "random" else None,
        "burstiness": flags["burstiness"],
        "ignore_eos": flags["ignore_eos"],
    }
    points = sweep(flags["rate"], flags["concurrency"])
    for point in points:
        in_flight = min(point.concurrency or num, num)
        if in_flight > MAX_IN_FLIGHT:
            what = f"--concurrency {point.concurrency}" if point.concurrency else f"-n {num} with no --concurrency"
            raise ConfigError(
                f"{what} would put {in_flight} requests in flight; kit bench keeps at most {MAX_IN_FLIGHT}",
                key="--concurrency",
                hint=f"pass --concurrency {MAX_IN_FLIGHT} or less",
            )
    return Load(
        prompts=prompts,
        points=points,
        warmup=max(0, flags["warmup"]),
        seed=flags["seed"],
        burstiness=flags["burstiness"],
        description=description,
    )
