"""Checks across nodes: node count, Ray's view, GPU models, versions, HF snapshots, exposure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from kit.verify.checks import FAIL, PASS, WARN, Check
from kit.verify.facts import NodeFacts, RayNode

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


def check_hf_snapshots(nodes: Mapping[str, NodeFacts]) -> Check | None:
    """The model asked for is the same snapshot on every node (None: no model asked for)."""
    model = next((f.hf_cache.model for f in nodes.values() if f.hf_cache.model), None)
    if model is None:
        return None
    prints = {n: f.hf_cache.fingerprint for n, f in nodes.items()}
    missing = [n for n, p in prints.items() if not p]
    if missing and len(missing) == len(prints):
        return Check(
            "cluster.hf_snapshot",
            WARN,
            f"{model} is in the HF cache of no node: every node downloads it at start",
            "download it once into the shared HF cache (huggingface-cli download)",
        )
    if missing:
        return Check(
            "cluster.hf_snapshot",
            FAIL,
            f"{model} not in the HF cache on {', '.join(missing)}",
            "mount the same HF cache on every node",
        )
    if len(set(prints.values())) > 1:
        return Check(
            "cluster.hf_snapshot",
            FAIL,
            f"{model} snapshots differ across nodes",
            "mount one shared HF cache, or download the same revision everywhere",
        )
    return Check("cluster.hf_snapshot", PASS, f"{model} identical on all nodes")


def check_exposure(exposures: Sequence[Exposure]) -> list[Check]:
    """What the cluster leaves open to anyone who can reach it (kit.plan.exposure: the API without
    a key, Ray without token authentication): warnings, never failures."""
    return [Check(e.check, WARN, e.message, e.fix) for e in exposures]
