"""Files in places other users share (issue 27), on a real directory: kit writes without following
links planted there (kit/safe/files.py), updates its record files under a lock with a re-read so
several kit processes at once keep each other's entries, reads state files through the bounded
loaders (a FIFO or a deeply nested file is one error, not a hang or a traceback), and warns
about a secret file others can read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kit import safeload
from kit.errors import ConfigError, KitError
from kit.images.records import images_file, record_image, recorded_image
from kit.models.records import models_file, recorded_model
from kit.safe import files as safefile
from tests.conftest import ROOT, run_kit, write_secret


def test_write_atomic_replaces_a_planted_link_and_never_writes_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "images.json").symlink_to(victim)
    safefile.write_atomic(shared / "images.json", "{}\n", mode=0o640)
    assert victim.read_text() == "mine\n"
    assert not (shared / "images.json").is_symlink() and (shared / "images.json").read_text() == "{}\n"
    assert (shared / "images.json").stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in shared.iterdir()) == ["images.json"]  # no temporary file left


def test_open_private_refuses_links_fifos_and_hard_links(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    (tmp_path / "link").symlink_to(victim)
    os.link(victim, tmp_path / "hard")
    os.mkfifo(tmp_path / "fifo")
    for name, why in (("link", "is a symbolic link"), ("hard", "has 2 hard links"), ("fifo", "FIFO")):
        with pytest.raises(safefile.UnsafeFile, match=why):
            safefile.open_private(tmp_path / name, os.O_WRONLY | os.O_CREAT)
    assert victim.read_text() == "mine\n"
    os.close(safefile.open_private(tmp_path / "new", os.O_WRONLY | os.O_CREAT))  # a file of its own: fine
    # A folder kit would create under the cache, planted as a link into someone's home: refused.
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "snapshots").symlink_to(home)
    with pytest.raises(safefile.UnsafeFile, match="is a symbolic link or not a folder"):
        safefile.make_dirs(tmp_path / "snapshots" / "abc", tmp_path)
    assert list(home.iterdir()) == []


def test_a_record_file_that_is_a_link_a_fifo_or_deep_json(kit_state_dir: Path, tmp_path: Path) -> None:
    kit_state_dir.mkdir()
    victim = tmp_path / "victim.json"
    victim.write_text('{"mine": 1}\n')
    images_file().symlink_to(victim)
    record_image("vllm/vllm-openai:v1", "sha256:" + "a" * 64)
    assert json.loads(victim.read_text()) == {"mine": 1}  # the link was replaced, not written through
    assert recorded_image("vllm/vllm-openai:v1")["digest"] == "sha256:" + "a" * 64  # type: ignore[index]
    images_file().unlink()
    os.mkfifo(images_file())
    errors: list[BaseException] = []
    reader = threading.Thread(target=lambda: errors.append(_raises(lambda: recorded_image("x"))), daemon=True)
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "a FIFO in the state folder hung kit"
    assert isinstance(errors[0], KitError) and "is not a regular file" in errors[0].message
    images_file().unlink()
    images_file().write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(KitError, match="nested deeper than 64 levels") as err:
        recorded_image("x")
    assert "\n" not in err.value.message
    code, _, stderr = run_kit(["up", "--dry-run"])  # a verb that reads the record: one line, no traceback
    assert "Traceback" not in stderr and (code == 0 or stderr.count("kit: error:") == 1)


def _raises(call: object) -> BaseException | None:
    try:
        call()  # type: ignore[operator]
    except BaseException as exc:
        return exc
    return None


RECORDER = """
import sys
from kit.models.records import record_model
who, count = sys.argv[1], int(sys.argv[2])
for i in range(count):
    record_model(f"org/{who}-{i}", "main", sha="0" * 40, path="/x", complete=True, bytes=1)
"""


def test_concurrent_writers_keep_each_others_records(kit_state_dir: Path) -> None:
    """Four kit processes (`kit fetch` on four nodes sharing the state folder) record 25 models
    each at the same time: every one of the 100 records is there afterwards."""
    env = {**os.environ, "KIT_STATE_DIR": str(kit_state_dir), "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", RECORDER, f"node{n}", "25"], env=env, stderr=subprocess.PIPE, text=True)
        for n in range(4)
    ]
    for proc in procs:
        assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
    records = json.loads(models_file().read_text())
    assert len(records) == 100 and all(f"org/node{n}-{i}@main" in records for n in range(4) for i in range(25))
    assert recorded_model("org/node3-24")["complete"] is True  # type: ignore[index]
    assert not [p for p in kit_state_dir.iterdir() if p.name.endswith(".tmp")]


def test_a_secret_file_others_can_read_is_one_warning(tmp_path: Path) -> None:
    key = write_secret(tmp_path / "key", "sk-0123456789\n")
    with safeload.warnings.catch_warnings():
        safeload.warnings.simplefilter("error")
        assert safeload.read_secret(key, key="api_key_file") == "sk-0123456789"  # mode 600: quiet
    key.chmod(0o640)
    with pytest.warns(safeload.LooseSecretFile, match=rf"api_key_file {key} is readable by its group \(mode 640\)"):
        safeload.read_secret(key, key="api_key_file")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ConfigError, match="is not a regular file"):
        safeload.read_secret(tmp_path / "fifo", key="api_key_file")
