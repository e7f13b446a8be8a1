"""What one GPU holds when a model is split by TP, PP and EP: the rules `recommend` and
`layout_candidates` share (head divisibility, PP stages, the worst stage's weights and KV)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

from kit.sizing.architecture import LINEAR, Architecture
from kit.sizing.kv import KVEstimate
from kit.sizing.weights import WeightEstimate


def heads_split(heads: int, kv_heads: int | None, tp: int) -> bool:
    """The head-divisibility rule (the one kit has: `kit plan`, the layout planner and the plan
    checks all call it): vLLM shards attention heads evenly; KV heads are split or replicated
    (`kv_heads` None: MLA, whose latent KV is not split by heads)."""
    if tp < 1 or heads % tp:
        return False
    return kv_heads is None or kv_heads % tp == 0 or tp % kv_heads == 0


def valid_tp(arch: Architecture, tp: int) -> bool:
    """heads_split for the model's attention, and the linear-attention heads split by TP too."""
    if not heads_split(arch.num_attention_heads, None if arch.mla is not None else arch.num_kv_heads, tp):
        return False
    la = arch.linear
    return la is None or (la.num_key_heads % tp == 0 and la.num_value_heads % tp == 0)


def pp_stages(n_layers: int, pp: int) -> list[range]:
    """Contiguous layer ranges per PP stage; vLLM gives the remainder to the last stages."""
    base, extra = divmod(n_layers, pp)
    out, start = [], 0
    for s in range(pp):
        size = base + (1 if s >= pp - extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def _kv_per_layer(arch: Architecture, kv: KVEstimate, kind: str, tp: int, seq_len: int) -> int:
    """KV bytes one TP rank holds for one sequence of `seq_len` on one layer of `kind`."""
    total = 0
    for lk in kv.layers:
        if lk.kind == "mla":  # the latent is not split by TP: every rank holds all of it
            total += lk.bytes_per_token * seq_len
        elif lk.kind == kind == LINEAR:
            total += lk.state_bytes_per_seq // tp
        elif lk.kind == kind:
            heads_per_rank = max(1, arch.num_kv_heads // tp)
            per = lk.bytes_per_token * heads_per_rank // arch.num_kv_heads
            tokens = min(seq_len, lk.window) if lk.window else seq_len
            total += per * tokens
    return total


def _prefix(values: Iterable[int]) -> list[int]:
    """Running sums from 0: a stage's layers a..b-1 sum to out[b] - out[a]."""
    return [0, *itertools.accumulate(values)]


def expert_share(arch: Architecture, tp: int, ep: int) -> float:
    """Fraction of a layer's routed experts one GPU holds: 1/TP without EP (each expert split
    along its intermediate dim), else the experts of one EP rank (vLLM gives the first
    `E mod EP` ranks one more, so the worst rank holds ceil(E/EP))."""
    if ep <= 1 or arch.moe is None:
        return 1 / tp
    return math.ceil(arch.moe.num_experts / ep) / arch.moe.num_experts


def worst_stage(
    arch: Architecture, weights: WeightEstimate, kv: KVEstimate, *, tp: int, pp: int, ep: int, seq_len: int
) -> tuple[int, int, int]:
    """(weights, KV of one `seq_len` sequence, KV per token) per GPU on the worst PP stage.

    Attention, dense MLP, shared experts and embeddings are split by TP (and copied on every
    DP rank); routed experts by TP, or by EP when `ep` > 1; norms and routers are copied.
    """
    share = expert_share(arch, tp, ep)
    stages = pp_stages(arch.num_layers, pp)
    # Every stage's sums from running sums over the layers: `kit plan` tries every PP up to one
    # stage per layer, which summed layer by layer grew with the square of the layers.
    kinds = {
        kind: (
            _kv_per_layer(arch, kv, kind, tp, seq_len),
            _kv_per_layer(arch, kv, kind, tp, 1) - _kv_per_layer(arch, kv, kind, tp, 0),
        )
        for kind in set(arch.layer_kinds)
    }
    kv_sum = _prefix(kinds[kind][0] for kind in arch.layer_kinds)
    token_sum = _prefix(kinds[kind][1] for kind in arch.layer_kinds)
    layer_sum = _prefix(weights.layer_bytes)
    expert_sum = _prefix(weights.layer_expert_bytes)
    replicated_sum = _prefix(weights.layer_replicated_bytes)
    worst_weights = worst_kv = per_token = 0
    for s, layers in enumerate(stages):
        a, b = layers.start, layers.stop
        experts = expert_sum[b] - expert_sum[a]
        w = (layer_sum[b] - layer_sum[a] - experts) / tp + experts * share
        w += replicated_sum[b] - replicated_sum[a]
        if s == 0:
            w += (weights.embedding_bytes + weights.vision_bytes) / tp
        if s == len(stages) - 1:
            if pp > 1 or not arch.tie_word_embeddings:
                w += weights.lm_head_bytes / tp
            w += weights.final_norm_bytes
        worst_weights = max(worst_weights, math.ceil(w))
        worst_kv = max(worst_kv, kv_sum[b] - kv_sum[a])
        per_token = max(per_token, token_sum[b] - token_sum[a])
    return worst_weights, worst_kv, per_token


def best_tp(arch: Architecture, gpus_per_node: int) -> int:
    for tp in range(gpus_per_node, 0, -1):
        if gpus_per_node % tp == 0 and valid_tp(arch, tp):
            return tp
    return 1
