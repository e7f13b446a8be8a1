"""The vLLM release kit renders for, and the multi-node options that changed between releases.

One table, read by kit.plan.vllm (the `vllm serve` argv), kit.plan.node (the node's environment)
and kit.plan.checks (refusals at config time). Pure: no I/O; kit.cluster.resolve supplies the
version kit recorded when it pulled or built the image (kit.state), everything else is here.

How kit learns the version (first that answers):
  1. `vllm_version: X.Y.Z` in the config (an override: the image lies, or its tag says nothing);
  2. kit's image record (kit pull / kit build): the image's `kit.vllm-version` label where an
     image sets one, else the build argument that chose vLLM (VLLM_CPU_VERSION, VLLM_TAG of
     containers/*/Dockerfile), else the tag;
  3. the image reference's tag: vllm/vllm-openai:v0.11.0, kit/vllm-cpu:0.32.0 (or the name kit pull
     gives an image file: vllm_vllm-openai_v0.11.0.sif);
  4. else DEFAULT_VERSION, and the dry run says the version is unknown.

Sources for each row (vllm-project/vllm pull requests; the release is the first one cut after
the merge, from the GitHub release notes unless marked "not confirmed"). Rows marked "verified
0.32.0" were read from the vLLM 0.32.0 in kit's CPU image (vllm/engine/arg_utils.py,
vllm/config/parallel.py, vllm/entrypoints/cli/serve.py, `vllm serve --help=all`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

Version = tuple[int, int, int]

# The release kit's default GPU image carries (kit.config `image`), and what kit renders for
# when it cannot learn the image's version.
DEFAULT_VERSION: Version = (0, 33, 0)
# A label an image may carry to name its release. kit's own Dockerfiles do not set it: their
# Apptainer definitions are generated from them (containers/make-defs.py), which cannot carry a
# build argument's value into a label; kit build records the build argument instead.
VERSION_LABEL = "kit.vllm-version"
# Build arguments that pick the vLLM release in containers/*/Dockerfile (kit build records them).
VERSION_BUILD_ARGS = ("VLLM_CPU_VERSION", "VLLM_TAG")

# --all2all-backend: PR #26732 ("[UX] Replace VLLM_ALL2ALL_BACKEND with --all2all-backend",
# merged 2025-10, after v0.11.0 of 2025-10-02; vllm#27347 is 0.11.0 answering "unrecognized
# arguments: --all2all-backend"). Before it the backend was the VLLM_ALL2ALL_BACKEND variable.
ALL2ALL_FLAG_SINCE: Version = (0, 11, 1)
# The variable itself: PR #33535 removed it ("scheduled for removal in v0.15.0"); listed under
# "Deprecation & Breaking Changes" of v0.16.0. From the flag's release on kit uses the flag only.
ALL2ALL_ENV_REMOVED: Version = (0, 16, 0)
ALL2ALL_ENV = "VLLM_ALL2ALL_BACKEND"
# vLLM's default backend (verified 0.32.0: ParallelConfig.all2all_backend), the fix for a removed one.
ALL2ALL_DEFAULT = "allgather_reducescatter"


@dataclass(frozen=True)
class Backend:
    since: Version  # the first release kit vouches for
    removed: Version | None = None  # from this release on vLLM warns and falls back to the default
    note: str = ""


_V0_11_0: Version = (0, 11, 0)
_V0_32_0: Version = (0, 32, 0)

# The all-to-all backends for expert parallelism. `since` 0.11.0: the choices of
# VLLM_ALL2ALL_BACKEND in 0.11.0 (naive, pplx, deepep_*; allgather_reducescatter from PR #23964,
# 2025-08). `since` 0.32.0: present in 0.32.0's --all2all-backend choices (verified 0.32.0), first
# release not confirmed, so kit refuses them for older releases (conservative).
# pplx: PR #33724 (merged 2026-02-26); naive: PR #33728 ("Remove naive all2all. Use
# allgather_reducescatter instead", merged 2026-03). Both stay accepted choices and fall back to
# allgather_reducescatter with only a log line (verified 0.32.0, ParallelConfig.__post_init__):
# a silent slowdown, so kit refuses them. The first release without them is 0.17.0 or 0.18.0 (not
# confirmed): kit refuses from 0.18.0, where both merges are certainly in.
ALL2ALL_BACKENDS: Mapping[str, Backend] = {
    "allgather_reducescatter": Backend(_V0_11_0),
    "naive": Backend(_V0_11_0, removed=(0, 18, 0), note="PR #33728"),
    "pplx": Backend(_V0_11_0, removed=(0, 18, 0), note="PR #33724"),
    "deepep_high_throughput": Backend(_V0_11_0),
    "deepep_low_latency": Backend(_V0_11_0),
    "deepep_v2": Backend(_V0_32_0, note="PR #41183, in v0.24.0"),
    "flashinfer_all2allv": Backend(_V0_32_0, note="0.32.0: an alias of flashinfer_nvlink_two_sided"),
    "flashinfer_nvlink_one_sided": Backend(_V0_32_0),
    "flashinfer_nvlink_two_sided": Backend(_V0_32_0),
    "mori_high_throughput": Backend(_V0_32_0, note="MoRI EP: PR #28664, in v0.15.0"),
    "mori_low_latency": Backend(_V0_32_0),
    "moonep": Backend(_V0_32_0),
    "nixl_ep": Backend(_V0_32_0),
}

# --api-server-count: with it unset, vLLM >= 0.15.0 starts one API server per DP rank on the head
# (internal LB: data_parallel_size; hybrid LB: data_parallel_size_local): PR #32525 ("Default
# api_server_count to dp_size if not specified"), v0.15.0 "UX improvements". Before: 1. The flag
# itself predates 0.11.0 (API server scale-out, vLLM 0.9; not confirmed against 0.11.0's source).
# Verified 0.32.0: --headless with an --api-server-count above 0 is an error, so kit passes it
# only where an API server runs.
API_SERVERS_DP_DEFAULT_SINCE: Version = (0, 15, 0)

# Data-parallel load balancing. internal: one API endpoint (the head) balances over every rank
# (kit's default, every release). hybrid (--data-parallel-hybrid-lb): each node runs its own API
# server over its local ranks, an external balancer spreads over nodes: PR #21238 ("[DP] Internal
# Load Balancing Per Node", merged 2025-07, in v0.10.1). external (--data-parallel-external-lb):
# one server per DP rank behind your own balancer; verified 0.32.0, first release not confirmed.
# kit starts one `vllm serve` per node, so it offers internal and hybrid only.
DP_LB_SINCE: Mapping[str, Version] = {"internal": (0, 0, 0), "hybrid": (0, 10, 1), "external": _V0_32_0}
DP_LB_MODES = ("internal", "hybrid")

# GPU selection: PR #45026 ("Stop setting CUDA_VISIBLE_DEVICES internally in vLLM, add device_ids
# arg", merged 2026-06-20), v0.24.0 "Device selection change". From it kit passes --device-ids to
# the mp backend instead of setting CUDA_VISIBLE_DEVICES (verified 0.32.0: the ids are indices into
# the visible devices; the Ray executor ignores the flag, so Ray keeps CUDA_VISIBLE_DEVICES).
DEVICE_IDS_SINCE: Version = (0, 24, 0)

_VERSION_RE = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?:[.+-].*|rc\d+.*|post\d+.*)?")


def parse_version(text: str) -> Version | None:
    """'0.11.0', 'v0.33.0', '0.32.0+cpu', '0.11.1rc2' -> (major, minor, patch); else None."""
    match = _VERSION_RE.fullmatch(text.strip())
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def fmt(version: Version) -> str:
    return ".".join(str(part) for part in version)


# kit pull's image files keep the tag in their name: vllm_vllm-openai_v0.11.0.sif (.sqsh).
_FILE_RE = re.compile(r".*_v?(\d+\.\d+\.\d+)\.(?:sif|sqsh)")


def version_from_ref(ref: str) -> Version | None:
    """The release in an image reference's tag (vllm/vllm-openai:v0.11.0 -> 0.11.0) or in the name
    kit pull gives an image file (/images/vllm_vllm-openai_v0.11.0.sif); None for a tag that names
    no release (latest, test), a digest-only reference or another file."""
    if ref.endswith((".sif", ".sqsh")):
        match = _FILE_RE.fullmatch(ref.rsplit("/", 1)[-1])
        return parse_version(match[1]) if match else None
    name = ref.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        return None
    return parse_version(last.rsplit(":", 1)[1])


def recorded_version(ref: str, labels: Mapping[str, str], buildargs: Mapping[str, str]) -> tuple[str, str] | None:
    """(version, how it was learnt) for kit's image record at pull/build: the image's label, the
    build argument that chose vLLM, or the tag; None when none of them says."""
    if (found := parse_version(labels.get(VERSION_LABEL, ""))) is not None:
        return fmt(found), f"image label {VERSION_LABEL}"
    for arg in VERSION_BUILD_ARGS:
        if (found := parse_version(buildargs.get(arg, ""))) is not None:
            return fmt(found), f"build argument {arg}"
    found = version_from_ref(ref)
    return (fmt(found), "image tag") if found is not None else None


@dataclass(frozen=True)
class Target:
    """The vLLM release kit renders for and how it was learnt."""

    version: Version
    source: str
    known: bool = True

    def __str__(self) -> str:
        return fmt(self.version)


def target_version(config_value: str, image: str, recorded_from: str | None = None) -> Target:
    """`config_value`: the `vllm_version` key (auto, or a release kit.cluster.resolve filled in
    from the image record, then `recorded_from` says so)."""
    if config_value != "auto" and (found := parse_version(config_value)) is not None:
        return Target(found, recorded_from or "vllm_version")
    if (found := version_from_ref(image)) is not None:
        return Target(found, "image tag")
    return Target(DEFAULT_VERSION, "kit's default", known=False)


def unknown_warning(target: Target) -> str | None:
    if target.known:
        return None
    return (
        f"the image's vLLM version is unknown (no vllm_version, kit record or release tag): "
        f"rendering for kit's default vLLM {target}; set vllm_version: X.Y.Z if the image differs"
    )


# ---- what the table decides ---------------------------------------------------------------------


def all2all_by_flag(version: Version) -> bool:
    """True: --all2all-backend; False: the VLLM_ALL2ALL_BACKEND variable."""
    return version >= ALL2ALL_FLAG_SINCE


def all2all_problem(backend: str, version: Version) -> tuple[str, str] | None:
    """(message, fix) when `backend` is not a working choice of this release; None when it is."""
    entry = ALL2ALL_BACKENDS.get(backend)
    if entry is None:
        return f"{backend!r} is not an all-to-all backend kit knows", "use auto or one of " + ", ".join(
            ALL2ALL_BACKENDS
        )
    if entry.removed is not None and version >= entry.removed:
        return (
            f"vLLM {fmt(version)} removed the {backend!r} all-to-all backend and silently falls back to "
            f"{ALL2ALL_DEFAULT!r}",
            f"set model.all2all: {ALL2ALL_DEFAULT} (or auto), or a backend your cluster supports "
            "(deepep_high_throughput, deepep_low_latency)",
        )
    if version < entry.since:
        return (
            f"vLLM {fmt(version)} has no {backend!r} all-to-all backend (kit knows it from vLLM {fmt(entry.since)})",
            "choose a backend of that release (allgather_reducescatter, deepep_high_throughput, "
            "deepep_low_latency), or use a newer image",
        )
    return None


def api_servers_default(version: Version, dp: int, dp_local: int, dp_lb: str) -> int:
    """How many API servers vLLM starts on a node that serves the API when kit passes no
    --api-server-count."""
    if version < API_SERVERS_DP_DEFAULT_SINCE:
        return 1
    return max(1, dp_local if dp_lb == "hybrid" else dp)


def dp_lb_problem(mode: str, version: Version) -> tuple[str, str] | None:
    since = DP_LB_SINCE.get(mode)
    if since is not None and version < since:
        return (
            f"vLLM {fmt(version)} has no {mode} data-parallel load balancing (from vLLM {fmt(since)})",
            "use model.dp_lb: internal, or a newer image",
        )
    return None


def uses_device_ids(version: Version, backend: str) -> bool:
    """GPU selection by --device-ids (mp backend, vLLM >= 0.24.0) instead of CUDA_VISIBLE_DEVICES."""
    return backend == "mp" and version >= DEVICE_IDS_SINCE
