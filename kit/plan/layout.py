"""The TP/PP/DP/EP layout of a cluster, decided in one place (issue 17).

`plan_layout(config, model)` is pure: the config (model.tp/pp/dp, `auto` or numbers; nodes and
GPUs per node) and the model's facts (its config.json, read once per command by
kit.cluster.resolve; None when this host does not have it) give one `Layout`, with how it was
decided. Every command takes its layout from here: `kit up`/`serve`/`slurm`/`tune` and, through
KitConfig.tp/pp/dp for a config not resolved yet, every planner.

The rules, for `auto`:

- one replica over the cluster (model.dp = 1): a value left auto fills the GPUs the other one
  leaves (PP = GPUs / TP, TP = GPUs / PP); both auto: TP is the largest split of one node's GPUs
  that divides the model's heads (kit.sizing's rule) and PP takes the rest — with
  model.gpu_memory, `kit plan`'s recommendation (which also refuses a cluster too small);
  without the model's files, TP = gpus_per_node and PP = nodes.
- data parallel (model.dp auto or > 1): every replica stays inside one node; TP is the largest
  head-dividing split of a replica's GPUs (without the model's files: all of them), PP fills a
  fixed-DP replica (1 with DP auto), and DP auto = GPUs / (TP × PP).

Without the model's files the rule can only guess where the model would decide (both TP and PP
auto, or TP auto with DP, on more than one GPU per node or replica): `Layout.guessed` says so.
Hosts that see different files would then choose different layouts, so `kit slurm` refuses a
guessed layout and `kit up`/`kit serve` warn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kit import sizing
from kit.layout import (
    BY_CONFIG,
    BY_FILL,
    BY_MODEL,
    BY_MODEL_MEMORY,
    BY_NO_MODEL,
    BY_NO_MODEL_DP,
    Layout,
)

if TYPE_CHECKING:
    from kit.config import KitConfig
    from kit.sizing import Architecture


@dataclass(frozen=True)
class ModelFacts:
    """What the layout and the plan checks need from the model's config.json."""

    source: str  # the config.json read
    heads: int | None
    kv_heads: int | None  # None: MLA (latent KV, not split by heads) or not stated
    experts: int | None  # routed experts, 0 for a dense model; None when kit.sizing cannot read the config
    architecture: Architecture | None  # None: a config kit plan does not understand (heads still checked)

    def splits_heads(self, tp: int) -> bool:
        """Whether TP divides the model's heads: kit.sizing's one rule."""
        if self.architecture is not None:
            return sizing.valid_tp(self.architecture, tp)
        return self.heads is None or sizing.heads_split(self.heads, self.kv_heads, tp)


def plan_layout(config: KitConfig, model: ModelFacts | None) -> Layout:
    """The layout of `config`, with the model's facts when this host has its config.json."""
    m = config.model
    router = m.dp_lb == "router"
    if "auto" not in (m.tp, m.pp, m.dp):
        return Layout(int(m.tp), int(m.pp), int(m.dp), m.ep, BY_CONFIG, router=router)
    arch = model.architecture if model is not None else None
    replicated = m.dp == "auto" or int(m.dp) > 1
    tp, pp, decided_by, guessed = _replica_layout(config, arch) if replicated else _cluster_layout(config, arch)
    total = config.nodes * config.gpus_per_node
    dp = max(1, total // max(1, tp * pp)) if m.dp == "auto" else int(m.dp)
    return Layout(tp, pp, dp, m.ep, decided_by, guessed, router=router)


def _cluster_layout(config: KitConfig, arch: Architecture | None) -> tuple[int, int, str, bool]:
    """TP and PP of the one replica that spans the cluster (model.dp = 1)."""
    m = config.model
    total = config.nodes * config.gpus_per_node
    rec = _recommend(config, arch) if arch is not None and m.gpu_memory else None  # may refuse: too small
    if m.tp != "auto" and m.pp != "auto":
        return int(m.tp), int(m.pp), BY_CONFIG, False
    if m.tp != "auto":  # only PP is auto: it covers what the user's TP leaves
        return int(m.tp), total // int(m.tp), BY_FILL, False
    if m.pp != "auto":  # only TP is auto
        return total // int(m.pp), int(m.pp), BY_FILL, False
    if rec is not None:
        return rec[0], rec[1], BY_MODEL_MEMORY, False
    if arch is not None:
        tp = sizing.best_tp(arch, config.gpus_per_node)
        return tp, total // tp, BY_MODEL, False
    # With one GPU per node the heads cannot matter: no host would decide otherwise.
    return config.gpus_per_node, config.nodes, BY_NO_MODEL, config.gpus_per_node > 1


def _replica_layout(config: KitConfig, arch: Architecture | None) -> tuple[int, int, str, bool]:
    """TP and PP of one DP replica, which stays inside one node (kit.plan.checks)."""
    m = config.model
    pp = 1 if m.pp == "auto" else int(m.pp)
    replica = config.gpus_per_node if m.dp == "auto" else max(1, config.nodes * config.gpus_per_node // int(m.dp))
    decided_by, guessed = BY_FILL, False
    if m.tp != "auto":
        tp = int(m.tp)
    elif arch is not None:
        tp, decided_by = sizing.best_tp(arch, max(1, replica // pp)), BY_MODEL
    else:
        tp, decided_by = max(1, replica // pp), BY_NO_MODEL_DP
        guessed = tp > 1  # one GPU per replica: nothing for the heads to decide
    if m.pp == "auto" and m.dp != "auto":  # PP fills a fixed-DP replica
        pp = max(1, replica // tp)
    return tp, pp, decided_by, guessed


def _recommend(config: KitConfig, arch: Architecture) -> tuple[int, int]:
    """kit plan's fewest-nodes TP/PP for the configured GPU memory (raises when it cannot fit)."""
    m = config.model
    rec = sizing.recommend(
        arch,
        gpu_memory_bytes=sizing.gpu_memory_bytes(str(m.gpu_memory), key="model.gpu_memory"),
        gpus_per_node=config.gpus_per_node,
        max_model_len=m.max_model_len if (m.max_model_len or 0) > 0 else None,  # -1: auto
        nodes=config.nodes,
    )
    return rec.tp, rec.pp
