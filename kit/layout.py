"""The layout of a serving group: TP × PP × DP GPUs, expert parallelism on or off. One shape for
every part of kit (issue 26): the planner decides it (kit.plan.layout, with how it was decided),
the nodes carry it in their labels (kit.labels), `kit plan` sizes it (kit.sizing), `kit tune`
tries several (written `tp2-pp2`, `tp1-dp4-ep`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from kit.errors import ConfigError

# How a layout was decided (Layout.decided_by; the kit.layout-from label). Fixed words only: they
# are printed in --dry-run comments, so they never hold a configured value.
BY_CONFIG = "config: model.tp, model.pp and model.dp set"
BY_FILL = "auto: the GPUs the set values leave"
BY_MODEL = "auto: model files (kit plan)"
BY_MODEL_MEMORY = "auto: model files and model.gpu_memory (kit plan)"
BY_NO_MODEL = "auto: no model files: TP = gpus_per_node, PP = nodes"
BY_NO_MODEL_DP = "auto: no model files: TP = the GPUs of one replica"

LAYOUT_RE = re.compile(r"^tp(\d+)(?:[-_]?pp(\d+))?(?:[-_]?dp(\d+))?([-_]?ep)?([-_]?router)?\Z")


@dataclass(frozen=True, order=True)
class Layout:
    """`decided_by` says how the planner chose it (fixed words: kit.plan.layout's BY_*; printed in
    --dry-run comments); `guessed`: an auto value the model's files would decide was chosen
    without them. `router`: the DP replicas are independent servers behind vLLM's router
    (model.dp_lb router, issue 29; kit.plan.replicas places them), not one vLLM DP group."""

    tp: int
    pp: int = 1
    dp: int = 1
    ep: bool = False
    decided_by: str = ""
    guessed: bool = False
    router: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def ep_size(self) -> int:
        """vLLM's expert-parallel group: TP × DP ranks with EP on, else 1 (experts split by TP)."""
        return self.tp * self.dp if self.ep else 1

    def nodes(self, gpus_per_node: int) -> int:
        return math.ceil(self.gpus / gpus_per_node)

    @property
    def name(self) -> str:
        """`tp2-pp2`, `tp1-dp4-ep`: how `kit tune` writes it."""
        name = f"tp{self.tp}" + (f"-pp{self.pp}" if self.pp > 1 else "") + (f"-dp{self.dp}" if self.dp > 1 else "")
        return name + ("-ep" if self.ep else "") + ("-router" if self.router else "")

    def describe(self) -> str:
        """`TP=4 PP=2 DP=1` (+ ` EP`, ` (router)`): kit's own words and numbers."""
        text = f"TP={self.tp} PP={self.pp} DP={self.dp}" + (" EP" if self.ep else "")
        return text + (" (router)" if self.router else "")

    def to_dict(self) -> dict[str, int | bool | str]:
        out: dict[str, int | bool | str] = {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep}
        if self.router:
            out["router"] = True
        return {**out, "decided_by": self.decided_by}

    def overrides(self, gpus_per_node: int) -> dict[str, Any]:
        """Config keys that give this layout (whole nodes; the GPUs of one node when smaller)."""
        return {
            "nodes": self.nodes(gpus_per_node),
            "gpus_per_node": min(gpus_per_node, self.gpus),
            "model.tp": self.tp,
            "model.pp": self.pp,
            "model.dp": self.dp,
            "model.ep": self.ep,
            **({"model.dp_lb": "router"} if self.router else {}),
        }

    @classmethod
    def parse(cls, text: str) -> Layout:
        m = LAYOUT_RE.match(text.strip().lower())
        if not m:
            raise ConfigError(
                f"{text!r} is not a layout",
                key="--layouts",
                hint="write layouts like tp1,tp2,tp2-pp2,tp1-dp2,tp1-dp4-ep,tp2-dp2-router",
            )
        tp, pp, dp = (int(g) if g else 1 for g in m.groups()[:3])
        if min(tp, pp, dp) < 1:
            raise ConfigError(f"{text!r}: sizes must be at least 1", key="--layouts")
        return cls(tp, pp, dp, ep=bool(m.group(4)), router=bool(m.group(5)))
