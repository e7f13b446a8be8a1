"""`kit fetch` MB/s against huggingface_hub's own CLI (`hf download`; `huggingface-cli download` on
older versions), from the same loopback Hub, side by side in one run (issue 19; goal >= 0.95x).

A synthetic checkpoint (default 4 x 256 MB safetensors shards, their index, config and tokenizer
files, plus files neither side fetches) is served by tests/infra/hub_server.py, unthrottled, with
the Hub's redirect of LFS files to a "CDN" host. Each round runs both commands as fresh processes
into empty caches, one after the other, the order alternating (kit first in odd rounds):

    kit   kit fetch kit/bench --set hf_cache=DIR --json
    hf    hf download kit/bench --include '*.json' --include '*.safetensors' --cache-dir DIR/hub

Both fetch the same files (the script checks which files the server sent per side) with the
default 8 workers, progress bars off (HF_HUB_DISABLE_PROGRESS_BARS=1; kit --json). The clock is
the wall time of the process, start-up included; MB/s = bytes / that time (1 MB = 10^6 B). Each
round gives one kit/hf ratio; the headline is the median with min-max and the quartiles. Not a
test: nothing is asserted.

    python benchmarks/fetch_vs_hf.py [--rounds 6] [--shards 4] [--shard-mb 256] [--keep DIR] [--json] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.infra.hub_server import HubServer, make_repo, write_model  # noqa: E402

REPO = "kit/bench"


def hf_cli() -> list[str]:
    for name in ("hf", "huggingface-cli"):
        found = shutil.which(name) or (Path(sys.executable).parent / name)
        if Path(found).exists():
            return [str(found), "download"]
    raise SystemExit("neither `hf` nor `huggingface-cli` is installed (pip install huggingface_hub)")


def kit_cli() -> list[str]:
    found = shutil.which("kit") or (Path(sys.executable).parent / "kit")
    return [str(found), "fetch"] if Path(found).exists() else [sys.executable, "-m", "kit", "fetch"]


def run_side(side: str, hub: HubServer, work: Path, env: dict[str, str]) -> dict[str, Any]:
    target = work / side
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    if side == "kit":
        argv = [*kit_cli(), REPO, "--set", f"hf_cache={target}", "--json"]
    else:
        patterns = ["--include", "*.json", "--include", "*.safetensors"]
        argv = [*hf_cli(), REPO, *patterns, "--cache-dir", str(target / "hub")]
    hub.reset_counters()
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=work)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    served = dict(hub.served)
    snapshots = list((target / "hub" / "models--kit--bench" / "snapshots").glob("*"))
    files = sorted(p.name for p in snapshots[0].iterdir()) if snapshots else []
    # the files' sizes: kit also reads the weights index once more, to plan the shards
    size = sum(f.size for f in hub.repos[REPO].files.values() if f.path in served)
    out: dict[str, Any] = {"seconds": seconds, "bytes": size, "served": sum(served.values()), "files": files}
    if side == "kit":
        out["kit_transfer_seconds"] = json.loads(proc.stdout)["result"]["seconds"]
    shutil.rmtree(target, ignore_errors=True)
    return out


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--shard-mb", type=int, default=256)
    parser.add_argument("--keep", type=Path, help="keep the generated model here (reused when present)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="kit-fetch-bench-") as tmp:
        work = Path(tmp)
        source = args.keep or work / "model"
        if not (source / "model.safetensors.index.json").exists():
            write_model(source, [args.shard_mb * 1_000_000] * args.shards)
        repo = make_repo(REPO, source)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE", "KIT_"))}
        env.update(
            HF_HUB_DISABLE_PROGRESS_BARS="1",
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HOME=str(work / "hf-home"),
            KIT_STATE_DIR=str(work / "state"),
        )
        rounds = []
        with HubServer([repo]) as hub:
            env["HF_ENDPOINT"] = hub.url
            run_side("kit", hub, work, env)  # warm-up: page cache, imports
            run_side("hf", hub, work, env)
            for i in range(args.rounds):
                order = ("kit", "hf") if i % 2 == 0 else ("hf", "kit")
                result = {side: run_side(side, hub, work, env) for side in order}
                if result["kit"]["files"] != result["hf"]["files"] or result["kit"]["bytes"] != result["hf"]["bytes"]:
                    raise SystemExit(f"the two sides fetched different files: {result}")
                rounds.append({"order": list(order), **result})

    total = rounds[0]["kit"]["bytes"]
    mbps = {side: [total / r[side]["seconds"] / 1e6 for r in rounds] for side in ("kit", "hf")}
    ratios = [k / h for k, h in zip(mbps["kit"], mbps["hf"], strict=True)]
    q1, q3 = quartiles(ratios)
    summary = {
        "bytes": total,
        "files": rounds[0]["kit"]["files"],
        "rounds": len(rounds),
        "kit_mb_s_median": statistics.median(mbps["kit"]),
        "hf_mb_s_median": statistics.median(mbps["hf"]),
        "kit_transfer_mb_s_median": statistics.median(total / r["kit"]["kit_transfer_seconds"] / 1e6 for r in rounds),
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_q1": q1,
        "ratio_q3": q3,
        "goal": 0.95,
        "per_round": rounds,
        "python": sys.version.split()[0],
        "huggingface_hub": __import__("huggingface_hub").__version__,
        "cpus": os.cpu_count(),
    }
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{len(summary['files'])} files, {total / 1e6:.0f} MB, {len(rounds)} rounds (order alternating)")
    print(f"{'round':>5}  {'first':>5}  {'kit s':>7}  {'hf s':>7}  {'kit MB/s':>9}  {'hf MB/s':>8}  {'kit/hf':>6}")
    for i, r in enumerate(rounds):
        print(
            f"{i + 1:>5}  {r['order'][0]:>5}  {r['kit']['seconds']:>7.2f}  {r['hf']['seconds']:>7.2f}  "
            f"{mbps['kit'][i]:>9.0f}  {mbps['hf'][i]:>8.0f}  {ratios[i]:>6.2f}"
        )
    print(
        f"median kit {summary['kit_mb_s_median']:.0f} MB/s (transfer alone "
        f"{summary['kit_transfer_mb_s_median']:.0f}), hf {summary['hf_mb_s_median']:.0f} MB/s; "
        f"kit/hf {summary['ratio_median']:.2f}x (min {summary['ratio_min']:.2f}, Q1 {q1:.2f}, Q3 {q3:.2f}, "
        f"max {summary['ratio_max']:.2f}); goal >= 0.95x"
    )


if __name__ == "__main__":
    main()
