"""The supervise bundle (kit/supervise/bundle.py): the same bytes from the same sources, closed
over the standard library (it runs with `python3 -I -S`: no site-packages, no kit install), and
its launch / stop cycle with real processes: `launch` starts an agent in the background (as
`kit serve --supervise` does through the runtime's exec), kit/supervise/stop.py ends it and its resume
marker."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kit.plan.supervise import RUN_DIR
from kit.resources import program_source
from kit.supervise import bundle, main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bundle") / main.BUNDLE_NAME
    path.write_bytes(bundle.build())
    return path


def test_the_bundle_is_reproducible_and_fits_one_argument() -> None:
    first = bundle.build()
    bundle.build.cache_clear()
    assert bundle.build() == first
    assert len(bundle.encoded()) < 128 * 1024, "one argv word or variable (MAX_ARG_STRLEN) must hold it"
    assert set(bundle.encoded()) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")


def test_every_kit_import_of_the_bundle_is_in_the_bundle() -> None:
    shipped = {"kit"} | {
        "kit." + m.removesuffix(".py").replace("/", ".").removesuffix(".__init__") for m in bundle.MODULES
    }
    for module in bundle.MODULES:
        tree = ast.parse((ROOT / "kit" / module).read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kit"):
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("kit")]
            assert not names or any(n in shipped for n in names), f"{module} imports {names}, not in the bundle"


def test_the_bundle_runs_without_site_packages(pyz: Path) -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import kit.supervise.agent, kit.supervise.coordinator, kit.supervise.main, kit.health.liveness\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('requests', 'yaml', 'click', 'jinja2', 'docker'))\n"
        "print(kit.__file__, bad)\n"
    )
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(pyz)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{pyz}/kit/__init__.py []"
    usage = subprocess.run([sys.executable, "-I", "-S", str(pyz)], capture_output=True, text=True)
    assert usage.returncode == 2 and "launch DIR" in usage.stderr


def test_the_resume_hook_resumes_every_marked_run_directory_kit_names(tmp_path: Path) -> None:
    """The node entrypoint's hook, run by bash with /tmp/kit moved under tmp_path: the node's run
    directory and each replica slot's (run_files) resume when marked, nothing else does."""
    from kit.plan.supervise import run_files

    hook = (ROOT / "kit" / "templates" / "_supervise_resume.sh.j2").read_text()
    assert "{{" not in hook and "{%" not in hook, "the hook is plain shell (no template values)"
    root = tmp_path / "kit"
    record = tmp_path / "resumed"
    fake = f"import sys\nopen({str(record)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
    dirs = {run_files(0).run_dir: True, run_files(1).run_dir: True, run_files(2).run_dir: False}
    dirs["/tmp/kit/supervise-x"] = True  # not a name kit gives
    for run_dir, marked in dirs.items():
        here = root / Path(run_dir).relative_to("/tmp/kit")
        here.mkdir(parents=True)
        (here / main.BUNDLE_NAME).write_text(fake)
        if marked:
            (here / "resume").touch()
    done = subprocess.run(["bash", "-c", hook.replace("/tmp/kit", str(root))], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(record.read_text().splitlines()) == [
        f"resume {root}/supervise",
        f"resume {root}/supervise-1",
    ]
    assert run_files(0).run_dir == RUN_DIR


def test_launch_starts_an_agent_once_and_stop_py_ends_it(pyz: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / main.BUNDLE_NAME).write_bytes(pyz.read_bytes())
    (run_dir / "token").write_text("t")
    (tmp_path / "serve.sh").write_text("#!/bin/bash\nexec sleep 300\n")
    settings = {
        "port": 9,
        "serve_script": str(tmp_path / "serve.sh"),
        "serve_log": str(tmp_path / "serve.log"),
        "pid_file": str(tmp_path / "serve.pid"),
        "coordinator": True,
    }
    (run_dir / "supervise.json").write_text(json.dumps(settings))
    (run_dir / "resume").touch()
    env = {**os.environ, "KIT_ROLE": "worker", "KIT_NODE_RANK": "1", "KIT_HEAD_ADDRESS": "127.0.0.1"}
    bundle_cmd = [sys.executable, str(run_dir / main.BUNDLE_NAME)]
    first = subprocess.run([*bundle_cmd, "launch", str(run_dir)], capture_output=True, text=True, env=env)
    started = json.loads(first.stdout.split("KIT_SUPERVISE_LAUNCHED ", 1)[1])
    assert list(started) == ["agent"], "a worker runs no coordinator"
    pid = started["agent"]
    try:
        assert main.ours(run_dir / "agent.pid") == pid
        again = subprocess.run([*bundle_cmd, "resume", str(run_dir)], capture_output=True, text=True, env=env)
        assert json.loads(again.stdout.split("KIT_SUPERVISE_LAUNCHED ", 1)[1]) == {"agent": pid}, "launched once"
        end = time.monotonic() + 10
        while "cannot reach the coordinator" not in (run_dir / "agent.log").read_text() and time.monotonic() < end:
            time.sleep(0.1)
        assert "cannot reach the coordinator at http://127.0.0.1:9" in (run_dir / "agent.log").read_text()
        stopped = subprocess.run(
            [sys.executable, "-c", program_source("supervise/stop.py"), str(run_dir), str(tmp_path / "serve.pid")],
            capture_output=True,
            text=True,
        )
        assert json.loads(stopped.stdout.split("KIT_SUPERVISE_STOPPED ", 1)[1]) == {"agent": pid}
        assert not (run_dir / "resume").exists() and main.ours(run_dir / "agent.pid") is None
        assert "signal 15: stopping the serve group and exiting" in (run_dir / "agent.log").read_text()
        after = subprocess.run([*bundle_cmd, "resume", str(run_dir)], capture_output=True, text=True, env=env)
        assert after.stdout == "" and after.returncode == 0, "no resume marker: a restart resumes nothing"
    finally:
        if main.ours(run_dir / "agent.pid"):
            os.kill(pid, 9)


def test_a_stale_pid_file_names_nothing_to_signal(tmp_path: Path) -> None:
    (tmp_path / "agent.pid").write_text(f"{os.getpid()}\n")  # a live process, but not the bundle's
    assert main.ours(tmp_path / "agent.pid") is None
    (tmp_path / "agent.pid").write_text("999999999\n")
    assert main.ours(tmp_path / "agent.pid") is None
