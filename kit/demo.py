"""What `kit demo` does, without click: kit's whole job on one machine. The CPU engine image
(built when missing) and a tiny model made offline; two container "nodes" with distinct IPs
brought up with kit.cluster, serving the model with vLLM (TP=2 across them); one OpenAI-style
request; and the teardown."""

from __future__ import annotations

import functools
import ipaddress
import os
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kit import labels, resources
from kit.cluster import Cluster
from kit.cluster.status import render
from kit.config import KitConfig, load_config
from kit.errors import ConfigError, ImageError
from kit.net import openai as client
from kit.output import progress
from kit.plan.checks import check_image
from kit.plan.roles import Role
from kit.runtime.docker import DockerRuntime
from kit.state import state_dir

DEMO_MODEL = "kit/tiny-llama"
DEFAULT_BASE = "kit/debian-base:bookworm"
CPU_IMAGE = "kit/vllm-cpu:0.32.0"
SYSTEM_CA = Path("/etc/ssl/certs/ca-certificates.crt")
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def hf_cache_dir() -> Path:
    """The demo's own HF cache (the tiny model), under kit's state directory."""
    return state_dir() / "demo-hf"


def api_key_path() -> Path:
    """The demo server's API key file (made once, mode 600)."""
    return state_dir() / "demo-api-key"


def demo_settings(
    *, cluster: str, image: str, hf_cache: Path, api_key_file: Path, subnet: str, gpus: bool
) -> dict[str, tuple[Any, str]]:
    values: dict[str, Any] = {
        "cluster": cluster,
        "image": image,
        "backend": "mp",
        "accelerator": "gpu" if gpus else "cpu",
        "nodes": 2,
        "gpus_per_node": 1,
        "model.tp": 2,
        "model.pp": 1,
        "model.id": DEMO_MODEL,
        "model.served_name": "tiny",
        "model.max_model_len": 2048,
        "model.extra_args": ["--enforce-eager"],
        "network": f"kit-{cluster}",
        "network_subnet": subnet,
        "ipc_host": False,
        "shm_size": "2g",
        "hf_cache": str(hf_cache),
        "api_key_file": str(api_key_file),
        "env": {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
        "timeouts.join": 120,
        "timeouts.ready": 600,
    }
    return {k: (v, "kit demo") for k, v in values.items()}


def ensure_cpu_image(
    rt: DockerRuntime, tag: str, *, base_image: str | None, ca_bundle: Path | None, as_json: bool
) -> str:
    from kit import proc
    from kit.cluster.images import build_image
    from kit.images.build import plan_build_context

    if rt.image_info(tag):
        return "reused"
    base = base_image or DEFAULT_BASE
    if base == DEFAULT_BASE and not rt.image_info(base):
        progress(f"building the Debian base image {base} (debootstrap, about a minute)", as_json=as_json)
        script = resources.containers_dir() / "base" / "build-debian-base.sh"
        try:
            proc.run(["bash", str(script), base], what="building the Debian base image", timeout=1800)
        except Exception as exc:
            raise ImageError(
                f"cannot build {base}: {getattr(exc, 'message', exc)}",
                hint="run as root on Debian, or pass --base-image python:3.11-slim-bookworm",
            ) from None
    ca = ca_bundle or (SYSTEM_CA if SYSTEM_CA.is_file() else None)
    with tempfile.TemporaryDirectory(prefix="kit-wheels-") as tmp:
        wheels = resources.torch_wheelhouse(Path(tmp))
        plan = plan_build_context(
            "cpu",
            resources.container_dir("cpu"),
            probe_files=resources.probe_files(),
            tag=tag,
            ca_bundle=ca,
            wheels_dir=wheels,
            base_image=base,
            extra_args=None if wheels else {"TORCH_INDEX_URL": TORCH_INDEX},
        )
        progress(f"building {tag} (vLLM CPU build + Ray; several minutes the first time)", as_json=as_json)
        build_image(rt, rt.plan_build(plan), as_json=as_json)
    return "built"


def ensure_model(rt: DockerRuntime, image: str, hf_cache: Path) -> str:
    snapshots = hf_cache / "hub" / "models--kit--tiny-llama" / "snapshots"
    if any(snapshots.glob("*/config.json")):
        return "reused"
    hf_cache.mkdir(parents=True, exist_ok=True)
    result = rt.run_once(
        image,
        ["python3", "/opt/kit/make_tiny_model.py", "--out", "/hf/hub"],
        volumes={str(hf_cache): "/hf"},
        labels={labels.MANAGED: labels.MANAGED_TRUE, labels.DEMO: "model"},
    )
    if result.returncode != 0:
        raise ImageError("generating the tiny model failed", details=result.stderr.splitlines()[-10:])
    return "generated"


def free_subnet(used: list[str]) -> str:
    """The first 172.30.x.0/24 that overlaps no existing Docker network."""
    import ipaddress

    taken = [ipaddress.ip_network(u, strict=False) for u in used if ":" not in u]
    for third in range(77, 255):
        candidate = ipaddress.ip_network(f"172.30.{third}.0/24")
        if not any(candidate.overlaps(t) for t in taken):
            return str(candidate)
    raise ImageError("no free 172.30.x.0/24 subnet for the demo network", hint="pass --subnet")


def check_settings(*, cluster: str, image: str, subnet: str | None, gpus: bool) -> None:
    """The demo's settings checked like any kit.yaml before the first build or container: the
    same config it will load, with a stand-in subnet until a free one is picked."""
    if subnet is not None:
        try:
            net = ipaddress.ip_network(subnet, strict=False)
        except ValueError:
            raise ConfigError(
                f"{subnet!r} is not a subnet", key="--subnet", hint="e.g. --subnet 172.30.9.0/24"
            ) from None
        if net.version != 4 or net.prefixlen > 28:
            raise ConfigError(f"{subnet} is not an IPv4 /28 or wider", key="--subnet", hint="e.g. 172.30.9.0/24")
    overrides = demo_settings(
        cluster=cluster,
        image=image,
        hf_cache=hf_cache_dir(),
        api_key_file=api_key_path(),
        subnet=subnet or "172.30.0.0/24",
        gpus=gpus,
    )
    resolved = load_config(environ={}, cwd=Path("/nonexistent"), overrides=overrides)
    check_image(resolved.config, resolved.sources)


def ensure_api_key(path: Path) -> None:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(24))


STATES = ("image", "image_state", "model_state")


def prepare(
    rt: DockerRuntime, image: str, *, gpus: bool, base_image: str | None, ca_bundle: Path | None, as_json: bool
) -> dict[str, Any]:
    """Step 1: the engine image (built when missing), the tiny model and the API key."""
    progress(f"[1/5] engine image {image}", as_json=as_json)
    if gpus:
        if not rt.image_info(image):
            raise ImageError(f"{image} is not on this host", hint="build it with `kit build vllm` (or pass --image)")
        image_state = "reused"
    else:
        image_state = ensure_cpu_image(rt, image, base_image=base_image, ca_bundle=ca_bundle, as_json=as_json)
    hf_cache = hf_cache_dir()
    progress(f"[1/5] tiny model {DEMO_MODEL} in {hf_cache}", as_json=as_json)
    model_state = ensure_model(rt, image, hf_cache)
    ensure_api_key(api_key_path())
    return {"image": image, "image_state": image_state, "model_state": model_state, "hf_cache": str(hf_cache)}


def run(
    demo: Cluster,
    prompt: str,
    max_tokens: int,
    *,
    keep: bool,
    gpus: bool,
    say: Callable[[str], None],
    show: Callable[[str], None],
) -> dict[str, Any]:
    """Steps 2-4 (kit up, kit serve, kit status, kit query) on a clean slate; on any failure
    (Ctrl-C too) the cluster is removed unless `keep`. `say` hears progress lines, `show` the
    status table."""
    demo.down()  # a clean slate: leftovers of an earlier demo go
    try:
        demo.bring_up(
            on_progress=lambda line: say(f"[2/5] {line}"),
            node_progress=say,
            node_config=functools.partial(gpu_of, demo.config) if gpus else None,
        )
        say("[3/5] kit serve: vllm serve across 2 nodes (TP=2), waiting for /health")
        served = demo.serve(on_progress=say)
        say("[4/5] kit status")
        status = demo.status(ray=False)
        show(render(status))
        query = ask(served.url, demo.config.api_key_file, prompt, max_tokens)
        say(f"[4/5] kit query: {served.url}/v1/chat/completions")
    except BaseException:
        if not keep:
            say("demo failed: removing its containers (use --keep to leave them for `kit logs`)")
            demo.down()
        raise
    return {"serve": served.to_dict(), "status": status.to_dict(), "query": query}


def gpu_of(config: KitConfig, role: Role) -> KitConfig:
    """--gpus on one host: the worker gets GPU 1, the head GPU 0."""
    return config.replace(gpus="0" if role.is_head else "1")


def ask(url: str, key_file: str | None, prompt: str, max_tokens: int) -> dict[str, Any]:
    """kit query's chat, once: the answer and its numbers."""
    key = client.read_key(key_file)
    models = client.list_models(url, key)
    answer = client.chat(url, key, models[0]["id"], prompt, max_tokens=max_tokens)
    return {
        "models": [m["id"] for m in models],
        "prompt": prompt,
        "answer": answer.text,
        "finish_reason": answer.finish_reason,
        "completion_tokens": answer.completion_tokens,
        "latency_s": round(answer.latency_s, 3),
    }
