"""KV-cache bytes per token per layer kind, and the fixed per-sequence state of linear attention."""

from __future__ import annotations

from dataclasses import dataclass

from kit.sizing.architecture import FULL, LINEAR, SLIDING, Architecture
from kit.sizing.quantization import DTYPE_BYTES, parse_dtype


@dataclass(frozen=True)
class LayerKV:
    """KV-cache cost of one kind of layer, for the whole model (before TP/PP split)."""

    kind: str  # full_attention, sliding_attention, mla, linear_attention
    layers: int
    bytes_per_token: int  # per layer, unsharded
    formula: str
    window: int | None = None  # sliding layers keep at most this many tokens
    state_bytes_per_seq: int = 0  # per layer, linear attention


@dataclass(frozen=True)
class KVEstimate:
    dtype: str
    per_token_bytes: int  # all layers, a token inside every window
    layers: tuple[LayerKV, ...]

    def per_sequence_bytes(self, seq_len: int) -> int:
        total = 0
        for lk in self.layers:
            tokens = min(seq_len, lk.window) if lk.window else seq_len
            total += lk.layers * (lk.bytes_per_token * tokens + lk.state_bytes_per_seq)
        return total


def kv_bytes_per_token(arch: Architecture, kv_cache_dtype: str = "auto") -> KVEstimate:
    """KV bytes per token per layer type; linear-attention layers hold a per-sequence state."""
    dtype = arch.dtype if kv_cache_dtype in ("auto", "") else kv_cache_dtype
    b = int(DTYPE_BYTES[parse_dtype(dtype, source="--kv-cache-dtype", key="kv_cache_dtype")])
    layers: list[LayerKV] = []
    if arch.mla is not None:
        m = arch.mla
        per = (m.kv_lora_rank + m.qk_rope_head_dim) * b
        layers.append(
            LayerKV(
                "mla",
                arch.num_layers,
                per,
                f"(kv_lora_rank {m.kv_lora_rank} + rope {m.qk_rope_head_dim}) × {b} B",
            )
        )
    else:
        per = 2 * arch.num_kv_heads * arch.head_dim * b
        formula = f"2 (K,V) × {arch.num_kv_heads} KV heads × head_dim {arch.head_dim} × {b} B"
        if arch.count(FULL):
            layers.append(LayerKV(FULL, arch.count(FULL), per, formula))
        if arch.count(SLIDING):
            layers.append(LayerKV(SLIDING, arch.count(SLIDING), per, formula, window=arch.sliding_window))
    if arch.linear is not None and arch.count(LINEAR):
        la = arch.linear
        state_b = int(DTYPE_BYTES[la.state_dtype])
        conv = la.conv_dim * (la.conv_kernel - 1) * b
        ssm = la.num_value_heads * la.key_head_dim * la.value_head_dim * state_b
        layers.append(
            LayerKV(
                LINEAR,
                arch.count(LINEAR),
                0,
                f"state per sequence: conv {la.conv_dim}×{la.conv_kernel - 1}×{b} B"
                f" + {la.num_value_heads} heads × {la.key_head_dim}×{la.value_head_dim}"
                f" × {state_b} B",
                state_bytes_per_seq=conv + ssm,
            )
        )
    per_token = sum(lk.layers * lk.bytes_per_token for lk in layers)
    return KVEstimate(dtype=dtype, per_token_bytes=per_token, layers=tuple(layers))
