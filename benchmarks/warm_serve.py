"""Warm compile caches (issue 19): time to ready of `kit serve` on fresh containers with an empty
compile cache (compile_cache.dir, first start) vs the same folder again (second start, warm),
next to a start without the key (today: every start is cold), all in one run; the ratio warm /
cold.

Topology: two container "nodes" on a private Docker network, vLLM's CPU build, mp backend, TP=2
over both nodes, the tiny random-weight Llama (`kit demo --prepare-only`), vLLM's default start
(no --enforce-eager; `--extra-args` changes it). Each start is on fresh containers (`kit down`,
then `kit up` of both nodes): within one container vLLM's caches survive `kit serve --replace`
anyway, so only a new container shows what the mount keeps.

Order per round: cold (empty folder), none (no compile_cache), warm (the folder the cold start
filled); `none` runs between them so the OS page cache (image, model) is as warm for `warm` as
for `none`. time = `kit serve` started -> first one-token completion answered. Also: what the
cold start wrote into the folder (files, bytes), which says whether there was anything to keep.

    python benchmarks/warm_serve.py [--rounds 1] [--image IMAGE (default: the demo's)] [--subnet-prefix 10.236]
        [--extra-args '[--enforce-eager]'] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import docker
import requests
from _images import default_image, require_image


def kit(args: list[str], env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kit", *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def checked(args: list[str], env: dict[str, str]) -> None:
    done = kit(args, env)
    if done.returncode != 0:
        raise RuntimeError(f"kit {' '.join(args)}: {done.stderr[-2000:]}")


def first_answer(url: str, timeout: float = 900) -> float:
    body = {"model": "tiny", "prompt": "ping", "max_tokens": 1}
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if requests.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200:
                return time.time()
        except requests.RequestException:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def cache_content(folder: Path) -> dict[str, Any]:
    files = [p for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []
    return {
        "files": len(files),
        "bytes": sum(p.stat().st_size for p in files),
        "dirs": sorted(str(p.relative_to(folder)) for p in folder.glob("*/*") if p.is_dir()) if folder.is_dir() else [],
    }


def start(env: dict[str, str]) -> float:
    """Fresh containers (down, up worker, up head), then `kit serve` -> first answer, in seconds."""
    kit(["down"], env, timeout=300)
    for role in ("--worker", "--head"):
        checked(["up", role], env)
    url = f"http://{head_ip(env)}:8000"
    began = time.time()
    checked(["serve"], env)
    return first_answer(url) - began


def head_ip(env: dict[str, str]) -> str:
    return str(docker.from_env().containers.get(f"kit-{env['KIT_CLUSTER']}-head").labels["kit.node-ip"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--image", default=default_image())
    parser.add_argument("--subnet-prefix", default="10.236")
    parser.add_argument("--extra-args", default="[]", help="model.extra_args as YAML (default: none)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    require_image(args.image)
    work = Path(tempfile.mkdtemp(prefix="kit-bench-warm-"))
    name = f"bwarm{random.randrange(10**5):05d}"
    env = {
        **os.environ,
        "KIT_STATE_DIR": str(work / "state"),
        "KIT_CLUSTER": name,
        "KIT_IMAGE": args.image,
        "KIT_BACKEND": "mp",
        "KIT_ACCELERATOR": "cpu",
        "KIT_NODES": "2",
        "KIT_GPUS_PER_NODE": "1",
        "KIT_MODEL_TP": "2",
        "KIT_MODEL_PP": "1",
        "KIT_MODEL_ID": "kit/tiny-llama",
        "KIT_MODEL_SERVED_NAME": "tiny",
        "KIT_MODEL_MAX_MODEL_LEN": "2048",
        "KIT_MODEL_EXTRA_ARGS": args.extra_args,
        "KIT_NETWORK": f"{name}-net",
        "KIT_NETWORK_SUBNET": f"{args.subnet_prefix}.{random.randrange(2, 250)}.0/24",
        "KIT_IPC_HOST": "false",
        "KIT_SHM_SIZE": "2g",
        "KIT_ENV": "{HF_HUB_OFFLINE: '1', VLLM_CPU_KVCACHE_SPACE: '1'}",
        "KIT_TIMEOUTS_READY": "900",
        "KIT_TIMEOUTS_JOIN": "300",
    }
    prep = kit(["demo", "--prepare-only", "--json"], env)
    if prep.returncode != 0:
        print(prep.stderr, file=sys.stderr)
        return 1
    env["KIT_HF_CACHE"] = json.loads(prep.stdout)["result"]["hf_cache"]
    rows: list[dict[str, Any]] = []
    try:
        for i in range(args.rounds):
            folder = work / f"compile-cache-{i}"
            with_cache = {**env, "KIT_COMPILE_CACHE_DIR": str(folder)}
            cold = start(with_cache)
            written = cache_content(folder)
            none = start(env)
            warm = start(with_cache)
            row = {"round": i, "cold_s": round(cold, 1), "none_s": round(none, 1), "warm_s": round(warm, 1)}
            row |= {"ratio_warm_cold": round(warm / cold, 2), "ratio_warm_none": round(warm / none, 2)}
            rows.append({**row, "cache_after_cold": written})
            print(f"[{i}] cold {cold:.1f} s, none {none:.1f} s, warm {warm:.1f} s; cache {written}", file=sys.stderr)
    finally:
        kit(["down"], env, timeout=300)
        shutil.rmtree(work, ignore_errors=True)
    summary = {
        k: round(statistics.median(r[k] for r in rows), 2) for k in ("cold_s", "none_s", "warm_s", "ratio_warm_cold")
    }
    if args.json:
        print(json.dumps({"rows": rows, "median": summary, "image": args.image}, indent=2))
        return 0
    print(f"{'round':<6}{'cold s':>8}{'none s':>8}{'warm s':>8}{'warm/cold':>10}{'cache files':>12}{'cache bytes':>12}")
    for r in rows:
        c = r["cache_after_cold"]
        print(
            f"{r['round']:<6}{r['cold_s']:>8}{r['none_s']:>8}{r['warm_s']:>8}{r['ratio_warm_cold']:>10}"
            f"{c['files']:>12}{c['bytes']:>12}"
        )
    print(f"median warm/cold {summary['ratio_warm_cold']} (cold {summary['cold_s']} s, warm {summary['warm_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
