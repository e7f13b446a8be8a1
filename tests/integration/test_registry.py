"""`kit pull` against a real registry on loopback (Debian's docker-registry, distribution 2.x).

The engine treats 127.0.0.0/8 registries as insecure by default, so plain HTTP works.
The mid-pull test puts a throttling TCP proxy in front of the registry (loopback is too fast
to catch a layer mid-download), then kills both once a layer is downloading.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kit.errors import ExitCode

ROOT = Path(__file__).resolve().parents[2]
REGISTRY_BIN = os.environ.get("KIT_REGISTRY_BIN", "/usr/bin/docker-registry")
BASE_IMAGE = "kit/debian-base:bookworm"
# A ~100 MB random (incompressible) layer on top of the base. Built anew per session (NONCE):
# once pushed, its local copy is deleted, so that the pull has to download the layer.
BIG_DOCKERFILE = f"""FROM {BASE_IMAGE}
ARG NONCE
RUN echo "$NONCE" > /nonce && head -c 100000000 /dev/urandom > /blob
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Registry:
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def start_registry(tmp: Path) -> Registry:
    if not Path(REGISTRY_BIN).is_file():
        pytest.fail(f"{REGISTRY_BIN} is missing: run tests/infra/registry.sh (Debian package docker-registry)")
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = tmp / "registry.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {tmp / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    log = (tmp / "registry.log").open("wb")
    proc = subprocess.Popen([REGISTRY_BIN, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as resp:
                if resp.status == 200:
                    return Registry(port, proc)
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"docker-registry did not come up: {(tmp / 'registry.log').read_text()[-2000:]}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def registry(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("registry"))
    yield reg
    reg.stop()


def push(client: Any, source: str, ref: str) -> str:
    """Tag `source` as `ref`, push it, drop the local tag; returns the pushed manifest digest."""
    repository, _, tag = ref.rpartition(":")
    client.images.get(source).tag(repository, tag)
    digest = None
    for event in client.api.push(repository, tag=tag, stream=True, decode=True):
        if "errorDetail" in event or "error" in event:
            raise AssertionError(f"push of {ref} failed: {event}")
        aux = event.get("aux") or {}
        digest = aux.get("Digest") or digest
    client.images.remove(ref)
    assert digest, f"push of {ref} reported no digest"
    return str(digest)


def local_tags(client: Any, ref: str) -> list[str]:
    import docker

    try:
        return list(client.images.get(ref).tags)
    except docker.errors.ImageNotFound:
        return []


@pytest.fixture
def base_image(docker_client: Any) -> str:
    import docker

    try:
        docker_client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"{BASE_IMAGE} is missing: build it with containers/base/build-debian-base.sh")
    return BASE_IMAGE


def test_push_then_kit_pull_records_the_pushed_digest(
    docker_client: Any, registry: Registry, base_image: str, kit_cli: Callable[..., Any], kit_state: Path
) -> None:
    ref = f"{registry.host}/kit/base:test"
    pushed = push(docker_client, base_image, ref)
    assert local_tags(docker_client, ref) == []

    started = time.monotonic()
    proc = kit_cli("pull", ref, "--json")
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", "--json must print nothing but the envelope"
    result = json.loads(proc.stdout)["result"]
    assert result["ref"] == ref
    assert result["digest"] == f"{registry.host}/kit/base@{pushed}"
    assert ref in local_tags(docker_client, ref)
    record = json.loads((kit_state / "images.json").read_text())[ref]
    assert record["digest"] == result["digest"] and record["image_id"] == result["image_id"]
    print(f"kit pull {ref}: {elapsed:.1f} s")

    # Human mode: progress on stderr, the digest on stdout.
    proc = kit_cli("pull", ref)
    assert proc.returncode == 0, proc.stderr
    assert pushed in proc.stdout
    assert f"pulling {ref}" in proc.stderr
    docker_client.images.remove(ref)


def test_unknown_tag_is_an_image_error(registry: Registry, kit_cli: Callable[..., Any], docker_client: Any) -> None:
    ref = f"{registry.host}/kit/base:no-such-tag"
    proc = kit_cli("pull", ref)
    assert proc.returncode == ExitCode.IMAGE, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("kit: error:")]
    assert len(errors) == 1, proc.stderr
    assert f"pull of {registry.host}/kit/base:no-such-tag failed" in errors[0]
    assert "not found" in errors[0]
    assert local_tags(docker_client, ref) == []


def test_dead_docker_socket_exits_4(kit_cli: Callable[..., Any], tmp_path: Path) -> None:
    proc = kit_cli("pull", "kit/base:test", env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert proc.returncode == ExitCode.RUNTIME_UNAVAILABLE, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("pulling ")]
    assert len(lines) == 1 and lines[0].startswith("kit: error: the Docker engine is not reachable"), proc.stderr


class ThrottledProxy:
    """127.0.0.1:port -> target, registry-to-client bytes limited to `rate` B/s. kill() drops all."""

    def __init__(self, target_port: int, rate: float) -> None:
        self.target_port = target_port
        self.rate = rate
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        self.sockets: list[socket.socket] = []
        self.dead = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.dead.is_set():
            try:
                client, _ = self.server.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                return
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, 0.0), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self.rate), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, rate: float) -> None:
        try:
            while not self.dead.is_set():
                data = src.recv(64 * 1024)
                if not data:
                    break
                dst.sendall(data)
                if rate:
                    time.sleep(len(data) / rate)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def kill(self) -> None:
        self.dead.set()
        self.server.close()
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            except OSError:
                pass


@pytest.fixture
def big_image(docker_client: Any, base_image: str, tmp_path: Path, test_labels: dict[str, str]) -> Iterator[str]:
    tag = f"kit/test-bigpull:{test_labels['kit.test-run']}"
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "Dockerfile").write_text(BIG_DOCKERFILE)
    docker_client.images.build(
        path=str(tmp_path / "big"), tag=tag, rm=True, labels=test_labels, buildargs={"NONCE": tag}
    )
    yield tag
    for image in docker_client.images.list(filters={"label": f"kit.test-run={test_labels['kit.test-run']}"}):
        docker_client.images.remove(image.id, force=True)


def test_registry_gone_mid_pull_is_a_clear_error_and_leaves_no_tag(
    docker_client: Any, big_image: str, tmp_path: Path, kit_state: Path
) -> None:
    registry = start_registry(tmp_path / "reg")
    proxy = ThrottledProxy(registry.port, rate=10e6)
    try:
        pushed_ref = f"{registry.host}/kit/big:test"
        push(docker_client, big_image, pushed_ref)
        docker_client.images.remove(big_image, force=True)  # its layers must come from the registry
        ref = f"127.0.0.1:{proxy.port}/kit/big:test"  # the same registry, through the slow proxy
        assert local_tags(docker_client, ref) == []

        env = {**os.environ, "KIT_STATE_DIR": str(kit_state)}
        kit = subprocess.Popen(
            [sys.executable, "-m", "kit", "pull", ref],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert kit.stderr is not None
        seen: list[str] = []
        started = time.monotonic()
        for line in kit.stderr:
            seen.append(line.rstrip())
            if ": Downloading " in line:
                break
        else:
            pytest.fail("kit pull ended before any layer was downloading:\n" + "\n".join(seen))
        killed_at = time.monotonic() - started
        proxy.kill()
        registry.stop()
        out, rest = kit.communicate(timeout=300)
        elapsed = time.monotonic() - started
        stderr = seen + rest.splitlines()
    finally:
        proxy.kill()
        registry.stop()

    assert kit.returncode == ExitCode.IMAGE, "\n".join(stderr)
    errors = [ln for ln in stderr if ln.startswith("kit: error:")]
    assert len(errors) == 1, "\n".join(stderr)
    assert errors[0].startswith(f"kit: error: pull of 127.0.0.1:{proxy.port}/kit/big:test failed"), errors[0]
    assert out == ""
    assert local_tags(docker_client, ref) == [], "a failed pull left the tag behind"
    # The state starts with the session's image-facts seed (conftest.facts_seed: the test images'
    # records), so the file may exist; the pulled reference must not be in it.
    records = json.loads((kit_state / "images.json").read_text()) if (kit_state / "images.json").exists() else {}
    assert ref not in records and f"{registry.host}/kit/big:test" not in records, "a failed pull recorded a digest"
    print(f"registry killed {killed_at:.1f} s into the pull; kit exited after {elapsed:.1f} s: {errors[0]}")


def test_registry_binary_install_script_is_idempotent() -> None:
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    proc = subprocess.run(
        ["bash", str(ROOT / "tests" / "infra" / "registry.sh")], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == REGISTRY_BIN
