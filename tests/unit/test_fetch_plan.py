"""kit/models/fetch.py without a network: which repo files a fetch takes, the input checks, the layout,
the manifest, and the offline completeness check on snapshots made by hand."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kit.errors import ConfigError, VerifyFailed
from kit.models.fetch import (
    DiskLayout,
    Manifest,
    RemoteFile,
    RepoListing,
    check_model,
    check_repo_id,
    check_revision,
    check_snapshot,
    find_snapshot,
    manifest_path,
    parse_index,
    plan_fetch,
    safe_relpath,
    survey,
    weight_index,
)

SHA = "a" * 40


def listing(*paths: str, sizes: dict[str, int] | None = None) -> RepoListing:
    sizes = sizes or {}
    files = tuple(RemoteFile(p, sizes.get(p, 10 + i), f"blob{i}") for i, p in enumerate(paths))
    return RepoListing("org/m", "main", SHA, files)


SHARDED = listing(
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "modeling_custom.py",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "consolidated.safetensors",
    "params.json",
    "pytorch_model.bin",
    "README.md",
    ".gitattributes",
    "original/consolidated.00.pth",
    "original/tokenizer.model",
    "onnx/model.onnx",
    "m.Q4_K_M.gguf",
)


def test_sharded_checkpoint_takes_what_vllm_loads_and_exactly_the_indexed_shards() -> None:
    assert weight_index(SHARDED) == "model.safetensors.index.json"
    plan = plan_fetch(SHARDED, ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"))
    paths = [f.path for f in plan.files]
    assert set(paths) == {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "preprocessor_config.json",
        "modeling_custom.py",
        "params.json",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    }
    # the Mistral-format copy, the .bin duplicate, sub-folders, GGUF and docs stay on the Hub
    assert {"consolidated.safetensors", "pytorch_model.bin", "original/tokenizer.model", "m.Q4_K_M.gguf"} <= set(
        plan.skipped
    )
    assert paths[-2:] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert plan.total == sum(f.size for f in plan.files)
    assert plan.index == "model.safetensors.index.json"


def test_bin_only_checkpoint_and_unsharded_safetensors() -> None:
    bins = listing("config.json", "pytorch_model.bin", "training_args.bin", "tokenizer.json")
    assert weight_index(bins) is None
    plan = plan_fetch(bins, None)
    assert [f.path for f in plan.files] == ["config.json", "tokenizer.json", "pytorch_model.bin"]
    single = listing("config.json", "model.safetensors", "consolidated.safetensors", "pytorch_model.bin")
    assert [f.path for f in plan_fetch(single, None).files] == ["config.json", "model.safetensors"]
    mistral = listing("params.json", "tekken.json", "consolidated.safetensors")
    assert [f.path for f in plan_fetch(mistral, None).files] == [
        "params.json",
        "tekken.json",
        "consolidated.safetensors",
    ]


def test_bad_checkpoints_are_refused_before_any_download() -> None:
    with pytest.raises(ConfigError, match=r"no \*\.safetensors or \*\.bin"):
        plan_fetch(listing("config.json", "m.gguf"), None)
    with pytest.raises(ConfigError, match=r"has no config\.json"):
        plan_fetch(listing("model.safetensors"), None)
    with pytest.raises(VerifyFailed, match="names shards the repo does not have: model-00003"):
        plan_fetch(SHARDED, ("model-00001-of-00002.safetensors", "model-00003-of-00003.safetensors"))
    with pytest.raises(ConfigError, match="bad shard"):
        parse_index('{"weight_map": {"w": "../../etc/passwd"}}', source="idx")
    with pytest.raises(ConfigError, match="no weight_map"):
        parse_index('{"metadata": {}}', source="idx")
    assert parse_index('{"weight_map": {"a": "s1", "b": "s2", "c": "s1"}}', source="idx") == ("s1", "s2")


@pytest.mark.parametrize("repo", ["../etc", "org/../x", "a--b/c", "org/name/extra", "-rf", "org/", "", "a b/c"])
def test_bad_model_ids(repo: str) -> None:
    with pytest.raises(ConfigError, match="not a Hub model id"):
        check_repo_id(repo)


@pytest.mark.parametrize("revision", ["-x", "a..b", "a b", "a//b", "tag/", "x\n", "é"])
def test_bad_revisions(revision: str) -> None:
    with pytest.raises(ConfigError, match="not a branch, tag or commit"):
        check_revision(revision)


def test_good_ids_and_revisions() -> None:
    for repo in ("gpt2", "Qwen/Qwen2.5-7B-Instruct", "meta-llama/Llama-3.1-8B", "a_b/c.d"):
        assert check_repo_id(repo) == repo
    for rev in ("main", "v1.0", "refs/pr/1", SHA):
        assert check_revision(rev) == rev
    assert not safe_relpath("a/../b") and not safe_relpath("/abs") and safe_relpath("sub/file.json")


def test_cache_layout_is_huggingface_hubs(tmp_path: Path) -> None:
    f = RemoteFile("sub/model.safetensors", 5, "b" * 64)
    layout = DiskLayout.cache(tmp_path, "org/m", SHA)
    assert layout.final(f) == tmp_path / "models--org--m" / "snapshots" / SHA / "sub" / "model.safetensors"
    assert layout.store(f) == tmp_path / "models--org--m" / "blobs" / ("b" * 64)
    assert layout.partial(f).name == "b" * 64 + ".incomplete"
    assert layout.lock(f) == tmp_path / ".locks" / "models--org--m" / ("b" * 64 + ".lock")
    assert layout.link_target(f) == "../../../blobs/" + "b" * 64
    assert layout.manifest == tmp_path / "models--org--m" / "kit" / f"{SHA}.json"
    local = DiskLayout.folder(tmp_path / "d", "org/m", SHA)
    assert local.final(f) == local.store(f) == tmp_path / "d" / "sub" / "model.safetensors"
    assert local.manifest == tmp_path / "d" / ".cache" / "kit" / "manifest.json"
    assert local.ref("main") is None


# --------------------------------------------------------------------------- the check


def fake_snapshot(tmp_path: Path, *, shard_sizes: tuple[int, ...] = (100, 50)) -> tuple[Path, Manifest]:
    """A cache snapshot written by hand (blobs + relative symlinks) and its manifest."""
    names = [f"model-{i:05d}-of-{len(shard_sizes):05d}.safetensors" for i in range(1, len(shard_sizes) + 1)]
    index = json.dumps({"weight_map": {f"w{i}": n for i, n in enumerate(names)}}).encode()
    contents = {"config.json": b"{}", "model.safetensors.index.json": index}
    contents.update({n: b"x" * s for n, s in zip(names, shard_sizes, strict=True)})
    files = tuple(RemoteFile(p, len(c), f"blob-{p}") for p, c in contents.items())
    layout = DiskLayout.cache(tmp_path / "hub", "org/m", SHA)
    for f in files:
        layout.store(f).parent.mkdir(parents=True, exist_ok=True)
        layout.store(f).write_bytes(contents[f.path])
        layout.final(f).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(layout.link_target(f), layout.final(f))
    manifest = Manifest("org/m", "main", SHA, "http://hub", files, "model.safetensors.index.json", tuple(names))
    layout.manifest.parent.mkdir(parents=True, exist_ok=True)
    layout.manifest.write_text(json.dumps(manifest.to_dict()))
    return layout.snapshot, manifest


def test_check_complete_snapshot_and_report_is_json(tmp_path: Path) -> None:
    snap, manifest = fake_snapshot(tmp_path)
    report = check_snapshot(snap)
    assert report.complete and report.sizes_checked and report.sha == SHA and report.revision == "main"
    assert report.total == manifest.total == report.present_bytes
    data = json.loads(json.dumps(report.to_dict()))
    assert data["complete"] is True and data["missing"] == [] and len(data["files"]) == 4
    assert Manifest.from_dict(json.loads(manifest_path(snap).read_text()), source="m") == manifest


def test_check_names_missing_and_truncated_shards(tmp_path: Path) -> None:
    snap, _ = fake_snapshot(tmp_path)
    (snap / "model-00002-of-00002.safetensors").resolve().unlink()  # dangling link = missing
    os.truncate((snap / "model-00001-of-00002.safetensors").resolve(), 60)
    report = check_snapshot(snap)
    assert not report.complete
    assert report.missing == ("model-00002-of-00002.safetensors",)
    assert [(m.path, m.expected, m.actual) for m in report.mismatched] == [
        ("model-00001-of-00002.safetensors", 100, 60)
    ]
    assert "1 missing (model-00002-of-00002.safetensors)" in report.summary()
    assert "model-00001-of-00002.safetensors: 60 of 100 bytes" in report.summary()


def test_check_without_manifest_still_checks_the_index(tmp_path: Path) -> None:
    snap, _ = fake_snapshot(tmp_path)
    manifest_path(snap).unlink()
    report = check_snapshot(snap)
    assert report.complete and not report.sizes_checked and report.sha == SHA
    (snap / "model-00001-of-00002.safetensors").unlink()
    report = check_snapshot(snap)
    assert report.missing == ("model-00001-of-00002.safetensors",) and not report.complete
    empty = tmp_path / "empty"
    empty.mkdir()
    assert check_snapshot(empty).missing == ("config.json",)
    assert "does not exist" in check_snapshot(tmp_path / "nope").summary()


def test_find_snapshot_follows_refs_then_kits_manifest(tmp_path: Path) -> None:
    snap, _ = fake_snapshot(tmp_path)
    hub = tmp_path / "hub"
    assert find_snapshot(hub, "org/m", "main") == snap  # no ref yet: kit's manifest for main
    assert find_snapshot(hub, "org/m", "v2") is None
    assert find_snapshot(hub, "org/other") is None
    other = "b" * 40
    (hub / "models--org--m" / "refs").mkdir()
    (hub / "models--org--m" / "refs" / "main").write_text(other)
    assert find_snapshot(hub, "org/m", "main") == snap.parent / other
    assert find_snapshot(hub, "org/m", SHA) == snap
    report = check_model(hub, "org/m", SHA)
    assert report is not None and report.complete


def test_survey_counts_done_blobs_and_partials(tmp_path: Path) -> None:
    files = (RemoteFile("config.json", 2, "c1"), RemoteFile("model.safetensors", 100, "s1"))
    plan = plan_fetch(RepoListing("org/m", "main", SHA, files), None)
    layout = DiskLayout.cache(tmp_path, "org/m", SHA)
    layout.store(files[0]).parent.mkdir(parents=True)
    layout.store(files[0]).write_bytes(b"{}")
    layout.partial(files[1]).write_bytes(b"x" * 30)
    on_disk = survey(plan, layout)
    assert on_disk.done == {"config.json"} and on_disk.partial == {"model.safetensors": 30}
    assert on_disk.to_fetch(plan) == 70
    # a local folder trusts a file only when the previous manifest recorded the same blob
    local = DiskLayout.folder(tmp_path / "d", "org/m", SHA)
    local.final(files[0]).parent.mkdir(parents=True)
    local.final(files[0]).write_bytes(b"{}")
    assert survey(plan, local).done == frozenset()
    previous = Manifest("org/m", "main", SHA, "e", files, None, ("model.safetensors",))
    assert survey(plan, local, previous).done == {"config.json"}
