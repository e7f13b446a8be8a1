"""Decode latency for the collective probe (issue 30): all-reduces of 4 KiB to 1 MiB timed the
way tensor-parallel decode runs them, so the figure is the link's, not Python's launch overhead.

Part of the collective probe (kit/verify/collective.py), and like it it imports the standard
library only when loaded: torch comes from the probe's workers, NCCL through ctypes. It ships beside
collective.py (kit.resources.PROBE_FILES), which loads it from there; sent with `python3 -c`,
its source follows collective.py's in one program (kit.verify.runner.collective_source), and the
last lines below start the probe. Hence no `from __future__` import here (it would stand in the
middle of that program) and no top-level name that collective.py also defines (a unit test
checks both).

Methods (LATENCY_METHODS; `auto` takes the first of AUTO_METHODS that works on every rank):

    nccl-graph   ncclAllReduce through ctypes on the libnccl torch loaded, as nccl-tests calls
                 NCCL (no torch.distributed in between), GRAPH_OPS of them captured in one CUDA
                 graph and replayed, timed with CUDA events: what a decode step's graph does
    nccl-eager   the same calls launched back to back, as nccl-tests' own loop does
    torch-graph  torch.distributed all_reduce, GRAPH_OPS per CUDA graph, replayed
    torch-eager  torch.distributed all_reduce back to back (the bandwidth loop's way)
    gloo-eager   Gloo on CPU: back to back, timed by the wall clock; CUDA graphs need a GPU

bf16 on NCCL (what decode reduces), float32 on Gloo. nccl-* report out-of-place (separate send
and receive buffers, like vLLM's pynccl) and in-place figures, torch-* and gloo-* in-place only
(torch.distributed reduces in place). The ctypes calls run on a communicator of their own,
created after every other NCCL line was logged: `log_cut` says where each process's
NCCL_DEBUG_FILE stood then, and collective.py leaves the rest out of the transport verdict.
"""

import glob
import os
import sys
from typing import Any

LATENCY_METHODS = ("nccl-graph", "nccl-eager", "torch-graph", "torch-eager", "gloo-eager")
AUTO_METHODS = ("nccl-graph", "torch-graph", "torch-eager")
GRAPH_OPS = 64  # all-reduces per CUDA graph: two per layer in a 32-layer model's decode step
_NCCL_BF16, _NCCL_SUM = 9, 0  # ncclBfloat16, ncclSum (nccl.h)


def parse_latency(text: Any, backend: str) -> list[str]:
    """`auto` -> ["auto"] on NCCL, ["gloo-eager"] on Gloo; `off` -> []; else the named methods
    (one that cannot run on this backend reports so in its `error`)."""
    names = [t.strip() for t in (text or "auto").split(",") if t.strip()] or ["auto"]
    if names in (["off"], ["auto"]):
        return [] if names == ["off"] else ["auto"] if backend == "nccl" else ["gloo-eager"]
    bad = [n for n in names if n not in LATENCY_METHODS]
    if bad:
        raise ValueError(f"unknown latency method {', '.join(bad)} (use auto, off, {', '.join(LATENCY_METHODS)})")
    return names


class LatencyProbe:
    """One worker's latency measurement: torch, the process group, its rank, the probe's timer."""

    def __init__(self, torch: Any, dist: Any, rank: int, world: int, device: Any, cfg: dict[str, Any], timed: Any):
        self.torch, self.dist, self.rank, self.world, self.device = torch, dist, rank, world, device
        self.cfg, self.timed = cfg, timed
        self.nccl: Any = None  # a _LibNccl once opened
        self.log_cut: dict[str, int] = {}

    def measure(self) -> dict[str, Any]:
        """Every requested method's figures, the first one's on top; `auto` walks AUTO_METHODS
        and keeps the first that every rank could run, saying why it passed over the others."""
        asked = self.cfg["latency"]
        auto = asked == ["auto"]
        runs, passed_over = [], []
        for method in AUTO_METHODS if auto else asked:
            run = self.run(method)
            if auto and run["error"]:
                passed_over.append(f"{method}: {run['error']}")
                continue
            runs.append(run)
            if auto:
                break
        if self.nccl is not None:
            self.torch.cuda.synchronize()
            self.nccl.close()
        head = runs[0] if runs else {"method": None, "results": [], "error": "; ".join(passed_over)}
        return {
            **head,
            "requested": ",".join(asked),
            "fallback_reason": "; ".join(passed_over) or None,
            "others": runs[1:],
        }

    def run(self, method: str) -> dict[str, Any]:
        if method == "gloo-eager":
            return self.run_on_stream(method)
        # A stream of its own (non-blocking, as nccl-tests gives NCCL), not the legacy default
        # stream, which synchronises with every other: there a replayed graph cost 16-27 us per
        # all-reduce, here 6-14 us (2x H200, tests/fixtures/recorded/decode/README.md).
        with self.torch.cuda.stream(self.torch.cuda.Stream(device=self.device)):
            return self.run_on_stream(method)

    def run_on_stream(self, method: str) -> dict[str, Any]:
        torch = self.torch
        dtype = torch.float32 if method == "gloo-eager" else torch.bfloat16
        run: dict[str, Any] = {"method": method, "dtype": str(dtype).replace("torch.", ""), "error": None}
        run.update(graph_ops=GRAPH_OPS if method.endswith("-graph") else None, correct=None, results=[])
        try:
            if (method == "gloo-eager") != (self.cfg["backend"] == "gloo"):
                raise RuntimeError(f"runs on {'Gloo (no GPUs)' if method == 'gloo-eager' else 'NCCL (GPUs)'} only")
            if method.startswith("nccl"):
                run.update(library=self.open_nccl().path, nccl=self.open_nccl().version)
            run["correct"] = self.correct(method, dtype)
            for size in self.cfg["latency_sizes"]:
                run["results"].append(self.size(method, size, dtype))
        except Exception as exc:
            run["error"] = f"{type(exc).__name__}: {exc}"[:300]
        return run

    def agree(self, ok: bool) -> bool:
        """True on every rank only when `ok` on every rank: a step one rank cannot take is
        dropped by all, so no rank waits in a collective the others never start."""
        flag = self.torch.tensor([1 if ok else 0], dtype=self.torch.int32, device=self.device)
        self.dist.all_reduce(flag, op=self.dist.ReduceOp.MIN)
        return bool(flag.item())

    def open_nccl(self) -> Any:
        if self.nccl is None:
            lib, err = None, None
            try:
                lib = _LibNccl(self.torch)
            except Exception as exc:  # no libnccl, another version than torch's, no ctypes
                err = f"{type(exc).__name__}: {exc}"
            if not self.agree(err is None) or lib is None:
                raise RuntimeError(err or "another rank could not load libnccl")
            # NCCL writes NCCL_DEBUG_FILE unbuffered (debug.cc: setbuf(file, NULL)): what is in
            # it now belongs to the transport verdict; this communicator's lines come after.
            pattern = os.path.join(self.cfg["workdir"], f"nccl.*.{os.getpid()}.log")
            self.log_cut = {os.path.basename(f): os.path.getsize(f) for f in glob.glob(pattern)}
            lib.connect(self)
            self.nccl = lib
        return self.nccl

    def correct(self, method: str, dtype: Any) -> bool:
        """One all-reduce of -1/0/1 from every rank (exact in bf16 up to 256 ranks), on every rank."""
        torch = self.torch
        pattern = (torch.arange(4096, device=self.device) % 3 - 1).to(dtype)
        got = pattern.clone()
        if method.startswith("nccl"):
            self.open_nccl().all_reduce(pattern, got, torch.cuda.current_stream().cuda_stream)
        else:
            self.dist.all_reduce(got)
        want = pattern.float() * self.world
        return self.agree(bool(torch.allclose(got.float(), want, rtol=1 / 64)))

    def size(self, method: str, size: int, dtype: Any) -> dict[str, Any]:
        """Per-op time at one size: out of place (nccl-*) and in place, as nccl-tests prints them.
        Small random integers, not zeros (METHOD: zeros can hide unwritten output)."""
        torch = self.torch
        count = max(size // (4 if dtype is torch.float32 else 2), 1)
        src = torch.randint(-3, 4, (count,), device=self.device).to(dtype)
        row: dict[str, Any] = {"bytes": src.numel() * src.element_size(), "out_of_place_us": None}
        ops = GRAPH_OPS if method.endswith("-graph") else 1
        pairs = {"out_of_place": (src, torch.empty_like(src))} if method.startswith("nccl") else {}
        for name, (a, b) in {**pairs, "in_place": (src, src)}.items():
            op = self.op(method, a, b)
            t = self.timed(self.graph(op, ops) if ops > 1 else op, row["bytes"], _algbw, self.cfg["latency_budget_s"])
            row[f"{name}_us"], row["iters"] = round(t["time_us"] / ops, 2), t["iters"] * ops
        return row

    def op(self, method: str, a: Any, b: Any) -> Any:
        if method.startswith("nccl"):
            return self.open_nccl().bind(a, b, self.torch.cuda.current_stream().cuda_stream)
        return lambda: self.dist.all_reduce(a)

    def graph(self, op: Any, ops: int) -> Any:
        """`ops` calls of `op` captured in one CUDA graph: replaying it is one launch."""
        torch = self.torch
        graph, err = torch.cuda.CUDAGraph(), None
        op()  # once outside the graph, on every rank, before any capture
        torch.cuda.synchronize()
        try:
            # On the current stream (bound into nccl-* ops); thread-local, as torch's NCCL
            # watchdog thread may query events meanwhile.
            stream = torch.cuda.current_stream()
            with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                for _ in range(ops):
                    op()
        except Exception as exc:
            err = f"CUDA graph capture failed: {type(exc).__name__}: {exc}"
        if not self.agree(err is None):
            raise RuntimeError(err or "CUDA graph capture failed on another rank")
        return graph.replay


def _algbw(algbw: float, world: int) -> float:
    return algbw  # the timer's bus-bandwidth hook; latency rows keep times only


class _LibNccl:
    """ncclAllReduce through ctypes on the libnccl that torch loaded, on a communicator of its own."""

    def __init__(self, torch: Any) -> None:
        import ctypes

        self.ct = ctypes
        self.path = _loaded_libnccl() or "libnccl.so.2"
        self.lib = lib = ctypes.CDLL(self.path)
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        ptr, size_t, c_int = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        lib.ncclAllReduce.argtypes = [ptr, ptr, size_t, c_int, c_int, ptr, ptr]
        code = ctypes.c_int()
        self.check(lib.ncclGetVersion(ctypes.byref(code)), "ncclGetVersion")
        v = code.value  # major*10000 + minor*100 + patch since NCCL 2.9 (torch's NCCL is newer)
        self.version = f"{v // 10000}.{v // 100 % 100}.{v % 100}"
        ours = ".".join(str(p) for p in torch.cuda.nccl.version())
        if self.version != ours:
            raise RuntimeError(f"{self.path} is NCCL {self.version}, torch uses NCCL {ours}")
        self.comm = ctypes.c_void_p()

    def check(self, result: int, what: str) -> None:
        if result != 0:
            raise RuntimeError(f"{what}: {self.lib.ncclGetErrorString(result).decode()} (ncclResult {result})")

    def connect(self, probe: LatencyProbe) -> None:
        """ncclCommInitRank with rank 0's unique id, handed out over the torch process group."""
        ct = self.ct

        class UniqueId(ct.Structure):  # type: ignore[name-defined,misc]
            _fields_ = (("internal", ct.c_byte * 128),)

        uid = UniqueId()
        if probe.rank == 0:
            self.check(self.lib.ncclGetUniqueId(ct.byref(uid)), "ncclGetUniqueId")
        raw = probe.torch.tensor(list(bytes(uid)), dtype=probe.torch.uint8, device=probe.device)
        probe.dist.broadcast(raw, src=0)
        uid = UniqueId.from_buffer_copy(bytes(raw.tolist()))
        self.lib.ncclCommInitRank.argtypes = [ct.c_void_p, ct.c_int, UniqueId, ct.c_int]
        self.check(self.lib.ncclCommInitRank(ct.byref(self.comm), probe.world, uid, probe.rank), "ncclCommInitRank")

    def all_reduce(self, src: Any, dst: Any, stream: int) -> None:
        self.bind(src, dst, stream)()

    def bind(self, src: Any, dst: Any, stream: int) -> Any:
        """ncclAllReduce(src -> dst) on `stream` as a call with its arguments converted once:
        in an eager loop only ctypes' own call stands between two launches."""
        fn, check = self.lib.ncclAllReduce, self.check
        args = (src.data_ptr(), dst.data_ptr(), src.numel(), _NCCL_BF16, _NCCL_SUM, self.comm, stream)
        return lambda: check(fn(*args), "ncclAllReduce")

    def close(self) -> None:
        self.check(self.lib.ncclCommDestroy(self.comm), "ncclCommDestroy")


def _loaded_libnccl() -> Any:
    """The libnccl this process has mapped (torch's own, from its wheel or the image), or None."""
    try:
        with open("/proc/self/maps") as fh:
            paths = [ln.split()[-1] for ln in fh if "libnccl" in ln]
    except OSError:
        return None
    return next((p for p in paths if os.path.basename(p).startswith("libnccl.so")), None)


# Sent with `python3 -c` (collective.py's source, then this one): both are defined now, start.
if __name__ == "__main__" and "__file__" not in globals():
    sys.exit(globals()["main"]())
