"""Verification results: one data object, its text tables and JUnit XML. Pure."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kit.errors import VerifyFailed
from kit.output import table
from kit.verify.checks import FAIL, PASS, WARN, Check, overall
from kit.verify.checks.cluster import model_files
from kit.verify.facts import nodes_from_probe
from kit.verify.nccl import TransportSummary
from kit.verify.policy import version_table


@dataclass
class VerifyResult:
    mode: str  # "host" | "cluster" | "image"
    checks: list[Check]
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    collective: dict[str, Any] | None = None
    transport: TransportSummary | None = None
    expect: str = "auto"
    wall_s: float = 0.0
    target: str | None = None  # image reference in image mode
    ray: list[dict[str, Any]] | None = None  # the head's Ray view (cluster mode, Ray backend)
    command = "verify"

    @property
    def status(self) -> str:
        return overall(self.checks)

    def text(self) -> str:
        return render_text(self)

    @property
    def latency(self) -> dict[str, Any] | None:
        """The all-reduce's decode latency (issue 30), if the probe measured it."""
        per = (self.collective or {}).get("collectives") or {}
        found = (per.get("all-reduce") or {}).get("latency")
        return dict(found) if isinstance(found, Mapping) else None

    def to_dict(self, *, nccl_lines: bool = True) -> dict[str, Any]:
        collective = dict(self.collective) if self.collective else None
        if collective is not None and not nccl_lines:
            collective.pop("nccl_lines", None)
        return {
            "mode": self.mode,
            "target": self.target,
            "status": self.status,
            "expect": self.expect,
            "checks": [c.to_dict() for c in self.checks],
            "versions": version_table(self.nodes) if self.nodes else {},
            "transport": self.transport.to_dict() if self.transport else None,
            "bandwidth": (self.collective or {}).get("results", []),
            "latency": self.latency,
            "model_files": model_files(nodes_from_probe(self.nodes)) if self.nodes else None,
            "nodes": self.nodes,
            "collective": collective,
            "ray": self.ray,
            "wall_s": self.wall_s,
        }


class VerificationFailed(VerifyFailed):
    """VerifyFailed (exit 7) that carries the whole result into `--json` output."""

    def __init__(self, result: VerifyResult):
        failed = [c for c in result.checks if c.status == FAIL]
        first = failed[0] if failed else None
        super().__init__(
            f"verification failed: {len(failed)} check(s) failed" + (f"; first: {first.reason}" if first else ""),
            hint=first.fix if first else None,
            details=[f"{c.name}{' @' + c.node if c.node else ''}: {c.reason}" for c in failed],
        )
        self.result = result

    def to_dict(self) -> dict[str, object]:
        data = super().to_dict()
        data["result"] = self.result.to_dict()
        return data


def raise_if_failed(result: VerifyResult) -> None:
    if result.status == FAIL:
        raise VerificationFailed(result)


_MARK = {PASS: "ok", WARN: "WARN", FAIL: "FAIL"}


def render_checks(checks: Sequence[Check]) -> str:
    rows = [(c.node or "(cluster)", c.name, _MARK[c.status], c.reason) for c in checks]
    return table(["node", "check", "result", "reason"], rows)


def render_versions(nodes: Mapping[str, Mapping[str, Any]]) -> str:
    names = list(nodes)
    rows = [[key, *[values.get(n) or "-" for n in names]] for key, values in version_table(nodes).items()]
    return table(["version", *names], rows)


def render_bandwidth(results: Sequence[Mapping[str, Any]]) -> str:
    rows = [(_size(r["bytes"]), r["iters"], r["time_us"], r["algbw_gbps"], r["busbw_gbps"]) for r in results]
    return table(["size", "iters", "time (us)", "algbw (GB/s)", "busbw (GB/s)"], rows)


# How each latency method times (kit/verify/latency.py), as the text output names it.
LATENCY_HOW = {
    "nccl-graph": "NCCL called directly (libnccl{nccl} via ctypes), {ops} all-reduces per CUDA graph, "
    "replayed, timed with CUDA events",
    "nccl-eager": "NCCL called directly (libnccl{nccl} via ctypes), launched back to back, timed with CUDA events",
    "torch-graph": "torch.distributed, {ops} all-reduces per CUDA graph, replayed, timed with CUDA events",
    "torch-eager": "torch.distributed launched back to back (launch overhead included), timed with CUDA events",
    "gloo-eager": "Gloo on CPU, back to back, wall clock (CUDA graphs need GPUs)",
}


def render_latency(latency: Mapping[str, Any], world: object) -> list[str]:
    """The decode-latency table (issue 30): per size, out-of-place and in-place microseconds."""
    title = f"All-reduce latency at decode sizes ({world} ranks, {latency.get('dtype') or '?'})"
    method, results = latency.get("method"), latency.get("results") or []
    if not method or not results:
        why = latency.get("error") or latency.get("fallback_reason") or "no result"
        return [title, f"  not measured: {why}", ""]
    nccl = f" {latency['nccl']}" if latency.get("nccl") else ""
    how = LATENCY_HOW.get(str(method), str(method)).format(nccl=nccl, ops=latency.get("graph_ops"))
    lines = [f"{title}, {method}: {how}"]
    if latency.get("fallback_reason"):
        lines.append(f"  auto passed over: {latency['fallback_reason']}")
    if latency.get("correct") is False:
        lines.append("  WRONG SUM: this all-reduce did not add up on every rank")
    oop = any(r.get("out_of_place_us") is not None for r in results)
    rows = [(_size(r["bytes"]), *([r.get("out_of_place_us")] if oop else []), r.get("in_place_us")) for r in results]
    header = ["size", *(["out-of-place (us)"] if oop else []), "in-place (us)"]
    return [*lines, table(header, rows), ""]


def render_text(result: VerifyResult) -> str:
    parts = []
    if result.nodes:
        parts += ["Versions", render_versions(result.nodes), ""]
    t = result.transport
    if t is not None and (t.intra or t.inter or t.version):
        links = f"intra-node {_counts(t.intra)}; inter-node {_counts(t.inter)}"
        what = "Gloo (TCP, no NCCL)" if t.backend == "gloo" else f"NCCL {t.version or '?'}"
        parts += [f"{what}: {links}", ""]
    if result.ray:
        rows = [
            (r.get("ip"), "LOST" if r.get("lost") else "yes", r.get("vllm_host_ip") or "-", f"{r.get('gpus', 0):g}")
            for r in result.ray
        ]
        parts += ["Ray (head's view)", table(["registered ip", "alive", "VLLM_HOST_IP", "GPU"], rows), ""]
    coll = result.collective or {}
    per = coll.get("collectives") or ({"all-reduce": {"results": coll["results"]}} if coll.get("results") else {})
    for name, c in per.items():
        if not c.get("results"):
            continue
        title = "All-reduce" if name == "all-reduce" else "All-to-all"
        how = f", {c['method']}" if c.get("method") and c.get("method") != "all_to_all_single" else ""
        how += f", {c['placement']}" if c.get("placement") else ""
        parts += [
            f"{title} bandwidth ({coll.get('world_size')} ranks, {coll.get('backend')}{how})",
            render_bandwidth(c["results"]),
            "",
        ]
        if c.get("latency"):
            parts += render_latency(c["latency"], coll.get("world_size"))
    parts += ["Checks", render_checks(result.checks), ""]
    fixes = [c for c in result.checks if c.status != PASS and c.fix]
    for c in fixes:
        parts.append(f"  {_MARK[c.status]} {c.name}: fix: {c.fix}")
    parts.append(f"verify ({result.mode}, expect {result.expect}): {result.status.upper()} in {result.wall_s:.1f}s")
    return "\n".join(parts)


def junit_xml(result: VerifyResult) -> str:
    """One <testsuite>, one <testcase> per check; fail -> <failure>, warn -> <system-out>."""
    failures = sum(c.status == FAIL for c in result.checks)
    suite = ET.Element(
        "testsuite",
        {
            "name": f"kit verify {result.mode}" + (f" {result.target}" if result.target else ""),
            "tests": str(len(result.checks)),
            "failures": str(failures),
            "errors": "0",
            "time": f"{result.wall_s:.3f}",
        },
    )
    for c in result.checks:
        case = ET.SubElement(
            suite,
            "testcase",
            {
                "classname": f"kit.verify.{result.mode}" + (f".{c.node}" if c.node else ""),
                "name": c.name,
            },
        )
        if c.status == FAIL:
            failure = ET.SubElement(case, "failure", {"message": c.reason})
            failure.text = f"fix: {c.fix}" if c.fix else c.reason
        elif c.status == WARN:
            out = ET.SubElement(case, "system-out")
            out.text = f"WARN: {c.reason}" + (f" (fix: {c.fix})" if c.fix else "")
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in counts.items()) or "none"


def _size(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):g} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):g} MiB"
    return f"{n / 1024:g} KiB"
