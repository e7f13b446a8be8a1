"""A model's config.json as an `Architecture`: the shapes and layer kinds sizing counts from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kit.errors import ConfigError
from kit.sizing.limits import TEXT_LIMITS, check_quant_config, check_text_config, checked_int
from kit.sizing.quantization import WeightFormat, parse_dtype, parse_weight_format

# model_type defaults that config.json leaves out (they come from the transformers class).
_TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "gemma3_text", "gemma4", "gemma4_text")
QKV_BIAS_BY_DEFAULT = ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl")
_QK_NORM_BY_DEFAULT = (
    "qwen3",
    "qwen3_moe",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_text",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
    "gemma3",
    "gemma3_text",
    "olmo2",
)
_FOUR_NORMS_PER_LAYER = ("gemma2", "gemma3", "gemma3_text", "gemma4", "gemma4_text")
_LINEAR_ATTENTION_TYPES = (
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_text",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
)

# gpt-oss: biased router and experts, and one learned attention-sink logit per head
# (transformers models/gpt_oss: `mlp.router.bias`, `experts.*_bias`, `self_attn.sinks`).
_MOE_LINEAR_BIASES = ("gpt_oss",)
_ATTENTION_SINKS = ("gpt_oss",)

# Llama 4 (transformers models/llama4): every MoE layer holds a shared expert beside the routed
# ones (`feed_forward.shared_expert`, an MLP of width intermediate_size, no gate), which
# config.json never mentions; dense layers are MLPs of intermediate_size_mlp. Its chunked-
# attention layers are sized as full attention: vLLM turns the hybrid KV-cache manager off for
# chunked local attention by default (a latency regression), so every layer gets full-length KV.
_SHARED_EXPERT_BY_DEFAULT = ("llama4", "llama4_text")

# Layer kinds in `Architecture.layer_kinds`.
FULL = "full_attention"
SLIDING = "sliding_attention"
LINEAR = "linear_attention"


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2/V3): a compressed KV latent per token."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class MoE:
    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_intermediate_size: int  # 0: no shared expert
    shared_expert_gate: bool  # Qwen: a hidden->1 gate on the shared expert
    router_bias: bool  # DeepSeek-V3 noaux_tc: e_score_correction_bias
    moe_layers: tuple[int, ...]  # decoder layers whose MLP is the MoE block
    linear_biases: bool = False  # gpt-oss: router.bias and per-expert gate_up/down biases (bf16)


@dataclass(frozen=True)
class LinearAttention:
    """Gated DeltaNet (Qwen3-Next / Qwen3.5) layers: no KV cache, a fixed state per sequence."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    state_dtype: str

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True)
class Vision:
    """A ViT-style vision tower, sized from `vision_config`."""

    depth: int
    hidden_size: int
    intermediate_size: int
    patch_params: int  # patch embedding + position embedding
    projector_params: int


@dataclass(frozen=True)
class Architecture:
    model_type: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    tie_word_embeddings: bool
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int | None
    layer_kinds: tuple[str, ...]
    sliding_window: int | None
    attention_bias: bool
    qk_norm: bool
    attn_output_gate: bool
    norms_per_layer: int
    weight_format: WeightFormat
    mla: MLA | None = None
    moe: MoE | None = None
    linear: LinearAttention | None = None
    vision: Vision | None = None
    mtp_layers: int = 0
    attention_sinks: bool = False  # gpt-oss: `self_attn.sinks`, one value per head

    @property
    def dtype(self) -> str:
        return self.weight_format.dtype

    def count(self, kind: str) -> int:
        return sum(1 for k in self.layer_kinds if k == kind)


def _text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Multimodal configs keep the language model under `text_config` (or `llm_config`)."""
    for key in ("text_config", "llm_config", "language_config"):
        inner = config.get(key)
        if isinstance(inner, Mapping) and inner.get("hidden_size"):
            merged = {k: v for k, v in config.items() if k != key}
            merged.update(inner)
            return merged
    return dict(config)


def _get(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def _req_int(cfg: Mapping[str, Any], *keys: str, source: str) -> int:
    key = next((k for k in keys if cfg.get(k) is not None), None)
    if key is None:
        raise ConfigError(
            f"needs a positive integer {keys[0]}",
            key=keys[0],
            source=source,
            hint="point kit plan at the model's own config.json (a decoder LLM)",
        )
    low, high = TEXT_LIMITS[key]
    return checked_int(cfg[key], key, max(low, 1), high, source=source)


def _layer_kinds(cfg: Mapping[str, Any], model_type: str, n: int, source: str) -> tuple[str, ...]:
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) < n:
            raise ConfigError(
                f"layer_types lists {len(types)} layers but num_hidden_layers is {n}",
                key="layer_types",
                source=source,
                hint="fix config.json so both agree",
            )
        kinds = []
        for t in types[:n]:
            t = str(t)
            if t in ("linear_attention", "mamba", "gated_deltanet"):
                kinds.append(LINEAR)
            elif t in ("sliding_attention", "chunked_attention", "local_attention"):
                kinds.append(SLIDING)
            else:
                kinds.append(FULL)
        return tuple(kinds)
    window = cfg.get("sliding_window")
    interval = cfg.get("full_attention_interval")
    if model_type in _LINEAR_ATTENTION_TYPES and isinstance(interval, int) and interval > 0:
        return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(n))
    if window and model_type == "gemma2":
        return tuple(SLIDING if i % 2 == 0 else FULL for i in range(n))
    if window and model_type in ("gemma3", "gemma3_text"):
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        return tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n))
    if window and model_type in ("mistral", "mixtral"):
        return (SLIDING,) * n
    if window and cfg.get("use_sliding_window"):
        # Qwen2: layers from max_window_layers upwards use the window.
        start = int(cfg.get("max_window_layers") or 0)
        return tuple(SLIDING if i >= start else FULL for i in range(n))
    return (FULL,) * n


def _moe(cfg: Mapping[str, Any], n_layers: int, intermediate: int) -> MoE | None:
    experts = int(_get(cfg, "num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts") or 0)
    if experts <= 1:
        return None
    model_type = str(cfg.get("model_type"))
    expert_inter = int(_get(cfg, "moe_intermediate_size", "expert_intermediate_size") or intermediate)
    shared = int(cfg.get("shared_expert_intermediate_size") or 0)
    shared_gate = shared > 0
    if not shared and cfg.get("n_shared_experts"):
        shared = int(cfg["n_shared_experts"]) * expert_inter
    if not shared and model_type in _SHARED_EXPERT_BY_DEFAULT:
        shared = expert_inter
    first_dense = int(cfg.get("first_k_dense_replace") or 0)
    # Every step-th layer is MoE: Qwen decoder_sparse_step, DeepSeek moe_layer_freq, Llama 4
    # interleave_moe_layer_step (Maverick: 2, MoE and dense layers alternate; transformers:
    # moe_layers = range(step - 1, layers, step)). An explicit moe_layers list wins.
    step = int(cfg.get("decoder_sparse_step") or cfg.get("moe_layer_freq") or cfg.get("interleave_moe_layer_step") or 1)
    mlp_only = {int(i) for i in cfg.get("mlp_only_layers") or []}
    explicit = cfg.get("moe_layers")
    if isinstance(explicit, list):
        wanted = {int(i) for i in explicit}
        layers = tuple(i for i in range(n_layers) if i in wanted)
    else:
        layers = tuple(
            i for i in range(n_layers) if i >= first_dense and i not in mlp_only and (i + 1) % max(step, 1) == 0
        )
    return MoE(
        num_experts=experts,
        experts_per_token=int(_get(cfg, "num_experts_per_tok", "moe_topk", default=2)),
        expert_intermediate_size=expert_inter,
        shared_intermediate_size=shared,
        shared_expert_gate=shared_gate,
        router_bias=cfg.get("topk_method") == "noaux_tc",
        moe_layers=layers,
        linear_biases=str(cfg.get("model_type")) in _MOE_LINEAR_BIASES,
    )


def _vision(config: Mapping[str, Any], text_hidden: int) -> Vision | None:
    vc = config.get("vision_config")
    if not isinstance(vc, Mapping):
        return None
    # vt_*: Kimi-K2.5's MoonViT (its patch embedding and projector use the defaults below).
    depth = _get(vc, "num_hidden_layers", "depth", "num_layers", "vt_num_hidden_layers")
    hidden = _get(vc, "hidden_size", "embed_dim", "width", "vt_hidden_size")
    if not isinstance(depth, int) or not isinstance(hidden, int):
        return None
    inter = int(_get(vc, "intermediate_size", "mlp_dim", "vt_intermediate_size", default=4 * hidden))
    patch = int(_get(vc, "patch_size", default=14))
    channels = int(_get(vc, "num_channels", "in_channels", "in_chans", default=3))
    temporal = int(vc.get("temporal_patch_size") or 1)
    image = vc.get("image_size")
    positions = (int(image) // patch) ** 2 if isinstance(image, int) else 0
    positions = int(vc.get("num_position_embeddings") or positions)
    patch_params = channels * temporal * patch * patch * hidden + hidden + positions * hidden
    merge = int(vc.get("spatial_merge_size") or 1)
    out = int(vc.get("out_hidden_size") or text_hidden)
    if vc.get("projector_input_dim"):
        # Llama 4: a class token (+ its position) and pre/post LayerNorms beside the patch
        # embedding; the pixel-shuffle adapter (fc1 intermediate -> projector_input_dim, fc2
        # projector_output_dim square, no biases) and multi_modal_projector.linear_1
        # (vision_output_dim -> text hidden, no bias).
        patch_params += hidden + 4 * hidden  # (the base "+ hidden" is the class embedding here)
        p_in = int(vc["projector_input_dim"])
        p_out = int(vc.get("projector_output_dim") or p_in)
        v_out = int(vc.get("vision_output_dim") or p_out)
        projector = inter * p_in + p_out * p_out + v_out * text_hidden
    elif merge > 1:  # Qwen-VL patch merger: (h·m²) -> (h·m²) -> out
        merged = hidden * merge * merge
        projector = merged * merged + merged + merged * out + out + hidden
    else:  # Gemma3 / LLaVA style: one linear projection (+ norm)
        projector = hidden * out + hidden
    return Vision(
        depth=depth,
        hidden_size=hidden,
        intermediate_size=inter,
        patch_params=patch_params,
        projector_params=projector,
    )


def parse_architecture(
    config: Mapping[str, Any],
    quant_config: Mapping[str, Any] | None = None,
    *,
    dtype: str | None = None,
    source: str = "config.json",
) -> Architecture:
    """Turn a config.json dict (+ optional separate quant config) into an `Architecture`.

    `dtype` overrides the checkpoint dtype of unquantized tensors (`--dtype`). Every number is
    range-checked first (kit.sizing.limits); a value of a type the parser does not expect is
    refused as well, with the file named, never a traceback.
    """
    try:
        return _parse(config, quant_config, dtype=dtype, source=source)
    except (TypeError, ValueError, ArithmeticError, AttributeError, LookupError) as err:
        # Last line of defence behind the checks in limits.py: a shape of config.json no check
        # foresaw is still one line naming the file (issue 16), not a traceback.
        raise ConfigError(
            f"cannot read the model's configuration ({type(err).__name__}: {err})",
            source=source,
            hint="point kit plan at the model's own, unmodified config.json",
        ) from None


def _parse(
    config: Mapping[str, Any], quant_config: Mapping[str, Any] | None, *, dtype: str | None, source: str
) -> Architecture:
    cfg = _text_config(config)
    check_text_config(cfg, source=source)
    model_type = str(cfg.get("model_type") or config.get("model_type") or "unknown")
    hidden = _req_int(cfg, "hidden_size", "n_embd", "d_model", source=source)
    n_layers = _req_int(cfg, "num_hidden_layers", "n_layer", "num_layers", source=source)
    vocab = _req_int(cfg, "vocab_size", "padded_vocab_size", source=source)
    heads = _req_int(cfg, "num_attention_heads", "n_head", source=source)
    kv_heads = int(_get(cfg, "num_key_value_heads", "num_kv_heads", default=heads))
    if cfg.get("multi_query") and not cfg.get("num_key_value_heads"):
        kv_heads = 1
    head_dim = int(_get(cfg, "head_dim", default=hidden // heads))
    intermediate = int(_get(cfg, "intermediate_size", "ffn_hidden_size", "n_inner", default=0))
    if not intermediate:
        intermediate = 4 * hidden
    dense_intermediate = int(cfg.get("intermediate_size_mlp") or intermediate)  # Llama 4 dense layers
    raw_dtype = dtype or _get(cfg, "torch_dtype", "dtype") or _get(config, "torch_dtype", "dtype")
    dtype_name = parse_dtype(raw_dtype or "bfloat16", source=source)
    # Multimodal checkpoints may keep quantization_config next to the language model in
    # text_config (vLLM PR 10120: InternVL2's llm_config, Kimi-K2.5's text_config); cfg has it then.
    quant = quant_config or config.get("quantization_config") or cfg.get("quantization_config")
    check_quant_config(quant, source=source)
    fmt = parse_weight_format(quant, dtype_name, source=source)

    mla = None
    if cfg.get("kv_lora_rank"):
        mla = MLA(
            q_lora_rank=int(cfg["q_lora_rank"]) if cfg.get("q_lora_rank") else None,
            kv_lora_rank=int(cfg["kv_lora_rank"]),
            qk_nope_head_dim=int(cfg.get("qk_nope_head_dim") or 128),
            qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 64),
            v_head_dim=int(cfg.get("v_head_dim") or 128),
        )
    kinds = _layer_kinds(cfg, model_type, n_layers, source)
    linear = None
    if LINEAR in kinds:
        nv = int(_get(cfg, "linear_num_value_heads", default=heads))
        linear = LinearAttention(
            num_key_heads=int(_get(cfg, "linear_num_key_heads", default=nv)),
            num_value_heads=nv,
            key_head_dim=int(_get(cfg, "linear_key_head_dim", default=128)),
            value_head_dim=int(_get(cfg, "linear_value_head_dim", default=128)),
            conv_kernel=int(_get(cfg, "linear_conv_kernel_dim", default=4)),
            state_dtype=parse_dtype(cfg.get("mamba_ssm_dtype") or dtype_name, source=source),
        )
    tie_default = model_type in _TIED_BY_DEFAULT
    tie = _get(cfg, "tie_word_embeddings")
    if tie is None:
        tie = config.get("tie_word_embeddings", tie_default)
    return Architecture(
        model_type=model_type,
        hidden_size=hidden,
        num_layers=n_layers,
        vocab_size=vocab,
        tie_word_embeddings=bool(tie),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=dense_intermediate,
        max_position_embeddings=_positions(cfg),
        layer_kinds=kinds,
        sliding_window=int(cfg["sliding_window"]) if cfg.get("sliding_window") else None,
        attention_bias=bool(_get(cfg, "attention_bias", default=model_type in QKV_BIAS_BY_DEFAULT)),
        qk_norm=model_type in _QK_NORM_BY_DEFAULT,
        attn_output_gate=bool(cfg.get("attn_output_gate", model_type == "qwen3_next")),
        norms_per_layer=4 if model_type in _FOUR_NORMS_PER_LAYER else 2,
        weight_format=fmt,
        mla=mla,
        moe=_moe(cfg, n_layers, intermediate),
        linear=linear,
        vision=_vision(config, hidden),
        mtp_layers=int(_get(cfg, "num_nextn_predict_layers", "mtp_num_hidden_layers", default=0)),
        attention_sinks=model_type in _ATTENTION_SINKS,
    )


def _positions(cfg: Mapping[str, Any]) -> int | None:
    value = _get(cfg, "max_position_embeddings", "n_positions", "seq_length")
    return None if value is None else int(value)


def summarize_layers(kinds: Sequence[str]) -> str:
    """`60 (45 linear_attention, 15 full_attention)`."""
    counts: dict[str, int] = {}
    for k in kinds:
        counts[k] = counts.get(k, 0) + 1
    if len(counts) == 1:
        return f"{len(kinds)} ({next(iter(counts))})"
    return f"{len(kinds)} (" + ", ".join(f"{n} {k}" for k, n in counts.items()) + ")"


def with_quantization(arch: Architecture, quantization: str | None) -> Architecture:
    """Apply a `--quantization` override (vLLM's names) to an architecture."""
    if not quantization or quantization in ("auto", "none"):
        return arch
    q = quantization.lower()
    fmt = arch.weight_format
    # Kernel choices for an already-quantized checkpoint: same bytes on the GPU.
    same_bytes = {
        "gptq": ("gptq",),
        "gptq_marlin": ("gptq",),
        "awq": ("awq",),
        "awq_marlin": ("awq",),
        "cpu_awq": ("awq",),
        "marlin": ("gptq", "awq"),
        "moe_wna16": ("gptq", "awq", "int-pack"),
        "auto-round": ("gptq", "awq"),
        "inc": ("gptq", "awq"),
        "compressed-tensors": ("int-pack", "fp8", "nvfp4", "mxfp4"),
        "fp8": ("fp8",),
        "fbgemm_fp8": ("fp8",),
        "modelopt": ("fp8", "nvfp4"),
        "modelopt_fp4": ("nvfp4",),
        "petit_nvfp4": ("nvfp4",),
        "mxfp4": ("mxfp4",),
        "quark": ("fp8", "mxfp4", "int-pack"),
        "bitsandbytes": ("bnb-int8", "bnb-nf4"),
    }
    if fmt.method != "none":
        if fmt.method in same_bytes.get(q, ()):
            return arch
        raise ConfigError(
            f"--quantization {quantization} does not match the checkpoint ({fmt.method})",
            key="quantization",
            hint=f"drop --quantization, or use one that reads {fmt.method} weights",
        )
    # Online quantization of a bf16/fp16 checkpoint: the GPU holds the quantized weights.
    if q in ("fp8", "fbgemm_fp8", "ptpc_fp8"):  # weights cast to fp8 at load
        fmt = WeightFormat(method="fp8", dtype=fmt.dtype, bits=8, scale_bytes=4)
        return replace(arch, weight_format=fmt)
    if q == "experts_int8":  # vLLM ExpertsInt8: MoE experts to int8 with an fp32 scale per row
        if arch.moe is None:
            raise ConfigError(
                "--quantization experts_int8 needs an MoE model", key="quantization", hint="drop --quantization"
            )
        fmt = WeightFormat(
            method="int8", dtype=fmt.dtype, bits=8, scale_bytes=4, per_channel_scale=True, experts_only=True
        )
        return replace(arch, weight_format=fmt)
    if q == "bitsandbytes":  # in-flight 4-bit (NF4, blocks of 64, no double quant)
        fmt = WeightFormat(method="bnb-nf4", dtype=fmt.dtype, bits=4, group_size=64, scale_bytes=4)
        return replace(arch, weight_format=fmt)
    raise ConfigError(
        f"--quantization {quantization} needs a checkpoint quantized that way",
        key="quantization",
        hint="online quantization kit can size: fp8, fbgemm_fp8, ptpc_fp8, experts_int8, bitsandbytes; "
        "otherwise use a quantized checkpoint",
    )
