"""`kit plan MODEL`: size a model to GPUs and nodes before anything starts (issue 7)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import click

from kit import sizing
from kit.cluster.resolve import load_settings
from kit.commands._options import overrides_from
from kit.commands._params import KitCommand
from kit.errors import ConfigError, UsageError
from kit.output import emit, table

EXAMPLES = """\b
Examples:
  kit plan ./Qwen3.5-397B-A17B-GPTQ-Int4 --gpu A100-40GB --gpus-per-node 4 \\
      --max-model-len 262144
  kit plan meta-llama/Llama-3.1-70B-Instruct --gpu H100-80GB --gpus-per-node 8
  kit plan ./my-model --gpu-memory 40GiB --nodes 2 --json

\b
MODEL is a directory holding config.json, or org/name found in the Hugging Face
cache (--hf-cache, else $HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub);
--fetch downloads config.json from the Hub when it is not there, sending the
token in the file hf_token_file names (kit.yaml, KIT_HF_TOKEN_FILE or
--set hf_token_file=PATH); kit never reads HF_TOKEN from the environment.
Without --gpu/--gpu-memory kit prints the estimates only.
Overhead: a fixed 2 GiB per GPU (activation peak, CUDA graphs, CUDA/NCCL context)
is kept out of the KV-cache room; change it with --overhead.
config.json numbers are range-checked first (e.g. at most 1,024 layers).

\b
Exit codes: 0 planned; 2 a number flag out of range, or text (MODEL, a flag)
too long or holding control characters; 3 a value kit cannot use (unknown GPU,
unreadable size, utilisation outside (0, 1]), an unreadable or out-of-range
config.json, a gated model without hf_token_file, a model that does not fit.
"""

# Flags and the argument are text a person typed: refused (exit 2) past these lengths or with
# control characters, before anything is read (issue 16: a 100 kB name, a newline).
MAX_PATH_CHARS = 4096
MAX_FLAG_CHARS = 256
# Numeric flags: far above any cluster, low enough that the layout search stays fast (the TP
# candidates are the divisors of --gpus-per-node, tried one by one).
MAX_GPUS_PER_NODE = 1024
MAX_NODES = 100_000
MAX_NUM_SEQS = 1_000_000


def _architecture_lines(arch: sizing.Architecture) -> list[str]:
    lines = [
        f"  layers      {sizing.summarize_layers(arch.layer_kinds)}",
        f"  hidden      {arch.hidden_size}, vocab {arch.vocab_size}, embeddings "
        + ("tied" if arch.tie_word_embeddings else "untied"),
    ]
    if arch.mla is not None:
        m = arch.mla
        lines.append(
            f"  attention   MLA: {arch.num_attention_heads} heads, q_lora {m.q_lora_rank}, "
            f"kv_lora {m.kv_lora_rank}, rope {m.qk_rope_head_dim}"
        )
    else:
        kind = "MHA"
        if arch.num_kv_heads == 1:
            kind = "MQA"
        elif arch.num_kv_heads < arch.num_attention_heads:
            kind = f"GQA {arch.num_attention_heads // arch.num_kv_heads}:1"
        extra = ", output gate" if arch.attn_output_gate else ""
        lines.append(
            f"  attention   {kind}: {arch.num_attention_heads} heads, {arch.num_kv_heads} KV "
            f"heads, head_dim {arch.head_dim}{extra}"
        )
    if arch.sliding_window and arch.count(sizing.SLIDING):
        lines.append(f"  window      {arch.sliding_window} tokens on sliding layers")
    if arch.linear is not None:
        la = arch.linear
        lines.append(
            f"  linear attn {la.num_key_heads} key / {la.num_value_heads} value heads of "
            f"{la.key_head_dim}/{la.value_head_dim}, conv {la.conv_kernel}"
        )
    if arch.moe is not None:
        moe = arch.moe
        shared = f" + shared {moe.shared_intermediate_size}" if moe.shared_intermediate_size else ""
        lines.append(
            f"  MoE         {len(moe.moe_layers)} layers: {moe.num_experts} experts × "
            f"{moe.expert_intermediate_size} (top-{moe.experts_per_token}){shared}"
        )
    if arch.vision is not None:
        lines.append(f"  vision      {arch.vision.depth} layers × {arch.vision.hidden_size}")
    if arch.mtp_layers:
        lines.append(f"  MTP         {arch.mtp_layers} layer(s) (loaded only for speculative decoding)")
    return lines


def render(
    model: str,
    arch: sizing.Architecture,
    weights: sizing.WeightEstimate,
    kv: sizing.KVEstimate,
    max_model_len: int,
    max_num_seqs: int,
    rec: sizing.Recommendation | None,
    gpu_label: str | None,
    index_size: int | None,
    layouts: tuple[sizing.LayoutFit, ...] = (),
    chosen: tuple[sizing.LayoutFit | None, str] = (None, ""),
) -> str:
    """Human text: formula inputs first, then the recommendation (and, for MoE, the layouts)."""
    out = [f"kit plan: {model} ({arch.model_type})", "", "Architecture", *_architecture_lines(arch)]
    out += ["", f"Weights ({weights.format})"]
    rows = [[c.category, f"{c.params / 1e9:.3f} B", sizing.format_bytes(c.bytes)] for c in weights.categories]
    rows.append(
        [
            "loaded by vLLM",
            f"{weights.params / 1e9:.3f} B",
            sizing.format_bytes(weights.loaded_bytes),
        ]
    )
    out += ["  " + line for line in table(["component", "params", "bytes"], rows).splitlines()]
    if index_size:
        diff = (weights.checkpoint_bytes / index_size - 1) * 100
        out.append(f"  checkpoint index says {index_size:,} B; estimate {weights.checkpoint_bytes:,} B ({diff:+.2f} %)")
    out += ["", f"KV cache ({kv.dtype})"]
    for lk in kv.layers:
        window = f", at most {lk.window} tokens" if lk.window else ""
        if lk.bytes_per_token:
            out.append(
                f"  {lk.layers} {lk.kind} layers × {lk.formula} = "
                f"{sizing.format_bytes(lk.bytes_per_token)}/token/layer{window}"
            )
        else:
            out.append(
                f"  {lk.layers} {lk.kind} layers: {lk.formula} = {sizing.format_bytes(lk.state_bytes_per_seq)}/layer"
            )
    per_seq = kv.per_sequence_bytes(max_model_len)
    out.append(f"  per token (all layers): {sizing.format_bytes(kv.per_token_bytes)}")
    out.append(f"  one sequence of {max_model_len} tokens: {sizing.format_bytes(per_seq)}")
    out.append(f"  max-num-seqs {max_num_seqs} × {max_model_len} tokens: {sizing.format_bytes(per_seq * max_num_seqs)}")
    if rec is None:
        out += ["", "Pass --gpu (e.g. A100-40GB) or --gpu-memory 40GiB for a recommendation."]
        return "\n".join(out)
    best = chosen[0] if layouts else None
    moved = best is not None and (best.layout.tp, best.layout.pp, best.layout.dp) != (rec.tp, rec.pp, 1)
    # For MoE the layout comparison below decides; this block is then the smallest fit only.
    heading = "Fewest nodes, largest TP" if moved else "Recommendation"
    out += [
        "",
        f"{heading} ({gpu_label}: {sizing.format_bytes(rec.gpu_memory_bytes)} × "
        f"{rec.gpu_memory_utilization:g}, {rec.gpus_per_node} GPUs per node)",
        f"  nodes {rec.nodes}, TP {rec.tp}, PP {rec.pp} ({rec.gpus} GPUs)",
        f"  per GPU: budget {sizing.format_bytes(rec.budget_per_gpu)} - weights "
        f"{sizing.format_bytes(rec.weights_per_gpu)} - overhead "
        f"{sizing.format_bytes(rec.overhead_per_gpu)} = KV room "
        f"{sizing.format_bytes(rec.kv_room_per_gpu)}",
        f"  KV per {rec.max_model_len}-token sequence per GPU: "
        f"{sizing.format_bytes(rec.kv_per_sequence_per_gpu)} -> {rec.max_concurrent_seqs} "
        f"concurrent full-length sequences (max-num-seqs {rec.max_num_seqs})",
    ]
    if rec.kv_tokens_per_gpu:
        out.append(f"  KV room holds {rec.kv_tokens_per_gpu:,} tokens in total")
    if not rec.fits_max_num_seqs:
        out.append(
            f"  note: fewer than max-num-seqs {rec.max_num_seqs} full-length sequences fit; "
            "vLLM will queue or preempt the rest"
        )
    out += [f"  note: {note}" for note in rec.notes]
    out.append("  vllm serve ... " + " ".join(rec.vllm_args()))
    if moved and best is not None:
        out.append(f"  note: on these nodes {best.name} runs more at once: see the recommendation below")
    if layouts:
        out += ["", *_layout_lines(rec, layouts, chosen)]
    return "\n".join(out)


def _layout_lines(
    rec: sizing.Recommendation, layouts: tuple[sizing.LayoutFit, ...], chosen: tuple[sizing.LayoutFit | None, str]
) -> list[str]:
    """Every TP×PP layout of the same nodes, DP+EP (MoE) and replicas behind a router, side by
    side, and the pick."""
    f = sizing.format_bytes
    rows = []
    for c in layouts:
        rows.append(
            [
                ("* " if chosen[0] == c else "  ") + c.name,
                f"{f(c.dense_weights_per_gpu)} + {f(c.expert_weights_per_gpu)}",
                f(c.kv_room_per_gpu) if c.kv_room_per_gpu > 0 else "none",
                f(c.kv_per_sequence_per_gpu),
                str(c.max_concurrent_seqs) if c.fits else "-",
                str(c.scheduled_seqs) if c.fits else c.why_not,
            ]
        )
    head = ["layout", "weights/GPU (dense + experts)", "KV room/GPU", "KV/seq/GPU", "KV holds", "runs at once"]
    out = [
        f"Layouts on {rec.nodes} node(s) × {rec.gpus_per_node} GPUs (TP×PP, DP+EP for MoE, replicas; "
        f"{rec.max_model_len}-token sequences, max-num-seqs {rec.max_num_seqs} per engine)"
    ]
    out += ["  " + line for line in table(head, rows).splitlines()]
    best, why = chosen
    out.append(f"  recommended: {best.name if best else 'none'} — {why}")
    if best is not None:
        out.append("  vllm serve ... " + " ".join(best.vllm_args()))
    return out


def to_result(
    model: str,
    arch: sizing.Architecture,
    weights: sizing.WeightEstimate,
    kv: sizing.KVEstimate,
    max_model_len: int,
    max_num_seqs: int,
    rec: sizing.Recommendation | None,
    index_size: int | None,
    layouts: tuple[sizing.LayoutFit, ...] = (),
    chosen: tuple[sizing.LayoutFit | None, str] = (None, ""),
) -> dict[str, Any]:
    """The `--json` result: every estimate with its inputs (and every layout for MoE models)."""
    weights_dict = asdict(weights)
    for key in ("layer_bytes", "layer_replicated_bytes", "layer_expert_bytes"):
        weights_dict.pop(key)
    per_seq = kv.per_sequence_bytes(max_model_len)
    result: dict[str, Any] = {
        "model": model,
        "architecture": {
            "model_type": arch.model_type,
            "hidden_size": arch.hidden_size,
            "num_layers": arch.num_layers,
            "layer_kinds": sizing.summarize_layers(arch.layer_kinds),
            "vocab_size": arch.vocab_size,
            "tie_word_embeddings": arch.tie_word_embeddings,
            "num_attention_heads": arch.num_attention_heads,
            "num_kv_heads": arch.num_kv_heads,
            "head_dim": arch.head_dim,
            "mla": asdict(arch.mla) if arch.mla else None,
            "moe": asdict(arch.moe) if arch.moe else None,
            "linear_attention": asdict(arch.linear) if arch.linear else None,
            "vision": asdict(arch.vision) if arch.vision else None,
            "mtp_layers": arch.mtp_layers,
            "weight_format": asdict(arch.weight_format),
        },
        "weights": weights_dict,
        "checkpoint_index_bytes": index_size,
        "kv_cache": {
            **asdict(kv),
            "max_model_len": max_model_len,
            "max_num_seqs": max_num_seqs,
            "per_sequence_bytes": per_seq,
            "max_num_seqs_bytes": per_seq * max_num_seqs,
        },
        "overhead_per_gpu_bytes": rec.overhead_per_gpu if rec else sizing.DEFAULT_OVERHEAD_BYTES,
        "recommendation": None,
    }
    if rec is not None:
        result["recommendation"] = {
            **asdict(rec),
            "fits_max_num_seqs": rec.fits_max_num_seqs,
            "vllm_args": rec.vllm_args(),
        }
    result["layouts"] = None
    if layouts:
        best, why = chosen
        result["layouts"] = {
            "candidates": [
                {**c.to_dict(), "name": c.name, "kind": c.kind, "vllm_args": c.vllm_args()} for c in layouts
            ],
            "recommended": best.name if best else None,
            "why": why,
        }
        if (
            rec is not None
            and best is not None
            and (best.layout.tp, best.layout.pp, best.layout.dp)
            != (
                rec.tp,
                rec.pp,
                1,
            )
        ):
            # result.recommendation is then the smallest fit; the layout comparison decides
            result["recommendation"]["superseded_by"] = best.name
    return result


@click.command(
    name="plan",
    cls=KitCommand,
    epilog=EXAMPLES,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.argument("model")
@click.option("--gpu", "gpu", metavar="NAME", help="Known GPU: " + ", ".join(sizing.KNOWN_GPUS) + ".")
@click.option("--gpu-memory", metavar="SIZE", help="Memory per GPU instead of --gpu: 40GiB, 80GB, 141e9.")
@click.option("--gpus-per-node", type=int, default=None, help="GPUs per node (default 8 with a GPU given).")
@click.option(
    "--gpu-memory-utilization",
    type=float,
    default=sizing.DEFAULT_GPU_MEMORY_UTILIZATION,
    show_default=True,
    help="Fraction of each GPU vLLM may use.",
)
@click.option(
    "--max-model-len",
    type=int,
    default=None,
    help="Tokens per sequence (default: the model's max).",
)
@click.option(
    "--max-num-seqs",
    type=int,
    default=sizing.DEFAULT_MAX_NUM_SEQS,
    show_default=True,
    help="Concurrent sequences vLLM schedules.",
)
@click.option("--nodes", type=int, default=None, help="Plan for exactly this many nodes.")
@click.option("--hf-cache", metavar="DIR", help="Hugging Face hub cache to look in.")
@click.option(
    "--fetch", is_flag=True, help="Download config.json from the Hub if it is not local (token: hf_token_file)."
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Config file with hf_token_file, read only with --fetch (default: $KIT_CONFIG, else ./kit.yaml).",
)
@click.option(
    "--set",
    "set_values",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set a config key for --fetch, e.g. hf_token_file=~/.config/kit/hf_token; repeatable.",
)
@click.option("--dtype", default=None, help="Dtype of unquantized weights (bfloat16, float16, float32).")
@click.option("--quantization", default=None, help="vLLM --quantization (fp8 sizes online FP8).")
@click.option("--kv-cache-dtype", default="auto", show_default=True, help="auto, fp8, bfloat16, …")
@click.option("--overhead", metavar="SIZE", default="2GiB", show_default=True, help="Fixed per-GPU overhead.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON result envelope.")
def command(
    model: str,
    gpu: str | None,
    gpu_memory: str | None,
    gpus_per_node: int | None,
    gpu_memory_utilization: float,
    max_model_len: int | None,
    max_num_seqs: int,
    nodes: int | None,
    hf_cache: str | None,
    fetch: bool,
    config_path: str | None,
    set_values: tuple[str, ...],
    dtype: str | None,
    quantization: str | None,
    kv_cache_dtype: str,
    overhead: str,
    as_json: bool,
) -> None:
    """Size MODEL: weights, KV cache, and the nodes/TP/PP it needs on your GPUs.

    Reads the model's own config.json (and quantization config): weight bytes per component,
    KV-cache bytes per token per layer type, then the fewest nodes that hold the weights and
    one --max-model-len sequence, with TP (splits the heads, within a node) and PP (the rest).
    For MoE models it also compares every TP×PP layout of those nodes with the DP+EP layouts
    (--data-parallel-size, --enable-expert-parallel) and recommends the one that runs the most
    full-length sequences at once.
    """
    if gpu and gpu_memory:
        raise UsageError("give --gpu or --gpu-memory, not both", hint="e.g. --gpu A100-40GB")
    # Every flag is checked before the model is read (and before --fetch goes online).
    _check_counts(
        {
            "--gpus-per-node": (gpus_per_node, MAX_GPUS_PER_NODE),
            "--nodes": (nodes, MAX_NODES),
            "--max-model-len": (max_model_len, sizing.MAX_POSITIONS),
            "--max-num-seqs": (max_num_seqs, MAX_NUM_SEQS),
        }
    )
    if not (math.isfinite(gpu_memory_utilization) and 0 < gpu_memory_utilization <= 1):
        raise ConfigError(
            f"{gpu_memory_utilization} is outside (0, 1]",
            key="gpu_memory_utilization",
            source="flag --gpu-memory-utilization",
            hint="use a fraction such as 0.9",
        )
    overhead_bytes = sizing.parse_size(overhead, key="overhead")
    memory = None
    if gpu or gpu_memory:
        memory = (
            sizing.gpu_memory_bytes(gpu, key="gpu") if gpu else sizing.parse_size(str(gpu_memory), key="gpu_memory")
        )
    token_file = _hf_token_file(config_path, set_values) if fetch else None
    config = sizing.load_model_config(model, hf_cache, fetch=fetch, token_file=token_file)
    arch = sizing.parse_architecture(config, dtype=dtype, source=f"{model}/config.json")
    arch = sizing.with_quantization(arch, quantization)
    weights = sizing.estimate_weights(arch)
    kv = sizing.kv_bytes_per_token(arch, kv_cache_dtype)
    seq_len = max_model_len or int(arch.max_position_embeddings or 4096)
    rec: sizing.Recommendation | None = None
    label = None
    if memory is not None:
        label = gpu or f"{gpu_memory} GPU"
        rec = sizing.recommend(
            arch,
            gpu_memory_bytes=memory,
            gpus_per_node=gpus_per_node if gpus_per_node is not None else 8,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            nodes=nodes,
            kv_cache_dtype=kv_cache_dtype,
            overhead_bytes=overhead_bytes,
        )
    layouts: tuple[sizing.LayoutFit, ...] = ()
    chosen: tuple[sizing.LayoutFit | None, str] = (None, "")
    # issue 10: TP×PP vs DP+EP on the same nodes; issue 29: vs replicas behind a router
    if rec is not None and (arch.moe is not None or rec.nodes * rec.gpus_per_node > 1):
        layouts = sizing.layout_candidates(
            arch,
            nodes=rec.nodes,
            gpus_per_node=rec.gpus_per_node,
            gpu_memory_bytes=rec.gpu_memory_bytes,
            gpu_memory_utilization=rec.gpu_memory_utilization,
            max_model_len=rec.max_model_len,
            max_num_seqs=rec.max_num_seqs,
            kv_cache_dtype=kv_cache_dtype,
            overhead_bytes=rec.overhead_per_gpu,
            replicas=True,
        )
        chosen = sizing.pick_layout(layouts)
    index_size = sizing.load_checkpoint_size(model, hf_cache)
    emit(
        Sizing(model, arch, weights, kv, seq_len, max_num_seqs, rec, label, index_size, layouts, chosen),
        as_json=as_json,
    )


@dataclass(frozen=True)
class Sizing:
    """`kit plan`: the model's estimates, the recommendation for the GPU (if one was named) and,
    on more than one GPU, each layout and the one chosen."""

    model: str
    arch: sizing.Architecture
    weights: sizing.WeightEstimate
    kv: sizing.KVEstimate
    max_model_len: int
    max_num_seqs: int
    rec: sizing.Recommendation | None
    gpu_label: str | None
    index_size: int | None
    layouts: tuple[sizing.LayoutFit, ...]
    chosen: tuple[sizing.LayoutFit | None, str]
    command = "plan"

    def to_dict(self) -> dict[str, Any]:
        return to_result(
            self.model,
            self.arch,
            self.weights,
            self.kv,
            self.max_model_len,
            self.max_num_seqs,
            self.rec,
            self.index_size,
            self.layouts,
            self.chosen,
        )

    def text(self) -> str:
        return render(
            self.model,
            self.arch,
            self.weights,
            self.kv,
            self.max_model_len,
            self.max_num_seqs,
            self.rec,
            self.gpu_label,
            self.index_size,
            self.layouts,
            self.chosen,
        )


def _check_counts(values: dict[str, tuple[int | None, int]]) -> None:
    """Each given count is in 1..its bound."""
    for flag, (number, high) in values.items():
        if number is not None and not 1 <= number <= high:
            raise UsageError(f"{flag} {number} is outside 1..{high:,}", hint=f"pass {flag} from 1 to {high:,}")


def _hf_token_file(config_path: str | None, set_values: tuple[str, ...]) -> str | None:
    """hf_token_file from the resolved configuration (kit.yaml < KIT_* < --set), for --fetch."""
    resolved = load_settings(config_path, overrides_from({}, set_values, {}))
    return resolved.config.hf_token_file
