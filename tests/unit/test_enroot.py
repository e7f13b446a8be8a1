"""`kit pull --runtime enroot` against a recording FAKE `enroot` on PATH (issue 20).

enroot cannot be installed on these machines, so these tests check the argv kit passes (the URI
form `docker://[REGISTRY#]IMAGE[:TAG][@DIGEST]` is checked against enroot's own parsing rules,
src/docker.sh docker::_parse_uri) and how kit handles what the fake simulates: enroot 4 with
`enroot digest`, enroot 3 without it, a failed import, an import killed half way (enroot writes its
output file in place). They do not prove enroot itself behaves as the fake does.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kit.cli import cli
from kit.errors import ConfigError, ImageError, ImageRefError
from kit.plan.container_args import enroot_image
from kit.runtime.enroot import EnrootImages, import_uri, sqsh_name
from tests.conftest import ROOT

DIGEST = "sha256:" + "cd" * 32

FAKE = f"""#!{sys.executable}
# A recording fake of enroot for kit's unit tests (not the real tool).
import json, os, re, sys, time
args = sys.argv[1:]
with open(os.environ["KIT_RECORD"], "a") as f:
    f.write(json.dumps(args) + "\\n")
old = os.environ.get("KIT_FAKE_ENROOT") == "3"
# enroot's URI grammar (docker::_parse_uri; '@DIGEST' only from enroot 4)
user, image, tag = r"[A-Za-z0-9_.!~*'()%;:&=+$,-]+", r"[a-z0-9/._-]+", r"[A-Za-z0-9._:-]+"
uri_re = rf"^docker://({{user}}@)?([^#/@]+#)?{{image}}(:{{tag}})?" + ("" if old else r"(@sha256:[A-Za-z0-9]+)?") + "$"
def check(uri):
    if not re.match(uri_re, uri):
        print(f"[ERROR] Invalid image reference: {{uri}}", file=sys.stderr); sys.exit(1)
if args[:1] == ["version"]:
    print("3.4.1" if old else "4.2.0"); sys.exit(0)
if args[:1] == ["digest"]:
    if old:
        print("Usage: enroot COMMAND [ARG...]", file=sys.stderr); sys.exit(1)
    check(args[1]); print("{DIGEST}"); sys.exit(0)
if args[:1] == ["import"]:
    assert args[1] in ("-o", "--output"), args
    out, uri = args[2], args[3]
    check(uri)
    if os.path.exists(out):
        print(f"[ERROR] File already exists: {{out}}", file=sys.stderr); sys.exit(1)
    mode = os.environ.get("KIT_FAKE_IMPORT", "ok")
    print("[INFO] Querying registry for permission grant", file=sys.stderr)
    if mode == "denied":
        print("[ERROR] URL https://nvcr.io/v2/ returned error code: 401 Unauthorized", file=sys.stderr); sys.exit(1)
    with open(out, "w") as f:  # enroot (mksquashfs) writes the output file in place
        f.write("hsqs half a squashfs")
    if mode == "slow":
        open(os.environ["KIT_FAKE_PIDFILE"], "w").write(str(os.getpid()))
        time.sleep(60)
    if mode == "empty":
        open(out, "w").close(); sys.exit(0)
    with open(out, "a") as f:
        f.write(" and the rest")
    sys.exit(0)
print("FAKE: unexpected " + " ".join(args), file=sys.stderr); sys.exit(98)
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "enroot").write_text(FAKE)
    (bindir / "enroot").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setenv("KIT_RECORD", str(tmp_path / "record.jsonl"))
    monkeypatch.setenv("KIT_STATE_DIR", str(tmp_path / "state"))
    return {"bin": bindir, "tmp": tmp_path, "images": tmp_path / "images"}


def recorded(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "record.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def pull(fake: dict[str, Any], ref: str, lines: list[str] | None = None) -> dict[str, Any]:
    """EnrootImages' plan_pull and pull, as `kit pull` drives them; the result as --json prints it."""
    sink = lines if lines is not None else []
    store = EnrootImages(str(fake["images"]))
    result = store.pull(store.plan_pull(ref), on_progress=lambda event: sink.append(event.text or ""))
    return result.to_dict()


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("vllm/vllm-openai:v0.11.0", "vllm/vllm-openai:v0.11.0"),
        ("ubuntu", "ubuntu:latest"),
        ("docker.io/library/ubuntu:24.04", "ubuntu:24.04"),  # Docker Hub: enroot's default registry
        ("nvcr.io/nvidia/vllm:25.01-py3", "nvcr.io#nvidia/vllm:25.01-py3"),  # '#' separates the registry
        ("localhost:5000/kit/vllm", "localhost:5000#kit/vllm:latest"),
        ("nvcr.io/nvidia/vllm:25.01@" + DIGEST, "nvcr.io#nvidia/vllm@" + DIGEST),  # the digest wins
        ("/shared/images/vllm.sqsh", "/shared/images/vllm.sqsh"),  # a file stays a file
    ],
)
def test_enroot_image_form(ref: str, expected: str) -> None:
    assert enroot_image(ref) == expected


def test_names_and_refusals() -> None:
    assert sqsh_name("nvcr.io/nvidia/vllm:25.01-py3") == "nvcr.io_nvidia_vllm_25.01-py3.sqsh"
    assert sqsh_name("vllm/vllm-openai") == "vllm_vllm-openai_latest.sqsh"
    assert sqsh_name("x/y@" + DIGEST).startswith("x_y_sha256-cdcd")
    assert import_uri("nvcr.io/nvidia/vllm:25.01-py3") == "docker://nvcr.io#nvidia/vllm:25.01-py3"
    with pytest.raises(ImageRefError):
        import_uri("/shared/images/vllm.sqsh")
    with pytest.raises(ImageRefError):
        import_uri("Not A Reference")


def test_pull_pins_the_digest_and_writes_the_file_atomically(fake: dict[str, Any]) -> None:
    """enroot 4: `enroot digest` resolves the tag; the import is pinned to that digest, written
    under a hidden temporary name and renamed; the digest is recorded beside the file."""
    lines: list[str] = []
    result = pull(fake, "nvcr.io/nvidia/vllm:25.01-py3", lines)
    sqsh = fake["images"] / "nvcr.io_nvidia_vllm_25.01-py3.sqsh"
    assert result["path"] == str(sqsh) and sqsh.read_text() == "hsqs half a squashfs and the rest"
    assert result["digest"] == DIGEST and result["digest_source"] == "enroot digest"
    assert result["source"] == f"docker://nvcr.io#nvidia/vllm:25.01-py3@{DIGEST}"
    assert json.loads(Path(result["metadata"]).read_text())["digest"] == DIGEST
    assert sorted(p.name for p in fake["images"].iterdir()) == [sqsh.name, sqsh.name + ".json"]
    digest, imported = recorded(fake["tmp"])
    assert digest == ["digest", "docker://nvcr.io#nvidia/vllm:25.01-py3"]
    assert imported[:2] == ["import", "--output"] and imported[3] == result["source"]
    assert Path(imported[2]).name.startswith(f".{sqsh.name}.partial-")  # never the final name
    assert {"path", "source", "digest", "digest_source", "size", "seconds"} <= set(result)  # as Apptainer's
    assert any("importing" in line for line in lines)


def test_a_pinned_reference_needs_no_lookup(fake: dict[str, Any]) -> None:
    result = pull(fake, f"nvcr.io/nvidia/vllm@{DIGEST}")
    assert (result["digest"], result["digest_source"]) == (DIGEST, "reference")
    assert [argv[0] for argv in recorded(fake["tmp"])] == ["import"]


def test_enroot_3_has_no_digest_and_kit_says_so(fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIT_FAKE_ENROOT", "3")
    lines: list[str] = []
    result = pull(fake, "nvcr.io/nvidia/vllm:25.01-py3", lines)
    assert result["digest"] is None and result["digest_source"] is None
    assert result["source"] == "docker://nvcr.io#nvidia/vllm:25.01-py3"  # enroot 3 cannot parse '@'
    assert any("no digest is recorded" in line for line in lines)
    # through the CLI: nothing recorded, and the output says why
    out = CliRunner().invoke(cli, ["pull", "--runtime", "enroot", "nvcr.io/nvidia/vllm:25.01-py3", "--set",
                                   f"enroot.image_dir={fake['images']}"])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "digest: unknown (not recorded" in out.output and not (fake["tmp"] / "state" / "images.json").exists()


@pytest.mark.parametrize("mode", ["denied", "empty"])
def test_a_failed_import_leaves_no_file(mode: str, fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIT_FAKE_IMPORT", mode)
    with pytest.raises(ImageError) as err:
        pull(fake, "nvcr.io/nvidia/vllm:25.01-py3")
    assert list(fake["images"].iterdir()) == []
    if mode == "denied":
        assert ".credentials" in (err.value.hint or "") and "401" in err.value.details[-1]


def test_pull_through_the_cli_records_the_digest(fake: dict[str, Any]) -> None:
    """`kit pull --runtime enroot`: the digest lands in kit's image record (as for Docker and
    Apptainer), with the file's path; runtime pyxis in the config pulls the same way."""
    args = ["pull", "--runtime", "pyxis", "vllm/vllm-openai:v0.11.0", "--json", "--set",
            f"enroot.image_dir={fake['images']}"]  # fmt: skip
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)["result"]  # stdout alone: another test's thread may write to stderr
    record = json.loads((fake["tmp"] / "state" / "images.json").read_text())["vllm/vllm-openai:v0.11.0"]
    assert record["digest"] == result["digest"] == DIGEST and record["runtime"] == "enroot"
    assert record["path"] == result["path"] and Path(record["path"]).is_file()


def test_help_names_the_credentials_file() -> None:
    out = CliRunner().invoke(cli, ["pull", "--help"])
    assert "$ENROOT_CONFIG_PATH/.credentials" in out.output and "netrc" in out.output


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_an_import_killed_half_way_leaves_no_file_that_looks_finished(
    how: signal.Signals, fake: dict[str, Any]
) -> None:
    """The fake writes half its output and hangs; kit is interrupted (Ctrl-C: the child is killed
    and the temporary file removed) or killed outright (then only the hidden .NAME.partial-PID
    stays): never a file with the image's name."""
    pidfile = fake["tmp"] / "enroot.pid"
    env = {**os.environ, "KIT_FAKE_IMPORT": "slow", "KIT_FAKE_PIDFILE": str(pidfile), "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "kit", "pull", "--runtime", "enroot", "vllm/vllm-openai:v0.11.0",
            "--set", f"enroot.image_dir={fake['images']}"]  # fmt: skip
    kit = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pidfile.exists(), kit.communicate(timeout=5)
        [partial] = fake["images"].iterdir()
        assert partial.name.startswith(".vllm_vllm-openai_v0.11.0.sqsh.partial-") and partial.stat().st_size
        kit.send_signal(how)
        kit.wait(timeout=30)
    finally:
        kit.kill()
        if pidfile.exists():  # a SIGKILLed kit leaves its child behind, as any killed parent does
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
    left = sorted(p.name for p in fake["images"].iterdir())
    assert "vllm_vllm-openai_v0.11.0.sqsh" not in left and not any(n.endswith(".json") for n in left)
    if how == signal.SIGINT:
        assert kit.returncode == 130 and left == []
    else:
        assert all(n.startswith(".") and ".partial-" in n for n in left)


def test_kit_up_refuses_the_slurm_only_runtimes() -> None:
    from kit.config import load_config
    from kit.runtime import get_runtime

    config = load_config(environ={}, cwd=Path("/nonexistent"), overrides={"runtime": ("pyxis", "test")}).config
    with pytest.raises(ConfigError, match="only inside a SLURM job"):
        get_runtime(config)
    # the verbs: one line, exit 3, before anything is planned or printed (a dry run included)
    for args in (["up", "--dry-run", "--set", "runtime=edf"], ["slurm", "--set", "runtime=enroot"]):
        result = subprocess.run([sys.executable, "-m", "kit", *args], capture_output=True, text=True, timeout=60,
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd="/")  # fmt: skip
        assert result.returncode == 3 and result.stdout == "", result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "runtime" in result.stderr
