"""Bus bandwidth of kit's collective probe vs nccl-tests, for the three forced transports.

Runs kit/verify/collective.py on this host (all local GPUs) with P2P (default), SHM
(NCCL_P2P_DISABLE=1) and Socket (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1), and prints busbw at
32 MiB and 1 GiB next to `all_reduce_perf` numbers measured on the same 2x H200 machine
(FIELD_NOTES section 5). Targets: ratio >= 0.97 at 1 GiB, >= 0.90 at 32 MiB. Then times a
whole `kit verify --host` (target <= 30 s on 2 GPUs).

    python benchmarks/verify_bandwidth.py [--python python3] [--out bench.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLLECTIVE = ROOT / "kit" / "verify" / "collective.py"

# nccl-tests all_reduce_perf busbw (GB/s) on 2x H200 NV18, NCCL 2.28.9.
NCCL_TESTS = {
    "p2p": {32 << 20: 241.2, 1 << 30: 327.3},
    "shm": {32 << 20: 27.2, 1 << 30: 27.6},
    "socket": {32 << 20: 4.1, 1 << 30: 4.0},
}
TARGETS = {32 << 20: 0.90, 1 << 30: 0.97}
FORCED = {
    "p2p": {},
    "shm": {"NCCL_P2P_DISABLE": "1"},
    "socket": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"},
}


def run_probe(python: str, transport: str, budget: float, port: int) -> dict[str, object]:
    env = {
        **os.environ,
        **FORCED[transport],
        "KIT_SIZES": "32M,1G",
        "KIT_BUDGET_S": str(budget),
        "MASTER_PORT": str(port),
    }
    proc = subprocess.run([python, str(COLLECTIVE)], capture_output=True, text=True, env=env, timeout=600, check=False)
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
    if line is None:
        raise SystemExit(f"{transport}: collective probe failed\n{proc.stderr[-3000:]}")
    result: dict[str, object] = json.loads(line)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--budget", type=float, default=2.0, help="timed seconds per size")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--skip-verify", action="store_true")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from kit.verify.nccl import summarize_lines

    rows = []
    report: dict[str, object] = {"runs": {}}
    for i, transport in enumerate(FORCED):
        result = run_probe(args.python, transport, args.budget, 29600 + i)
        summary = summarize_lines(result.get("nccl_lines") or [])  # type: ignore[arg-type]
        seen = summary.intra_worst.value if summary.intra_worst else "?"
        for r in result["results"]:  # type: ignore[attr-defined]
            ref = NCCL_TESTS[transport][r["bytes"]]
            ratio = r["busbw_gbps"] / ref
            ok = ratio >= TARGETS[r["bytes"]]
            rows.append((transport, seen, r["bytes"], r["iters"], r["busbw_gbps"], ref, ratio, ok))
        report["runs"][transport] = {  # type: ignore[index]
            "transport_seen": seen,
            "results": result["results"],
            "world_size": result["world_size"],
            "nccl": result.get("nccl"),
            "wall_s": result.get("wall_s"),
        }

    print(f"{'forced':8} {'seen':8} {'size':>8} {'iters':>6} {'kit busbw':>10} {'nccl-tests':>10} {'ratio':>6}  target")
    for transport, seen, size, iters, bw, ref, ratio, ok in rows:
        label = "1 GiB" if size == 1 << 30 else f"{size >> 20} MiB"
        print(
            f"{transport:8} {seen:8} {label:>8} {iters:>6} {bw:>10.1f} {ref:>10.1f} {ratio:>6.3f}  "
            f"{'ok' if ok else 'MISSED'} (>= {TARGETS[size]})"
        )
    report["rows"] = [
        {
            "forced": t,
            "seen": s,
            "bytes": b,
            "iters": it,
            "busbw_gbps": bw,
            "nccl_tests_gbps": ref,
            "ratio": round(ratio, 3),
            "meets_target": ok,
        }
        for t, s, b, it, bw, ref, ratio, ok in rows
    ]

    if not args.skip_verify:
        started = time.monotonic()
        proc = subprocess.run(
            [args.python, "-m", "kit", "verify", "--host", "--json"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        wall = time.monotonic() - started
        print(f"kit verify --host: exit {proc.returncode}, {wall:.1f} s (target <= 30 s)")
        report["verify_host"] = {"exit": proc.returncode, "wall_s": round(wall, 2)}

    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
