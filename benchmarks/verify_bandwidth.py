"""kit's collective probe vs nccl-tests, side by side on this host's GPUs (issues 5 and 30).

- Bus bandwidth at 32 MiB and 1 GiB with P2P (default), SHM (NCCL_P2P_DISABLE=1) and Socket
  (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1): kit's all-reduce (torch.distributed, in place, float32)
  against `all_reduce_perf`'s in-place column (float). Goal: kit/nccl-tests within 0.97-1.03.
- All-reduce latency at decode sizes (4 KiB-1 MiB, bf16), per latency method of the probe
  (kit/verify/latency.py), against `all_reduce_perf -d bfloat16` with one thread per GPU
  (`-t N -g 1`, the goal's reference) and with one thread driving every GPU (`-g N`), out of place
  and in place. Goal: kit/nccl-tests(-t N -g 1) <= 1.2 from 8 KiB to 1 MiB.

nccl-tests and kit alternate within each round (nccl-tests first in even rounds, kit first in odd
ones); the tables show the median of the rounds. The script does not build nccl-tests: pass an
`all_reduce_perf` built against the NCCL that torch uses (`--nccl-tests`, the binary or its
folder); its banner's `nccl-library=` is compared with torch's NCCL and printed. With `--raw DIR`
every raw output (nccl-tests' stdout, the probe's JSON) is kept there, named by what ran.

    python benchmarks/verify_bandwidth.py --nccl-tests PATH [--python python3] [--rounds 3]
        [--methods nccl-graph,nccl-eager,torch-graph,torch-eager] [--transports p2p,shm,socket]
        [--budget 2] [--gpus N] [--raw DIR] [--skip-verify] [--json] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COLLECTIVE = ROOT / "kit" / "verify" / "collective.py"

FORCED = {
    "p2p": {},
    "shm": {"NCCL_P2P_DISABLE": "1"},
    "socket": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"},
}
# Iterations of all_reduce_perf (-w warm-up, -n timed) by transport: Socket moves 4 GB/s, so
# 100 timed 1 GiB all-reduces would take a minute there.
NT_ITERS = {"p2p": ("20", "100"), "shm": ("5", "20"), "socket": ("5", "20")}
BW_SIZES = (32 << 20, 1 << 30)
BW_GOAL = (0.97, 1.03)
LAT_GOAL, LAT_FROM = 1.2, 8 << 10
DEFAULT_METHODS = "nccl-graph,nccl-eager,torch-graph,torch-eager"

_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)\s+(.*)$")
_BANNER = re.compile(r"nccl-tests version (\S+) nccl-headers=(\d+) nccl-library=(\d+)")


# --- pure: reading nccl-tests and the probe, comparing -----------------------------------------


def nccl_version(code: int) -> str:
    """NCCL_VERSION_CODE (22809) -> "2.28.9"."""
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def parse_nccl_tests(text: str) -> dict[str, Any]:
    """all_reduce_perf's stdout -> its version banner and one row per size: out-of-place and
    in-place time (us) and busbw (GB/s), #wrong (None when not checked)."""
    rows = []
    for line in text.splitlines():
        m = _ROW.match(line)
        if not m:
            continue
        cells = m.group(6).split()
        if len(cells) < 8:
            continue
        oop, ip = cells[:4], cells[4:8]
        rows.append(
            {
                "bytes": int(m.group(1)),
                "type": m.group(3),
                "oop_us": float(oop[0]),
                "oop_busbw": float(oop[2]),
                "ip_us": float(ip[0]),
                "ip_busbw": float(ip[2]),
                "wrong": None if "N/A" in (oop[3], ip[3]) else int(float(oop[3])) + int(float(ip[3])),
            }
        )
    banner = _BANNER.search(text)
    return {
        "nccl_tests": banner.group(1) if banner else None,
        "nccl_headers": nccl_version(int(banner.group(2))) if banner else None,
        "nccl_library": nccl_version(int(banner.group(3))) if banner else None,
        "rows": rows,
    }


def probe_json(stdout: str) -> dict[str, Any]:
    """The last JSON object the collective probe printed."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            data: dict[str, Any] = json.loads(line)
            return data
    raise ValueError("the collective probe printed no JSON")


def kit_latency(doc: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """method -> its rows, from one probe result (the headline method and the `others`)."""
    top = ((doc.get("collectives") or {}).get("all-reduce") or {}).get("latency") or {}
    runs = [top, *(top.get("others") or [])] if top else []
    return {str(r["method"]): list(r.get("results") or []) for r in runs if r.get("method") and not r.get("error")}


def _median(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return round(statistics.median(got), 2) if got else None


def _ratio(kit: float | None, ref: float | None) -> float | None:
    return round(kit / ref, 3) if kit is not None and ref else None


def compare_latency(
    kit_runs: Sequence[Mapping[str, Any]],
    nt_thread: Sequence[Mapping[str, Any]],
    nt_one: Sequence[Mapping[str, Any]],
    nt_graph: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """One row per (method, size): medians over the rounds of kit (probe JSONs), nccl-tests with
    one thread per GPU (parsed -t N -g 1 runs), with one thread for all GPUs (-g N) and with one
    thread per GPU in CUDA graphs (-G), and the ratios kit / nccl-tests(-t N -g 1), out of place
    and in place (the goal's), and in place against -G."""

    def by_size(runs: Sequence[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
        out: dict[int, list[Mapping[str, Any]]] = {}
        for run in runs:
            for row in run["rows"]:
                out.setdefault(row["bytes"], []).append(row)
        return out

    thread, one, graph = by_size(nt_thread), by_size(nt_one), by_size(nt_graph)
    per_method: dict[str, dict[int, list[Mapping[str, Any]]]] = {}
    for doc in kit_runs:
        for method, rows in kit_latency(doc).items():
            for row in rows:
                per_method.setdefault(method, {}).setdefault(row["bytes"], []).append(row)
    table = []
    for method, sizes in per_method.items():
        for size in sorted(sizes):
            kit_oop = _median([r.get("out_of_place_us") for r in sizes[size]])
            kit_ip = _median([r.get("in_place_us") for r in sizes[size]])
            nt_oop = _median([r["oop_us"] for r in thread.get(size, [])])
            nt_ip = _median([r["ip_us"] for r in thread.get(size, [])])
            nt_graph_ip = _median([r["ip_us"] for r in graph.get(size, [])])
            ratio_ip, ratio_oop = _ratio(kit_ip, nt_ip), _ratio(kit_oop, nt_oop)
            worst = max((r for r in (ratio_ip, ratio_oop) if r is not None), default=None)
            table.append(
                {
                    "method": method,
                    "bytes": size,
                    "kit_oop_us": kit_oop,
                    "kit_ip_us": kit_ip,
                    "nt_oop_us": nt_oop,
                    "nt_ip_us": nt_ip,
                    "nt_one_proc_ip_us": _median([r["ip_us"] for r in one.get(size, [])]),
                    "nt_graph_ip_us": nt_graph_ip,
                    "ratio_oop": ratio_oop,
                    "ratio_ip": ratio_ip,
                    "ratio_ip_graph": _ratio(kit_ip, nt_graph_ip),
                    "meets_goal": None if size < LAT_FROM or worst is None else worst <= LAT_GOAL,
                }
            )
    return table


def compare_bandwidth(
    transport: str, kit_runs: Sequence[Mapping[str, Any]], nt_runs: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """busbw at BW_SIZES: kit's all-reduce (in place) against all_reduce_perf's in-place column."""
    out = []
    for size in BW_SIZES:
        kit = _median([r["busbw_gbps"] for doc in kit_runs for r in doc.get("results") or [] if r["bytes"] == size])
        ref = _median([r["ip_busbw"] for run in nt_runs for r in run["rows"] if r["bytes"] == size])
        ratio = _ratio(kit, ref)
        out.append(
            {
                "forced": transport,
                "bytes": size,
                "kit_busbw_gbps": kit,
                "nccl_tests_busbw_gbps": ref,
                "ratio": ratio,
                "meets_goal": None if ratio is None else BW_GOAL[0] <= ratio <= BW_GOAL[1],
            }
        )
    return out


def _size(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 else f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def _f(v: float | None, width: int, digits: int = 2) -> str:
    return f"{v:>{width}.{digits}f}" if v is not None else f"{'-':>{width}}"


def _goal(ok: bool | None) -> str:
    return "" if ok is None else "ok" if ok else "MISSED"


def render(summary: Mapping[str, Any]) -> str:
    gpus, lines = summary["gpus"], []
    lines.append(
        f"nccl-tests {summary['nccl_tests']} (nccl-library {summary['nccl_library']}), torch's NCCL "
        f"{summary['torch_nccl']}, {gpus} GPUs, median of {summary['rounds']} round(s)"
    )
    lines.append(f"\nBus bandwidth, kit (in place, float32) / all_reduce_perf -t {gpus} -g 1 (in place, float)")
    if summary["nccl_library"] != summary["torch_nccl"]:
        lines.append("WARNING: nccl-tests ran another NCCL than torch's: the ratios compare two libraries")
    head = f"{'forced':8} {'seen':8} {'size':>7} {'kit':>8} {'nt':>8} {'ratio':>6}"
    lines.append(f"{head}  goal {BW_GOAL[0]}-{BW_GOAL[1]}")
    for r in summary["bandwidth"]:
        lines.append(
            f"{r['forced']:8} {r.get('seen') or '?':8} {_size(r['bytes']):>7} {_f(r['kit_busbw_gbps'], 8, 1)} "
            f"{_f(r['nccl_tests_busbw_gbps'], 8, 1)} {_f(r['ratio'], 6, 3)}  {_goal(r['meets_goal'])}"
        )
    methods = list(dict.fromkeys(r["method"] for r in summary["latency"]))
    for method in methods:
        lines.append(
            f"\nLatency (us, bf16) of kit {method} vs all_reduce_perf -d bfloat16 -t {gpus} -g 1 (nt), "
            f"-g {gpus} (nt1p), -t {gpus} -g 1 -G 10 (ntG); r: kit/nt, goal <= {LAT_GOAL} from {_size(LAT_FROM)}"
        )
        lines.append(
            f"{'size':>7} {'nt oop':>7} {'nt ip':>7} {'nt1p ip':>7} {'ntG ip':>7} {'kit oop':>8} {'kit ip':>7} "
            f"{'r oop':>6} {'r ip':>6} {'kit/ntG':>7}  goal"
        )
        for r in (r for r in summary["latency"] if r["method"] == method):
            lines.append(
                f"{_size(r['bytes']):>7} {_f(r['nt_oop_us'], 7)} {_f(r['nt_ip_us'], 7)} "
                f"{_f(r['nt_one_proc_ip_us'], 7)} {_f(r.get('nt_graph_ip_us'), 7)} {_f(r['kit_oop_us'], 8)} "
                f"{_f(r['kit_ip_us'], 7)} {_f(r['ratio_oop'], 6, 3)} {_f(r['ratio_ip'], 6, 3)} "
                f"{_f(r.get('ratio_ip_graph'), 7, 3)}  {_goal(r['meets_goal'])}"
            )
    if summary.get("verify_host"):
        v = summary["verify_host"]
        lines.append(f"\nkit verify --host: exit {v['exit']}, {v['wall_s']:.1f} s (target <= 30 s)")
    return "\n".join(lines)


# --- running -----------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.raw: Path | None = args.raw
        self.port = 29600

    def keep(self, name: str, text: str) -> None:
        if self.raw is not None:
            self.raw.mkdir(parents=True, exist_ok=True)
            (self.raw / name).write_text(text)

    def nccl_tests(self, name: str, transport: str, argv: list[str]) -> dict[str, Any]:
        env = {**os.environ, **FORCED[transport]}
        warm, iters = NT_ITERS[transport]
        cmd = [str(self.args.nccl_tests), *argv, "-w", warm, "-n", iters]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
        self.keep(f"{name}.txt", f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
        parsed = parse_nccl_tests(proc.stdout)
        if proc.returncode != 0 or not parsed["rows"]:
            raise SystemExit(f"{' '.join(cmd)}: exit {proc.returncode}\n{(proc.stdout + proc.stderr)[-3000:]}")
        return parsed

    def kit(self, name: str, transport: str, latency: str) -> dict[str, Any]:
        self.port += 1
        env = {
            **os.environ,
            **FORCED[transport],
            "KIT_SIZES": ",".join(str(s) for s in BW_SIZES),
            "KIT_BUDGET_S": str(self.args.budget),
            "KIT_LATENCY": latency,
            "MASTER_PORT": str(self.port),
        }
        argv = [self.args.python, str(COLLECTIVE)]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
        self.keep(f"{name}.json", proc.stdout)
        try:
            return probe_json(proc.stdout)
        except ValueError:
            raise SystemExit(f"{name}: the collective probe failed\n{proc.stderr[-3000:]}") from None


def run(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from kit.verify.nccl import summarize_lines

    bench, n = Bench(args), args.gpus
    thread_argv = ["-t", str(n), "-g", "1"]
    kit_runs: list[dict[str, Any]] = []
    nt: dict[str, list[dict[str, Any]]] = {"thread": [], "one": [], "graph": [], "p2p_bw": []}
    for rnd in range(args.rounds):
        steps = ["nccl-tests", "kit"] if rnd % 2 == 0 else ["kit", "nccl-tests"]
        for step in steps:
            if step == "kit":
                methods = args.methods.split(",")
                kit_runs.append(bench.kit(f"kit_p2p_r{rnd}", "p2p", ",".join(methods[:: 1 if rnd % 2 == 0 else -1])))
                continue
            bf16 = ["-b", "4K", "-e", "1M", "-f", "2", "-d", "bfloat16"]
            nt["thread"].append(bench.nccl_tests(f"nt_t{n}g1_bf16_r{rnd}", "p2p", [*bf16, *thread_argv]))
            nt["one"].append(bench.nccl_tests(f"nt_t1g{n}_bf16_r{rnd}", "p2p", [*bf16, "-t", "1", "-g", str(n)]))
            graph = [*bf16, *thread_argv, "-G", "10"]  # its 100 timed ops in one graph, 10 replays
            nt["graph"].append(bench.nccl_tests(f"nt_t{n}g1_bf16_G10_r{rnd}", "p2p", graph))
            full = ["-b", "4K", "-e", "1G", "-f", "2", *thread_argv]
            nt["p2p_bw"].append(bench.nccl_tests(f"nt_t{n}g1_float_r{rnd}", "p2p", full))
    bandwidth = compare_bandwidth("p2p", kit_runs, nt["p2p_bw"])
    bandwidth[0]["seen"] = bandwidth[1]["seen"] = _seen(summarize_lines, kit_runs)
    for transport in (t for t in args.transports.split(",") if t != "p2p"):
        argv = ["-b", "32M", "-e", "1G", "-f", "32", *thread_argv]
        refs, docs = [], []
        for rnd in range(min(args.rounds, 2)):  # Socket is slow: two rounds at most, alternating
            for step in ["nccl-tests", "kit"] if rnd % 2 == 0 else ["kit", "nccl-tests"]:
                if step == "kit":
                    docs.append(bench.kit(f"kit_{transport}_r{rnd}", transport, "off"))
                else:
                    refs.append(bench.nccl_tests(f"nt_t{n}g1_float_{transport}_r{rnd}", transport, argv))
        rows = compare_bandwidth(transport, docs, refs)
        for r in rows:
            r["seen"] = _seen(summarize_lines, docs)
        bandwidth += rows
    first = nt["thread"][0]
    summary: dict[str, Any] = {
        "gpus": n,
        "rounds": args.rounds,
        "nccl_tests": first["nccl_tests"],
        "nccl_library": first["nccl_library"],
        "torch_nccl": kit_runs[0].get("nccl"),
        "bandwidth": bandwidth,
        "latency": compare_latency(kit_runs, nt["thread"], nt["one"], nt["graph"]),
        "latency_methods": {
            m: {k: v for k, v in r.items() if k not in ("results", "others")}
            for doc in kit_runs[:1]
            for m, r in _latency_runs(doc).items()
        },
    }
    if not args.skip_verify:
        summary["verify_host"] = verify_host(bench, args.python)
    return summary


def _latency_runs(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    top = ((doc.get("collectives") or {}).get("all-reduce") or {}).get("latency") or {}
    return {str(r.get("method")): r for r in [top, *(top.get("others") or [])] if top}


def _seen(summarize: Any, docs: Sequence[Mapping[str, Any]]) -> str:
    worst = summarize(docs[0].get("nccl_lines") or []).intra_worst if docs else None
    return str(worst.value) if worst is not None else "?"


def verify_host(bench: Bench, python: str) -> dict[str, Any]:
    started = time.monotonic()
    argv = [python, "-m", "kit", "verify", "--host", "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False, timeout=600)
    wall = time.monotonic() - started
    bench.keep("kit_verify_host.json", proc.stdout)
    return {"exit": proc.returncode, "wall_s": round(wall, 2)}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nccl-tests", required=True, type=Path, help="all_reduce_perf, or the folder that holds it")
    p.add_argument("--python", default=sys.executable, help="the Python with torch that runs kit's probe")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--methods", default=DEFAULT_METHODS, help="latency methods of the probe to compare")
    p.add_argument("--transports", default="p2p,shm,socket")
    p.add_argument("--budget", type=float, default=2.0, help="kit's timed seconds per bandwidth size")
    p.add_argument("--gpus", type=int, help="GPUs to use (default: all that nvidia-smi -L lists)")
    p.add_argument("--raw", type=Path, help="keep every raw output in this folder")
    p.add_argument("--skip-verify", action="store_true", help="do not time a whole `kit verify --host`")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--out", type=Path, help="also write the summary JSON here")
    args = p.parse_args(argv)
    if args.nccl_tests.is_dir():
        args.nccl_tests = args.nccl_tests / "all_reduce_perf"
    if not (args.nccl_tests.is_file() and os.access(args.nccl_tests, os.X_OK)):
        p.error(f"--nccl-tests: {args.nccl_tests} is not an executable all_reduce_perf (build nccl-tests first)")
    if args.rounds < 1:
        p.error("--rounds: at least 1")
    bad = [t for t in args.transports.split(",") if t not in FORCED]
    if bad or "p2p" not in args.transports.split(","):
        p.error(f"--transports: p2p plus any of shm, socket (not {', '.join(bad) or args.transports})")
    if args.gpus is None:
        args.gpus = _gpu_count()
    if args.gpus < 2:
        p.error(f"--gpus: needs at least 2 GPUs, found {args.gpus}")
    return args


def _gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for ln in out.splitlines() if ln.startswith("GPU "))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    summary = run(args)
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2) if args.json else render(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
