"""`recommend()`: the fewest nodes, and TP/PP, that hold the weights and one full-length sequence."""

from __future__ import annotations

from dataclasses import dataclass, field

from kit.errors import ConfigError
from kit.sizing.architecture import Architecture
from kit.sizing.gpus import DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_MAX_NUM_SEQS, DEFAULT_OVERHEAD_BYTES, format_bytes
from kit.sizing.kv import KVEstimate, kv_bytes_per_token
from kit.sizing.split import best_tp, worst_stage
from kit.sizing.weights import WeightEstimate, estimate_weights


@dataclass(frozen=True)
class Recommendation:
    nodes: int
    tp: int
    pp: int
    gpus: int
    gpus_per_node: int
    gpu_memory_bytes: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    budget_per_gpu: int  # gpu_memory_bytes × utilization
    weights_per_gpu: int  # worst pipeline stage
    overhead_per_gpu: int
    kv_room_per_gpu: int
    kv_per_sequence_per_gpu: int  # one max_model_len sequence, worst stage
    max_concurrent_seqs: int  # full-length sequences the KV room holds
    kv_tokens_per_gpu: int  # tokens of full-attention KV the room holds (0: none needed)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def fits_max_num_seqs(self) -> bool:
        return self.max_concurrent_seqs >= self.max_num_seqs

    def vllm_args(self) -> list[str]:
        return [
            "--tensor-parallel-size",
            str(self.tp),
            "--pipeline-parallel-size",
            str(self.pp),
            "--max-model-len",
            str(self.max_model_len),
            "--gpu-memory-utilization",
            f"{self.gpu_memory_utilization:g}",
        ]


def _evaluate(
    arch: Architecture,
    weights: WeightEstimate,
    kv: KVEstimate,
    *,
    nodes: int,
    gpus_per_node: int,
    tp: int,
    gpu_memory_bytes: int,
    gpu_memory_utilization: float,
    max_model_len: int,
    max_num_seqs: int,
    overhead_bytes: int,
) -> Recommendation:
    gpus = nodes * gpus_per_node
    pp = gpus // tp
    budget = int(gpu_memory_bytes * gpu_memory_utilization)
    worst_weights, worst_kv, per_token = worst_stage(arch, weights, kv, tp=tp, pp=pp, ep=1, seq_len=max_model_len)
    room = budget - worst_weights - overhead_bytes
    # With no per-sequence KV (nothing grows with the sequence) only the room itself limits.
    concurrent = max(room, 0) // worst_kv if worst_kv > 0 else (max_num_seqs if room > 0 else 0)
    # Tokens of KV the room holds on the worst stage (linear-attention state excluded).
    full_tokens = room // per_token if per_token > 0 and room > 0 else 0
    notes: list[str] = []
    if arch.mla is None and tp > arch.num_kv_heads:
        notes.append(f"TP {tp} > {arch.num_kv_heads} KV heads: each rank keeps a copy of one KV head")
    if arch.mla is not None and tp > 1:
        notes.append("MLA: the KV latent is not split by TP; every rank holds all of it")
    if arch.num_layers % pp:
        notes.append(f"PP {pp} does not divide {arch.num_layers} layers: stages are uneven")
    return Recommendation(
        nodes=nodes,
        tp=tp,
        pp=pp,
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        gpu_memory_bytes=gpu_memory_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        budget_per_gpu=budget,
        weights_per_gpu=worst_weights,
        overhead_per_gpu=overhead_bytes,
        kv_room_per_gpu=room,
        kv_per_sequence_per_gpu=worst_kv,
        max_concurrent_seqs=int(min(concurrent, 10**9)),
        kv_tokens_per_gpu=int(full_tokens),
        notes=tuple(notes),
    )


def recommend(
    arch: Architecture,
    *,
    gpu_memory_bytes: int,
    gpus_per_node: int,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_model_len: int | None = None,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    nodes: int | None = None,
    kv_cache_dtype: str = "auto",
    overhead_bytes: int = DEFAULT_OVERHEAD_BYTES,
) -> Recommendation:
    """The fewest nodes (or exactly `nodes`) that hold the weights and one full-length sequence.

    TP is the largest divisor of `gpus_per_node` that splits the attention (and KV, and
    linear-attention) heads; PP is the rest (`nodes × gpus_per_node / TP`), at most one layer
    per stage. Raises `ConfigError` (one line, the field and the fix) when impossible.
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise ConfigError(
            f"{gpu_memory_utilization} is outside (0, 1]",
            key="gpu_memory_utilization",
            hint="use a fraction such as 0.9",
        )
    if gpus_per_node < 1:
        raise ConfigError(f"{gpus_per_node} GPUs per node", key="gpus_per_node", hint="use ≥ 1")
    if max_num_seqs < 1:
        raise ConfigError(f"{max_num_seqs} sequences", key="max_num_seqs", hint="use ≥ 1")
    if nodes is not None and nodes < 1:
        raise ConfigError(f"{nodes} nodes", key="nodes", hint="use ≥ 1, or leave it out")
    limit = arch.max_position_embeddings
    if max_model_len is None:
        max_model_len = int(limit or 4096)
    if max_model_len < 1:
        raise ConfigError(f"{max_model_len} tokens", key="max_model_len", hint="use ≥ 1")
    if limit and max_model_len > limit:
        raise ConfigError(
            f"{max_model_len} is longer than the model's max_position_embeddings {limit}",
            key="max_model_len",
            hint=f"use --max-model-len {limit} or less (vLLM refuses longer without rope scaling)",
        )
    budget = gpu_memory_bytes * gpu_memory_utilization
    if budget <= overhead_bytes:
        raise ConfigError(
            f"{format_bytes(budget)} per GPU leaves nothing after the {format_bytes(overhead_bytes)} overhead",
            key="gpu_memory",
            hint="use a larger GPU or a higher --gpu-memory-utilization",
        )
    weights = estimate_weights(arch)
    kv = kv_bytes_per_token(arch, kv_cache_dtype)
    tp = best_tp(arch, gpus_per_node)

    def evaluate(n: int) -> Recommendation:
        return _evaluate(
            arch,
            weights,
            kv,
            nodes=n,
            gpus_per_node=gpus_per_node,
            tp=tp,
            gpu_memory_bytes=gpu_memory_bytes,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            overhead_bytes=overhead_bytes,
        )

    def fits(r: Recommendation) -> bool:
        return r.kv_room_per_gpu > 0 and r.max_concurrent_seqs >= 1

    max_nodes = max(1, (arch.num_layers * tp) // gpus_per_node)
    if nodes is not None:
        if nodes * gpus_per_node // tp > arch.num_layers:
            raise ConfigError(
                f"{nodes} nodes × {gpus_per_node} GPUs / TP {tp} gives more pipeline stages "
                f"than the model's {arch.num_layers} layers",
                key="nodes",
                hint=f"use --nodes {max_nodes} or fewer",
            )
        r = evaluate(nodes)
        if not fits(r):
            raise ConfigError(_why_not(r, weights), key="nodes", hint=_fix(arch, r, max_nodes))
        return r
    last: Recommendation | None = None
    for n in range(1, max_nodes + 1):
        if (n * gpus_per_node) % tp:
            continue
        last = evaluate(n)
        if fits(last):
            return last
    assert last is not None
    raise ConfigError(
        f"does not fit even on {last.nodes} nodes (PP {last.pp} = one stage per layer): " + _why_not(last, weights),
        key="model",
        hint=_fix(arch, last, max_nodes),
    )


def _why_not(r: Recommendation, weights: WeightEstimate) -> str:
    where = f"{r.nodes} node(s) × {r.gpus_per_node} GPUs (TP {r.tp}, PP {r.pp})"
    if r.budget_per_gpu - r.overhead_per_gpu <= r.weights_per_gpu:
        return (
            f"weights need {format_bytes(r.weights_per_gpu)} per GPU on {where} but only "
            f"{format_bytes(r.budget_per_gpu - r.overhead_per_gpu)} is left after overhead"
        )
    return (
        f"one {r.max_model_len}-token sequence needs {format_bytes(r.kv_per_sequence_per_gpu)} "
        f"of KV cache per GPU on {where} but only {format_bytes(max(r.kv_room_per_gpu, 0))} is left"
    )


def _fix(arch: Architecture, r: Recommendation, max_nodes: int) -> str:
    if r.nodes < max_nodes:
        return "add nodes (kit plan without --nodes finds the minimum), or lower --max-model-len"
    if arch.weight_format.method == "none":
        return "use a quantized checkpoint (FP8, AWQ/GPTQ int4) or larger GPUs"
    return "use larger GPUs, a smaller --max-model-len, or a smaller model"
