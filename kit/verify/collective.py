"""Collective probe: an all-reduce and/or an all-to-all across every GPU of every node, with
bus bandwidth per message size.

Self-contained on purpose (standard library at import time, torch imported in the workers):
kit runs it inside arbitrary images as `python3 collective.py` or `python3 -c "<source>"`.
One invocation per node; it forks one worker per local GPU (fork, so it also works from `-c`;
the parent never touches CUDA). Rendezvous is torch.distributed's TCP store at the head:

    MASTER_ADDR, MASTER_PORT   the head's node IP and a free port
    KIT_NODE_RANK, KIT_NNODES  this node's rank and the number of nodes (NODE_RANK/NNODES too)
    KIT_NPROC                  workers on this node (default: visible GPUs, else 1 on CPU/Gloo)
    KIT_SIZES                  message sizes, e.g. "1M,32M,1G" (default: by backend, below)
    KIT_COLLECTIVES            "all-reduce" (default), "all-to-all" or "all-reduce,all-to-all"
    KIT_LATENCY                decode latency: "auto" (default), "off" or methods (latency.py)

NCCL_DEBUG=INFO goes to per-process files (NCCL_DEBUG_FILE) so the JSON on stdout stays clean;
the captured lines are returned for kit to classify (kit.verify.nccl). Bus bandwidth follows
nccl-tests: all-reduce busbw = algbw x 2(n-1)/n, all-to-all busbw = algbw x (n-1)/n (alltoall_perf;
the message size is each rank's whole send buffer), timed with CUDA events over many iterations.

Decode latency (issue 30): after the bandwidth loop, the workers time bf16 all-reduces of 4 KiB
to 1 MiB the way tensor-parallel decode runs them (in CUDA graphs, NCCL called directly), with the
code of latency.py. That file ships beside this one (kit.resources.PROBE_FILES) and is loaded from
there; sent with `python3 -c`, its source follows this one (kit.verify.runner.collective_source)
and its last line starts main() once both are defined.

All-to-all is what expert parallelism (MoE) sends between every pair of GPUs. On Gloo (CPU) it
uses torch's all_to_all_single, which ProcessGroupGloo implements (checked on torch 2.13.0+cpu);
where a torch build refuses it, the probe falls back to the same exchange built from
isend/irecv pairs and says so in `method` and `fallback_reason`.

It stays stdlib-only, so it runs its one subprocess (nvidia-smi) with the standard library's
subprocess, not kit.proc: inside the container there is no kit. It is one of the two modules of
kit/ allowed to (with probe.py; tests/unit/test_runtime_protocols.py checks the rest).
"""

from __future__ import annotations

import argparse
import glob
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
# Gloo on CPU moves ~1 GB/s between containers: 1 GiB messages would take most of a minute and
# prove nothing more than 16 MiB does (measured on the 2-node CPU cluster).
DEFAULT_SIZES = {"nccl": "1M,32M,256M,1G", "gloo": "1M,16M"}


def parse_size(text: str) -> int:
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1] if t and t[-1] in _UNITS else ""
    return int(float(t[: len(t) - len(unit)]) * _UNITS[unit])


def busbw(algbw: float, world_size: int) -> float:
    """All-reduce bus bandwidth (nccl-tests all_reduce_perf)."""
    return algbw * 2 * (world_size - 1) / world_size if world_size > 1 else algbw


def alltoall_busbw(algbw: float, world_size: int) -> float:
    """All-to-all bus bandwidth (nccl-tests alltoall_perf): each rank keeps 1/n of its buffer."""
    return algbw * (world_size - 1) / world_size if world_size > 1 else algbw


ALL_REDUCE, ALL_TO_ALL = "all-reduce", "all-to-all"
COLLECTIVES = (ALL_REDUCE, ALL_TO_ALL)


def parse_collectives(text: str | None) -> list[str]:
    """`all-reduce,all-to-all` / `both` -> the list, in kit's order; unknown names are an error."""
    names = [t.strip() for t in (text or ALL_REDUCE).split(",") if t.strip()]
    if names == ["both"]:
        return list(COLLECTIVES)
    bad = [n for n in names if n not in COLLECTIVES]
    if bad or not names:
        what = ", ".join(bad) or repr(text)
        raise ValueError(f"unknown collective {what} (use all-reduce, all-to-all or both)")
    return [c for c in COLLECTIVES if c in names]


def _env(*names: str, default: str | None = None) -> str | None:
    for name in names:
        if os.environ.get(name):
            return os.environ[name]
    return default


def local_gpu_count() -> int:
    """GPUs this node may use, without initialising CUDA in the parent (workers are forked)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for ln in out.stdout.splitlines() if ln.startswith("GPU ")) if out.returncode == 0 else 0


def _worker(local_rank: int, cfg: dict[str, Any], outdir: str) -> None:
    rank = cfg["node_rank"] * cfg["nproc"] + local_rank
    result: dict[str, Any] = {"rank": rank, "local_rank": local_rank, "error": None}
    try:
        result.update(_measure(rank, local_rank, cfg))
    except BaseException as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-2000:]
    with open(os.path.join(outdir, f"rank{local_rank}.json"), "w") as fh:
        json.dump(result, fh)
    os._exit(0 if result["error"] is None else 1)


def _measure(rank: int, local_rank: int, cfg: dict[str, Any]) -> dict[str, Any]:
    import datetime

    import torch  # type: ignore[import-not-found,unused-ignore]
    import torch.distributed as dist  # type: ignore[import-not-found,unused-ignore]

    world = cfg["world_size"]
    gpu = cfg["backend"] == "nccl"
    if gpu:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
    dist.init_process_group(
        cfg["backend"],
        init_method=f"tcp://{cfg['master_addr']}:{cfg['master_port']}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=cfg["timeout_s"]),
    )
    out: dict[str, Any] = {"device": str(device), "torch": torch.__version__}
    if gpu:
        out["device_name"] = torch.cuda.get_device_name(local_rank)
        out["nccl"] = ".".join(str(p) for p in torch.cuda.nccl.version())

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize()

    def timed(op: Any, nbytes: int, bus: Any, budget_s: float | None = None) -> dict[str, Any]:
        """Time `op()` like nccl-tests: warm up, agree on one iteration count (every rank must
        run the same number of collectives), then that many back to back; the slowest rank's
        time counts."""
        for _ in range(cfg["warmup"]):
            op()
        sync()
        t0 = time.perf_counter()
        for _ in range(3):
            op()
        sync()
        est = torch.tensor([(time.perf_counter() - t0) / 3], dtype=torch.float64, device=device)
        dist.all_reduce(est, op=dist.ReduceOp.MAX)
        budget = cfg["budget_s"] if budget_s is None else budget_s
        iters = int(min(cfg["max_iters"], max(cfg["min_iters"], budget / max(est.item(), 1e-7))))
        dist.barrier()
        sync()
        if gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                op()
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                op()
            elapsed = time.perf_counter() - t0
        slowest = torch.tensor([elapsed], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        per_call = slowest.item() / iters
        algbw = nbytes / per_call / 1e9
        return {
            "bytes": nbytes,
            "iters": iters,
            "time_us": round(per_call * 1e6, 2),
            "algbw_gbps": round(algbw, 2),
            "busbw_gbps": round(bus(algbw, world), 2),
        }

    collectives: dict[str, Any] = {}
    if ALL_REDUCE in cfg["collectives"]:
        # Correctness: integers small enough to be exact in float32.
        n = 1 << 20
        pattern = torch.arange(n, device=device, dtype=torch.float32).remainder_(251).add_(1)
        t = pattern * (rank + 1)
        dist.all_reduce(t)
        correct = bool(torch.equal(t, pattern * (world * (world + 1) // 2)))
        results = []
        for size in cfg["sizes"]:
            buf = torch.zeros(max(size // 4, 1), device=device, dtype=torch.float32)
            results.append(timed(lambda b=buf: dist.all_reduce(b), buf.numel() * 4, busbw))
            del buf
        # torch.distributed reduces in place: nccl-tests' "in-place" columns compare with these.
        collectives[ALL_REDUCE] = {"correct": correct, "results": results, "placement": "in-place"}
    if ALL_TO_ALL in cfg["collectives"]:
        collectives[ALL_TO_ALL] = _all_to_all(torch, dist, rank, world, device, cfg, timed)
    if ALL_REDUCE in cfg["collectives"] and cfg["latency"]:
        # Last: the transport verdict reads every NCCL line logged before it (latency.py).
        latency = _latency_code().LatencyProbe(torch, dist, rank, world, device, cfg, timed)
        collectives[ALL_REDUCE]["latency"] = latency.measure()
        out["nccl_log_cut"] = latency.log_cut
    first = collectives[cfg["collectives"][0]]
    out["collectives"] = collectives
    out["correct"] = all(c["correct"] for c in collectives.values())
    out["results"] = first["results"]
    dist.barrier()
    dist.destroy_process_group()
    return out


def _all_to_all(
    torch: Any, dist: Any, rank: int, world: int, device: Any, cfg: dict[str, Any], timed: Any
) -> dict[str, Any]:
    """all_to_all_single, checked element by element, then timed per size (busbw x (n-1)/n)."""
    # KIT_A2A_METHOD=send/recv forces the fallback (tests exercise it on a torch that has both).
    method, reason = os.environ.get("KIT_A2A_METHOD") or "all_to_all_single", None

    def exchange(out_t: Any, in_t: Any) -> None:
        if method == "all_to_all_single":
            dist.all_to_all_single(out_t, in_t)
            return
        # Fallback: the same exchange from point-to-point pairs (chunk j of rank r -> rank j).
        ins, outs = in_t.chunk(world), out_t.chunk(world)
        outs[rank].copy_(ins[rank])
        ops = []
        for peer in range(world):
            if peer != rank:
                ops.append(dist.P2POp(dist.isend, ins[peer].contiguous(), peer))
                ops.append(dist.P2POp(dist.irecv, outs[peer], peer))
        for req in dist.batch_isend_irecv(ops) if ops else []:
            req.wait()

    # Chunk j of rank r holds base + 256*(r*world + j): exact in float32 up to 128 ranks, and a
    # chunk landing in the wrong place or from the wrong rank cannot compare equal.
    n = 1 << 12
    base = torch.arange(n, device=device, dtype=torch.float32).remainder_(251)
    send = torch.cat([base + 256 * (rank * world + j) for j in range(world)])
    want = torch.cat([base + 256 * (j * world + rank) for j in range(world)])
    got = torch.empty_like(send)
    try:
        exchange(got, send)
    except RuntimeError as exc:  # a torch build whose Gloo lacks alltoall
        method, reason = "send/recv", f"all_to_all_single refused: {exc}"[:300]
        exchange(got, send)
    correct = bool(torch.equal(got, want))
    results = []
    for size in cfg["sizes"]:
        count = max(size // 4 // world, 1) * world  # divisible by the number of ranks
        src = torch.zeros(count, device=device, dtype=torch.float32)
        dst = torch.empty_like(src)
        results.append(timed(lambda a=dst, b=src: exchange(a, b), count * 4, alltoall_busbw))
        del src, dst
    return {"correct": correct, "results": results, "method": method, "fallback_reason": reason}


def _latency_code() -> Any:
    """latency.py: the file beside this one, or (sent with -c) the source that followed this one."""
    if "__file__" not in globals():
        return sys.modules[__name__]
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "latency.py")
    spec = importlib.util.spec_from_file_location("kit_probe_latency", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nccl_lines(logdir: str, cut: dict[str, int]) -> list[str]:
    """Every process's NCCL lines, each file up to its `cut` (the latency communicator's start)."""
    lines: list[str] = []
    for path in sorted(glob.glob(os.path.join(logdir, "nccl.*.log"))):
        with open(path, "rb") as fh:
            text = fh.read(cut.get(os.path.basename(path), -1)).decode(errors="replace")
        lines.extend(ln for ln in text.splitlines() if "NCCL" in ln)
    return lines


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="kit-collective-")
    if cfg["backend"] == "nccl":
        os.environ.setdefault("NCCL_DEBUG", "INFO")
        os.environ.setdefault("NCCL_DEBUG_FILE", os.path.join(workdir, "nccl.%h.%p.log"))
    cfg = {**cfg, "workdir": workdir}
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_worker, args=(i, cfg, workdir)) for i in range(cfg["nproc"])]
    for p in procs:
        p.start()
    deadline = time.monotonic() + cfg["timeout_s"] + 60
    error = None
    while any(p.is_alive() for p in procs):
        failed = [p for p in procs if p.exitcode not in (None, 0)]
        if failed or time.monotonic() > deadline:
            # One rank failed or all hang: the others would wait for it until their timeout.
            grace = time.monotonic() + (3 if failed else 0)
            while time.monotonic() < grace and any(p.is_alive() for p in procs):
                time.sleep(0.1)
            for p in procs:
                if p.is_alive():
                    p.kill()
            if not failed:
                error = f"timed out after {cfg['timeout_s'] + 60}s"
            break
        time.sleep(0.05)
    for p in procs:
        p.join()
    ranks = []
    for i in range(cfg["nproc"]):
        path = os.path.join(workdir, f"rank{i}.json")
        if os.path.exists(path):
            with open(path) as fh:
                ranks.append(json.load(fh))
        else:
            ranks.append({"local_rank": i, "error": error or f"worker exited with {procs[i].exitcode}"})
    errors = [r["error"] for r in ranks if r.get("error")]
    lead = ranks[0] if ranks else {}
    return {
        "probe": "collective",
        "hostname": socket.gethostname(),
        "backend": cfg["backend"],
        "node_rank": cfg["node_rank"],
        "nnodes": cfg["nnodes"],
        "nproc": cfg["nproc"],
        "world_size": cfg["world_size"],
        "master": f"{cfg['master_addr']}:{cfg['master_port']}",
        "ok": not errors,
        "error": errors[0] if errors else None,
        "correct": all(r.get("correct") is True for r in ranks) and not errors,
        "results": lead.get("results", []),
        "collectives": _merge_ranks(ranks, cfg["collectives"]),
        "ranks": [{k: v for k, v in r.items() if k not in ("results", "collectives", "nccl_log_cut")} for r in ranks],
        "torch": lead.get("torch"),
        "nccl": lead.get("nccl"),
        "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "GLOO_"))},
        "nccl_lines": _nccl_lines(workdir, {k: v for r in ranks for k, v in (r.get("nccl_log_cut") or {}).items()}),
        "wall_s": round(time.monotonic() - started, 3),
    }


def _merge_ranks(ranks: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Per collective: rank 0's numbers, correct only when every local rank was."""
    lead = (ranks[0] if ranks else {}).get("collectives") or {}
    merged = {}
    for name in names:
        per_rank = [(r.get("collectives") or {}).get(name) or {} for r in ranks]
        merged[name] = {
            **(lead.get(name) or {"results": []}),
            "correct": bool(per_rank) and all(p.get("correct") is True for p in per_rank),
        }
    return merged


def config(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="kit-collective", description=__doc__)
    p.add_argument("--master-addr", default=_env("MASTER_ADDR", default="127.0.0.1"))
    p.add_argument("--master-port", type=int, default=int(_env("MASTER_PORT", default="29512") or 0))
    p.add_argument("--node-rank", type=int, default=int(_env("KIT_NODE_RANK", "NODE_RANK", default="0") or 0))
    p.add_argument("--nnodes", type=int, default=int(_env("KIT_NNODES", "NNODES", default="1") or 1))
    p.add_argument("--nproc", type=int, default=int(_env("KIT_NPROC", default="0") or 0))
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default=_env("KIT_BACKEND", default="auto"))
    p.add_argument("--sizes", default=_env("KIT_SIZES"), help="default: by backend")
    p.add_argument(
        "--collective",
        default=_env("KIT_COLLECTIVES", default=ALL_REDUCE),
        help="all-reduce, all-to-all, both (or a comma list)",
    )
    p.add_argument("--budget-s", type=float, default=float(_env("KIT_BUDGET_S", default="0.5") or 0.5))
    p.add_argument("--latency", default=_env("KIT_LATENCY", default="auto"), help="auto, off or methods")
    p.add_argument("--latency-sizes", default=_env("KIT_LATENCY_SIZES", default="4K,8K,16K,32K,64K,128K,256K,512K,1M"))
    p.add_argument("--latency-budget-s", type=float, default=float(_env("KIT_LATENCY_BUDGET_S", default="0.05") or 0))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--max-iters", type=int, default=1000)
    p.add_argument("--timeout-s", type=int, default=int(_env("KIT_TIMEOUT_S", default="120") or 120))
    a = p.parse_args(argv)
    gpus = local_gpu_count()
    backend = a.backend if a.backend != "auto" else ("nccl" if gpus else "gloo")
    nproc = a.nproc or (gpus if backend == "nccl" else 1)
    return {
        "master_addr": a.master_addr,
        "master_port": a.master_port,
        "node_rank": a.node_rank,
        "nnodes": a.nnodes,
        "nproc": nproc,
        "world_size": nproc * a.nnodes,
        "backend": backend,
        "sizes": [parse_size(s) for s in (a.sizes or DEFAULT_SIZES[backend]).split(",") if s.strip()],
        "collectives": parse_collectives(a.collective),
        "budget_s": a.budget_s,
        "latency": _latency_code().parse_latency(a.latency, backend),
        "latency_sizes": [parse_size(s) for s in a.latency_sizes.split(",") if s.strip()],
        "latency_budget_s": a.latency_budget_s,
        "warmup": a.warmup,
        "min_iters": a.min_iters,
        "max_iters": a.max_iters,
        "timeout_s": a.timeout_s,
    }


def main(argv: list[str] | None = None) -> int:
    result = run(config(argv))
    print(json.dumps(result, sort_keys=True))
    return 0 if result["ok"] else 1


if __name__ == "__main__" and "__file__" in globals():  # python3 collective.py (with -c: latency.py)
    sys.exit(main())
