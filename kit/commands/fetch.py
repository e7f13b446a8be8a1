"""`kit fetch [MODEL]`: download a model once, into the shared HF cache, check it is complete.

Plan, then act: the Hub's listing at one commit becomes a FetchPlan (kit/models/fetch.py: the files
vLLM loads), --dry-run prints it; otherwise kit/models/hub.py moves the bytes and kit/models/fetch.py's
offline check must pass before the revision is recorded as complete.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from kit.cluster.resolve import load_settings
from kit.commands._options import cluster_overrides, config_options, json_option
from kit.commands._params import KitCommand, Number
from kit.config import KitConfig
from kit.errors import ConfigError, VerifyFailed
from kit.models import local
from kit.models.fetch import (
    SHA_RE,
    DiskLayout,
    FetchPlan,
    Manifest,
    check_repo_id,
    check_revision,
    check_snapshot,
    find_snapshot,
    parse_index,
    plan_fetch,
    read_manifest,
    survey,
    weight_index,
)
from kit.models.hub import Hub, NoSpace, Progress, endpoint_from_env, write_error
from kit.models.records import models_file, record_model
from kit.output import LiveLine, bar, emit, human_bytes, table
from kit.safe import files as safefile
from kit.safe import text as safetext

HELP = """Download a model once into the shared HF cache (or --local-dir) and check it is complete.

\b
MODEL is a Hub id (ORG/NAME; default: the config's model.id). kit fetch resolves --revision
(a branch or tag, default main) to its commit, downloads only what vLLM loads (config,
tokenizer, generation and processor configs, remote code, the weights index and exactly the
shards it names; *.bin only when there are no safetensors) into hf_cache/hub in
huggingface_hub's layout (snapshots/COMMIT), checks every file against the sizes the Hub
listed, and records the commit ($KIT_STATE_DIR/models.json; a manifest beside the snapshot
lets any node check it offline). An interrupted fetch continues where it stopped.
\b
HPC: run it on a login node (Hub access) into the hf_cache the compute nodes mount; there,
`kit fetch MODEL --check` checks the copy without the network.
The token comes only from hf_token_file (never HF_TOKEN or a stored login). HF_ENDPOINT
selects a mirror.
\b
Exit codes: 3 bad model id or revision, unknown model, gated without a (valid) token, no
space left; 7 the copy is incomplete (--check, or after the download); 8 the Hub is
unreachable or failed; 130 interrupted (run it again to resume).
"""


@click.command(name="fetch", help=HELP, cls=KitCommand)
@click.argument("model", required=False)
@click.option("--revision", default="main", show_default=True, help="Branch, tag or commit to fetch.")
@click.option(
    "--local-dir",
    type=click.Path(file_okay=False),
    help="Download into this folder instead of the HF cache (vLLM then loads the folder's path).",
)
@click.option("--dry-run", is_flag=True, help="Print the files and sizes it would fetch; download nothing.")
@click.option("--check", "check_only", is_flag=True, help="Only check the local copy (offline); exit 7 if incomplete.")
@click.option("--workers", type=click.IntRange(1, 64), default=8, show_default=True, help="Files downloaded at once.")
@click.option(
    "--timeout",
    type=Number(1, 7 * 86400),
    default=600,
    show_default=True,
    help="Seconds one request to the Hub may take; a file that takes longer continues with the next request.",
)
@config_options
@json_option
def command(
    model: str | None,
    revision: str,
    local_dir: str | None,
    dry_run: bool,
    check_only: bool,
    workers: int,
    timeout: float,
    config_path: str | None,
    cluster: str | None,
    set_values: tuple[str, ...],
    as_json: bool,
) -> None:
    resolved = load_settings(config_path, cluster_overrides(cluster, set_values))  # never planned (issue 25)
    config = resolved.config
    repo = (
        check_repo_id(model, source="argument MODEL")
        if model
        else check_repo_id(config.model.id, source=resolved.sources.get("model.id", "config model.id"))
    )
    check_revision(revision)
    hub_dir = Path(config.hf_cache) / "hub"
    target = Path(os.path.abspath(os.path.expanduser(local_dir))) if local_dir else None
    if check_only:
        emit(Checked(repo, revision, check_local(hub_dir, repo, revision, target)), as_json=as_json)
        return
    hub = Hub(endpoint_from_env(), read_token(config, resolved.sources), timeout=min(timeout, 60.0), transfer_s=timeout)

    def layout_for(sha: str) -> DiskLayout:
        return DiskLayout.folder(target, repo, sha) if target else DiskLayout.cache(hub_dir, repo, sha)

    result = fetch_model(hub, repo, revision, layout_for, dry_run=dry_run, workers=workers, as_json=as_json)
    emit(Fetched(result, dry_run=dry_run), as_json=as_json)


@dataclass(frozen=True)
class Checked:
    """`kit fetch --check`: the offline completeness check of REPO@REVISION (its document)."""

    repo: str
    revision: str
    doc: dict[str, Any]  # the check's report, its summary and the snapshot's path
    command = "fetch"

    def to_dict(self) -> dict[str, Any]:
        return self.doc

    def text(self) -> str:
        return f"{self.repo}@{self.revision}: {self.doc['summary']}\n  {self.doc['path']}"


@dataclass(frozen=True)
class Fetched:
    """`kit fetch`: what was fetched (or, with --dry-run, what would be), fetch_model's document."""

    doc: dict[str, Any]
    dry_run: bool = False
    command = "fetch"

    def to_dict(self) -> dict[str, Any]:
        return self.doc

    def text(self) -> str:
        return render_dry_run(self.doc) if self.dry_run else render(self.doc)


def read_token(config: KitConfig, sources: Mapping[str, str]) -> str | None:
    """The token in hf_token_file (one word), or None without the key. Never logged: redacted
    from everything kit prints from then on."""
    if not config.hf_token_file:
        return None
    return local.read_token(config.hf_token_file, sources.get("hf_token_file"))


def fetch_model(
    hub: Hub,
    repo: str,
    revision: str,
    layout_for: Callable[[str], DiskLayout],
    *,
    dry_run: bool = False,
    workers: int = 8,
    as_json: bool = False,
) -> dict[str, Any]:
    started = time.monotonic()
    listing = hub.listing(repo, revision)
    names = [f.path for f in listing.files]
    if names:  # one HEAD first: a gated repo fails here, before anything is written
        hub.check_access(repo, listing.sha, "config.json" if "config.json" in names else names[0])
    index = weight_index(listing)
    shards = None
    if index is not None:
        shards = parse_index(hub.read_text(repo, listing.sha, index), source=f"{hub.endpoint}/{repo}/{index}")
    plan = plan_fetch(listing, shards)
    layout = layout_for(plan.sha)
    previous = _previous_manifest(layout) if layout.local else None
    on_disk = survey(plan, layout, previous)
    need = on_disk.to_fetch(plan)
    free = free_bytes(layout.root)
    if dry_run:
        return {
            **_summary(plan, layout),
            "to_fetch": need,
            "free": free,
            "fits": need <= free,
            "files": [
                {"path": f.path, "size": f.size, "state": _state(f.path, on_disk.done, on_disk.partial)}
                for f in plan.files
            ],
        }
    if need > free:
        raise NoSpace(
            f"{repo}@{plan.sha[:12]} needs {human_bytes(need)} more and {layout.root} has {human_bytes(free)} free",
            hint="free space or choose another hf_cache / --local-dir",
        )
    manifest = Manifest.of(plan, safetext.redact_url(hub.endpoint))
    _prepare(plan, layout, on_disk.done, manifest)
    record_model(repo, revision, sha=plan.sha, path=str(layout.snapshot), complete=False, bytes=plan.total)
    progress = Progress(total=plan.total, files=len(plan.files))
    line = LiveLine(as_json=as_json, every=5.0)
    t0 = time.monotonic()
    try:
        hub.fetch(
            plan,
            layout,
            progress,
            done=on_disk.done,
            workers=workers,
            on_tick=lambda: line.update(progress_line(repo, progress, time.monotonic() - t0)),
        )
    finally:
        line.done()
    seconds = time.monotonic() - t0
    report = check_snapshot(layout.snapshot, manifest)
    if not report.complete:
        raise VerifyFailed(
            f"{repo}@{plan.sha[:12]} is not complete after the download: {report.summary()}",
            details=report.details()[:20],
            hint="run kit fetch again",
        )
    _write_ref(layout, revision, plan.sha)
    record_model(repo, revision, sha=plan.sha, path=str(layout.snapshot), complete=True, bytes=plan.total)
    return {
        **_summary(plan, layout),
        "complete": True,
        "fetched_bytes": progress.fetched,
        "reused_bytes": plan.total - progress.fetched,
        "seconds": round(seconds, 3),
        "total_seconds": round(time.monotonic() - started, 3),
        "mb_per_s": round(progress.fetched / seconds / 1e6, 1) if seconds > 0 and progress.fetched else None,
        "manifest": str(layout.manifest),
        "record": str(models_file()),
        "check": report.summary(),
    }


def check_local(hub_dir: Path, repo: str, revision: str, local_dir: Path | None) -> dict[str, Any]:
    """--check: kit/models/fetch.py's offline completeness check; VerifyFailed (7) names what is wrong."""
    snap = local_dir if local_dir else find_snapshot(hub_dir, repo, revision)
    if snap is None or not snap.is_dir():
        raise VerifyFailed(
            f"{repo}@{revision} is not in {local_dir or hub_dir}",
            hint=f"run `kit fetch {repo}` where the Hub is reachable (a login node), into the hf_cache all nodes mount",
        )
    report = check_snapshot(snap)
    if not report.complete:
        raise VerifyFailed(
            f"{repo}@{revision} at {snap}: {report.summary()}",
            details=report.details()[:20],
            hint=f"run `kit fetch {repo}` again where the Hub is reachable; it continues partial files",
        )
    return {**report.to_dict(), "summary": report.summary()}


def free_bytes(path: Path) -> int:
    """Free bytes for an unprivileged user on the file system that holds (or will hold) path."""
    for candidate in (path, *path.parents):
        try:
            st = os.statvfs(candidate)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return 0


def _previous_manifest(layout: DiskLayout) -> Manifest | None:
    try:
        return read_manifest(layout.snapshot)
    except ConfigError:
        return None  # unreadable: trust nothing in the folder


def _prepare(plan: FetchPlan, layout: DiskLayout, done: frozenset[str], manifest: Manifest) -> None:
    """Before the first byte: in a local folder drop files that are not this commit's (so a
    partial fetch can never pass for complete), then write the manifest (atomically)."""
    try:
        if layout.local:
            for f in plan.files:
                if f.path not in done and layout.final(f).exists():
                    layout.final(f).unlink()
        path = layout.manifest
        safefile.make_dirs(path.parent, layout.root)
        safefile.write_atomic(path, safetext.to_json(manifest.to_dict()) + "\n")
    except OSError as err:
        raise write_error(err, layout.root, "the manifest") from None


def _write_ref(layout: DiskLayout, revision: str, sha: str) -> None:
    """refs/REVISION -> SHA, only now that the snapshot is complete: vLLM with HF_HUB_OFFLINE=1
    follows it, so it must never point at a partial snapshot."""
    ref = layout.ref(revision)
    if ref is None or SHA_RE.fullmatch(revision):
        return
    try:
        safefile.make_dirs(ref.parent, layout.root)
        safefile.write_atomic(ref, sha)
    except OSError as err:
        raise write_error(err, ref.parent, f"refs/{revision}") from None


def _state(path: str, done: frozenset[str], partial: Mapping[str, int]) -> str:
    if path in done:
        return "here"
    return f"partial {human_bytes(partial[path])}" if path in partial else "fetch"


def _summary(plan: FetchPlan, layout: DiskLayout) -> dict[str, Any]:
    return {
        "repo": plan.repo,
        "revision": plan.revision,
        "sha": plan.sha,
        "path": str(layout.snapshot),
        "index": plan.index,
        "file_count": len(plan.files),
        "bytes": plan.total,
        "skipped": list(plan.skipped),
    }


def progress_line(repo: str, p: Progress, elapsed: float) -> str:
    rate = p.fetched / elapsed / 1e6 if elapsed > 0 else 0.0
    return (
        f"{repo} {bar(p.done, p.total)} {human_bytes(p.done)}/{human_bytes(p.total)}"
        f"  {rate:.0f} MB/s  {p.files_done}/{p.files} files"
    )


def render(r: dict[str, Any]) -> str:
    fetched = (
        f"fetched {human_bytes(r['fetched_bytes'])} in {r['seconds']:.1f} s ({r['mb_per_s']} MB/s)"
        if r["fetched_bytes"]
        else "nothing to fetch"
    )
    return "\n".join(
        [
            f"{r['repo']}@{r['revision']} -> {r['sha']}",
            f"  {r['file_count']} files, {human_bytes(r['bytes'])}; {fetched}; "
            f"{human_bytes(r['reused_bytes'])} already here",
            f"  {r['check']}",
            f"  snapshot: {r['path']}",
            f"  recorded in {r['record']}",
        ]
    )


def render_dry_run(r: dict[str, Any]) -> str:
    rows = [(human_bytes(f["size"]), f["state"], f["path"]) for f in r["files"]]
    fits = "" if r["fits"] else "  NOT ENOUGH SPACE"
    return "\n".join(
        [
            f"{r['repo']}@{r['revision']} -> {r['sha']} (dry run: nothing downloaded)",
            table(["size", "state", "file"], rows),
            f"{r['file_count']} files, {human_bytes(r['bytes'])}; to fetch {human_bytes(r['to_fetch'])} "
            f"into {r['path']} ({human_bytes(r['free'])} free){fits}",
            f"left on the Hub: {len(r['skipped'])} files"
            + (
                f" ({', '.join(r['skipped'][:6])}" + (", ..." if len(r["skipped"]) > 6 else "") + ")"
                if r["skipped"]
                else ""
            ),
        ]
    )
