"""Checks across nodes: node count, Ray's view, GPU models, versions, HF snapshots, exposure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from kit.verify.checks import FAIL, PASS, WARN, Check
from kit.verify.facts import HfCacheFacts, NodeFacts, RayNode

if TYPE_CHECKING:
    from kit.plan.exposure import Exposure

# "packages": a fingerprint of every installed distribution (name==version), so a pip tree that
# differs anywhere is caught, not only in the packages named here.
VERSION_KEYS = ("python", "torch", "cuda", "nccl", "vllm", "ray", "kit_probe", "packages", "image_digest")


def check_cluster(
    nodes: Mapping[str, NodeFacts],
    *,
    expected_nodes: int | None = None,
    ray: Sequence[RayNode] | None = None,
    ray_error: str | None = None,
) -> list[Check]:
    """Every check across nodes, in the order the report lists them."""
    checks = [
        check_node_count(len(nodes), expected_nodes),
        check_ray_view(ray, ray_error, expected_nodes if expected_nodes is not None else len(nodes)),
        check_gpu_models(nodes),
    ]
    found = [c for c in checks if c is not None]
    found.extend(check_versions(nodes))
    if (snapshots := check_hf_snapshots(nodes)) is not None:
        found.append(snapshots)
    return found


def check_node_count(found: int, expected: int | None) -> Check | None:
    if expected is None or found == expected:
        return None
    return Check(
        "cluster.nodes",
        FAIL,
        f"{found} nodes found, the plan expects {expected}",
        "start the missing nodes (kit up) or fix --nodes",
    )


def check_ray_view(ray: Sequence[RayNode] | None, ray_error: str | None, want: int) -> Check | None:
    """Ray sees every planned node alive (None: no Ray view was read)."""
    if ray_error:
        return Check("cluster.ray", FAIL, ray_error, "is the head ready? see `kit logs --role head`")
    if ray is None:
        return None
    alive = sorted(str(r.ip) for r in ray if not r.lost and r.alive)
    if len(alive) < want:
        return Check(
            "cluster.ray",
            FAIL,
            f"Ray sees {len(alive)} alive node(s) ({', '.join(alive) or 'none'}), the plan expects {want}",
            "start the missing workers (kit up --worker) and see `kit status`",
        )
    return Check("cluster.ray", PASS, f"Ray sees {len(alive)} alive node(s): {', '.join(alive)}")


def check_gpu_models(nodes: Mapping[str, NodeFacts]) -> Check | None:
    models = {g.name for f in nodes.values() for g in f.gpus}
    if len(models) <= 1:
        return None
    return Check(
        "cluster.gpu_models",
        WARN,
        f"mixed GPU models: {', '.join(sorted(models))}",
        "use one GPU model per replica",
    )


def version_table(nodes: Mapping[str, NodeFacts]) -> dict[str, dict[str, str | None]]:
    """key -> node -> value, for VERSION_KEYS plus the GPU driver."""
    return {key: {node: facts.versions.get(key) for node, facts in nodes.items()} for key in (*VERSION_KEYS, "driver")}


def package_differences(nodes: Mapping[str, NodeFacts], limit: int = 5) -> list[str]:
    """`six (a 1.17.0, b 1.16.0)` for each installed package whose version differs across nodes."""
    names = sorted({p for f in nodes.values() for p in f.packages})
    out = []
    for name in names:
        seen = {n: f.packages.get(name) for n, f in nodes.items()}
        if len(set(seen.values())) > 1:
            per_node = ", ".join(f"{n} {v or 'absent'}" for n, v in seen.items())
            out.append(f"{name} ({per_node})")
    return out[:limit] + ([f"and {len(out) - limit} more"] if len(out) > limit else [])


def check_versions(nodes: Mapping[str, NodeFacts]) -> list[Check]:
    """One failure per version that differs across nodes (the GPU driver: a warning)."""
    checks = []
    for key, values in version_table(nodes).items():
        if len(set(values.values())) > 1:
            status = WARN if key == "driver" else FAIL
            detail = ", ".join(f"{n}={v}" for n, v in values.items())
            if key == "packages" and (diff := package_differences(nodes)):
                detail = "; ".join(diff)
            checks.append(
                Check(
                    f"versions.{key}",
                    status,
                    f"{key} differs: {detail}",
                    "run the same image digest on every node (kit pull)",
                )
            )
    if not checks:
        checks.append(Check("versions", PASS, f"identical on {len(nodes)} node(s)"))
    return checks


def _gb(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e9:.2f} GB" if n >= 10**8 else f"{n} bytes"


def _rev(rev: str | None) -> str:
    return rev[:12] if rev else "no ref"


def _holds(name: str, f: HfCacheFacts) -> str:
    """What one node holds: `head: revision abc123456789, 12 files, 1.23 GB`."""
    return f"{name}: revision {_rev(f.revision)}, {f.files} files, {_gb(f.total_bytes)}"


def _incomplete(name: str, f: HfCacheFacts) -> str | None:
    """`worker-1: model-00002.safetensors is 1000 of 5000 bytes` (the first problem), or None."""
    if f.mismatched:
        m = f.mismatched[0]
        more = f" (and {len(f.mismatched) - 1} more)" if len(f.mismatched) > 1 else ""
        return f"{name}: {m.path} is {m.actual} of {m.expected} bytes{more}"
    if f.missing:
        more = f" (and {len(f.missing) - 1} more)" if len(f.missing) > 1 else ""
        return f"{name}: {f.missing[0]} is missing{more}"
    return None


def _size_differences(nodes: Mapping[str, HfCacheFacts], limit: int = 3) -> list[str]:
    """`worker-1: model.safetensors 1000 bytes, head 5000` for files whose size differs."""
    ref_name, ref = next(iter(nodes.items()))
    out = []
    for name, facts in list(nodes.items())[1:]:
        for path in sorted(set(ref.sizes) | set(facts.sizes)):
            mine, theirs = facts.sizes.get(path), ref.sizes.get(path)
            if mine != theirs:
                have = "absent" if mine is None else f"{mine} bytes"
                out.append(f"{name}: {path} {have}, {ref_name} {'absent' if theirs is None else theirs}")
    return out[:limit] + ([f"and {len(out) - limit} more"] if len(out) > limit else [])


def check_hf_snapshots(nodes: Mapping[str, NodeFacts]) -> Check | None:
    """The model's files on every node (issue 19): present, complete (kit fetch's manifest sizes
    or the weights index), the same revision and the same sizes everywhere. None: no model asked
    for."""
    model = next((f.hf_cache.model for f in nodes.values() if f.hf_cache.model), None)
    if model is None:
        return None
    caches = {n: f.hf_cache for n, f in nodes.items()}
    fetch = f"kit fetch {model}" if not model.startswith("/") else "copy the same folder to every node"
    missing = [n for n, c in caches.items() if not c.fingerprint]
    if missing and len(missing) == len(caches):
        return Check(
            "cluster.hf_snapshot",
            WARN,
            f"{model} is in the HF cache of no node: every node downloads it at start",
            f"download it once into the shared HF cache: {fetch}",
        )
    if missing:
        return Check(
            "cluster.hf_snapshot",
            FAIL,
            f"{model} not in the HF cache on {', '.join(missing)}; "
            + "; ".join(_holds(n, c) for n, c in caches.items() if c.fingerprint),
            f"mount the same HF cache on every node, or {fetch} where it is missing",
        )
    broken = [(n, line) for n, c in caches.items() if c.complete is False and (line := _incomplete(n, c))]
    if broken:
        return Check(
            "cluster.hf_snapshot",
            FAIL,
            f"{model} incomplete on {', '.join(n for n, _ in broken)}: " + "; ".join(line for _, line in broken),
            f"{fetch} again on a host that mounts that node's HF cache (it resumes and checks sizes)",
        )
    holds = "; ".join(_holds(n, c) for n, c in caches.items())
    if len({c.revision for c in caches.values()}) > 1:
        return Check(
            "cluster.hf_snapshot",
            FAIL,
            f"{model} revision differs across nodes: {holds}",
            f"mount one shared HF cache, or {fetch} the same revision on every node",
        )
    if len({c.fingerprint for c in caches.values()}) > 1:
        diff = _size_differences(caches)
        return Check(
            "cluster.hf_snapshot",
            FAIL,
            f"{model} files differ across nodes at the same revision: " + ("; ".join(diff) if diff else holds),
            f"mount one shared HF cache, or {fetch} again where the files differ",
        )
    first = next(iter(caches.values()))
    checked = " (sizes checked against kit fetch's manifest)" if all(c.manifest for c in caches.values()) else ""
    return Check(
        "cluster.hf_snapshot",
        PASS,
        f"{model} identical on {len(caches)} node(s): revision {_rev(first.revision)}, {first.files} files, "
        f"{_gb(first.total_bytes)}{checked}",
    )


def model_files(nodes: Mapping[str, NodeFacts]) -> dict[str, dict[str, object]] | None:
    """`kit verify --json`'s model_files: what each node holds of the model (None: no model)."""
    if not any(f.hf_cache.model for f in nodes.values()):
        return None
    return {n: f.hf_cache.to_dict() for n, f in nodes.items()}


def check_exposure(exposures: Sequence[Exposure]) -> list[Check]:
    """What the cluster leaves open to anyone who can reach it (kit.plan.exposure: the API without
    a key, Ray without token authentication): warnings, never failures."""
    return [Check(e.check, WARN, e.message, e.fix) for e in exposures]
