"""Output tokens/s through a kit-launched vLLM server vs the same image run directly with
`docker run ... vllm serve` (issue 4: target median ratio kit/direct >= 0.97), plus time-to-ready.

Topology: a 1-node mp-backend cluster (`kit up --head` + `kit serve`, accelerator cpu, TP 1,
PP 1) serving the tiny random-weight Llama that the image generates offline
(/opt/kit/make_tiny_model.py). The direct side runs the *same* `vllm serve` argv (taken from
kit's own planner, kit.plan.vllm.vllm_serve_argv) in a plain `docker run` with the same
environment (HF_HUB_OFFLINE=1, VLLM_CPU_KVCACHE_SPACE=1, HF_HOME), the same --shm-size and IPC
(not host), and the same network mode: both containers sit on ONE private bridge network that
this script creates (a random --subnet-prefix.X.0/24) with fixed IPs, kit's head at .10 (kit
reuses the existing network and leaves it alone on `kit down`) and the direct container at .20.

Why both servers stay up: on a shared, small host the throughput of one server drifts 2-4x
within a minute (outside load), so measuring one server and then the other compares two
different machines. Here both run at the same time and the timed batches alternate between them
in an ABBA order (kit, direct, direct, kit, kit, direct, ...), never two at once, with --gap
seconds of quiet before each batch. Each consecutive (kit, direct) pair gives one ratio; slow
drift hits both members of a pair alike and cancels. The headline is the median pair ratio with
its interquartile range. Per batch the script also reads both containers' CPU time from the
host's cgroup (cpuacct) so it can show how much CPU the *idle* server used during the other's
batch (it should be ~0); `docker stats --no-stream` is sampled during each side's warm-up too.
--cpuset CPUS pins both containers identically (`docker update --cpuset-cpus`, after both are
ready: kit has no option for extra docker flags), off by default.

Phases:
  1. time-to-ready, each side started alone, one after the other (--first picks which): from
     just before the first command (`kit up --head` / `docker run`) until this script's own
     /health poll (every 0.25 s) first answers 200; for kit the moment `kit serve` returned is
     shown too. The network is created before either clock starts. While the second side starts,
     the first one is up but idle (its CPU time over that window is reported).
  2. warm-up per side: 2 single requests + --warmup untimed batches (more while `docker stats`
     samples both containers).
  3. --batches timed batches per side, alternating ABBA. A batch: --requests chat completions
     (default 32) with --max-tokens (default 32), temperature 0 and ignore_eos (so every request
     makes exactly max_tokens tokens), --concurrency threads (default 4). tokens/s =
     sum(usage.completion_tokens) / batch wall time.
Load generator: standard library threads + requests. Not a timed test: run it.

    python benchmarks/serve_throughput.py [--batches 8] [--warmup 1] [--requests 32] [--concurrency 4]
        [--max-tokens 32] [--gap 1.0] [--first kit|direct] [--cpuset CPUS] [--json] [--out FILE]
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
from _images import default_image, require_image

TARGET = 0.97
HF_HOME = "/root/.cache/huggingface"
MODEL = "kit/tiny-llama"
SERVED = "tiny"
PORT = 8000
ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
SHM = "2g"
SIDES = ("kit", "direct")


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


def batch(url: str, args: argparse.Namespace) -> tuple[int, float, list[float]]:
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        results = list(pool.map(lambda i: chat(url, i, args.max_tokens), range(args.requests)))
    return sum(t for t, _ in results), time.perf_counter() - start, [lat for _, lat in results]


# ---- per-container CPU time from the host's cgroup --------------------------------------------
def cgroup_cpu_file(container: str) -> Path | None:
    cid = sh(["docker", "inspect", "--format", "{{.Id}}", container], check=False).strip()
    for candidate in (
        Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage"),  # cgroup v1, cgroupfs driver
        Path(f"/sys/fs/cgroup/cpu,cpuacct/docker/{cid}/cpuacct.usage"),
        Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat"),  # cgroup v2, systemd driver
        Path(f"/sys/fs/cgroup/docker/{cid}/cpu.stat"),
    ):
        if cid and candidate.exists():
            return candidate
    return None


def cpu_seconds(path: Path | None) -> float | None:
    if path is None:
        return None
    try:
        text = path.read_text()
    except OSError:
        return None
    if path.name == "cpuacct.usage":
        return int(text.strip()) / 1e9
    fields = dict(line.split() for line in text.splitlines() if line.strip())
    return int(fields["usage_usec"]) / 1e6


def steal_jiffies() -> int | None:
    """The VM's cumulative CPU steal (USER_HZ ticks, all CPUs) from /proc/stat; None if unknown."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8])
    except (OSError, IndexError, ValueError):
        return None


def docker_stats(names: list[str]) -> str:
    fmt = "{{.Name}} {{.CPUPerc}} {{.MemUsage}}"
    return sh(["docker", "stats", "--no-stream", "--format", fmt, *names], check=False, timeout=60).strip()


# ---- kit ------------------------------------------------------------------------------------
def kit_config(cluster: str, net: str, subnet: str, image: str, hf: Path) -> dict[str, Any]:
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
        "network": net,  # created by this script first; kit reuses an existing network
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
    from kit.plan.roles import HEAD
    from kit.plan.vllm import vllm_serve_argv

    config = load_config(str(config_file), environ={}, cwd=config_file.parent).config
    argv = vllm_serve_argv(config, HEAD)
    if not all(isinstance(a, str) for a in argv):
        raise SystemExit(f"unexpected environment references in the 1-node argv: {argv}")
    return [str(a) for a in argv]


def kit_env(cfg: Path, work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIT_")}
    env.update({"KIT_CONFIG": str(cfg), "KIT_STATE_DIR": str(work / "state")})
    return env


def start_kit(env: dict[str, str], container: str, url: str, python: str) -> dict[str, Any]:
    kit = [python, "-m", "kit"]
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
    script = sh(["docker", "exec", container, "cat", "/tmp/kit/serve.sh"], check=False)
    exec_line = next((ln for ln in script.splitlines() if ln.startswith("exec ")), "")
    return {
        "ready_s": round(healthy - t0, 2),
        "kit_up_s": round(t_up - t0, 2),
        "kit_serve_returned_s": round(t_serve - t0, 2),
        "serve_exec_line": exec_line,
    }


# ---- direct docker run ----------------------------------------------------------------------
def start_direct(
    name: str, tag: str, net: str, ip: str, image: str, hf: Path, argv: list[str], url: str
) -> dict[str, Any]:
    envs = [x for k, v in ENV.items() for x in ("-e", f"{k}={v}")]
    t0 = time.time()
    sh(
        ["docker", "run", "-d", "--name", name, "--label", f"kit.bench={tag}", "--network", net, "--ip", ip,
         "--shm-size", SHM, "-v", f"{hf}:{HF_HOME}", "-e", f"HF_HOME={HF_HOME}", *envs, image, *argv]
    )  # fmt: skip
    healthy = wait_healthy(url, 900)
    if healthy is None:
        logs = subprocess.run(["docker", "logs", "--tail", "30", name], capture_output=True, text=True).stderr
        raise RuntimeError(f"direct vllm serve never became healthy:\n{logs}")
    return {"ready_s": round(healthy - t0, 2)}


def abba(pairs: int) -> list[tuple[str, str]]:
    """(kit, direct), (direct, kit), (kit, direct), ...: kit, direct, direct, kit, kit, direct, ..."""
    return [("kit", "direct") if j % 2 == 0 else ("direct", "kit") for j in range(pairs)]


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=8, help="timed batches per side (= number of pairs)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed batches per side before the timed ones")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--gap", type=float, default=1.0, help="seconds of quiet before each timed batch")
    parser.add_argument("--first", choices=SIDES, default="kit", help="which side is started (and timed) first")
    parser.add_argument("--cpuset", help="pin BOTH containers to these CPUs (docker update --cpuset-cpus)")
    parser.add_argument("--image", default=default_image())
    parser.add_argument("--subnet-prefix", default="10.214", help="the private network is PREFIX.X.0/24")
    parser.add_argument("--hf-cache", type=Path, default=Path(tempfile.gettempdir()) / "kit-bench-hf",
                        help="where the tiny model is generated (reused between runs)")  # fmt: skip
    parser.add_argument("--python", default=sys.executable, help="the interpreter with kit installed")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the JSON result to this file")
    args = parser.parse_args()
    require_image(args.image)

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    hf = args.hf_cache.resolve()
    ensure_model(args.image, hf)
    run_id = f"{random.randrange(16**6):06x}"
    third = random.randrange(2, 254)
    subnet = f"{args.subnet_prefix}.{third}.0/24"
    tag = f"sv{run_id}"
    net = f"{tag}-net"
    cluster, direct_name = f"{tag}k", f"{tag}d"
    kit_name = f"kit-{cluster}-head"
    ip = {"kit": f"{args.subnet_prefix}.{third}.10", "direct": f"{args.subnet_prefix}.{third}.20"}
    url = {side: f"http://{ip[side]}:{PORT}" for side in SIDES}
    container = {"kit": kit_name, "direct": direct_name}
    load_before = os.getloadavg()
    ready: dict[str, dict[str, Any]] = {}
    idle_during_start: dict[str, float | None] = {}
    warm: dict[str, list[float]] = {s: [] for s in SIDES}
    batches: list[dict[str, Any]] = []
    stats_samples: list[dict[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="kit-bench-serve-") as tmp:
        work = Path(tmp)
        cfg = work / f"{cluster}.json"  # JSON is YAML: kit reads it as its config file
        cfg.write_text(json.dumps(kit_config(cluster, net, subnet, args.image, hf), indent=2))
        argv = planned_serve_argv(cfg)
        env = kit_env(cfg, work)
        cpu_file: dict[str, Path | None] = {}
        try:
            sh(["docker", "network", "create", "--subnet", subnet, "--label", f"kit.bench={tag}", net])
            # ---- phase 1: time-to-ready, one side at a time
            order = (args.first, "direct" if args.first == "kit" else "kit")
            for k, side in enumerate(order):
                other = order[0]
                before = cpu_seconds(cpu_file.get(other)) if k else None
                t = time.time()
                if side == "kit":
                    ready[side] = start_kit(env, kit_name, url["kit"], args.python)
                else:
                    ready[side] = start_direct(direct_name, tag, net, ip["direct"], args.image, hf, argv, url["direct"])
                cpu_file[side] = cgroup_cpu_file(container[side])
                if k:
                    after = cpu_seconds(cpu_file.get(other))
                    idle_during_start[other] = (
                        None if before is None or after is None else round((after - before) / (time.time() - t), 3)
                    )
                say(
                    f"{side:6s} ready after {ready[side]['ready_s']:6.1f} s (started {'first' if k == 0 else 'second'})"
                )
            if args.cpuset:
                for side in SIDES:
                    sh(["docker", "update", "--cpuset-cpus", args.cpuset, container[side]])
            # ---- phase 2: warm-up per side; `docker stats` is sampled while one side is loaded
            for side in SIDES:
                for i in range(2):
                    chat(url[side], -1 - i, args.max_tokens)
                sample: dict[str, str] = {"loaded": side}
                sampler = threading.Thread(
                    target=lambda s=sample: s.update(stats=docker_stats([kit_name, direct_name]))
                )
                sampler.start()
                done = 0
                while done < args.warmup or sampler.is_alive():  # keep loading until the sample is taken
                    tokens, wall, _ = batch(url[side], args)
                    warm[side].append(round(tokens / wall, 1))
                    done += 1
                sampler.join()
                stats_samples.append(sample)
            say(f"warm-up tok/s: {warm}")
            # ---- phase 3: timed batches, ABBA, one at a time
            for j, pair in enumerate(abba(args.batches)):
                for side in pair:
                    idle = "direct" if side == "kit" else "kit"
                    time.sleep(args.gap)
                    c0, st0 = {s: cpu_seconds(cpu_file[s]) for s in SIDES}, steal_jiffies()
                    tokens, wall, lats = batch(url[side], args)
                    c1, st1 = {s: cpu_seconds(cpu_file[s]) for s in SIDES}, steal_jiffies()
                    used = {
                        s: None if c0[s] is None or c1[s] is None else round((c1[s] - c0[s]) / wall, 3) for s in SIDES
                    }
                    rec = {
                        "pair": j,
                        "side": side,
                        "tokens": tokens,
                        "wall_s": round(wall, 3),
                        "tokens_per_s": round(tokens / wall, 1),
                        "mean_latency_s": round(statistics.mean(lats), 3),
                        "loaded_cpus": used[side],  # CPU-seconds per second of the loaded container
                        "idle_cpus": used[idle],  # ... and of the idle one over the same window
                        "tokens_per_cpu_s": None if not used[side] else round(tokens / (used[side] * wall), 1),
                        "steal_cpus": None if st0 is None or st1 is None else round((st1 - st0) / 100 / wall, 3),
                        "loadavg_1m": round(os.getloadavg()[0], 2),
                    }
                    batches.append(rec)
                    say(
                        f"pair {j + 1} {side:6s} {rec['tokens_per_s']:8.1f} tok/s  "
                        f"cpu loaded {used[side]} idle {used[idle]} steal {rec['steal_cpus']}  load {rec['loadavg_1m']}"
                    )
        finally:
            sh([args.python, "-m", "kit", "down"], env=env, check=False)
            sh(["docker", "rm", "-f", direct_name], check=False)
            sh(["docker", "network", "rm", net], check=False)

    rate = {s: [b["tokens_per_s"] for b in batches if b["side"] == s] for s in SIDES}
    pair_ratios = []
    for j in range(args.batches):
        by = {b["side"]: b["tokens_per_s"] for b in batches if b["pair"] == j}
        pair_ratios.append(round(by["kit"] / by["direct"], 3))
    q1, med, q3 = quartiles(pair_ratios)
    kit_tps, direct_tps = statistics.median(rate["kit"]), statistics.median(rate["direct"])
    idle = [b["idle_cpus"] for b in batches if b["idle_cpus"] is not None]
    result = {
        "topology": "1-node mp cluster (kit up --head + kit serve), accelerator cpu, TP 1, PP 1",
        "image": args.image,
        "vllm_argv": argv,
        "serve_exec_line": ready["kit"]["serve_exec_line"],
        "network": {"subnet": subnet, "kit_ip": ip["kit"], "direct_ip": ip["direct"]},
        "requests": args.requests,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "batches_per_side": args.batches,
        "warmup_batches": args.warmup,
        "gap_s": args.gap,
        "cpuset": args.cpuset,
        "order": [s for pair in abba(args.batches) for s in pair],
        "ready": ready,
        "first_started": args.first,
        "idle_cpus_of_first_while_second_started": idle_during_start,
        "warmup_tokens_per_s": warm,
        "batches": batches,
        "docker_stats_samples": stats_samples,
        "pair_ratios": pair_ratios,
        "ratio_median": round(med, 3),
        "ratio_q1": round(q1, 3),
        "ratio_q3": round(q3, 3),
        "ratio_min": min(pair_ratios),
        "ratio_max": max(pair_ratios),
        "kit_tokens_per_s_median": round(kit_tps, 1),
        "direct_tokens_per_s_median": round(direct_tps, 1),
        "ratio_of_side_medians": round(kit_tps / direct_tps, 3),
        "idle_cpus_max": max(idle) if idle else None,
        "target": TARGET,
        "ok": med >= TARGET,
        "loadavg_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"\nvllm argv (both sides): {' '.join(argv)}")
    print(f"kit's serve.sh ran:     {result['serve_exec_line']}")
    print(f"network {subnet}: kit head {ip['kit']}, direct {ip['direct']}; cpuset: {args.cpuset or 'not pinned'}")
    print(
        f"\ntime-to-ready (first command -> /health 200, each side started alone, {args.first} first): "
        f"kit {ready['kit']['ready_s']:.1f} s (`kit up --head` {ready['kit']['kit_up_s']:.1f} s, `kit serve` "
        f"returned at {ready['kit']['kit_serve_returned_s']:.1f} s), direct {ready['direct']['ready_s']:.1f} s"
    )
    print(
        f"\n{args.requests} chat requests x {args.max_tokens} tokens (ignore_eos), concurrency {args.concurrency}; "
        f"{args.batches} timed batches per side, ABBA order, {args.gap:g} s gap; "
        f"{args.warmup} warm-up batch(es) per side"
    )
    print(f"{'pair':>4}  {'order':>11}  {'kit tok/s':>9}  {'direct tok/s':>12}  {'ratio':>6}  {'idle cpu':>8}")
    for j, pair in enumerate(abba(args.batches)):
        by = {b["side"]: b for b in batches if b["pair"] == j}
        idle_max = max((b["idle_cpus"] or 0.0) for b in by.values())
        print(
            f"{j + 1:>4}  {pair[0][0].upper() + pair[1][0].upper():>11}  {by['kit']['tokens_per_s']:9.1f}  "
            f"{by['direct']['tokens_per_s']:12.1f}  {pair_ratios[j]:6.3f}  {idle_max:8.3f}"
        )
    print(f"{'median':>4}  {'':>11}  {kit_tps:9.1f}  {direct_tps:12.1f}  {med:6.3f}")
    verdict = "meets" if result["ok"] else "MISSES"
    print(
        f"\nmedian pair ratio kit/direct = {med:.3f}x, IQR {q1:.3f}-{q3:.3f}, range {min(pair_ratios):.3f}-"
        f"{max(pair_ratios):.3f} ({verdict} the target >= {TARGET:.2f}x); "
        f"ratio of side medians {kit_tps / direct_tps:.3f}"
    )
    print(
        f"idle server's CPU use during the other's batch: max {result['idle_cpus_max']} CPUs "
        f"(loaded server: median {statistics.median(b['loaded_cpus'] or 0 for b in batches):.2f})"
    )
    for s in stats_samples:
        print(f"docker stats while {s['loaded']} was loaded:\n  " + s.get("stats", "").replace("\n", "\n  "))
    print(f"load average (1 min) before/after: {result['loadavg_before_after']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
