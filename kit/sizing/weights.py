"""Checkpoint bytes, counted tensor by tensor from an `Architecture` in its weight format."""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from kit.sizing.architecture import LINEAR, QKV_BIAS_BY_DEFAULT, Architecture
from kit.sizing.quantization import WeightFormat


@dataclass(frozen=True)
class Tensor:
    """One weight (or `count` identical ones, e.g. experts) of the checkpoint."""

    name: str  # module path, matched against skip patterns (e.g. "model.layers.3.mlp.experts")
    category: str
    in_features: int
    out_features: int = 1
    count: int = 1
    linear: bool = False  # a quantizable linear layer
    expert: bool = False
    replicated: bool = False  # not split by tensor parallelism
    dtype_bytes: float | None = None  # fixed dtype (fp32 buffers)

    @property
    def params(self) -> int:
        return self.in_features * self.out_features * self.count


def _skipped(name: str, patterns: Iterable[str]) -> bool:
    """`re:` regexes (compressed-tensors), globs (`model.layers.*.self_attn`), or substrings."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.search(pattern[3:], name):
                return True
        elif "*" in pattern or "?" in pattern:
            if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + ".*"):
                return True
        elif pattern and pattern in name:
            return True
    return False


# The JSON blob bitsandbytes stores per 4-bit weight (`weight.quant_state.bitsandbytes__nf4`):
# quant_type, blocksize, dtype, shape (and nested_* keys with double quant), ~90-130 bytes.
_BNB_QUANT_STATE_BYTES = 112


def tensor_bytes(t: Tensor, fmt: WeightFormat) -> float:
    """Bytes of one tensor group in the checkpoint's format (formula in the comments)."""
    base = fmt.dtype_bytes if t.dtype_bytes is None else t.dtype_bytes
    quantized = (
        t.linear and fmt.method != "none" and not _skipped(t.name, fmt.skip) and (t.expert or not fmt.experts_only)
    )
    if not quantized:
        return t.params * base
    n_in, n_out = t.in_features, t.out_features
    if fmt.method in ("fp8", "int8"):
        if fmt.block:  # weight_scale_inv: one fp32 per (block_out x block_in) tile
            scales = math.ceil(n_out / fmt.block[0]) * math.ceil(n_in / fmt.block[1])
        elif fmt.per_channel_scale:
            scales = n_out
        else:  # per-tensor weight_scale (+ input_scale)
            scales = 2
        return (n_in * n_out + scales * fmt.scale_bytes) * t.count
    if fmt.method == "bnb-int8":  # int8 weight + fp32 row scale (SCB)
        return (n_in * n_out + n_out * 4) * t.count
    if fmt.method == "bnb-nf4":
        # Linear4bit state dict: packed U8 weight, absmax per block of 64, quant_map (16 fp32), and a
        # JSON quant_state (~100 B); double quant stores absmax as U8 + fp32 absmax per 256 blocks +
        # a 256-entry fp32 nested_quant_map.
        n = n_in * n_out
        blocks = math.ceil(n / max(fmt.group_size, 1))
        absmax = blocks + math.ceil(blocks / 256) * 4 + 256 * 4 if fmt.double_quant else blocks * 4
        return (n / 2 + absmax + 16 * 4 + _BNB_QUANT_STATE_BYTES) * t.count
    if fmt.method == "nvfp4":  # U8 pairs + fp8 scale per 16 + weight_scale_2 and input_scale (fp32)
        return (n_in * n_out / 2 + math.ceil(n_in / fmt.group_size) * n_out + 8) * t.count
    groups = n_in if fmt.group_size <= 0 else fmt.group_size
    n_groups = math.ceil(n_in / groups)
    packed = n_in * n_out * fmt.bits / 8
    group_scales = n_groups * n_out * fmt.scale_bytes
    zeros = n_groups * n_out * fmt.bits / 8 if fmt.zero_point else 0
    g_idx = n_in * 4 if fmt.g_idx else 0
    if fmt.method == "int-pack":
        g_idx += 16  # weight_shape int64[2] (+ weight_g_idx int32 per input with actorder "group")
    return (packed + group_scales + zeros + g_idx) * t.count


def _attention_tensors(arch: Architecture, p: str) -> list[Tensor]:
    h, hd = arch.hidden_size, arch.head_dim
    heads, kv = arch.num_attention_heads, arch.num_kv_heads
    if arch.mla is not None:
        m = arch.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        out: list[Tensor] = []
        if m.q_lora_rank:
            out += [
                Tensor(
                    f"{p}.self_attn.q_a_proj",
                    "attention",
                    h,
                    m.q_lora_rank,
                    linear=True,
                    replicated=True,
                ),
                Tensor(f"{p}.self_attn.q_a_layernorm", "norms", m.q_lora_rank, replicated=True),
                Tensor(f"{p}.self_attn.q_b_proj", "attention", m.q_lora_rank, heads * qk, linear=True),
            ]
        else:
            out.append(Tensor(f"{p}.self_attn.q_proj", "attention", h, heads * qk, linear=True))
        out += [
            Tensor(
                f"{p}.self_attn.kv_a_proj_with_mqa",
                "attention",
                h,
                m.kv_lora_rank + m.qk_rope_head_dim,
                linear=True,
                replicated=True,
            ),
            Tensor(f"{p}.self_attn.kv_a_layernorm", "norms", m.kv_lora_rank, replicated=True),
            Tensor(
                f"{p}.self_attn.kv_b_proj",
                "attention",
                m.kv_lora_rank,
                heads * (m.qk_nope_head_dim + m.v_head_dim),
                linear=True,
            ),
            Tensor(f"{p}.self_attn.o_proj", "attention", heads * m.v_head_dim, h, linear=True),
        ]
        return out
    q_out = heads * hd * (2 if arch.attn_output_gate else 1)
    out = [
        Tensor(f"{p}.self_attn.q_proj", "attention", h, q_out, linear=True),
        Tensor(f"{p}.self_attn.k_proj", "attention", h, kv * hd, linear=True),
        Tensor(f"{p}.self_attn.v_proj", "attention", h, kv * hd, linear=True),
        Tensor(f"{p}.self_attn.o_proj", "attention", heads * hd, h, linear=True),
    ]
    if arch.attention_bias:
        out.append(Tensor(f"{p}.self_attn.qkv_bias", "attention", q_out + 2 * kv * hd))
        if arch.model_type not in QKV_BIAS_BY_DEFAULT:  # Llama-style attention_bias: o_proj too
            out.append(Tensor(f"{p}.self_attn.o_proj.bias", "attention", h, replicated=True))
    if arch.attention_sinks:
        out.append(Tensor(f"{p}.self_attn.sinks", "attention", heads))
    if arch.qk_norm:
        out.append(Tensor(f"{p}.self_attn.qk_norm", "norms", 2 * hd, replicated=True))
    return out


def _linear_attention_tensors(arch: Architecture, p: str) -> list[Tensor]:
    la = arch.linear
    assert la is not None
    h, nv = arch.hidden_size, la.num_value_heads
    return [
        Tensor(
            f"{p}.linear_attn.in_proj_qkvz",
            "linear attention",
            h,
            2 * la.key_dim + 2 * la.value_dim,
            linear=True,
        ),
        Tensor(f"{p}.linear_attn.in_proj_ba", "linear attention", h, 2 * nv, linear=True),
        Tensor(f"{p}.linear_attn.conv1d", "linear attention", la.conv_dim, la.conv_kernel),
        Tensor(f"{p}.linear_attn.dt_bias_A_log", "linear attention", 2 * nv),
        Tensor(f"{p}.linear_attn.norm", "norms", la.value_head_dim, replicated=True),
        Tensor(f"{p}.linear_attn.out_proj", "linear attention", la.value_dim, h, linear=True),
    ]


def _mlp_tensors(arch: Architecture, p: str, layer: int) -> list[Tensor]:
    h = arch.hidden_size
    moe = arch.moe
    if moe is None or layer not in moe.moe_layers:
        inter = arch.intermediate_size
        return [
            Tensor(f"{p}.mlp.gate_up_proj", "dense MLP", h, 2 * inter, linear=True),
            Tensor(f"{p}.mlp.down_proj", "dense MLP", inter, h, linear=True),
        ]
    e, inter = moe.num_experts, moe.expert_intermediate_size
    out = [
        Tensor(
            f"{p}.mlp.experts.gate_up_proj",
            "MoE experts",
            h,
            2 * inter,
            count=e,
            linear=True,
            expert=True,
        ),
        Tensor(f"{p}.mlp.experts.down_proj", "MoE experts", inter, h, count=e, linear=True, expert=True),
        Tensor(f"{p}.mlp.gate", "router", h, e, replicated=True),
    ]
    if moe.linear_biases:  # gpt-oss: these stay bf16 next to the MXFP4 blocks
        out += [
            Tensor(f"{p}.mlp.router.bias", "router", e, replicated=True),
            Tensor(f"{p}.mlp.experts.gate_up_proj_bias", "MoE experts", 2 * inter, count=e, expert=True),
            Tensor(f"{p}.mlp.experts.down_proj_bias", "MoE experts", h, count=e, expert=True),
        ]
    if moe.router_bias:
        out.append(Tensor(f"{p}.mlp.gate.e_score_correction_bias", "router", e, replicated=True, dtype_bytes=4))
    if moe.shared_intermediate_size:
        s = moe.shared_intermediate_size
        name = f"{p}.mlp.shared_expert" if moe.shared_expert_gate else f"{p}.mlp.shared_experts"
        out += [
            Tensor(f"{name}.gate_up_proj", "shared experts", h, 2 * s, linear=True),
            Tensor(f"{name}.down_proj", "shared experts", s, h, linear=True),
        ]
        if moe.shared_expert_gate:
            out.append(Tensor(f"{p}.mlp.shared_expert_gate", "router", h, 1, replicated=True))
    return out


def layer_tensors(arch: Architecture, layer: int, prefix: str = "model.layers") -> list[Tensor]:
    """The tensors of decoder layer `layer` (MTP layers use the MoE/dense choice of the last)."""
    p = f"{prefix}.{layer}"
    kind = arch.layer_kinds[min(layer, arch.num_layers - 1)]
    mixer = _linear_attention_tensors(arch, p) if kind == LINEAR else _attention_tensors(arch, p)
    norms = Tensor(f"{p}.layernorms", "norms", arch.norms_per_layer * arch.hidden_size, replicated=True)
    return [*mixer, *_mlp_tensors(arch, p, min(layer, arch.num_layers - 1)), norms]


def _vision_tensors(arch: Architecture) -> list[Tensor]:
    v = arch.vision
    if v is None:
        return []
    h, i = v.hidden_size, v.intermediate_size
    per_layer = 4 * h * h + 2 * h * i + 4 * h + i + h + 4 * h  # qkv/o + fc1/fc2 + biases + 2 norms
    return [
        Tensor("visual.blocks", "vision tower", per_layer, count=v.depth),
        Tensor("visual.patch_embed", "vision tower", v.patch_params),
        Tensor("visual.merger", "vision tower", v.projector_params),
    ]


def _mtp_tensors(arch: Architecture) -> list[Tensor]:
    out: list[Tensor] = []
    h = arch.hidden_size
    for j in range(arch.mtp_layers):
        layer = arch.num_layers + j
        p = f"mtp.layers.{layer}"
        out += [replace(t, category="MTP (speculative)") for t in layer_tensors(arch, layer, "mtp")]
        out += [
            Tensor(f"{p}.eh_proj", "MTP (speculative)", 2 * h, h),
            Tensor(f"{p}.enorm_hnorm", "MTP (speculative)", 3 * h),
        ]
        if arch.mla is not None:  # DeepSeek-V3 ships embed_tokens + shared_head per MTP layer
            out.append(Tensor(f"{p}.embed_and_head", "MTP (speculative)", arch.vocab_size, 2 * h))
    return out


@dataclass(frozen=True)
class CategoryBytes:
    category: str
    params: int
    bytes: int


@dataclass(frozen=True)
class WeightEstimate:
    """Checkpoint bytes by component; `loaded_bytes` is what vLLM puts on the GPUs."""

    format: str
    params: int
    loaded_bytes: int  # everything vLLM loads for serving (no MTP)
    checkpoint_bytes: int  # loaded + MTP layers (what the safetensors files hold)
    categories: tuple[CategoryBytes, ...]
    layer_bytes: tuple[int, ...]  # per decoder layer, split by TP
    layer_replicated_bytes: tuple[int, ...]  # per decoder layer, on every TP rank
    layer_expert_bytes: tuple[int, ...]  # the routed-expert part of layer_bytes (split by EP = TP×DP)
    embedding_bytes: int
    lm_head_bytes: int  # lm_head (or the tied embedding) as the last PP stage holds it
    vision_bytes: int
    final_norm_bytes: int


def estimate_weights(arch: Architecture) -> WeightEstimate:
    """Count every tensor the checkpoint holds, in its weight format."""
    fmt = arch.weight_format
    h = arch.hidden_size
    totals: dict[str, list[float]] = {}

    expert_part = [0.0]

    def add(tensors: Iterable[Tensor]) -> tuple[float, float]:
        sharded = replicated = 0.0
        expert_part[0] = 0.0
        for t in tensors:
            b = tensor_bytes(t, fmt)
            entry = totals.setdefault(t.category, [0, 0])
            entry[0] += t.params
            entry[1] += b
            if t.replicated:
                replicated += b
            else:
                sharded += b
                if t.expert:
                    expert_part[0] += b
        return sharded, replicated

    embed_b, _ = add([Tensor("model.embed_tokens", "embeddings", arch.vocab_size, h)])
    head = Tensor("lm_head", "lm_head", h, arch.vocab_size, linear=fmt.quantize_lm_head)
    head_b = tensor_bytes(head, fmt)
    if not arch.tie_word_embeddings:
        add([head])
    final_b, _ = add([Tensor("model.norm", "norms", h)])
    layers: list[int] = []
    replicated: list[int] = []
    experts: list[int] = []
    for i in range(arch.num_layers):
        s, r = add(layer_tensors(arch, i))
        layers.append(round(s))
        replicated.append(round(r))
        experts.append(round(expert_part[0]))
    vision_b, _ = add(_vision_tensors(arch))
    mtp_b = sum(add(_mtp_tensors(arch)))
    order = [
        "embeddings",
        "lm_head",
        "attention",
        "linear attention",
        "dense MLP",
        "MoE experts",
        "shared experts",
        "router",
        "norms",
        "vision tower",
        "MTP (speculative)",
    ]
    categories = tuple(
        CategoryBytes(name, int(totals[name][0]), round(totals[name][1])) for name in order if name in totals
    )
    checkpoint = sum(c.bytes for c in categories)
    mtp_params = int(totals.get("MTP (speculative)", [0, 0])[0])
    return WeightEstimate(
        format=fmt.describe(),
        params=sum(c.params for c in categories) - mtp_params,
        loaded_bytes=checkpoint - round(mtp_b),
        checkpoint_bytes=checkpoint,
        categories=categories,
        layer_bytes=tuple(layers),
        layer_replicated_bytes=tuple(replicated),
        layer_expert_bytes=tuple(experts),
        embedding_bytes=round(embed_b),
        lm_head_bytes=round(head_b),
        vision_bytes=round(vision_b),
        final_norm_bytes=round(final_b),
    )
