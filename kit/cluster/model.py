"""Serve from the fetched copy (issue 19): is the model complete in the HF cache, and therefore
may vLLM run offline on every node?

`kit up`, `kit serve` and `kit slurm` share this decision. `decide_offline` is pure (config + the
cache check's report); `check_model_cache` is the one read of the disk (kit.models.fetch's offline
check, which reads sizes, kit's manifest and the weights index, never the weights). The decision
reaches the nodes as environment in the planned ContainerSpec (`with_offline`), so `--dry-run`
shows it.

Why offline at all: with the files complete in the cache, vLLM (through huggingface_hub) still asks
the Hub for the revision on every start on every node; compute nodes without internet then wait
for timeouts, and nodes that can reach it may each resolve `main` to another commit.
`HF_HUB_OFFLINE=1` makes huggingface_hub (and transformers, which reads the same constant) use
the cache only. vLLM reads no offline variable of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.config import KitConfig
from kit.models.fetch import SnapshotReport, check_model

# What the containers get when the model is complete. TRANSFORMERS_OFFLINE is not needed:
# huggingface_hub reads it only as a synonym of HF_HUB_OFFLINE, and transformers 5 takes its
# offline mode from huggingface_hub's constant; vLLM reads huggingface_hub's too (checked in
# kit/vllm-cpu:test: vLLM 0.32.0, transformers 5.19.0, huggingface_hub 2.4.0).
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1"}
# vLLM serves the cache's `main` (kit does not pass --revision): the snapshot refs/main names.
SERVED_REVISION = "main"

# What the check found, in kit's own words (no user value in them).
COMPLETE = "complete"
INCOMPLETE = "incomplete"
MISSING = "missing"
LOCAL = "local path"  # model.id is a directory: not a Hub model, nothing to fetch
FORCED = "not checked"  # model.offline: false


@dataclass(frozen=True)
class ModelCache:
    """The decision for one model: run vLLM offline or not, what the cache holds, and the one
    warning line (None: nothing to say)."""

    model: str
    revision: str
    mode: str  # model.offline: auto | true | false
    state: str  # COMPLETE | INCOMPLETE | MISSING | LOCAL | FORCED
    offline: bool
    summary: str | None = None  # the check's one line (kit.models.fetch.SnapshotReport.summary)
    sha: str | None = None  # the snapshot's commit, when one was found
    warning: str | None = None

    @property
    def env(self) -> dict[str, str]:
        return dict(OFFLINE_ENV) if self.offline else {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "revision": self.revision,
            "sha": self.sha,
            "offline": self.offline,
            "mode": self.mode,
            "cache": self.state,
            "summary": self.summary,
        }

    def describe(self) -> str:
        """What was decided and why, in kit's own words (no user value): kit slurm's stderr line
        says it, since the nodes' cache cannot be seen from the login node."""
        how = "offline (HF_HUB_OFFLINE=1)" if self.offline else "online"
        why = {
            COMPLETE: "the model is complete in hf_cache on this host",
            INCOMPLETE: "the model is incomplete in hf_cache on this host",
            MISSING: "the model is not in hf_cache on this host",
            LOCAL: "model.id is a local path",
            FORCED: "model.offline is false",
        }[self.state]
        if self.mode == "true" and self.state != LOCAL:
            why = f"model.offline is true ({why})"
        elif self.mode == "true":
            why = "model.offline is true"
        return f"vLLM runs {how}: {why}"


def hub_dir(config: KitConfig) -> Path:
    return Path(config.hf_cache) / "hub"


def is_local_path(config: KitConfig) -> bool:
    return config.model.id.startswith("/")


def needs_check(config: KitConfig) -> bool:
    """Whether the decision needs the cache read (a Hub model, model.offline not false)."""
    return config.model.offline != "false" and not is_local_path(config)


def check_model_cache(config: KitConfig) -> SnapshotReport | None:
    """The one read of the disk: kit.models.fetch's offline check of the model's snapshot in
    hf_cache/hub (None: no snapshot). Local paths and model.offline false are not read."""
    if not needs_check(config):
        return None
    return check_model(hub_dir(config), config.model.id, SERVED_REVISION)


def decide_offline(config: KitConfig, report: SnapshotReport | None) -> ModelCache:
    """Pure: offline when the model is complete in the cache (model.offline auto), always
    (true) or never (false); a warning naming the fix when a Hub model is not complete. A model
    given as a path is not a Hub model: vLLM loads the folder and asks the Hub nothing about it,
    so there is nothing to check and no reason to change the environment (unless forced)."""
    mode, model = config.model.offline, config.model.id
    if mode == "false":
        return ModelCache(model, SERVED_REVISION, mode, FORCED, offline=False)
    if is_local_path(config):
        return ModelCache(model, SERVED_REVISION, mode, LOCAL, offline=mode == "true")
    if report is None:
        state, summary = MISSING, None
    else:
        state, summary = (COMPLETE if report.complete else INCOMPLETE), report.summary()
    offline = state == COMPLETE or mode == "true"
    warning = None
    if state != COMPLETE:
        found = "is not in hf_cache on this host"
        if summary is not None:
            found = f"is incomplete in hf_cache on this host ({summary.removeprefix('incomplete: ')})"
        then = (
            "model.offline is true: vLLM will not download it and fails to start"
            if offline
            else "every node downloads it at start"
        )
        warning = f"{model} {found}; {then}: run `kit fetch {model}` first (then vLLM runs offline)"
    return ModelCache(
        model,
        SERVED_REVISION,
        mode,
        state,
        offline=offline,
        summary=summary,
        sha=report.sha if report is not None else None,
        warning=warning,
    )


def with_offline(config: KitConfig, decision: ModelCache) -> KitConfig:
    """The config whose nodes carry the decision in their environment. A value the user set in
    `env` wins (HF_HUB_OFFLINE: '0' keeps a node online whatever the cache holds)."""
    if not decision.offline:
        return config
    return config.replace(env={**decision.env, **config.env})
