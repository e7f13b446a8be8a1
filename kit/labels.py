"""Every label key kit puts on what it creates (containers, networks, Apptainer instance records),
in one place. Everything kit starts carries `kit.managed=true` and its cluster's name, so it is
found and removed by label (`kit status`, `kit down`), never by a guessed name.

The layout labels record what `kit up` decided (kit.plan.layout), so `kit status`, `kit bench`
and `kit tune` read the layout a node was started with instead of recomputing it from whatever
kit.yaml and model files the host they run on happens to have.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kit.layout import Layout

MANAGED = "kit.managed"
CLUSTER = "kit.cluster"
ROLE = "kit.role"
RANK = "kit.rank"
NODE_IP = "kit.node-ip"
BACKEND = "kit.backend"
ACCELERATOR = "kit.accelerator"
IMAGE = "kit.image"
VERSION = "kit.version"
SLURM_JOB = "kit.slurm-job"  # containers a `kit slurm` job starts (found and removed per job)
DEMO = "kit.demo"  # the one-off containers of `kit demo` (the tiny model's generator)
SOURCE = "kit.source"  # the Dockerfile an Apptainer definition was generated from
# What a node holds on its host (kit.plan.host_share): the host ports its processes bind
# ("8000 29570 11000-11999") and its GPUs ("all" or "2,3"), so another cluster's node is refused
# before it starts on any of them.
HOST_PORTS = "kit.host-ports"
GPUS = "kit.gpus"
# The layout the node was started for, and how it was decided (kit.plan.layout).
TP = "kit.tp"
PP = "kit.pp"
DP = "kit.dp"
EP = "kit.ep"
ROUTER = "kit.router"  # "true": DP replicas behind vLLM's router (model.dp_lb router, issue 29)
LAYOUT_FROM = "kit.layout-from"
SERVED_NAME = "kit.served-name"
MODEL = "kit.model"
MAX_MODEL_LEN = "kit.max-model-len"
# What a later command needs to operate the cluster without the config that started it (issue 25:
# kit status/query/metrics/logs/bench/down read these back; kit.cluster.running maps them to keys).
NODES = "kit.nodes"
GPUS_PER_NODE = "kit.gpus-per-node"
HEAD_ADDRESS = "kit.head-address"
API_PORT = "kit.api-port"
RAY_GCS_PORT = "kit.ray-gcs-port"
RAY_METRICS_PORT = "kit.ray-metrics-port"
SUPERVISOR_PORT = "kit.supervisor-port"
API_KEY_FILE = "kit.api-key-file"  # the key file's path on the host that started the node, never the key

MANAGED_TRUE = "true"


@dataclass(frozen=True)
class LayoutLabels:
    """What a node was started to serve: the layout (with how it was decided) and the model."""

    layout: Layout
    served_name: str | None = None
    model: str | None = None
    max_model_len: int | None = None

    def to_labels(self) -> dict[str, str]:
        lay = self.layout
        out = {TP: str(lay.tp), PP: str(lay.pp), DP: str(lay.dp), EP: "true" if lay.ep else "false"}
        if lay.router:
            out[ROUTER] = "true"
        out[LAYOUT_FROM] = lay.decided_by
        if self.served_name is not None:
            out[SERVED_NAME] = self.served_name
        if self.model is not None:
            out[MODEL] = self.model
        if self.max_model_len is not None:
            out[MAX_MODEL_LEN] = str(self.max_model_len)
        return out

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> LayoutLabels | None:
        """The recorded layout, or None when the node carries no (or malformed) layout labels
        (a node started by a kit before issue 17, or not by kit)."""
        try:
            tp, pp, dp = int(labels[TP]), int(labels[PP]), int(labels[DP])
        except (KeyError, ValueError):
            return None
        if min(tp, pp, dp) < 1:
            return None
        return cls(
            Layout(
                tp, pp, dp, labels.get(EP) == "true", labels.get(LAYOUT_FROM, ""), router=labels.get(ROUTER) == "true"
            ),
            served_name=labels.get(SERVED_NAME),
            model=labels.get(MODEL),
            max_model_len=_int_or_none(labels.get(MAX_MODEL_LEN)),
        )


def _int_or_none(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None
