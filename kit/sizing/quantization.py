"""Weight formats: a checkpoint's `quantization_config` (or ModelOpt `hf_quant_config.json`) as a
`WeightFormat`, and vLLM's `--quantization` override. Every format vLLM loads either maps to a byte
layout here or is refused with one line that names it (README: 'Quantization formats').
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kit.errors import ConfigError

DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8": 1,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}


def parse_dtype(value: Any, *, source: str, key: str = "dtype") -> str:
    name = str(value).replace("torch.", "").lower()
    if name not in DTYPE_BYTES:
        raise ConfigError(
            f"unknown dtype {value!r}",
            key=key,
            source=source,
            hint="use bfloat16, float16 or float32",
        )
    return name


@dataclass(frozen=True)
class WeightFormat:
    """How linear-layer weights are stored; everything else stays in `dtype`."""

    method: str  # "none", "fp8", "int8", "gptq", "awq", "bnb-int8", "bnb-nf4", "int-pack", "nvfp4", "mxfp4"
    dtype: str  # unquantized tensors (embeddings, norms, router, …)
    bits: int = 16
    group_size: int = -1  # -1: one group per input row (per-channel)
    zero_point: bool = False  # stores packed zeros next to the scales
    g_idx: bool = False  # GPTQ stores one int32 group index per input feature
    scale_bytes: float = 2  # per scale value
    block: tuple[int, int] | None = None  # FP8 block-wise scales (out, in)
    per_channel_scale: bool = False  # FP8 per output channel
    skip: tuple[str, ...] = ()  # module patterns kept in `dtype` (modules_to_not_convert, …)
    experts_only: bool = False  # only MoE experts are quantized (mxfp4, experts_int8)
    quantize_lm_head: bool = False
    double_quant: bool = False  # bitsandbytes 4-bit: absmax stored as U8 + nested fp32 absmax

    @property
    def dtype_bytes(self) -> float:
        return DTYPE_BYTES[self.dtype]

    def describe(self) -> str:
        if self.method == "none":
            return self.dtype
        parts = [self.method]
        if self.method in ("gptq", "awq", "int-pack"):
            group = "per-channel" if self.group_size <= 0 else f"group {self.group_size}"
            parts.append(f"int{self.bits}, {group}, fp16 scales")
            if self.zero_point:
                parts.append("+ zeros")
            if self.g_idx:
                parts.append("+ g_idx")
        elif self.method in ("fp8", "int8"):
            if self.block:
                parts.append(f"block {self.block[0]}x{self.block[1]} fp32 scales")
            elif self.per_channel_scale:
                parts.append("per-channel scales")
            else:
                parts.append("per-tensor scale")
        elif self.method == "nvfp4":
            parts.append(f"FP4 + fp8 scale per {self.group_size} + fp32 global scales")
        elif self.method == "mxfp4":
            parts.append(f"FP4 blocks + U8 scale per {self.group_size}")
        elif self.method == "bnb-nf4":
            parts.append(f"NF4 + absmax per {self.group_size}" + (" (double-quantized)" if self.double_quant else ""))
        if self.experts_only:
            parts.append("MoE experts only")
        parts.append(f"other tensors {self.dtype}")
        return ", ".join(parts)


# quant_method values vLLM knows (or knew) that kit refuses, each with the reason; one line each.
_REFUSED_METHODS: dict[str, str] = {
    "gguf": "GGUF files are out of scope: kit plan reads a safetensors checkpoint's config.json",
    "torchao": "torchao tensor-subclass checkpoints store layouts that depend on the torchao version and config",
    "fp_quant": "FP-Quant (Hadamard-rotated MXFP4/NVFP4) stores rotation matrices kit does not model",
    "hqq": "HQQ stores per-group scales and zeros in layouts kit does not model",
    "aqlm": "AQLM stores additive codebooks kit does not model",
    "gptq_marlin_24": "2:4 sparse GPTQ (Marlin 24) stores sparsity metadata kit does not model",
    "qqq": "QQQ (W4A8) stores per-channel and per-group scales kit does not model",
    "bitblas": "BitBLAS stores pre-permuted weights kit does not model",
    "deepspeedfp": "DeepSpeed FP6/FP8 checkpoints are not sized",
    "modelopt_mixed": "ModelOpt MIXED_PRECISION mixes FP8 and NVFP4 per layer",
    "bitnet": "BitNet ternary checkpoints are not sized",
    "eetq": "EETQ int8 checkpoints are not sized",
    "vptq": "VPTQ vector-quantized checkpoints are not sized",
    "higgs": "HIGGS checkpoints are not sized",
    "spqr": "SpQR checkpoints are not sized",
}


def _refuse(method: str, source: str, reason: str | None = None) -> ConfigError:
    why = reason or _REFUSED_METHODS.get(method) or "kit does not know how this format stores its weights"
    return ConfigError(
        f"unsupported quant_method {method!r}: {why}",
        key="quantization_config.quant_method",
        source=source,
        hint="see the README's 'Quantization formats' table; kit plan sizes bf16/fp16, fp8, gptq, awq, "
        "compressed-tensors, bitsandbytes, modelopt FP8/NVFP4, mxfp4, fbgemm_fp8, quark, auto-round",
    )


def _modelopt(inner: Mapping[str, Any], dtype: str, source: str) -> WeightFormat:
    """ModelOpt: `hf_quant_config.json` {"quantization": {...}} or config.json quant_method modelopt."""
    algo = str(inner.get("quant_algo") or "").upper()
    skip = tuple(str(m) for key in ("exclude_modules", "ignore") for m in inner.get(key) or ())
    if algo == "FP8":  # weight fp8 + weight_scale and input_scale (fp32 scalars) per linear
        return WeightFormat(method="fp8", dtype=dtype, bits=8, skip=skip, scale_bytes=4)
    if algo in ("NVFP4", "W4A16_NVFP4"):
        group = max(int(inner.get("group_size") or 16), 1)
        return WeightFormat(method="nvfp4", dtype=dtype, bits=4, group_size=group, scale_bytes=1, skip=skip)
    if algo == "MIXED_PRECISION":
        raise _refuse("modelopt_mixed", source)
    raise ConfigError(
        f"unsupported ModelOpt quant_algo {algo!r}",
        key="quantization.quant_algo",
        source=source,
        hint="kit plan knows ModelOpt FP8 and NVFP4; see the README's 'Quantization formats' table",
    )


def _quark(quant: Mapping[str, Any], dtype: str, skip: tuple[str, ...], source: str) -> WeightFormat:
    """AMD Quark: `global_quant_config.weight` says dtype and qscheme."""
    glob = quant.get("global_quant_config")
    weight = glob.get("weight") if isinstance(glob, Mapping) else None
    if isinstance(weight, list):
        weight = weight[0] if weight else None
    if not isinstance(weight, Mapping):
        raise _refuse("quark", source, "its global_quant_config has no weight scheme")
    kind = str(weight.get("dtype") or "").lower()
    scheme = str(weight.get("qscheme") or "").lower()
    skip = skip + tuple(str(m) for m in quant.get("exclude") or ())
    if kind.startswith("fp8"):
        return WeightFormat(
            method="fp8", dtype=dtype, bits=8, scale_bytes=4, per_channel_scale=scheme == "per_channel", skip=skip
        )
    if kind in ("fp4", "mxfp4") and scheme == "per_group":  # OCP MX: U8 E8M0 scale per 32
        group = max(int(weight.get("group_size") or 32), 1)
        return WeightFormat(method="mxfp4", dtype=dtype, bits=4, group_size=group, scale_bytes=1, skip=skip)
    if kind in ("int4", "uint4") and scheme == "per_group":
        return WeightFormat(
            method="int-pack",
            dtype=dtype,
            bits=4,
            group_size=int(weight.get("group_size") or 128),
            zero_point=kind == "uint4" or not weight.get("symmetric", True),
            skip=skip,
        )
    raise _refuse("quark", source, f"weight dtype {kind or '?'} with qscheme {scheme or '?'} is not sized")


def parse_weight_format(quant: Mapping[str, Any] | None, dtype: str, *, source: str = "config.json") -> WeightFormat:
    """Read `quantization_config` (or ModelOpt's `hf_quant_config.json`) into a WeightFormat.

    Every format vLLM loads either maps to a byte layout here or is refused with one line that
    names it and says why (README: 'Quantization formats').
    """
    if not quant:
        return WeightFormat(method="none", dtype=dtype)
    if isinstance(quant.get("quantization"), Mapping):  # ModelOpt hf_quant_config.json
        return _modelopt(quant["quantization"], dtype, source)
    method = str(quant.get("quant_method") or "").lower().replace("compressed_tensors", "compressed-tensors")
    skip = tuple(
        str(m)
        for key in ("modules_to_not_convert", "ignored_layers", "ignore", "llm_int8_skip_modules")
        for m in (quant.get(key) or ())
    )
    if method in ("modelopt", "modelopt_fp4", "modelopt_fp8"):  # config.json style ModelOpt
        return _modelopt(quant, dtype, source)
    if method == "gptq":
        bits = int(quant.get("bits") or 4)
        group = int(quant.get("group_size") or -1)
        # AutoGPTQ/GPTQModel always write qzeros and g_idx (even when sym / desc_act is off).
        return WeightFormat(
            method="gptq",
            dtype=dtype,
            bits=bits,
            group_size=group,
            zero_point=True,
            g_idx=True,
            skip=skip,
            quantize_lm_head=bool(quant.get("lm_head")),
        )
    if method in ("auto-round", "intel/auto-round", "inc"):
        # AutoRound exports in the AutoGPTQ (default) or AutoAWQ packing; vLLM loads both.
        packing = str(quant.get("packing_format") or quant.get("backend") or "auto_gptq").lower()
        inner = {**quant, "quant_method": "awq" if "awq" in packing else "gptq"}
        return parse_weight_format(inner, dtype, source=source)
    if method == "awq":
        return WeightFormat(
            method="awq",
            dtype=dtype,
            bits=int(quant.get("bits") or quant.get("w_bit") or 4),
            group_size=int(quant.get("group_size") or quant.get("q_group_size") or 128),
            zero_point=bool(quant.get("zero_point", True)),
            skip=skip,
        )
    if method == "fp8":
        block = quant.get("weight_block_size")
        return WeightFormat(
            method="fp8",
            dtype=dtype,
            bits=8,
            scale_bytes=4,
            block=(int(block[0]), int(block[1])) if block else None,
            skip=skip,
        )
    if method == "fbgemm_fp8":  # fp8 weight + one fp32 scale per output row
        return WeightFormat(method="fp8", dtype=dtype, bits=8, scale_bytes=4, per_channel_scale=True, skip=skip)
    if method == "bitsandbytes":
        if quant.get("load_in_4bit") or quant.get("_load_in_4bit"):
            return WeightFormat(
                method="bnb-nf4",
                dtype=dtype,
                bits=4,
                group_size=int(quant.get("bnb_4bit_blocksize") or 64),
                scale_bytes=4,
                double_quant=bool(quant.get("bnb_4bit_use_double_quant")),
                skip=skip,
            )
        return WeightFormat(method="bnb-int8", dtype=dtype, bits=8, scale_bytes=4, per_channel_scale=True, skip=skip)
    if method == "mxfp4":
        return WeightFormat(
            method="mxfp4", dtype=dtype, bits=4, group_size=32, scale_bytes=1, experts_only=True, skip=skip
        )
    if method == "compressed-tensors":
        return _compressed_tensors(quant, dtype, skip, source)
    if method == "quark":
        return _quark(quant, dtype, skip, source)
    raise _refuse(method or "(empty)", source)


def _compressed_tensors(quant: Mapping[str, Any], dtype: str, skip: tuple[str, ...], source: str) -> WeightFormat:
    sparsity = quant.get("sparsity_config")
    if isinstance(sparsity, Mapping) and sparsity.get("format") not in (None, "dense"):
        raise _refuse(
            "compressed-tensors", source, f"sparse format {sparsity.get('format')!r} stores masks kit does not model"
        )
    groups = quant.get("config_groups") or {}
    weights: Mapping[str, Any] = {}
    fmt_name = str(quant.get("format") or "")
    for group in groups.values():
        if isinstance(group, Mapping) and isinstance(group.get("weights"), Mapping):
            weights = group["weights"]
            fmt_name = str(group.get("format") or fmt_name)
            break
    bits = int(weights.get("num_bits") or 0)
    kind = str(weights.get("type") or "int")
    strategy = str(weights.get("strategy") or "tensor")
    if not bits:
        raise ConfigError(
            "compressed-tensors config has no weights.num_bits",
            key="quantization_config.config_groups",
            source=source,
            hint="pass --quantization to say how the weights are stored",
        )
    if kind == "float" and bits == 8:
        block = weights.get("block_structure")
        return WeightFormat(
            method="fp8",
            dtype=dtype,
            bits=8,
            scale_bytes=4 if strategy == "tensor" else 2,
            block=(int(block[0]), int(block[1])) if block else None,
            per_channel_scale=strategy == "channel",
            skip=skip,
        )
    if kind == "float" and bits == 4:
        group = max(int(weights.get("group_size") or 16), 1)
        if group == 16 or "nvfp4" in fmt_name:  # weight_packed + fp8 scale per 16 + global scales
            return WeightFormat(method="nvfp4", dtype=dtype, bits=4, group_size=group, scale_bytes=1, skip=skip)
        return WeightFormat(method="mxfp4", dtype=dtype, bits=4, group_size=group, scale_bytes=1, skip=skip)
    if kind == "float":
        raise _refuse("compressed-tensors", source, f"float{bits} weights are not sized")
    group = int(weights.get("group_size") or -1) if strategy == "group" else -1
    return WeightFormat(
        method="int-pack",
        dtype=dtype,
        bits=bits,
        group_size=group,
        zero_point=not bool(weights.get("symmetric", True)),
        # actorder "group" stores an int32 weight_g_idx per input feature; "static"/"weight"
        # reorder at quantization time and store none (vLLM compressed_tensors_wNa16 has_g_idx).
        g_idx=str(weights.get("actorder") or "").lower() == "group",
        skip=skip,
    )
