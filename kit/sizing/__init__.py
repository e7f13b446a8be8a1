"""Size a model to GPUs and nodes before anything starts (issue 7).

Pure functions over a model's own files: `config.json` (and its `quantization_config`, or a
ModelOpt `hf_quant_config.json`) becomes an `Architecture`; from it come

- `estimate_weights()`: checkpoint bytes, counted tensor by tensor from the architecture
  (tied or untied embeddings, GQA/MQA or MLA attention, linear-attention layers, dense MLP,
  MoE experts + shared experts + router, norms, vision tower, multi-token-prediction layers)
  in the weight format (bf16/fp16/fp32, FP8 per-tensor, per-channel or block-wise, GPTQ/AWQ/
  AutoRound int with their group-wise scales and zeros, bitsandbytes int8/NF4, ModelOpt and
  compressed-tensors NVFP4, gpt-oss MXFP4, Quark; `parse_weight_format` refuses the rest by name);
- `kv_bytes_per_token()`: KV-cache bytes per token per layer type (full, sliding-window, MLA
  latent) plus the fixed per-sequence state of linear-attention layers;
- `recommend()`: the fewest nodes, and TP/PP, for a GPU size, GPUs per node and
  `gpu_memory_utilization`, with the KV-cache room left and the concurrent sequences it holds;
- `layout_candidates()` / `pick_layout()` (issue 10): every TP×PP and, for MoE models, DP+EP
  layout of a cluster with weights, KV room and concurrent sequences per layout, and the pick.

Every estimate keeps its formula inputs so `kit plan` can show its work. Impossible requests
raise `ConfigError` with one line naming the field and the fix.

Modules, in dependency order (each imports only those above it):

    gpus          byte sizes, known GPUs' memory, per-GPU budget defaults
    quantization  weight formats (quantization_config) and the --quantization override
    limits        range checks on config.json numbers, before anything is sized
    architecture  config.json -> Architecture (text_config, MoE, MLA, linear attention, vision)
    weights       checkpoint bytes, tensor by tensor
    kv            KV-cache bytes per token and per sequence
    split         what one GPU holds under TP/PP/EP (shared by recommend and layouts)
    recommend     the fewest nodes and TP/PP
    layouts       TP×PP vs DP+EP layouts and the pick
    hub           the only I/O: model directories, HF cache, config.json, --fetch
"""

from __future__ import annotations

from kit.models.local import find_model_dir, load_checkpoint_size, load_model_config
from kit.sizing.architecture import (
    FULL,
    LINEAR,
    MLA,
    SLIDING,
    Architecture,
    LinearAttention,
    MoE,
    Vision,
    parse_architecture,
    summarize_layers,
    with_quantization,
)
from kit.sizing.gpus import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_OVERHEAD_BYTES,
    KNOWN_GPUS,
    GiB,
    KiB,
    MiB,
    format_bytes,
    gpu_memory_bytes,
    parse_size,
)
from kit.sizing.kv import KVEstimate, LayerKV, kv_bytes_per_token
from kit.sizing.layouts import LayoutFit, layout_candidates, pick_layout
from kit.sizing.limits import MAX_LAYERS, MAX_POSITIONS
from kit.sizing.quantization import WeightFormat, parse_weight_format
from kit.sizing.recommend import Recommendation, recommend
from kit.sizing.split import best_tp, heads_split, valid_tp
from kit.sizing.weights import CategoryBytes, Tensor, WeightEstimate, estimate_weights, layer_tensors, tensor_bytes

__all__ = [
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "DEFAULT_MAX_NUM_SEQS",
    "DEFAULT_OVERHEAD_BYTES",
    "FULL",
    "KNOWN_GPUS",
    "LINEAR",
    "MAX_LAYERS",
    "MAX_POSITIONS",
    "MLA",
    "SLIDING",
    "Architecture",
    "CategoryBytes",
    "GiB",
    "KVEstimate",
    "KiB",
    "LayerKV",
    "LayoutFit",
    "LinearAttention",
    "MiB",
    "MoE",
    "Recommendation",
    "Tensor",
    "Vision",
    "WeightEstimate",
    "WeightFormat",
    "best_tp",
    "estimate_weights",
    "find_model_dir",
    "format_bytes",
    "gpu_memory_bytes",
    "heads_split",
    "kv_bytes_per_token",
    "layer_tensors",
    "layout_candidates",
    "load_checkpoint_size",
    "load_model_config",
    "parse_architecture",
    "parse_size",
    "parse_weight_format",
    "pick_layout",
    "recommend",
    "summarize_layers",
    "tensor_bytes",
    "valid_tp",
    "with_quantization",
]
