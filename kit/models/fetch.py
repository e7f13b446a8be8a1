"""The parts of `kit fetch` that need no network (issue 19): which files of a Hub repo vLLM
loads, where each one goes on disk, the manifest kit writes next to a fetched snapshot, and the
offline completeness check of a snapshot that later work (serving offline, `kit verify` across
nodes) calls.

The Hub itself is reached only through kit/models/hub.py; nothing here writes a file. The check reads
file sizes, the manifest and the checkpoint's index (through kit.safeload), never the weights.

Layout on disk, the same as huggingface_hub's cache so that vLLM inside the containers (HF_HOME
mounted, `HF_HUB_OFFLINE=1`) finds the model by its id:

    HF_CACHE/hub/models--ORG--NAME/blobs/BLOB                 file content (BLOB: LFS sha256 or git blob id)
    HF_CACHE/hub/models--ORG--NAME/blobs/BLOB.incomplete      a partial download; kit fetch resumes it
    HF_CACHE/hub/models--ORG--NAME/snapshots/SHA/PATH -> ../../blobs/BLOB
    HF_CACHE/hub/models--ORG--NAME/refs/REVISION              SHA, written only once the snapshot is complete
    HF_CACHE/hub/models--ORG--NAME/kit/SHA.json               kit's manifest: every file and its size at SHA

With --local-dir the files land under the folder itself, partial files and the manifest under
its `.cache/kit/` (beside huggingface_hub's own `.cache/huggingface/`).
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit.errors import ConfigError, KitError, VerifyFailed
from kit.safeload import load_json_file, loads_json, read_text

MANIFEST_FORMAT = 1
SHA_RE = re.compile(r"^[0-9a-f]{40}\Z")
# huggingface_hub's repo id rule: optional namespace, [\w.-] names, no '--' or '..', at most 96 characters.
_REPO_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
REPO_ID_RE = re.compile(rf"^(?:{_REPO_PART}/)?{_REPO_PART}$")
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}\Z")

# Files of a repo's root that vLLM (config, tokenizer, processor, generation defaults, remote code)
# reads besides the weights. Exact names, then patterns; everything else is left on the Hub.
METADATA_NAMES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "spiece.model",
        "params.json",  # Mistral-format checkpoints (--load-format mistral)
        "tekken.json",
        "hf_quant_config.json",  # ModelOpt; read by vLLM and kit plan
        "quantize_config.json",  # old-style GPTQ
        "quant_config.json",
    }
)
METADATA_PATTERNS = (
    "tokenizer*",  # tokenizer.json, tokenizer_config.json, tokenizer.model(.v3), tokenizer.tiktoken
    "*.tiktoken",
    "chat_template*",  # chat_template.json / .jinja
    "*processor_config.json",  # preprocessor_config.json, processor_config.json, video_preprocessor_config.json
    "sentencepiece*.model",
    "*.py",  # trust_remote_code models need their code offline too
)
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
# *.bin files at a repo's root that are not weights.
NOT_WEIGHTS_BIN = ("training_args.bin", "optimizer.bin", "scheduler.bin", "rng_state*.bin")


@dataclass(frozen=True)
class RemoteFile:
    """A file of the repo at one commit, as the Hub listed it."""

    path: str
    size: int
    blob: str  # the cache's blob name: the LFS sha256, else the git blob id (huggingface_hub's ETag)


@dataclass(frozen=True)
class RepoListing:
    repo: str
    revision: str  # as asked: a branch, a tag or a commit
    sha: str  # the commit it resolved to
    files: tuple[RemoteFile, ...]


@dataclass(frozen=True)
class FetchPlan:
    """What `kit fetch` downloads: the files vLLM loads at one commit (weights last, biggest last)."""

    repo: str
    revision: str
    sha: str
    files: tuple[RemoteFile, ...]
    index: str | None  # the weights index file, when the checkpoint is sharded
    shards: tuple[str, ...]  # the weight files
    skipped: tuple[str, ...]  # repo files left on the Hub

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)


# --------------------------------------------------------------------------- input checks


def check_repo_id(repo: str, *, source: str = "argument MODEL") -> str:
    if not REPO_ID_RE.fullmatch(repo) or "--" in repo or ".." in repo:
        raise ConfigError(
            f"{repo!r} is not a Hub model id",
            source=source,
            hint="use ORG/NAME as on the model's page, e.g. Qwen/Qwen2.5-7B-Instruct",
        )
    return repo


def check_revision(revision: str) -> str:
    bad = not REVISION_RE.fullmatch(revision) or ".." in revision or "//" in revision or revision.endswith("/")
    if bad:
        raise ConfigError(
            f"{revision!r} is not a branch, tag or commit",
            source="flag --revision",
            hint="pass a branch (main), a tag (v1.0) or a 40-character commit sha",
        )
    return revision


def safe_relpath(path: str) -> bool:
    """A repo path that stays inside the target folder: relative, no '..', no backslash or control
    character (the Hub's listing is input like any other)."""
    if not path or path.startswith("/") or "\\" in path or any(ord(c) < 32 or ord(c) == 127 for c in path):
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


# --------------------------------------------------------------------------- selection


def _root(paths: Iterable[str]) -> list[str]:
    return [p for p in paths if "/" not in p]


def is_metadata(name: str) -> bool:
    return "/" not in name and (name in METADATA_NAMES or any(fnmatch.fnmatch(name, p) for p in METADATA_PATTERNS))


def weight_index(listing: RepoListing) -> str | None:
    """The index kit must read to know the shards: safetensors when the repo has any, else the
    .bin index (vLLM prefers safetensors and falls back to .bin only without them)."""
    root = set(_root(f.path for f in listing.files))
    if any(p.endswith(".safetensors") for p in root):
        return SAFETENSORS_INDEX if SAFETENSORS_INDEX in root else None
    return BIN_INDEX if BIN_INDEX in root else None


def index_shards(data: Any, *, source: str) -> tuple[str, ...]:
    """The weight files an index's `weight_map` names, in first-seen order."""
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ConfigError("has no weight_map", source=source, hint="the checkpoint's index is malformed")
    shards: dict[str, None] = {}
    for name in weight_map.values():
        if not isinstance(name, str) or not safe_relpath(name):
            raise ConfigError(f"names a bad shard {name!r}", source=source, hint="the checkpoint's index is malformed")
        shards[name] = None
    return tuple(shards)


def parse_index(text: str, *, source: str) -> tuple[str, ...]:
    return index_shards(loads_json(text, source=source), source=source)


def _weights_without_index(listing: RepoListing) -> list[str]:
    root = _root(f.path for f in listing.files)
    safetensors = [p for p in root if p.endswith(".safetensors")]
    if safetensors:
        if "config.json" not in root and "params.json" in root:  # a Mistral-format-only repo
            return [p for p in safetensors if p.startswith("consolidated")]
        # Repos shipping both formats keep the Mistral copy as consolidated*.safetensors: vLLM
        # loads the HF-format files, so fetching both would double the download.
        hf_format = [p for p in safetensors if not p.startswith("consolidated")]
        return hf_format or safetensors
    return [p for p in root if p.endswith(".bin") and not any(fnmatch.fnmatch(p, n) for n in NOT_WEIGHTS_BIN)]


def plan_fetch(listing: RepoListing, shards: Sequence[str] | None) -> FetchPlan:
    """The files vLLM loads from `listing`: config, tokenizer, generation and processor files,
    remote code, the weights index and exactly the shards it names (`shards`, read from the index
    by the caller), else the root's safetensors (or .bin files when there are none)."""
    by_path = {f.path: f for f in listing.files}
    index = weight_index(listing)
    if index is not None and shards is None:
        raise ValueError(f"plan_fetch needs the shards of {index}")
    weights = list(shards) if index is not None and shards is not None else _weights_without_index(listing)
    if not weights:
        raise ConfigError(
            f"{listing.repo}@{listing.sha[:12]} has no *.safetensors or *.bin weights at its root",
            source="argument MODEL",
            hint="kit fetch fetches checkpoints vLLM loads from a folder (GGUF-only repos are not supported)",
        )
    absent = [w for w in weights if w not in by_path]
    if absent:
        raise VerifyFailed(
            f"{index} of {listing.repo}@{listing.sha[:12]} names shards the repo does not have: "
            + ", ".join(absent[:5]),
            hint="the checkpoint on the Hub is broken at this revision: pick another --revision",
        )
    meta = [p for p in by_path if is_metadata(p) and p not in weights]
    if index is not None:
        meta.append(index)
    if "config.json" not in meta and "params.json" not in meta:
        raise ConfigError(
            f"{listing.repo}@{listing.sha[:12]} has no config.json",
            source="argument MODEL",
            hint="kit fetch fetches models vLLM can load (a config.json or params.json at the repo root)",
        )
    chosen = sorted(set(meta)) + sorted(set(weights), key=lambda p: (by_path[p].size, p))
    for path in chosen:
        if not safe_relpath(path):
            raise ConfigError(f"the Hub listed a bad path {path!r}", source=listing.repo, hint="report it to the repo")
    keep = set(chosen)
    return FetchPlan(
        repo=listing.repo,
        revision=listing.revision,
        sha=listing.sha,
        files=tuple(by_path[p] for p in chosen),
        index=index,
        shards=tuple(dict.fromkeys(weights)),
        skipped=tuple(sorted(p for p in by_path if p not in keep)),
    )


# --------------------------------------------------------------------------- layout


def repo_folder(repo: str) -> str:
    """huggingface_hub's folder name of a model repo in the hub cache."""
    return "models--" + repo.replace("/", "--")


@dataclass(frozen=True)
class DiskLayout:
    """Where one repo's files go: the HF hub cache (`cache_hub` = HF_CACHE/hub) or a plain folder."""

    root: Path  # the hub cache folder, or the local dir
    repo: str
    sha: str
    local: bool = False

    @classmethod
    def cache(cls, hub_dir: str | Path, repo: str, sha: str) -> DiskLayout:
        return cls(Path(hub_dir), repo, sha)

    @classmethod
    def folder(cls, local_dir: str | Path, repo: str, sha: str) -> DiskLayout:
        return cls(Path(local_dir), repo, sha, local=True)

    @property
    def repo_dir(self) -> Path:
        return self.root if self.local else self.root / repo_folder(self.repo)

    @property
    def snapshot(self) -> Path:
        """The folder vLLM loads: snapshots/SHA in the cache, the folder itself otherwise."""
        return self.root if self.local else self.repo_dir / "snapshots" / self.sha

    @property
    def manifest(self) -> Path:
        return manifest_path(self.snapshot)

    def final(self, f: RemoteFile) -> Path:
        return self.snapshot / f.path

    def store(self, f: RemoteFile) -> Path:
        """Where the complete content lives (a blob the snapshot links to, or the final file)."""
        return self.final(f) if self.local else self.repo_dir / "blobs" / f.blob

    def partial(self, f: RemoteFile) -> Path:
        if self.local:
            return self.root / ".cache" / "kit" / "download" / f"{f.blob}.incomplete"
        return self.repo_dir / "blobs" / f"{f.blob}.incomplete"

    def lock(self, f: RemoteFile) -> Path:
        """The lock huggingface_hub takes for the same blob, so the two never write it at once."""
        if self.local:
            return self.root / ".cache" / "kit" / "download" / f"{f.blob}.lock"
        return self.root / ".locks" / repo_folder(self.repo) / f"{f.blob}.lock"

    def ref(self, revision: str) -> Path | None:
        return None if self.local else self.repo_dir / "refs" / revision

    def link_target(self, f: RemoteFile) -> str:
        """The relative symlink target of a snapshot file (huggingface_hub's `../../blobs/BLOB`)."""
        return os.path.relpath(self.store(f), self.final(f).parent)


def manifest_path(snapshot: str | Path) -> Path:
    """kit's manifest of a snapshot: HF_CACHE/hub/models--X/kit/SHA.json for a cache snapshot,
    FOLDER/.cache/kit/manifest.json for a local folder."""
    snap = Path(snapshot)
    if snap.parent.name == "snapshots" and snap.parent.parent.name.startswith("models--"):
        return snap.parent.parent / "kit" / f"{snap.name}.json"
    return snap / ".cache" / "kit" / "manifest.json"


def find_snapshot(hub_dir: str | Path, repo: str, revision: str = "main") -> Path | None:
    """The cache snapshot of repo@revision: a commit's folder, the one refs/REVISION names (kit
    writes it only once complete; huggingface_hub and vLLM at start), else the one kit's latest
    manifest for that revision names (a fetch that has not finished: the check says what is
    missing). None when there is none."""
    repo_dir = Path(hub_dir) / repo_folder(repo)
    if SHA_RE.fullmatch(revision):
        return repo_dir / "snapshots" / revision
    ref = repo_dir / "refs" / revision
    if ref.is_file():
        try:  # bounded: a FIFO or a huge file planted in a shared cache is not read
            sha = read_text(ref, max_bytes=256, what="refs file").strip()
        except ConfigError:
            sha = ""
        if SHA_RE.fullmatch(sha):
            return repo_dir / "snapshots" / sha
    manifests = sorted((repo_dir / "kit").glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in manifests:
        try:
            manifest = Manifest.from_dict(load_json_file(path, what="kit manifest"), source=str(path))
        except KitError:
            continue
        if manifest.revision == revision:
            return repo_dir / "snapshots" / manifest.sha
    return None


# --------------------------------------------------------------------------- manifest


@dataclass(frozen=True)
class Manifest:
    """What kit fetched into a snapshot: written before the first byte so that a check of a
    partial snapshot can say what is missing, offline, on any node that mounts the cache."""

    repo: str
    revision: str
    sha: str
    endpoint: str
    files: tuple[RemoteFile, ...]
    index: str | None
    shards: tuple[str, ...]

    @classmethod
    def of(cls, plan: FetchPlan, endpoint: str) -> Manifest:
        return cls(plan.repo, plan.revision, plan.sha, endpoint, plan.files, plan.index, plan.shards)

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kit_manifest": MANIFEST_FORMAT,
            "repo": self.repo,
            "revision": self.revision,
            "sha": self.sha,
            "endpoint": self.endpoint,
            "index": self.index,
            "shards": list(self.shards),
            "total": self.total,
            "files": {f.path: {"size": f.size, "blob": f.blob} for f in self.files},
        }

    @classmethod
    def from_dict(cls, data: Any, *, source: str) -> Manifest:
        def bad(why: str) -> ConfigError:
            return ConfigError(f"not a kit manifest: {why}", source=source, hint="run kit fetch again to rewrite it")

        if not isinstance(data, dict) or data.get("kit_manifest") != MANIFEST_FORMAT:
            raise bad("unknown format")
        files_raw = data.get("files")
        if not isinstance(files_raw, dict):
            raise bad("no files")
        files = []
        for path, meta in files_raw.items():
            size = meta.get("size") if isinstance(meta, dict) else None
            blob = meta.get("blob") if isinstance(meta, dict) else None
            if not safe_relpath(path) or not isinstance(size, int) or size < 0 or not isinstance(blob, str):
                raise bad(f"bad entry {path!r}")
            files.append(RemoteFile(path, size, blob))
        strings = {k: data.get(k) for k in ("repo", "revision", "sha", "endpoint")}
        if not all(isinstance(v, str) for v in strings.values()):
            raise bad("repo, revision, sha and endpoint must be strings")
        index = data.get("index")
        shards = data.get("shards") or []
        if (index is not None and not isinstance(index, str)) or not all(isinstance(s, str) for s in shards):
            raise bad("bad index or shards")
        return cls(
            repo=str(strings["repo"]),
            revision=str(strings["revision"]),
            sha=str(strings["sha"]),
            endpoint=str(strings["endpoint"]),
            files=tuple(files),
            index=index,
            shards=tuple(shards),
        )


def read_manifest(snapshot: str | Path) -> Manifest | None:
    path = manifest_path(snapshot)
    if not path.is_file():
        return None
    return Manifest.from_dict(load_json_file(path, what="kit manifest"), source=str(path))


# --------------------------------------------------------------------------- the check


@dataclass(frozen=True)
class Mismatch:
    path: str
    expected: int
    actual: int


@dataclass(frozen=True)
class SnapshotReport:
    """The completeness of one snapshot (`check_snapshot`). JSON-able through to_dict().

    `complete` means: every file kit's manifest lists is present with the size the Hub listed
    (`sizes_checked`), every shard the checkpoint's index names is present, and there is a
    config. Without a manifest (a snapshot another tool downloaded) sizes cannot be checked: the
    index and config checks still run and `sizes_checked` is False.
    """

    path: str
    repo: str | None
    revision: str | None
    sha: str | None
    sizes_checked: bool
    files: tuple[tuple[str, int | None, int | None], ...]  # (path, expected size, size on disk or None)
    index: str | None
    missing: tuple[str, ...]
    mismatched: tuple[Mismatch, ...]
    problems: tuple[str, ...] = field(default=())  # what else is wrong (no config, unreadable index, ...)

    @property
    def total(self) -> int:
        return sum(exp or 0 for _, exp, _ in self.files)

    @property
    def present_bytes(self) -> int:
        return sum(act or 0 for _, exp, act in self.files if act is not None and (exp is None or act == exp))

    @property
    def complete(self) -> bool:
        return not self.missing and not self.mismatched and not self.problems

    def summary(self) -> str:
        """One line: what is wrong, or that nothing is."""
        if self.complete:
            checked = "sizes as the Hub listed" if self.sizes_checked else "sizes unchecked (no kit manifest)"
            return f"complete: {len(self.files)} files, {self.total} bytes, {checked}"
        parts = []
        if self.missing:
            parts.append(
                f"{len(self.missing)} missing ({', '.join(self.missing[:3])}{', ...' if len(self.missing) > 3 else ''})"
            )
        if self.mismatched:
            m = self.mismatched[0]
            more = f" and {len(self.mismatched) - 1} more" if len(self.mismatched) > 1 else ""
            parts.append(f"{len(self.mismatched)} of the wrong size ({m.path}: {m.actual} of {m.expected} bytes{more})")
        parts.extend(self.problems)
        return "incomplete: " + "; ".join(parts)

    def details(self) -> list[str]:
        lines = [f"missing: {p}" for p in self.missing]
        lines += [f"wrong size: {m.path} is {m.actual} bytes, the Hub listed {m.expected}" for m in self.mismatched]
        return lines + list(self.problems)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "repo": self.repo,
            "revision": self.revision,
            "sha": self.sha,
            "complete": self.complete,
            "sizes_checked": self.sizes_checked,
            "index": self.index,
            "files": [{"path": p, "size": exp, "on_disk": act} for p, exp, act in self.files],
            "total": self.total,
            "present_bytes": self.present_bytes,
            "missing": list(self.missing),
            "mismatched": [{"path": m.path, "expected": m.expected, "actual": m.actual} for m in self.mismatched],
            "problems": list(self.problems),
        }


def _size_on_disk(path: Path) -> int | None:
    """The size of a regular file (through a snapshot's symlink), None when absent or dangling."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def check_snapshot(path: str | Path, manifest: Manifest | None = None) -> SnapshotReport:
    """Is the snapshot at `path` complete? Offline: file sizes against kit's manifest (read from
    beside the snapshot unless given), the shards of the checkpoint's index present, a config
    present. Reads no weights, writes nothing."""
    snap = Path(path)
    problems: list[str] = []
    if manifest is None:
        try:
            manifest = read_manifest(snap)
        except ConfigError as err:
            problems.append(err.message)
    expected: dict[str, int | None] = {f.path: f.size for f in manifest.files} if manifest else {}
    index = manifest.index if manifest else None
    if index is None and not manifest:
        index = next((n for n in (SAFETENSORS_INDEX, BIN_INDEX) if (snap / n).exists()), None)
    if index is not None and _size_on_disk(snap / index) is not None:
        try:
            shards = index_shards(load_json_file(snap / index, what="weights index"), source=str(snap / index))
        except ConfigError as err:
            shards = manifest.shards if manifest else ()
            problems.append(f"{index}: {err.message}")
        for shard in shards:
            expected.setdefault(shard, None)
    elif index is not None:
        expected.setdefault(index, None)
    if not manifest and index is None:
        for name in sorted(os.listdir(snap)) if snap.is_dir() else ():
            if name.endswith((".safetensors", ".bin")):
                expected.setdefault(name, None)
    if "config.json" not in expected and "params.json" not in expected:
        expected["config.json"] = None
    rows = []
    missing: list[str] = []
    mismatched: list[Mismatch] = []
    for name in sorted(expected):
        size = expected[name]
        actual = _size_on_disk(snap / name)
        rows.append((name, size, actual))
        if actual is None:
            missing.append(name)
        elif size is not None and actual != size:
            mismatched.append(Mismatch(name, size, actual))
    if not snap.is_dir():
        problems.insert(0, f"{snap} does not exist")
    return SnapshotReport(
        path=str(snap),
        repo=manifest.repo if manifest else None,
        revision=manifest.revision if manifest else None,
        sha=manifest.sha if manifest else (snap.name if SHA_RE.fullmatch(snap.name) else None),
        sizes_checked=manifest is not None,
        files=tuple(rows),
        index=index,
        missing=tuple(missing),
        mismatched=tuple(mismatched),
        problems=tuple(problems),
    )


def check_model(hub_dir: str | Path, repo: str, revision: str = "main") -> SnapshotReport | None:
    """check_snapshot of repo@revision in the HF hub cache; None when no snapshot of it is there."""
    snap = find_snapshot(hub_dir, repo, revision)
    return None if snap is None else check_snapshot(snap)


# --------------------------------------------------------------------------- what is already here


@dataclass(frozen=True)
class OnDisk:
    done: frozenset[str]  # paths whose complete content is in place
    partial: Mapping[str, int]  # path -> bytes of its partial download

    def to_fetch(self, plan: FetchPlan) -> int:
        return sum(f.size - min(self.partial.get(f.path, 0), f.size) for f in plan.files if f.path not in self.done)


def survey(plan: FetchPlan, layout: DiskLayout, previous: Manifest | None = None) -> OnDisk:
    """What of the plan is already on disk. In the cache a blob is named by its content hash, so
    the right size means the right file; in a local folder a file counts only when the previous
    manifest there recorded the same blob for it."""
    done: set[str] = set()
    partial: dict[str, int] = {}
    before = {f.path: f.blob for f in previous.files} if previous else {}
    for f in plan.files:
        if _size_on_disk(layout.store(f)) == f.size and (not layout.local or before.get(f.path) == f.blob):
            done.add(f.path)
            continue
        size = _size_on_disk(layout.partial(f))
        if size:
            partial[f.path] = min(size, f.size)
    return OnDisk(frozenset(done), partial)
