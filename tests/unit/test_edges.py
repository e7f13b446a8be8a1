"""The smaller edges of issue 27: output that is lost is an error, input that never ends is
refused, a bad `--set` value or `KIT_CONFIG` path names what is wrong, a malformed image
reference never reaches the engine, and a log of a million distinct transports stays bounded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit.errors import ExitCode
from kit.verify import nccl_log
from tests.conftest import ROOT, run_kit


def test_lost_output_is_an_error(tmp_path: Path) -> None:
    closed = subprocess.run(
        ["bash", "-c", 'exec "$@" >&-', "_", sys.executable, "-m", "kit", "config", "show"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=False,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
    )
    assert closed.returncode == ExitCode.FAILURE and "standard output is closed" in closed.stderr
    with open("/dev/full", "w") as full:
        for args in (["config", "show"], ["config", "show", "--json"], ["--help"]):
            done = subprocess.run(
                [sys.executable, "-m", "kit", *args],
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
            )
            assert done.returncode == ExitCode.FAILURE, (args, done.stderr)
            assert done.stderr.strip().splitlines() == [
                "kit: error: cannot write to standard output (no space left on device): the output was lost"
            ], done.stderr


def test_diagnose_refuses_a_device_on_standard_input() -> None:
    with open("/dev/zero", "rb") as zero:
        done = subprocess.run(
            [sys.executable, "-m", "kit", "diagnose", "-"],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=zero,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode == ExitCode.CONFIG and "standard input is a device" in done.stderr


def test_a_bad_set_value_names_the_key_and_a_bad_kit_config_names_kit_config(
    kit_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_kit(["config", "show", "--set", "model.tp=a\x01b"])
    assert code == ExitCode.CONFIG and err.startswith(
        "kit: error: --set model.tp: contains the control character U+0001 (at character 2)"
    )
    code, _, err = run_kit(["config", "show", "--set", "model.tp=abc"])
    assert code == ExitCode.CONFIG and err.startswith("kit: error: flag --set model.tp: expected an integer or auto")
    monkeypatch.setenv("KIT_CONFIG", str(kit_env / "missing.yaml"))
    code, _, err = run_kit(["config", "show"])
    assert code == ExitCode.CONFIG and err.startswith(
        f"kit: error: KIT_CONFIG: {kit_env / 'missing.yaml'}: cannot read"
    )
    monkeypatch.setenv("KIT_CONFIG", "/dev/zero")
    code, _, err = run_kit(["config", "show"])
    assert code == ExitCode.CONFIG and "KIT_CONFIG" in err and "not a regular file" in err


@pytest.mark.parametrize(
    "ref",
    ["UPPER/case:tag", "a/b@sha256:" + "0" * 32, "a/b@sha256:" + "A" * 64, "a/b@md5:" + "0" * 32],
)
def test_a_malformed_reference_never_reaches_the_engine(kit_env: Path, ref: str) -> None:
    """Refused by kit's grammar (exit 5), with and without --dry-run, before the engine is
    asked anything (no engine is reachable here: the refusal comes first)."""
    for extra in ([], ["--dry-run"]):
        code, _, err = run_kit(["pull", ref, *extra, "--set", "runtime=docker"])
        assert code == ExitCode.IMAGE and err.startswith("kit: error: malformed image reference"), err


def test_a_million_distinct_transports_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the parser keeps is capped (MAX_ENTRIES distinct connections, ranks, hosts, ...):
    here at 1,000, with 20,000 distinct transport labels fed; the rest is counted."""
    monkeypatch.setattr(nccl_log, "MAX_ENTRIES", 1000)
    parser = nccl_log.NcclParser()
    for i in range(20_000):
        parser.feed(f"node1:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NET/Plugin{i}/0")
    log = parser.result()
    assert len(log.connections) < 1000 and log.dropped > 19_000 and log.lines == 20_000
