"""kit.sizing: weight / KV-cache estimates against real configs, each branch, every refusal."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from kit import sizing
from kit.errors import ConfigError

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
PUBLISHED = sorted(
    d.name for d in MODELS.iterdir() if "total_size_bytes" in json.loads((d / "expected.json").read_text())
)


def load(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fixture's config as `kit plan` reads it (a ModelOpt hf_quant_config.json beside it is folded in)."""
    d = MODELS / name
    return sizing.load_model_config(str(d)), json.loads((d / "expected.json").read_text())


def tiny(**overrides: Any) -> dict[str, Any]:
    """A small Llama-shaped config whose tensors are easy to count by hand."""
    cfg: dict[str, Any] = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    cfg.update(overrides)
    return cfg


def categories(w: sizing.WeightEstimate) -> dict[str, sizing.CategoryBytes]:
    return {c.category: c for c in w.categories}


# --------------------------------------------------------------------------- published sizes


def test_at_least_eight_real_models_ship() -> None:
    assert len(PUBLISHED) >= 8


@pytest.mark.parametrize("name", PUBLISHED)
def test_weight_estimate_within_3_percent_of_published_checkpoint(name: str) -> None:
    config, expected = load(name)
    weights = sizing.estimate_weights(sizing.parse_architecture(config))
    # A checkpoint that saved no MTP tensors (its index says so) is compared without them.
    estimate = weights.checkpoint_bytes if expected.get("mtp_in_checkpoint", True) else weights.loaded_bytes
    published = expected["total_size_bytes"]
    assert abs(estimate / published - 1) < 0.03, (name, estimate, published)
    assert expected["source"]


def test_published_set_covers_every_family() -> None:
    archs = {name: sizing.parse_architecture(load(name)[0]) for name in PUBLISHED}
    methods = {a.weight_format.method for a in archs.values()}
    assert {"none", "fp8", "gptq", "awq", "bnb-int8", "bnb-nf4", "int-pack", "mxfp4", "nvfp4"} <= methods
    fp8 = [a.weight_format for a in archs.values() if a.weight_format.method == "fp8"]
    assert any(f.block for f in fp8) and any(not f.block and not f.per_channel_scale for f in fp8)
    # Each checkpoint format behind the README's "tested" rows, not only the byte layout it maps to.
    blocks = [load(name)[0].get("quantization_config") or {} for name in PUBLISHED]
    assert {"fp8", "compressed-tensors", "bitsandbytes", "auto-round", "gptq", "awq", "mxfp4"} <= {
        str(q.get("quant_method")) for q in blocks
    }
    assert {"FP8", "NVFP4"} <= {q["quantization"]["quant_algo"] for q in blocks if "quantization" in q}  # ModelOpt
    # compressed-tensors beyond int4/fp8 per-tensor: int8 W8A8, fp8 per-channel (FP8_DYNAMIC), NVFP4.
    ct = [
        archs[n].weight_format
        for n, q in zip(PUBLISHED, blocks, strict=True)
        if q.get("quant_method") == "compressed-tensors"
    ]
    assert any(f.method == "int-pack" and f.bits == 8 and f.group_size <= 0 for f in ct)
    assert any(f.method == "fp8" and f.per_channel_scale for f in ct)
    assert any(f.method == "nvfp4" for f in ct)
    # bitsandbytes 4-bit both ways: NF4 with double quant and FP4 without it.
    bnb4 = [q for q in blocks if q.get("quant_method") == "bitsandbytes" and q.get("load_in_4bit")]
    assert {(q.get("bnb_4bit_quant_type"), bool(q.get("bnb_4bit_use_double_quant"))) for q in bnb4} >= {
        ("nf4", True),
        ("fp4", False),
    }
    assert any(a.mla for a in archs.values())  # DeepSeek-V3
    assert any(a.moe and a.moe.shared_intermediate_size for a in archs.values())
    assert any(a.moe and not a.moe.shared_intermediate_size for a in archs.values())  # Mixtral
    assert any(a.count(sizing.SLIDING) for a in archs.values())  # Gemma 3
    assert any(a.count(sizing.LINEAR) for a in archs.values())  # Qwen3.5
    assert any(a.vision for a in archs.values())
    assert any(a.tie_word_embeddings for a in archs.values())
    assert any(a.num_kv_heads < a.num_attention_heads for a in archs.values())


# --------------------------------------------------------------------------- the MeluXina guide


def guide_arch() -> tuple[sizing.Architecture, dict[str, Any]]:
    config, expected = load("qwen3.5-397b-a17b-gptq-int4")
    return sizing.parse_architecture(config), expected["guide"]


def test_guide_weights_match_397e9_times_half_a_byte() -> None:
    arch, guide = guide_arch()
    weights = sizing.estimate_weights(arch)
    assert weights.params == pytest.approx(guide["params"], rel=0.01)
    # The guide's 199 GB ignores group scales/zeros and bf16 embeddings: kit adds ~6 %.
    assert weights.loaded_bytes == pytest.approx(guide["weights_bytes"], rel=0.08)
    assert weights.loaded_bytes > guide["weights_bytes"]


def test_guide_two_nodes_of_four_a100_40gb() -> None:
    arch, guide = guide_arch()
    gpu = sizing.gpu_memory_bytes("A100-40GB")
    node_budget = 4 * gpu * guide["gpu_memory_utilization"]
    assert node_budget == pytest.approx(guide["node_budget_bytes"], rel=0.08)  # 144 GiB vs "GB"
    rec = sizing.recommend(
        arch,
        gpu_memory_bytes=gpu,
        gpus_per_node=4,
        gpu_memory_utilization=0.9,
        max_model_len=guide["max_model_len"],
        max_num_seqs=256,
    )
    assert (rec.nodes, rec.tp, rec.pp) == (guide["nodes"], 4, 2)
    # What the KV cache changes: 262144 tokens hold ~2 GiB per GPU per sequence, so the room
    # left on 2 nodes serves only a handful of full-length sequences, not 256.
    assert 1 <= rec.max_concurrent_seqs < 16
    assert not rec.fits_max_num_seqs
    with pytest.raises(ConfigError, match="nodes: weights need"):
        sizing.recommend(arch, gpu_memory_bytes=gpu, gpus_per_node=4, nodes=1, max_model_len=4096)


def test_guide_kv_cache_per_token() -> None:
    arch, _ = guide_arch()
    kv = sizing.kv_bytes_per_token(arch)
    # 15 full-attention layers × 2 × 2 KV heads × 256 × 2 B; linear layers add only state.
    assert kv.per_token_bytes == 15 * 2 * 2 * 256 * 2
    linear = next(lk for lk in kv.layers if lk.kind == sizing.LINEAR)
    assert linear.layers == 45
    assert linear.state_bytes_per_seq == (2 * 2048 + 8192) * 3 * 2 + 64 * 128 * 128 * 2


# --------------------------------------------------------------------------- architecture branches


def test_dense_llama_counts_every_tensor() -> None:
    arch = sizing.parse_architecture(tiny())
    w = sizing.estimate_weights(arch)
    h, kv, inter, v, n = 64, 2 * 8, 128, 1000, 4  # kv: 2 heads × head_dim 8
    attention = n * (h * h + 2 * h * kv + h * h)
    mlp = n * 3 * h * inter
    norms = n * 2 * h + h
    assert w.params == 2 * v * h + attention + mlp + norms
    assert w.loaded_bytes == 2 * w.params  # bf16
    assert categories(w)["lm_head"].params == v * h


def test_tied_embeddings_drop_lm_head() -> None:
    untied = sizing.estimate_weights(sizing.parse_architecture(tiny()))
    tied = sizing.estimate_weights(sizing.parse_architecture(tiny(tie_word_embeddings=True)))
    assert "lm_head" not in categories(tied)
    assert untied.params - tied.params == 1000 * 64


def test_gemma_defaults_to_tied_and_four_norms() -> None:
    cfg = tiny(model_type="gemma2", sliding_window=16)
    del cfg["tie_word_embeddings"]
    arch = sizing.parse_architecture(cfg)
    assert arch.tie_word_embeddings and arch.norms_per_layer == 4
    assert arch.layer_kinds[:2] == (sizing.SLIDING, sizing.FULL)


def test_mqa_and_gqa_kv_heads() -> None:
    mqa = sizing.parse_architecture(tiny(num_key_value_heads=None, multi_query=True))
    assert mqa.num_kv_heads == 1
    mha = sizing.parse_architecture(tiny(num_key_value_heads=None))
    assert mha.num_kv_heads == 8
    assert sizing.kv_bytes_per_token(mqa).per_token_bytes == 4 * 2 * 1 * 8 * 2


def test_qkv_bias_and_qk_norm_defaults() -> None:
    qwen2 = sizing.estimate_weights(sizing.parse_architecture(tiny(model_type="qwen2")))
    llama = sizing.estimate_weights(sizing.parse_architecture(tiny()))
    assert categories(qwen2)["attention"].params - categories(llama)["attention"].params == 4 * (64 + 2 * 16)
    qwen3 = sizing.parse_architecture(tiny(model_type="qwen3"))
    assert qwen3.qk_norm and not sizing.parse_architecture(tiny()).qk_norm


def test_mla_tensors_and_latent_kv() -> None:
    cfg = tiny(
        model_type="deepseek_v2",
        num_key_value_heads=8,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=8,
    )
    arch = sizing.parse_architecture(cfg)
    assert arch.mla is not None
    names = [t.name.split(".")[-1] for t in sizing.layer_tensors(arch, 0)]
    assert names[:6] == [
        "q_a_proj",
        "q_a_layernorm",
        "q_b_proj",
        "kv_a_proj_with_mqa",
        "kv_a_layernorm",
        "kv_b_proj",
    ]
    attention = 64 * 32 + 32 * 8 * 12 + 64 * (16 + 4) + 16 * 8 * 16 + 8 * 8 * 64
    assert categories(sizing.estimate_weights(arch))["attention"].params == 4 * attention
    kv = sizing.kv_bytes_per_token(arch)
    assert [lk.kind for lk in kv.layers] == ["mla"]
    assert kv.per_token_bytes == 4 * (16 + 4) * 2
    no_q_lora = sizing.parse_architecture({**cfg, "q_lora_rank": None})
    assert "q_proj" in [t.name.split(".")[-1] for t in sizing.layer_tensors(no_q_lora, 0)]


def test_moe_experts_shared_router_and_dense_first_layers() -> None:
    cfg = tiny(
        model_type="deepseek_v3",
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        n_shared_experts=2,
        first_k_dense_replace=1,
        topk_method="noaux_tc",
    )
    arch = sizing.parse_architecture(cfg)
    assert arch.moe is not None and arch.moe.moe_layers == (1, 2, 3)
    c = categories(sizing.estimate_weights(arch))
    assert c["MoE experts"].params == 3 * 8 * 3 * 64 * 32
    assert c["shared experts"].params == 3 * 3 * 64 * 64  # 2 shared × 32
    assert c["router"].params == 3 * (64 * 8 + 8)
    assert c["dense MLP"].params == 1 * 3 * 64 * 128


def test_qwen_shared_expert_gate_and_mlp_only_layers() -> None:
    cfg = tiny(
        model_type="qwen2_moe",
        num_experts=4,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=48,
        mlp_only_layers=[0],
    )
    arch = sizing.parse_architecture(cfg)
    assert arch.moe is not None and arch.moe.shared_expert_gate
    assert arch.moe.moe_layers == (1, 2, 3)
    c = categories(sizing.estimate_weights(arch))
    assert c["router"].params == 3 * (64 * 4 + 64)
    assert c["shared experts"].params == 3 * 3 * 64 * 48


def test_mixtral_experts_use_intermediate_size() -> None:
    arch = sizing.parse_architecture(tiny(model_type="mixtral", num_local_experts=4))
    assert arch.moe is not None and arch.moe.expert_intermediate_size == 128


def test_vision_tower_counted() -> None:
    config, _ = load("medgemma-27b-it")
    arch = sizing.parse_architecture(config)
    assert arch.vision is not None and arch.vision.depth == 27
    vision = categories(sizing.estimate_weights(arch))["vision tower"]
    assert 0.40e9 < vision.params < 0.45e9  # SigLIP-So400m + projector


def test_mtp_layers_are_not_loaded() -> None:
    config, _ = load("deepseek-v3")
    w = sizing.estimate_weights(sizing.parse_architecture(config))
    assert w.checkpoint_bytes - w.loaded_bytes == categories(w)["MTP (speculative)"].bytes
    assert w.params == pytest.approx(671e9, rel=0.002)


# --------------------------------------------------------------------------- layer kinds, KV


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"model_type": "mistral", "sliding_window": 32}, (sizing.SLIDING,) * 4),
        ({"model_type": "qwen2", "sliding_window": 32, "use_sliding_window": False}, None),
        (
            {
                "model_type": "qwen2",
                "sliding_window": 32,
                "use_sliding_window": True,
                "max_window_layers": 2,
            },
            (sizing.FULL, sizing.FULL, sizing.SLIDING, sizing.SLIDING),
        ),
        (
            {"model_type": "gemma3_text", "sliding_window": 32, "sliding_window_pattern": 2},
            (sizing.SLIDING, sizing.FULL) * 2,
        ),
        (
            {"model_type": "qwen3_next", "full_attention_interval": 2},
            (sizing.LINEAR, sizing.FULL) * 2,
        ),
        (
            {
                "layer_types": [
                    "sliding_attention",
                    "full_attention",
                    "linear_attention",
                    "chunked_attention",
                ],
                "sliding_window": 8,
            },
            (sizing.SLIDING, sizing.FULL, sizing.LINEAR, sizing.SLIDING),
        ),
    ],
)
def test_layer_kinds(overrides: dict[str, Any], expected: tuple[str, ...] | None) -> None:
    arch = sizing.parse_architecture(tiny(**overrides))
    assert arch.layer_kinds == (expected or (sizing.FULL,) * 4)


def test_sliding_window_caps_kv_per_sequence() -> None:
    arch = sizing.parse_architecture(tiny(model_type="mistral", sliding_window=32))
    kv = sizing.kv_bytes_per_token(arch)
    per_token = 4 * 2 * 2 * 8 * 2
    assert kv.per_sequence_bytes(16) == 16 * per_token
    assert kv.per_sequence_bytes(4096) == 32 * per_token


def test_kv_cache_dtype_fp8_halves_kv() -> None:
    arch = sizing.parse_architecture(tiny())
    assert sizing.kv_bytes_per_token(arch, "fp8").per_token_bytes * 2 == sizing.kv_bytes_per_token(arch).per_token_bytes


# --------------------------------------------------------------------------- weight formats


def linear(n_in: int, n_out: int) -> sizing.Tensor:
    return sizing.Tensor("model.layers.0.mlp.down_proj", "dense MLP", n_in, n_out, linear=True)


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        (None, 256 * 128 * 2),
        ({"quant_method": "fp8"}, 256 * 128 + 2 * 4),
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, 256 * 128 + 2 * 1 * 4),
        (
            {"quant_method": "gptq", "bits": 4, "group_size": 128},
            256 * 128 / 2 + 2 * 128 * 2 + 2 * 128 / 2 + 256 * 4,
        ),
        (
            {"quant_method": "gptq", "bits": 8, "group_size": -1},
            256 * 128 + 1 * 128 * 2 + 128 + 256 * 4,
        ),
        (
            {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True},
            256 * 128 / 2 + 4 * 128 * 2 + 4 * 128 / 2,
        ),
        ({"quant_method": "bitsandbytes", "load_in_8bit": True}, 256 * 128 + 128 * 4),
        # NF4: packed + fp32 absmax per 64 + quant_map (16 fp32) + the JSON quant_state
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, 256 * 128 / 2 + 512 * 4 + 64 + 112),
        (  # double quant: U8 absmax + fp32 absmax per 256 blocks + 256-entry fp32 nested map
            {"quant_method": "bitsandbytes", "_load_in_4bit": True, "bnb_4bit_use_double_quant": True},
            256 * 128 / 2 + 512 + 2 * 4 + 1024 + 64 + 112,
        ),
        (  # NVFP4: packed + fp8 scale per 16 + weight_scale_2 and input_scale (fp32)
            {"quantization": {"quant_algo": "NVFP4", "group_size": 16}},
            256 * 128 / 2 + 16 * 128 + 8,
        ),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, 256 * 128 / 2 + 16 * 128 + 8),
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, 256 * 128 + 2 * 4),
        ({"quant_method": "fbgemm_fp8", "modules_to_not_convert": ["lm_head"]}, 256 * 128 + 128 * 4),
        (  # AutoRound in its default AutoGPTQ packing
            {"quant_method": "auto-round", "bits": 4, "group_size": 128, "sym": True},
            256 * 128 / 2 + 2 * 128 * 2 + 2 * 128 / 2 + 256 * 4,
        ),
        (
            {"quant_method": "intel/auto-round", "bits": 4, "group_size": 128, "packing_format": "auto_round:auto_awq"},
            256 * 128 / 2 + 2 * 128 * 2 + 2 * 128 / 2,
        ),
        (
            {
                "quant_method": "quark",
                "global_quant_config": {"weight": {"dtype": "fp8_e4m3", "qscheme": "per_tensor"}},
            },
            256 * 128 + 2 * 4,
        ),
        (
            {
                "quant_method": "quark",
                "global_quant_config": {"weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32}},
            },
            256 * 128 / 2 + 8 * 128,
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "nvfp4-pack-quantized",
                "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}}},
            },
            256 * 128 / 2 + 16 * 128 + 8,
        ),
        ({"quantization": {"quant_algo": "FP8"}}, 256 * 128 + 2 * 4),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "g": {
                        "weights": {
                            "num_bits": 4,
                            "type": "int",
                            "strategy": "group",
                            "group_size": 128,
                            "symmetric": True,
                        }
                    }
                },
            },
            256 * 128 / 2 + 2 * 128 * 2 + 16,
        ),
        (  # GPTQ with actorder "group" in compressed-tensors: + weight_g_idx (int32 per input)
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "g": {
                        "weights": {
                            "num_bits": 4,
                            "type": "int",
                            "strategy": "group",
                            "group_size": 128,
                            "symmetric": True,
                            "actorder": "group",
                        }
                    }
                },
            },
            256 * 128 / 2 + 2 * 128 * 2 + 16 + 256 * 4,
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}},
            },
            256 * 128 + 128 * 2,
        ),
    ],
)
def test_linear_bytes_per_format(quant: dict[str, Any] | None, expected: float) -> None:
    fmt = sizing.parse_weight_format(quant, "bfloat16")
    assert sizing.tensor_bytes(linear(256, 128), fmt) == pytest.approx(expected)


def test_non_linear_tensors_stay_in_dtype_and_skip_lists_apply() -> None:
    fmt = sizing.parse_weight_format({"quant_method": "awq", "modules_to_not_convert": ["mlp.down_proj"]}, "float16")
    assert sizing.tensor_bytes(linear(256, 128), fmt) == 256 * 128 * 2
    embed = sizing.Tensor("model.embed_tokens", "embeddings", 1000, 64)
    assert sizing.tensor_bytes(embed, fmt) == 1000 * 64 * 2
    regex = sizing.parse_weight_format({"quant_method": "fp8", "ignored_layers": ["re:.*down_proj$"]}, "bfloat16")
    assert sizing.tensor_bytes(linear(256, 128), regex) == 256 * 128 * 2


def test_mxfp4_quantizes_only_experts() -> None:
    fmt = sizing.parse_weight_format({"quant_method": "mxfp4"}, "bfloat16")
    assert sizing.tensor_bytes(linear(256, 128), fmt) == 256 * 128 * 2
    expert = sizing.Tensor("x.experts", "MoE experts", 256, 128, linear=True, expert=True)
    assert sizing.tensor_bytes(expert, fmt) == 256 * 128 / 2 + 8 * 128


@pytest.mark.parametrize(("name", "experts"), [("gpt-oss-20b", 10165616640), ("gpt-oss-120b", 60993699840)])
def test_gpt_oss_mxfp4_bytes_match_the_checkpoint_exactly(name: str, experts: int) -> None:
    """U8 blocks (2 FP4 per byte) + one U8 scale per 32 inputs + bf16 biases, per expert; the rest bf16."""
    config, expected = load(name)
    arch = sizing.parse_architecture(config)
    assert arch.weight_format.method == "mxfp4" and arch.attention_sinks and arch.moe and arch.moe.linear_biases
    w = sizing.estimate_weights(arch)
    assert categories(w)["MoE experts"].bytes == experts  # the per-component ledger of the real files
    assert w.checkpoint_bytes == expected["total_size_bytes"]
    assert categories(w)["attention"].bytes == categories(w)["attention"].params * 2  # bf16, not converted
    assert "mxfp4" in w.format


def test_glob_skip_patterns() -> None:
    fmt = sizing.parse_weight_format({"quant_method": "fp8", "ignored_layers": ["model.layers.*.mlp"]}, "bfloat16")
    assert sizing.tensor_bytes(linear(256, 128), fmt) == 256 * 128 * 2
    other = sizing.Tensor("model.layers.0.self_attn.q_proj", "attention", 256, 128, linear=True)
    assert sizing.tensor_bytes(other, fmt) == 256 * 128 + 2 * 4


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dtype_override(dtype: str) -> None:
    w = sizing.estimate_weights(sizing.parse_architecture(tiny(), dtype=dtype))
    assert w.loaded_bytes == w.params * {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]


def test_online_fp8_override_and_kernel_names() -> None:
    arch = sizing.parse_architecture(tiny())
    fp8 = sizing.with_quantization(arch, "fp8")
    assert fp8.weight_format.method == "fp8"
    assert sizing.estimate_weights(fp8).loaded_bytes < sizing.estimate_weights(arch).loaded_bytes
    gptq = sizing.parse_architecture(tiny(quantization_config={"quant_method": "gptq"}))
    assert sizing.with_quantization(gptq, "moe_wna16") is gptq
    assert sizing.with_quantization(arch, None) is arch


def test_online_experts_int8_and_bitsandbytes() -> None:
    config, _ = load("wizardlm-2-8x22b")
    arch = sizing.parse_architecture(config)
    bf16 = categories(sizing.estimate_weights(arch))
    int8 = categories(sizing.estimate_weights(sizing.with_quantization(arch, "experts_int8")))
    # int8 experts + one fp32 scale per output row; attention untouched
    assert int8["MoE experts"].bytes == pytest.approx(bf16["MoE experts"].bytes / 2, rel=0.001)
    assert int8["attention"].bytes == bf16["attention"].bytes
    nf4 = sizing.with_quantization(arch, "bitsandbytes")
    assert nf4.weight_format.method == "bnb-nf4"
    with pytest.raises(ConfigError, match="needs an MoE model"):
        sizing.with_quantization(sizing.parse_architecture(tiny()), "experts_int8")


@pytest.mark.parametrize(
    ("quant", "kernel"),
    [
        ({"quant_method": "awq"}, "cpu_awq"),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "petit_nvfp4"),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "modelopt_fp4"),
        ({"quant_method": "mxfp4"}, "mxfp4"),
        ({"quant_method": "auto-round", "bits": 4}, "inc"),
        ({"quant_method": "fbgemm_fp8"}, "fbgemm_fp8"),
    ],
)
def test_kernel_names_keep_the_checkpoint_bytes(quant: dict[str, Any], kernel: str) -> None:
    arch = sizing.parse_architecture(tiny(quantization_config=quant))
    assert sizing.with_quantization(arch, kernel) is arch


# --------------------------------------------------------------------------- recommendation


def test_tp_divides_heads_and_kv_heads() -> None:
    config, _ = load("qwen2.5-7b")  # 28 heads, 4 KV heads: TP 8 would not split 28 heads
    rec = sizing.recommend(
        sizing.parse_architecture(config),
        gpu_memory_bytes=sizing.gpu_memory_bytes("A100-80GB"),
        gpus_per_node=8,
        max_model_len=32768,
    )
    assert (rec.nodes, rec.tp, rec.pp) == (1, 4, 2)
    assert "--tensor-parallel-size" in rec.vllm_args()


def test_kv_replication_and_uneven_pp_notes() -> None:
    arch = sizing.parse_architecture(tiny(num_hidden_layers=5, num_key_value_heads=2))
    rec = sizing.recommend(arch, gpu_memory_bytes=8 * sizing.GiB, gpus_per_node=4, nodes=2, max_model_len=1024)
    assert (rec.tp, rec.pp) == (4, 2)
    assert any("KV head" in n for n in rec.notes)
    assert any("uneven" in n for n in rec.notes)


def test_mla_kv_is_not_split_by_tp() -> None:
    config, _ = load("deepseek-v3")
    rec = sizing.recommend(
        sizing.parse_architecture(config),
        gpu_memory_bytes=sizing.gpu_memory_bytes("H200"),
        gpus_per_node=8,
        max_model_len=16384,
    )
    assert (rec.nodes, rec.tp, rec.pp) == (1, 8, 1)
    assert rec.kv_per_sequence_per_gpu == 61 * 576 * 2 * 16384
    assert any("MLA" in n for n in rec.notes)


def test_small_model_fits_one_node_and_defaults_max_model_len() -> None:
    rec = sizing.recommend(sizing.parse_architecture(tiny()), gpu_memory_bytes=24 * sizing.GiB, gpus_per_node=2)
    assert rec.nodes == 1 and rec.max_model_len == 4096 and rec.fits_max_num_seqs


REFUSALS: list[tuple[dict[str, Any], str]] = [
    ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"gpus_per_node": 0}, "gpus_per_node"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"nodes": 0}, "nodes"),
    ({"max_model_len": 0}, "max_model_len"),
    ({"max_model_len": 8192}, "max_position_embeddings"),
    ({"gpu_memory_bytes": 2 * sizing.GiB}, "gpu_memory"),
    ({"nodes": 9}, "pipeline stages"),
]


@pytest.mark.parametrize(("overrides", "match"), REFUSALS)
def test_recommend_refusals(overrides: dict[str, Any], match: str) -> None:
    kwargs: dict[str, Any] = {"gpu_memory_bytes": 8 * sizing.GiB, "gpus_per_node": 1}
    kwargs.update(overrides)
    with pytest.raises(ConfigError, match=match) as err:
        sizing.recommend(sizing.parse_architecture(tiny()), **kwargs)
    assert err.value.hint and "\n" not in err.value.message


def test_refuses_too_few_nodes_and_too_big_models() -> None:
    config, _ = load("wizardlm-2-8x22b")
    arch = sizing.parse_architecture(config)
    a100 = sizing.gpu_memory_bytes("A100-40GB")
    with pytest.raises(ConfigError, match="nodes: weights need") as err:
        sizing.recommend(arch, gpu_memory_bytes=a100, gpus_per_node=4, nodes=1, max_model_len=4096)
    assert err.value.hint and "add nodes" in err.value.hint
    with pytest.raises(ConfigError, match="KV cache"):
        sizing.recommend(arch, gpu_memory_bytes=a100, gpus_per_node=4, nodes=2, max_model_len=65536)
    with pytest.raises(ConfigError, match="does not fit even on"):
        sizing.recommend(arch, gpu_memory_bytes=4 * sizing.GiB, gpus_per_node=1)


# ------------------------------------------------- Llama 4, quantization_config in text_config (issue 19)


def test_llama4_scout_has_a_shared_expert_beside_the_routed_ones_in_every_layer() -> None:
    arch = sizing.parse_architecture(load("llama-4-scout-17b-16e")[0])
    assert arch.model_type == "llama4_text" and arch.vision is not None  # read from text_config
    assert arch.moe is not None and arch.moe.num_experts == 16 and arch.moe.experts_per_token == 1
    assert arch.moe.moe_layers == tuple(range(48))
    assert arch.moe.shared_intermediate_size == 8192 and not arch.moe.shared_expert_gate
    c = categories(sizing.estimate_weights(arch))
    assert c["shared experts"].params == 48 * 3 * 5120 * 8192
    assert c["MoE experts"].params == 48 * 16 * 3 * 5120 * 8192
    assert "dense MLP" not in c


def test_llama4_maverick_alternates_dense_and_moe_layers() -> None:
    arch = sizing.parse_architecture(load("llama-4-maverick-17b-128e")[0])
    assert arch.moe is not None and arch.moe.moe_layers == tuple(range(1, 48, 2))  # interleave_moe_layer_step 2
    assert arch.intermediate_size == 16384  # dense layers: intermediate_size_mlp
    assert arch.moe.expert_intermediate_size == arch.moe.shared_intermediate_size == 8192
    c = categories(sizing.estimate_weights(arch))
    assert c["dense MLP"].params == 24 * 3 * 5120 * 16384
    assert c["shared experts"].params == 24 * 3 * 5120 * 8192
    assert c["router"].params == 24 * 5120 * 128


def test_llama4_vision_tower_counts_the_pixel_shuffle_adapter_and_projector() -> None:
    arch = sizing.parse_architecture(load("llama-4-scout-17b-16e")[0])
    c = categories(sizing.estimate_weights(arch))
    layers = 34 * (4 * 1408 * 1408 + 2 * 1408 * 5632 + 4 * 1408 + 5632 + 1408 + 4 * 1408)
    patch = 3 * 14 * 14 * 1408 + 1408 + 577 * 1408 + 4 * 1408  # + class token, its position, 2 LayerNorms
    adapter = 5632 * 4096 + 4096 * 4096 + 4096 * 5120  # fc1, fc2, multi_modal_projector.linear_1
    assert c["vision tower"].params == layers + patch + adapter


def test_quantization_config_nested_in_text_config_is_read() -> None:
    config, _ = load("kimi-k2.5")
    assert "quantization_config" not in config and "quantization_config" in config["text_config"]
    arch = sizing.parse_architecture(config)
    fmt = arch.weight_format
    assert (fmt.method, fmt.bits, fmt.group_size, fmt.zero_point) == ("int-pack", 4, 32, False)
    assert arch.mla is not None and arch.moe is not None and arch.moe.shared_intermediate_size == 2048
    c = categories(sizing.estimate_weights(arch))
    # The ignore list keeps attention, the shared expert and the dense layer in bf16.
    for name in ("attention", "shared experts", "dense MLP", "lm_head"):
        assert c[name].bytes == 2 * c[name].params, name
    assert c["MoE experts"].bytes < 0.6 * c["MoE experts"].params  # int4 + a bf16 scale per 32


def test_explicit_moe_layers_list_wins_over_the_step() -> None:
    arch = sizing.parse_architecture(tiny(model_type="llama4_text", num_local_experts=4, moe_layers=[1, 3]))
    assert arch.moe is not None and arch.moe.moe_layers == (1, 3)
    assert arch.moe.shared_intermediate_size == 128  # llama4: shared expert of intermediate_size
    mixtral = sizing.parse_architecture(tiny(model_type="mixtral", num_local_experts=4, moe_layers=[1, 3]))
    assert mixtral.moe is not None and mixtral.moe.shared_intermediate_size == 0


# --------------------------------------------------------------------------- config.json numbers (issue 16)

OUT_OF_RANGE = {
    "num_hidden_layers": [10**12, 1e26, 0, -4, 4.5, "4", True, [4]],
    "hidden_size": [-64, 0, 10**30, 2**20 + 1],
    "num_attention_heads": [0, -8],
    "num_key_value_heads": [0, "eight", 10**9],
    "head_dim": [0],
    "vocab_size": [10**8],
    "intermediate_size": [-1, 10**12],
    "num_local_experts": [10**9],
    "max_position_embeddings": [0, 10**15],
    "sliding_window": [-1],
    "moe_layers": [[10**6], "all"],
    "layer_types": ["full_attention"],
}


@pytest.mark.parametrize(
    ("key", "value"), [(k, v) for k, values in OUT_OF_RANGE.items() for v in values], ids=lambda v: repr(v)[:20]
)
def test_config_numbers_are_range_checked_naming_the_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        sizing.parse_architecture(tiny(**{key: value}), source="m/config.json")
    assert err.value.message.startswith(f"m/config.json: {key}:") and "\n" not in err.value.message
    assert err.value.hint


def test_every_bounded_key_is_checked() -> None:
    from kit.sizing import limits

    for key, (low, high) in limits.TEXT_LIMITS.items():
        for bad in (low - 1, high + 1, float("inf"), "x"):
            with pytest.raises(ConfigError, match=key):
                sizing.parse_architecture(tiny(**{key: bad}))
        if key not in ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads"):
            sizing.parse_architecture(tiny(**{key: None}))  # null is "not set"
    assert limits.MAX_LAYERS == 1024


@pytest.mark.parametrize(
    ("quant", "key"),
    [
        (5, "quantization_config"),
        ({"quant_method": "fp8", "weight_block_size": [0, 128]}, "weight_block_size"),
        ({"quant_method": "fp8", "weight_block_size": 128}, "weight_block_size"),
        ({"quant_method": "gptq", "bits": 10**6}, "bits"),
        ({"quant_method": "awq", "group_size": -5}, "group_size"),
        ({"quant_method": "awq", "modules_to_not_convert": 5}, "modules_to_not_convert"),
        ({"quant_method": "compressed-tensors", "config_groups": []}, "config_groups"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 4, "group_size": 1e9}}},
            },
            "config_groups.g.weights.group_size",
        ),
        ({"quantization": {"quant_algo": "NVFP4", "group_size": 10**9}}, "quantization.group_size"),
    ],
)
def test_quantization_numbers_are_range_checked(quant: Any, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        sizing.parse_architecture(tiny(quantization_config=quant))


def test_vision_numbers_are_range_checked() -> None:
    vision = {"num_hidden_layers": 2, "hidden_size": 32, "patch_size": 0, "image_size": 224}
    with pytest.raises(ConfigError, match=r"vision_config\.patch_size"):
        sizing.parse_architecture(tiny(vision_config=vision))
    sizing.parse_architecture(tiny(vision_config={**vision, "patch_size": 14, "image_size": [224, 224]}))


def test_integral_floats_are_read_as_integers() -> None:
    arch = sizing.parse_architecture(tiny(hidden_size=64.0, num_hidden_layers=4.0, max_position_embeddings=4096.0))
    assert (arch.hidden_size, arch.num_layers, arch.max_position_embeddings) == (64, 4, 4096)


@pytest.mark.parametrize("text", ["1e999", "2000000TiB", "9" * 400])
def test_parse_size_refuses_infinite_and_huge(text: str) -> None:
    with pytest.raises(ConfigError, match="larger than 1 EiB"):
        sizing.parse_size(text, key="overhead")


# --------------------------------------------------------------------------- parsing refusals


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"model_type": "llama"}, "hidden_size"),
        (tiny(torch_dtype="int3"), "unknown dtype"),
        (tiny(quantization_config={"quant_method": "hqq"}), "unsupported quant_method 'hqq': HQQ"),
        (tiny(quantization_config={"quant_method": "gguf"}), "GGUF files are out of scope"),
        (tiny(quantization_config={"quant_method": "torchao"}), "torchao"),
        (tiny(quantization_config={"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}), "MIXED_PRECISION"),
        (tiny(quantization_config={"quant_method": "quark", "global_quant_config": {}}), "quark"),
        (
            tiny(
                quantization_config={
                    "quant_method": "compressed-tensors",
                    "sparsity_config": {"format": "sparse-24-bitmask"},
                }
            ),
            "sparse format 'sparse-24-bitmask'",
        ),
        (tiny(quantization_config={"quantization": {"quant_algo": "W4A8"}}), "quant_algo"),
        (
            tiny(quantization_config={"quant_method": "compressed-tensors", "config_groups": {}}),
            "num_bits",
        ),
        (tiny(layer_types=["full_attention"]), "layer_types"),
    ],
)
def test_parse_refusals(config: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        sizing.parse_architecture(config)


def test_quantization_override_refusals() -> None:
    arch = sizing.parse_architecture(tiny())
    with pytest.raises(ConfigError, match="needs a checkpoint"):
        sizing.with_quantization(arch, "awq")
    gptq = sizing.parse_architecture(tiny(quantization_config={"quant_method": "gptq"}))
    with pytest.raises(ConfigError, match="does not match"):
        sizing.with_quantization(gptq, "fp8")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("40GiB", 40 * 2**30), ("80GB", 80 * 10**9), ("141e9", 141 * 10**9), ("1.5 TiB", 3 * 2**39)],
)
def test_parse_size(text: str, expected: int) -> None:
    assert sizing.parse_size(text) == expected


@pytest.mark.parametrize("text", ["forty", "40XB", "0GB", ""])
def test_parse_size_refusals(text: str) -> None:
    with pytest.raises(ConfigError, match="size"):
        sizing.parse_size(text)


def test_known_gpus_and_aliases() -> None:
    assert sizing.gpu_memory_bytes("A100-40GB") == 40 * sizing.GiB
    assert sizing.gpu_memory_bytes("h200") == sizing.KNOWN_GPUS["H200"]
    assert sizing.gpu_memory_bytes("H100") == sizing.KNOWN_GPUS["H100-80GB"]
    assert sizing.gpu_memory_bytes("40GiB") == 40 * sizing.GiB
    with pytest.raises(ConfigError, match="unknown GPU"):
        sizing.gpu_memory_bytes("TPU-v5")


# --------------------------------------------------------------------------- loading


def test_load_local_directory_and_index_size(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny()))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 1234}, "weight_map": {}})
    )
    assert sizing.load_model_config(str(tmp_path))["hidden_size"] == 64
    assert sizing.load_checkpoint_size(str(tmp_path)) == 1234


def test_load_hf_cache_snapshot_and_folds_quant_files(tmp_path: Path) -> None:
    repo = tmp_path / "models--org--name"
    old = repo / "snapshots" / ("a" * 40)  # commit shas, as huggingface_hub names them
    new = repo / "snapshots" / ("b" * 40)
    for d in (old, new):
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(tiny()))
    (new / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128}))
    (new / "model.safetensors").write_bytes(b"x" * 10)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("b" * 40 + "\n")
    config = sizing.load_model_config("org/name", str(tmp_path))
    assert config["quantization_config"]["quant_method"] == "gptq"
    assert sizing.load_checkpoint_size("org/name", str(tmp_path)) == 10
    arch = sizing.parse_architecture(config)
    assert arch.weight_format.bits == 4


def test_load_hf_quant_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny()))
    (tmp_path / "hf_quant_config.json").write_text(
        json.dumps({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}})
    )
    arch = sizing.parse_architecture(sizing.load_model_config(str(tmp_path)))
    assert arch.weight_format.method == "fp8"


def test_load_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    with pytest.raises(ConfigError, match=r"no config\.json") as err:
        sizing.load_model_config("org/absent")
    assert err.value.hint and "--hf-cache" in err.value.hint
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read JSON"):
        sizing.load_model_config(str(tmp_path))
    assert sizing.load_checkpoint_size("org/absent") is None


# --------------------------------------------------------------------------- vLLM's method list

# vllm/model_executor/layers/quantization/__init__.py, QuantizationMethods (current main).
VLLM_METHODS = [
    "awq",
    "fp8",
    "fbgemm_fp8",
    "fp_quant",
    "modelopt",
    "modelopt_fp4",
    "modelopt_mixed",
    "gguf",
    "gptq_marlin",
    "awq_marlin",
    "gptq",
    "compressed-tensors",
    "bitsandbytes",
    "experts_int8",
    "quark",
    "moe_wna16",
    "torchao",
    "inc",
    "mxfp4",
    "petit_nvfp4",
    "cpu_awq",
]
REFUSED = {"modelopt_mixed", "fp_quant", "torchao", "gguf"}


def test_readme_lists_every_vllm_method_with_its_status() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme[readme.index("### Quantization formats") :]
    rows = [line for line in table.splitlines() if line.startswith("| `") or line.startswith("| (none)")]
    for method in VLLM_METHODS:
        row = next((r for r in rows if f"`{method}`" in r.split("|")[1]), None)
        assert row is not None, method
        status = row.split("|")[3]
        assert status.strip().startswith("refused" if method in REFUSED else "sized"), (method, status)


@pytest.mark.parametrize("method", sorted(REFUSED - {"modelopt_mixed"}))
def test_refused_methods_name_the_format(method: str) -> None:
    with pytest.raises(ConfigError, match=f"unsupported quant_method '{method}'") as err:
        sizing.parse_architecture(tiny(quantization_config={"quant_method": method}))
    assert "\n" not in err.value.message and err.value.hint


@pytest.mark.parametrize(
    "index", ['{"metadata": 5}', '{"metadata": {"total_size": "x"}}', '{"metadata": {"total_size": -5}}']
)
def test_odd_checkpoint_index_gives_no_size(tmp_path: Path, index: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny()))
    (tmp_path / "model.safetensors.index.json").write_text(index)
    assert sizing.load_checkpoint_size(str(tmp_path)) is None


def _snapshot(hub_dir: Path, repo: str, sha: str, mtime: float) -> Path:
    import os

    snap = hub_dir / ("models--" + repo.replace("/", "--")) / "snapshots" / sha
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"model_type": "llama", "marker": sha}))
    os.utime(snap / "config.json", (mtime, mtime))
    return snap


def test_sizing_reads_the_snapshot_kit_fetch_checks(tmp_path: Path) -> None:
    """One snapshot finder (issue 26): the layout (kit.sizing) and the offline decision
    (kit.models.fetch.find_snapshot) read the same snapshot, whichever way the cache names it."""
    from kit.models.fetch import Manifest, find_snapshot

    hub_dir = tmp_path / "hub"
    old = _snapshot(hub_dir, "org/m", "a" * 40, mtime=1_000)
    _snapshot(hub_dir, "org/m", "b" * 40, mtime=2_000)  # newer, but nothing names it
    # kit's manifest of a fetch in progress names the older one: both pick it.
    manifest = Manifest("org/m", "main", "a" * 40, "https://huggingface.co", (), None, ())
    (hub_dir / "models--org--m" / "kit").mkdir()
    (hub_dir / "models--org--m" / "kit" / f"{'a' * 40}.json").write_text(json.dumps(manifest.to_dict()))
    assert find_snapshot(hub_dir, "org/m") == old
    assert sizing.find_model_dir("org/m", str(hub_dir)) == old
    # refs/main (huggingface_hub, vLLM, kit once complete) wins over the manifest.
    (hub_dir / "models--org--m" / "refs").mkdir()
    (hub_dir / "models--org--m" / "refs" / "main").write_text("b" * 40)
    assert find_snapshot(hub_dir, "org/m") == sizing.find_model_dir("org/m", str(hub_dir)) == old.parent / ("b" * 40)


def test_a_cache_without_refs_sizes_its_only_snapshot_and_never_guesses(tmp_path: Path) -> None:
    """No ref and no manifest: vLLM offline would not find the snapshot (find_snapshot: None, the
    offline decision says so), sizing may still read the only one; of two it picks neither, where
    it once took the newest by mtime."""
    from kit.models.fetch import find_snapshot

    hub_dir = tmp_path / "hub"
    only = _snapshot(hub_dir, "org/m", "c" * 40, mtime=1_000)
    assert find_snapshot(hub_dir, "org/m") is None
    assert sizing.find_model_dir("org/m", str(hub_dir)) == only
    _snapshot(hub_dir, "org/m", "d" * 40, mtime=2_000)
    assert sizing.find_model_dir("org/m", str(hub_dir)) is None


@pytest.mark.parametrize("name", sorted(d.name for d in MODELS.iterdir()))
def test_worst_stage_equals_the_sums_of_each_stages_layers(name: str) -> None:
    """worst_stage sums each PP stage from running sums (kit plan tries every PP up to one stage
    per layer): the same numbers as adding up each stage's layers one by one, for every real
    config here (sliding windows, MLA, linear attention, MoE) and uneven stages."""
    from kit.sizing.kv import kv_bytes_per_token
    from kit.sizing.split import expert_share, pp_stages, worst_stage
    from kit.sizing.weights import estimate_weights

    arch = sizing.parse_architecture(load(name)[0])
    weights, kv = estimate_weights(arch), kv_bytes_per_token(arch, "auto")

    def kv_of(layers: range, tp: int, seq: int) -> int:
        total = 0
        for i in layers:
            for lk in kv.layers:
                if lk.kind == "mla":
                    total += lk.bytes_per_token * seq
                elif lk.kind == arch.layer_kinds[i] == "linear_attention":
                    total += lk.state_bytes_per_seq // tp
                elif lk.kind == arch.layer_kinds[i]:
                    per = lk.bytes_per_token * max(1, arch.num_kv_heads // tp) // arch.num_kv_heads
                    total += per * (min(seq, lk.window) if lk.window else seq)
        return total

    for tp, pp, ep in [(1, 1, 1), (2, 3, 1), (4, 7, 4), (8, arch.num_layers, 1)]:
        stages = pp_stages(arch.num_layers, pp)
        want = [0, 0, 0]
        for s, layers in enumerate(stages):
            experts = sum(weights.layer_expert_bytes[i] for i in layers)
            w = (sum(weights.layer_bytes[i] for i in layers) - experts) / tp + experts * expert_share(arch, tp, ep)
            w += sum(weights.layer_replicated_bytes[i] for i in layers)
            if s == 0:
                w += (weights.embedding_bytes + weights.vision_bytes) / tp
            if s == len(stages) - 1:
                w += (
                    weights.lm_head_bytes / tp if pp > 1 or not arch.tie_word_embeddings else 0
                ) + weights.final_norm_bytes
            got = (math.ceil(w), kv_of(layers, tp, 4096), kv_of(layers, tp, 1) - kv_of(layers, tp, 0))
            want = [max(a, b) for a, b in zip(want, got, strict=True)]
        assert worst_stage(arch, weights, kv, tp=tp, pp=pp, ep=ep, seq_len=4096) == tuple(want), (tp, pp, ep)
