"""Every TP×PP and (for MoE) DP+EP layout of a cluster, and the pick (issue 10)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kit.errors import ConfigError
from kit.layout import Layout
from kit.sizing.architecture import Architecture
from kit.sizing.gpus import DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_MAX_NUM_SEQS, DEFAULT_OVERHEAD_BYTES, format_bytes
from kit.sizing.kv import KVEstimate, kv_bytes_per_token
from kit.sizing.split import expert_share, pp_stages, valid_tp, worst_stage
from kit.sizing.weights import WeightEstimate, estimate_weights


@dataclass(frozen=True)
class LayoutFit:
    """How one layout (kit.layout: TP × PP × DP = `nodes × gpus_per_node` GPUs, EP on or off) holds
    the model: memory figures per GPU on the worst pipeline stage; `max_concurrent_seqs` counts
    full-length sequences the KV room of the whole cluster holds (every DP rank has its own).
    The EP size is `layout.ep_size` (TP × DP with EP: vLLM's EP group spans the TP × DP ranks).
    """

    layout: Layout
    nodes: int
    gpus_per_node: int
    max_model_len: int
    max_num_seqs: int  # per engine (DP rank), as vLLM schedules
    budget_per_gpu: int
    weights_per_gpu: int
    dense_weights_per_gpu: int  # attention, dense MLP, shared experts, embeddings, norms, routers
    expert_weights_per_gpu: int  # routed experts
    overhead_per_gpu: int
    kv_room_per_gpu: int
    kv_per_sequence_per_gpu: int
    seqs_per_replica: int  # full-length sequences one TP×PP replica (one DP rank) holds
    max_concurrent_seqs: int  # seqs_per_replica × DP: what the KV cache of the cluster holds
    scheduled_seqs: int  # min(max_concurrent_seqs, DP × max_num_seqs): what vLLM runs at once
    fits: bool
    why_not: str = ""

    @property
    def kind(self) -> str:
        if self.layout.router:
            return "replicas"
        return "dp+ep" if self.layout.dp > 1 else "tp×pp"

    def to_dict(self) -> dict[str, Any]:
        """`kit plan --json`'s candidate: the layout's sizes (`ep` the EP group size) and the figures."""
        lay = self.layout
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k != "layout"}
        return {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "ep": lay.ep_size, **fields, "gpus": lay.gpus}

    @property
    def name(self) -> str:
        lay = self.layout
        if lay.router:
            return f"{lay.dp}× TP{lay.tp}" + (f"×PP{lay.pp}" if lay.pp > 1 else "") + " (router)"
        if lay.dp > 1:
            return f"DP{lay.dp}+EP{lay.ep_size} (TP{lay.tp})" if lay.ep else f"DP{lay.dp} (TP{lay.tp})"
        return f"TP{lay.tp}×PP{lay.pp}"

    def vllm_args(self) -> list[str]:
        lay = self.layout
        args = ["--tensor-parallel-size", str(lay.tp)]
        if lay.pp > 1:
            args += ["--pipeline-parallel-size", str(lay.pp)]
        if lay.router:  # each replica its own server (kit.plan.replicas); kit's router in front
            span = max(1, lay.tp * lay.pp // self.gpus_per_node)
            return [*args, *(["--nnodes", str(span)] if span > 1 else []), "--max-model-len", str(self.max_model_len)]
        if lay.dp > 1:
            args += ["--data-parallel-size", str(lay.dp), "--data-parallel-size-local", str(lay.dp // self.nodes)]
        if lay.ep:
            args.append("--enable-expert-parallel")
        return [*args, "--max-model-len", str(self.max_model_len)]


def _layout(
    arch: Architecture,
    weights: WeightEstimate,
    kv: KVEstimate,
    *,
    tp: int,
    pp: int,
    dp: int,
    ep: int,
    nodes: int,
    gpus_per_node: int,
    budget: int,
    overhead_bytes: int,
    max_model_len: int,
    max_num_seqs: int,
    why_not: str = "",
    router: bool = False,
) -> LayoutFit:
    total, worst_kv, _ = worst_stage(arch, weights, kv, tp=tp, pp=pp, ep=ep, seq_len=max_model_len)
    # Experts per GPU on the worst stage: the stage with the most layers holds the most.
    per_stage = max(len(r) for r in pp_stages(arch.num_layers, pp))
    experts = math.ceil(sum(sorted(weights.layer_expert_bytes)[-per_stage:]) * expert_share(arch, tp, ep))
    room = budget - total - overhead_bytes
    per_replica = max(room, 0) // worst_kv if worst_kv > 0 else (max_num_seqs if room > 0 else 0)
    if not why_not and room <= 0:
        why_not = f"weights {format_bytes(total)} + overhead leave no KV room in {format_bytes(budget)}"
    elif not why_not and per_replica < 1:
        why_not = f"one {max_model_len}-token sequence needs {format_bytes(worst_kv)} of KV per GPU"
    return LayoutFit(
        layout=Layout(tp, pp, dp, ep > 1, router=router),
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        budget_per_gpu=budget,
        weights_per_gpu=total,
        dense_weights_per_gpu=max(total - experts, 0),
        expert_weights_per_gpu=experts,
        overhead_per_gpu=overhead_bytes,
        kv_room_per_gpu=room,
        kv_per_sequence_per_gpu=worst_kv,
        seqs_per_replica=int(min(per_replica, 10**9)),
        max_concurrent_seqs=int(min(per_replica * dp, 10**9)) if not why_not else 0,
        scheduled_seqs=int(min(per_replica, max_num_seqs) * dp) if not why_not else 0,
        fits=not why_not,
        why_not=why_not,
    )


def layout_candidates(
    arch: Architecture,
    *,
    nodes: int,
    gpus_per_node: int,
    gpu_memory_bytes: int,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_model_len: int | None = None,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    kv_cache_dtype: str = "auto",
    overhead_bytes: int = DEFAULT_OVERHEAD_BYTES,
    replicas: bool = False,
) -> tuple[LayoutFit, ...]:
    """Every TP×PP layout of the cluster, and for MoE models every DP+EP layout, with the
    weights, KV room and concurrent full-length sequences of each (pure; `kit plan`, `kit tune`).

    TP divides the GPUs of a node and splits the attention heads (as `recommend`). DP+EP
    layouts follow vLLM's rules: TP × DP = all GPUs, EP size = TP × DP with
    --enable-expert-parallel (vllm/config/parallel.py: "The EP group spans the TP x PCP x DP
    ranks"), DP ranks spread evenly over nodes (`--data-parallel-size-local` = DP / nodes), and
    the routed experts must divide evenly by EP (issue 10 refuses an uneven split). PP is 1 with
    DP: vLLM's data-parallel deployment guide only combines DP attention with TP ("Data Parallel
    attention can be combined with Tensor Parallel attention", docs/serving/
    data_parallel_deployment.md), and parallel.py refuses PP > 1 with elastic EP ("Elastic EP is
    not supported with pipeline parallelism"); kit does not plan DP × PP.
    Dense models get TP×PP layouts only: vLLM says non-MoE models should run independent
    instances, not --data-parallel-size. With `replicas` (issue 29), those independent instances
    too: DP ≥ 2 replicas of TP×PP behind kit's router, each on whole nodes (TP×PP a multiple of a
    node's GPUs, TP over nodes included) or sharing a node (TP×PP dividing it).
    """
    if nodes < 1 or gpus_per_node < 1:
        raise ConfigError(f"{nodes} nodes × {gpus_per_node} GPUs", key="nodes", hint="use ≥ 1 of each")
    if not 0 < gpu_memory_utilization <= 1:
        raise ConfigError(f"{gpu_memory_utilization} is outside (0, 1]", key="gpu_memory_utilization", hint="e.g. 0.9")
    seq_len = int(max_model_len or arch.max_position_embeddings or 4096)
    weights = estimate_weights(arch)
    kv = kv_bytes_per_token(arch, kv_cache_dtype)
    budget = int(gpu_memory_bytes * gpu_memory_utilization)
    gpus = nodes * gpus_per_node
    common: dict[str, Any] = {
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "budget": budget,
        "overhead_bytes": overhead_bytes,
        "max_model_len": seq_len,
        "max_num_seqs": max_num_seqs,
    }
    tps = [tp for tp in range(gpus_per_node, 0, -1) if gpus_per_node % tp == 0 and valid_tp(arch, tp)]
    out: list[LayoutFit] = []
    for tp in tps:
        pp = gpus // tp
        if pp <= arch.num_layers:
            out.append(_layout(arch, weights, kv, tp=tp, pp=pp, dp=1, ep=1, **common))
    if arch.moe is not None:
        for tp in tps:
            dp = gpus // tp
            if dp < 2:
                continue
            ep = tp * dp
            why = ""
            if arch.moe.num_experts % ep:
                why = f"{arch.moe.num_experts} experts do not divide by EP {ep} (= TP {tp} × DP {dp})"
            out.append(_layout(arch, weights, kv, tp=tp, pp=1, dp=dp, ep=ep, why_not=why, **common))
    if replicas:
        out += _replica_candidates(arch, weights, kv, tps, gpus, common)
    return tuple(out)


def _replica_candidates(
    arch: Architecture, weights: WeightEstimate, kv: KVEstimate, tps: list[int], gpus: int, common: dict[str, Any]
) -> list[LayoutFit]:
    """DP ≥ 2 independent replicas: TP (a divisor of a node) × PP, or TP over whole nodes."""
    per_node = int(common["gpus_per_node"])
    shapes = {(tp, pp) for tp in tps for pp in (1, *range(2, gpus // tp + 1)) if tp * pp <= gpus}
    shapes |= {(t, 1) for t in range(2 * per_node, gpus + 1, per_node) if valid_tp(arch, t)}
    out = []
    for tp, pp in sorted(shapes, key=lambda s: (-s[0], s[1])):
        size = tp * pp
        if gpus % size or gpus // size < 2 or pp > arch.num_layers:
            continue
        if (size < per_node and per_node % size) or (size > per_node and size % per_node):
            continue
        out.append(_layout(arch, weights, kv, tp=tp, pp=pp, dp=gpus // size, ep=1, router=True, **common))
    return out


def pick_layout(candidates: Sequence[LayoutFit]) -> tuple[LayoutFit | None, str]:
    """The layout that runs the most full-length sequences at once, and one line why.

    vLLM schedules at most max-num-seqs sequences per engine, and every DP rank is an engine,
    so a layout serves min(KV-cache capacity, DP × max-num-seqs). Ties go to fewer pipeline
    stages (less per-token latency), then to the larger KV capacity, then to TP×PP.
    """
    fitting = [c for c in candidates if c.fits]
    if not fitting:
        return None, "no layout holds the weights and one full-length sequence on these GPUs"

    def rank(c: LayoutFit) -> tuple[int, int, int, bool, int]:
        return (c.scheduled_seqs, -c.layout.pp, c.max_concurrent_seqs, c.layout.dp == 1, c.layout.tp)

    best = max(fitting, key=rank)
    others = [c for c in fitting if c.kind != best.kind]
    if not others:
        missing = {"tp×pp": "DP+EP", "dp+ep": "TP×PP", "replicas": "single-server"}[best.kind]
        why = next((c.why_not for c in candidates if c.kind != best.kind), "")
        return best, f"{best.name} is the best fitting layout; no {missing} layout fits" + (f" ({why})" if why else "")
    rival = max(others, key=rank)
    line = (
        f"{best.name} runs {best.scheduled_seqs} concurrent {best.max_model_len}-token sequences "
        f"vs {rival.scheduled_seqs} for {rival.name}"
    )
    if best.scheduled_seqs == rival.scheduled_seqs:
        fewer = best.layout.pp < rival.layout.pp
        reason = f"same concurrency with {'fewer pipeline stages' if fewer else 'more KV room'}"
    elif best.layout.router and rival.scheduled_seqs < rival.max_concurrent_seqs:
        reason = (
            f"one server schedules at most max-num-seqs {rival.max_num_seqs}; {best.layout.dp} replicas "
            "behind the router each schedule their own"
        )
    elif best.layout.router:
        reason = "smaller replicas keep more KV room per GPU, and a failed one is restarted alone"
    elif best.layout.dp > 1 and rival.scheduled_seqs < rival.max_concurrent_seqs:
        reason = (
            f"one TP×PP engine schedules at most max-num-seqs {rival.max_num_seqs}; "
            f"DP runs {best.layout.dp} engines, each with its own KV cache"
        )
    elif best.layout.dp > 1:
        reason = "experts split over all GPUs by EP leave more KV room on every DP rank"
    elif rival.layout.router:
        reason = "every replica holds a whole copy of the weights, leaving less KV room"
    else:
        reason = "DP+EP copies attention and dense weights on every DP rank, leaving less KV room"
    return best, f"{line}: {reason}"
