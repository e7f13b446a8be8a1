"""Output tokens/s through a kit-launched vLLM server vs the same image run directly with
`docker run ... vllm serve` (issue 4: target median ratio kit/direct >= 0.97), plus time-to-ready.

Topology: a 1-node mp-backend cluster (`kit up --head` + `kit serve`, accelerator cpu, TP 1,
PP 1) serving the tiny random-weight Llama that the image generates offline
(/opt/kit/make_tiny_model.py). The direct side runs the *same* `vllm serve` argv (taken from
kit's own planner, kit.plan.vllm.vllm_serve_argv) in a plain `docker run` with the same
environment (HF_HUB_OFFLINE=1, VLLM_CPU_KVCACHE_SPACE=1, HF_HOME), the same --shm-size and IPC
(not host), and the same network mode (a bridge network with a fixed IP, a random 10.214.X.0/24).

Per run: time-to-ready is measured from just before the first command (`kit up --head` /
`docker network create` + `docker run`) until this script's own /health poll (every 0.25 s)
first answers 200; for kit the moment `kit serve` returned is shown too. Then 2 warm-up
requests, then the timed batch: --requests chat completions (default 16) with --max-tokens
(default 32), temperature 0 and ignore_eos (so every request makes exactly max_tokens tokens),
--concurrency threads (default 4). Output tokens/s = sum(usage.completion_tokens) / batch wall
time; one batch lasts only ~1-2 s here, so it runs --repeats times (default 5) per server and the
median is that run's figure. Sides alternate (kit first in even rounds) and never overlap; each
is torn down before the next. Load generator: standard library threads + requests. Not a timed test: run it.

    python benchmarks/serve_throughput.py [--rounds 3] [--requests 16] [--concurrency 4] [--repeats 5]
                                          [--max-tokens 32] [--json] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

TARGET = 0.97
HF_HOME = "/root/.cache/huggingface"
MODEL = "kit/tiny-llama"
SERVED = "tiny"
PORT = 8000
ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
SHM = "2g"


def sh(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 900, check: bool = True) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def ensure_model(image: str, hf: Path) -> None:
    if any((hf / "hub" / "models--kit--tiny-llama" / "snapshots").glob("*/config.json")):
        return
    hf.mkdir(parents=True, exist_ok=True)
    sh(
        [
            "docker",
            "run",
            "--rm",
            "-v",
            f"{hf}:/hf",
            image,
            "python3",
            "/opt/kit/make_tiny_model.py",
            "--out",
            "/hf/hub",
        ]
    )


def wait_healthy(url: str, timeout: float, stop: threading.Event | None = None) -> float | None:
    """time.time() of the first /health 200, polling every 0.25 s; None on timeout or stop."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (stop and stop.is_set()):
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                return time.time()
        except requests.RequestException:
            pass
        time.sleep(0.25)
    return None


def chat(url: str, i: int, max_tokens: int) -> tuple[int, float]:
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": f"Request {i}: tell me about multi-node serving."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,  # vLLM extension: every request yields exactly max_tokens tokens
    }
    start = time.perf_counter()
    resp = requests.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    resp.raise_for_status()
    return int(resp.json()["usage"]["completion_tokens"]), time.perf_counter() - start


def batch(url: str, requests_n: int, concurrency: int, max_tokens: int) -> tuple[int, float, list[float]]:
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(lambda i: chat(url, i, max_tokens), range(requests_n)))
    return sum(t for t, _ in results), time.perf_counter() - start, [lat for _, lat in results]


def load(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, then run the fixed batch --repeats times; the run's figure is the median batch."""
    for i in range(2):  # warm-up, not timed
        chat(url, -1 - i, args.max_tokens)
    rates, latencies, tokens = [], [], 0
    for _ in range(args.repeats):
        tokens, wall, lats = batch(url, args.requests, args.concurrency, args.max_tokens)
        rates.append(tokens / wall)
        latencies += lats
    return {
        "tokens_per_batch": tokens,
        "batches_tokens_per_s": [round(r, 1) for r in rates],
        "tokens_per_s": round(statistics.median(rates), 2),
        "mean_latency_s": round(statistics.mean(latencies), 3),
    }


# ---- kit ------------------------------------------------------------------------------------
def kit_config(cluster: str, subnet: str, image: str, hf: Path) -> dict[str, Any]:
    return {
        "cluster": cluster,
        "image": image,
        "backend": "mp",
        "accelerator": "cpu",
        "nodes": 1,
        "gpus_per_node": 1,
        "model": {
            "id": MODEL,
            "served_name": SERVED,
            "tp": 1,
            "pp": 1,
            "max_model_len": 2048,
            "extra_args": ["--enforce-eager"],
        },
        "network": f"{cluster}-net",
        "network_subnet": subnet,
        "ipc_host": False,
        "shm_size": SHM,
        "hf_cache": str(hf),
        "env": dict(ENV),
        "ports": {"api": PORT},
        "timeouts": {"join": 120, "ready": 600},
    }


def planned_serve_argv(config_file: Path) -> list[str]:
    """The `vllm serve` argv kit plans for this config (kit's pure planner, no side effects)."""
    from kit.config import load_config
    from kit.plan.facts import HEAD
    from kit.plan.vllm import vllm_serve_argv

    config = load_config(str(config_file), environ={}, cwd=config_file.parent).config
    argv = vllm_serve_argv(config, HEAD)
    if not all(isinstance(a, str) for a in argv):
        raise SystemExit(f"unexpected environment references in the 1-node argv: {argv}")
    return [str(a) for a in argv]


def run_kit(cfg: Path, cluster: str, ip: str, python: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIT_")}
    env.update({"KIT_CONFIG": str(cfg), "KIT_STATE_DIR": str(work / "state")})
    kit = [python, "-m", "kit"]
    url = f"http://{ip}:{PORT}"
    try:
        t0 = time.time()
        sh([*kit, "up", "--head"], env=env)
        t_up = time.time()
        stop = threading.Event()
        seen: list[float | None] = []
        poller = threading.Thread(target=lambda: seen.append(wait_healthy(url, 900, stop)))
        poller.start()
        try:
            sh([*kit, "serve"], env=env)
        finally:
            t_serve = time.time()
            poller.join(timeout=30)
            stop.set()
        healthy = seen[0] if seen else None
        if healthy is None:
            raise RuntimeError("kit serve returned but /health never answered 200 to this script")
        script = sh(["docker", "exec", f"kit-{cluster}-head", "cat", "/tmp/kit/serve.sh"], check=False)
        exec_line = next((ln for ln in script.splitlines() if ln.startswith("exec ")), "")
        out = load(url, args)
        return {
            **out,
            "ready_s": round(healthy - t0, 2),
            "kit_up_s": round(t_up - t0, 2),
            "kit_serve_returned_s": round(t_serve - t0, 2),
            "serve_exec_line": exec_line,
        }
    finally:
        sh([*kit, "down"], env=env, check=False)


# ---- direct docker run ----------------------------------------------------------------------
def run_direct(
    tag: str, subnet: str, ip: str, image: str, hf: Path, argv: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    net = f"{tag}-net"
    label = ["--label", f"kit.bench={tag}"]
    envs = [x for k, v in ENV.items() for x in ("-e", f"{k}={v}")]
    url = f"http://{ip}:{PORT}"
    try:
        t0 = time.time()
        sh(["docker", "network", "create", "--subnet", subnet, *label, net])
        sh(
            ["docker", "run", "-d", "--name", tag, *label, "--network", net, "--ip", ip, "--shm-size", SHM,
             "-v", f"{hf}:{HF_HOME}", "-e", f"HF_HOME={HF_HOME}", *envs, image, *argv]
        )  # fmt: skip
        healthy = wait_healthy(url, 900)
        if healthy is None:
            logs = subprocess.run(["docker", "logs", "--tail", "30", tag], capture_output=True, text=True).stderr
            raise RuntimeError(f"direct vllm serve never became healthy:\n{logs}")
        out = load(url, args)
        return {**out, "ready_s": round(healthy - t0, 2)}
    finally:
        sh(["docker", "rm", "-f", tag], check=False)
        sh(["docker", "network", "rm", net], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5, help="timed batches per server (median taken)")
    parser.add_argument("--image", default=os.environ.get("KIT_TEST_IMAGE", "kit/vllm-cpu:test"))
    parser.add_argument("--hf-cache", type=Path, default=Path(tempfile.gettempdir()) / "kit-bench-hf",
                        help="where the tiny model is generated (reused between runs)")  # fmt: skip
    parser.add_argument("--python", default=sys.executable, help="the interpreter with kit installed")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the JSON result to this file")
    args = parser.parse_args()

    hf = args.hf_cache.resolve()
    ensure_model(args.image, hf)
    run_id = f"{random.randrange(16**6):06x}"
    third = random.randrange(2, 250)
    kit_subnet, direct_subnet = f"10.214.{third}.0/24", f"10.214.{third + 1}.0/24"
    kit_ip, direct_ip = f"10.214.{third}.10", f"10.214.{third + 1}.10"  # kit's head is .10
    load_before = os.getloadavg()
    kit_runs: list[dict[str, Any]] = []
    direct_runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kit-bench-serve-") as tmp:
        work = Path(tmp)
        for i in range(args.rounds):
            cluster = f"sv{run_id}k{i}"
            cfg = work / f"{cluster}.json"  # JSON is YAML: kit reads it as its config file
            cfg.write_text(json.dumps(kit_config(cluster, kit_subnet, args.image, hf), indent=2))
            argv = planned_serve_argv(cfg)
            order = ("kit", "direct") if i % 2 == 0 else ("direct", "kit")
            for side in order:
                if side == "kit":
                    r = run_kit(cfg, cluster, kit_ip, args.python, work, args)
                    kit_runs.append(r)
                else:
                    r = run_direct(f"sv{run_id}d{i}", direct_subnet, direct_ip, args.image, hf, argv, args)
                    direct_runs.append(r)
                print(
                    f"round {i + 1} {side:6s} {r['tokens_per_s']:8.1f} tok/s  ready {r['ready_s']:6.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
    kit_tps = statistics.median(r["tokens_per_s"] for r in kit_runs)
    direct_tps = statistics.median(r["tokens_per_s"] for r in direct_runs)
    ratio = kit_tps / direct_tps
    result = {
        "topology": "1-node mp cluster (kit up --head + kit serve), accelerator cpu, TP 1, PP 1",
        "image": args.image,
        "vllm_argv": argv,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "kit_runs": kit_runs,
        "direct_runs": direct_runs,
        "kit_tokens_per_s": round(kit_tps, 2),
        "direct_tokens_per_s": round(direct_tps, 2),
        "ratio": round(ratio, 3),
        "target": TARGET,
        "ok": ratio >= TARGET,
        "kit_ready_median_s": round(statistics.median(r["ready_s"] for r in kit_runs), 2),
        "direct_ready_median_s": round(statistics.median(r["ready_s"] for r in direct_runs), 2),
        "loadavg_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"\nvllm argv (both sides): {' '.join(argv)}")
    print(f"kit's serve.sh ran:     {kit_runs[0]['serve_exec_line']}")
    print(
        f"\n{args.requests} chat requests x {args.max_tokens} tokens (ignore_eos), concurrency {args.concurrency}; "
        f"tok/s = median of {args.repeats} batches per server; ready = first command -> /health 200"
    )
    print(f"{'round':>5}  {'kit tok/s':>9}  {'direct tok/s':>12}  {'ratio':>6}  {'kit ready':>9}  {'direct ready':>12}")
    for i, (k, d) in enumerate(zip(kit_runs, direct_runs, strict=True)):
        print(
            f"{i + 1:>5}  {k['tokens_per_s']:9.1f}  {d['tokens_per_s']:12.1f}  "
            f"{k['tokens_per_s'] / d['tokens_per_s']:6.3f}  {k['ready_s']:8.1f}s  {d['ready_s']:11.1f}s"
        )
    print(
        f"{'median':>5}  {kit_tps:9.1f}  {direct_tps:12.1f}  {ratio:6.3f}  "
        f"{result['kit_ready_median_s']:8.1f}s  {result['direct_ready_median_s']:11.1f}s"
    )
    verdict = "meets" if result["ok"] else "MISSES"
    print(f"\nmedian throughput ratio kit/direct = {ratio:.3f}x ({verdict} the target >= {TARGET:.2f}x)")
    ups = [r["kit_up_s"] for r in kit_runs]
    rets = [r["kit_serve_returned_s"] for r in kit_runs]
    print(
        f"kit: `kit up --head` took {statistics.median(ups):.1f} s (median); `kit serve` returned at "
        f"{statistics.median(rets):.1f} s after the start (its /health poll is every 2 s)"
    )
    print(f"load average (1 min) before/after: {result['loadavg_before_after']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
