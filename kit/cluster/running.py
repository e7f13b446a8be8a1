"""The running cluster describes itself (issue 25): what its nodes' labels and kit's record of it
say it is, and the config a look or a teardown operates with.

A command that only looks at a cluster or tears it down (status, query, metrics, logs, bench,
down, verify) takes the values it needs to reach it (its backend, model, served name, ports, API
key file, size, layout) from what runs, never from whatever kit.yaml the directory it runs in
happens to hold: a configured value that disagrees is reported as drift, not used instead.

    labels    kit.labels on every node container (what `kit up` started it with); first
    record    kit.cluster.record: kit's record of the cluster on this host (its runtime, where
              a node on another host leaves no label here, the config it was started from)
    config    the loaded settings (defaults < kit.yaml < KIT_* < flags) for everything else
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kit import labels
from kit.config import KitConfig, Resolved, coerce, parse_scalar
from kit.errors import ConfigError, ServerError
from kit.labels import LayoutLabels
from kit.layout import Layout
from kit.plan.layout import plan_layout
from kit.runtime.base import NodeHandle

# label -> the config key it records (kit.plan.node.node_labels writes them).
LABEL_KEYS = {
    labels.BACKEND: "backend",
    labels.ACCELERATOR: "accelerator",
    labels.IMAGE: "image",
    labels.NODES: "nodes",
    labels.GPUS_PER_NODE: "gpus_per_node",
    labels.HEAD_ADDRESS: "head_address",
    labels.MODEL: "model.id",
    labels.SERVED_NAME: "model.served_name",
    labels.MAX_MODEL_LEN: "model.max_model_len",
    labels.TP: "model.tp",
    labels.PP: "model.pp",
    labels.DP: "model.dp",
    labels.EP: "model.ep",
    labels.API_PORT: "ports.api",
    labels.RAY_GCS_PORT: "ports.ray_gcs",
    labels.RAY_METRICS_PORT: "ports.ray_metrics_export",
    labels.SUPERVISOR_PORT: "ports.supervisor",
    labels.API_KEY_FILE: "api_key_file",
}
# The keys a later command needs to operate the cluster: the record keeps them for the nodes this
# host does not run (and the runtime, which finds the nodes in the first place).
OPERATING_KEYS = ("runtime", "network", *dict.fromkeys(LABEL_KEYS.values()))
# Keys whose configured `auto` is a request to plan, not a value that can disagree.
_AUTO_KEYS = ("model.tp", "model.pp", "model.dp")
# A path configured relative or under ~ is the same file as its absolute form.
_PATH_KEYS = ("api_key_file",)


@dataclass(frozen=True)
class Running:
    """What the cluster named `cluster` runs with, by config key, and where each value was read."""

    cluster: str
    nodes: tuple[NodeHandle, ...] = ()
    values: Mapping[str, Any] = field(default_factory=dict)
    origins: Mapping[str, str] = field(default_factory=dict)
    layout: LayoutLabels | None = None
    record: Mapping[str, Any] | None = None

    @property
    def found(self) -> bool:
        """Something of it is known: a node on this host, or kit's record of it."""
        return bool(self.nodes) or self.record is not None


@dataclass(frozen=True)
class Drift:
    """A configured value that disagrees with what the cluster runs with."""

    key: str
    configured: Any
    source: str
    running: Any
    origin: str

    def line(self, cluster: str) -> str:
        return (
            f"drift: {self.key} is {_shown(self.configured)} ({self.source}) but cluster {cluster} runs with "
            f"{_shown(self.running)} ({self.origin}); kit uses what runs (`kit down` then `kit up`, or "
            "`kit up --replace`, applies the config)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "configured": self.configured,
            "source": self.source,
            "running": self.running,
            "origin": self.origin,
        }


def read_running(cluster: str, nodes: Sequence[NodeHandle], record: Mapping[str, Any] | None) -> Running:
    """What runs, from the nodes' labels (the head's first) over kit's record. Every value is
    checked like a config value (labels and the record are data from outside: a value kit cannot
    read is left out, never trusted)."""
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for key, raw in ((record or {}).get("values") or {}).items():
        if key in OPERATING_KEYS:
            _put(values, origins, key, raw, f"kit's record of cluster {cluster}")
    for node in sorted(nodes, key=lambda n: (n.role != "head", n.rank), reverse=True):  # the head's last: it wins
        for label, key in LABEL_KEYS.items():
            if label in node.labels:
                _put(values, origins, key, node.labels[label], f"label {label} of {node.name}")
    layout = _started_layout(nodes)
    return Running(cluster, tuple(nodes), values, origins, layout, record)


def _put(values: dict[str, Any], origins: dict[str, str], key: str, raw: Any, origin: str) -> None:
    try:
        parsed = parse_scalar(key, raw, origin) if isinstance(raw, str) else raw
        values[key] = coerce(key, parsed, origin)
    except ConfigError:
        return
    origins[key] = origin


def _started_layout(nodes: Sequence[NodeHandle]) -> LayoutLabels | None:
    for node in sorted(nodes, key=lambda n: n.role != "head"):
        found = LayoutLabels.from_labels(node.labels)
        if found is not None:
            return found
    return None


def drift(settings: Resolved, running: Running) -> list[Drift]:
    """The configured values (set in kit.yaml, KIT_* or a flag: a default never drifts) that
    disagree with what the cluster runs with."""
    out = []
    for key, value in running.values.items():
        source = settings.sources.get(key, "default")
        configured = _get(settings.config, key)
        if source == "default" or (key in _AUTO_KEYS and configured == "auto"):
            continue
        if key in _PATH_KEYS and isinstance(configured, str):
            configured = os.path.realpath(os.path.expanduser(configured))
        if configured != value:
            out.append(Drift(key, configured, source, value, running.origins[key]))
    return out


def operated(settings: Resolved, running: Running) -> Resolved:
    """The settings with every value the cluster runs with in place of the configured one, and its
    layout: the layout the nodes were started with, else (nothing of it runs here) what
    kit.plan.layout decides without reading the model's files. Never reads the model, never sizes
    it: a model kit cannot plan does not lock anyone out of looking or tearing down (issue 25)."""
    config = settings.config
    values, sources = dict(settings.values), dict(settings.sources)
    for key, value in running.values.items():
        config = _with(config, key, value)
        values[key], sources[key] = value, running.origins[key]
    layout: Layout
    if running.layout is not None:
        layout = running.layout.layout
        model = dataclasses.replace(config.model, tp=layout.tp, pp=layout.pp, dp=layout.dp)
        if layout.router:  # replicas behind the router (issue 29): its URL, not the head's API port
            model = dataclasses.replace(model, dp_lb="router")
        config = config.replace(model=model)
    else:
        layout = plan_layout(config, None)
    return Resolved(config.replace(planned=layout), values, sources, settings.path)


def operating_values(config: KitConfig, head_address: str) -> dict[str, Any]:
    """What kit's record keeps of a planned config (the values its node labels carry, and the
    runtime and network that find the nodes): the layout as planned, the served name as served."""
    values = {key: _get(config, key) for key in OPERATING_KEYS}
    lay = config.layout
    values.update({"model.tp": lay.tp, "model.pp": lay.pp, "model.dp": lay.dp, "model.ep": lay.ep})
    values.update({"model.served_name": config.served_name, "head_address": head_address})
    return values


def _get(config: KitConfig, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _with(config: KitConfig, key: str, value: Any) -> KitConfig:
    """`config` with one dotted key set (sections are frozen dataclasses)."""
    section, _, name = key.rpartition(".")
    if not section:
        return config.replace(**{name: value})
    return config.replace(**{section: dataclasses.replace(getattr(config, section), **{name: value})})


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


@contextlib.contextmanager
def key_hint(cluster: str | None, key_file: str | None, source: str) -> Iterator[None]:
    """A 401 from the cluster's server gets a fix that says which key file kit sent and where
    it learnt it, so the fix names something to do (issue 25: `kit query --cluster demo` failed
    401 and did not say where the demo's key is). `cluster` None: a server named by --url, not
    the cluster: the client's own fix stands."""
    try:
        yield
    except ServerError as err:
        if "401" not in err.message or cluster is None:
            raise
        if key_file is None:
            hint = (
                f"kit knows no API key file for cluster {cluster} (none in its labels, kit's record or the config): "
                "pass the server's key with --api-key-file FILE"
            )
        elif source.startswith("flag"):
            hint = (
                f"{key_file} does not hold the server's key: pass the file cluster {cluster} was started with "
                f"as --api-key-file (`kit status --cluster {cluster}` shows where it is)"
            )
        else:
            hint = (
                f"kit sent the key in {key_file} ({source}), the file the server was started with: it changed since; "
                "`kit serve --replace` serves the key it holds now"
            )
        raise ServerError(err.message, hint=hint) from None
