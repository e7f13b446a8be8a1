"""`kit verify --image IMAGE`: validate an image without a cluster (for CI).

The node probe runs in a throwaway container (`docker run --rm --entrypoint python3 IMAGE -c
<probe> --image-checks`, through the Docker adapter's CLI helper: --docker names the binary);
the judgement is a pure function of what it printed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from kit.runtime.docker_cli import DockerCli
from kit.verify.policy import FAIL, PASS, WARN, Check
from kit.verify.report import VerifyResult
from kit.verify.runner import parse_probe_output, probe_source


def image_probe_argv(image: str, *, docker: str = "docker", gpus: bool = False) -> list[str]:
    """The docker CLI argv that runs the probe once in a throwaway container."""
    return DockerCli(docker).run_argv(image, ["-c", probe_source(), "--image-checks"], entrypoint="python3", gpus=gpus)


def run_image_probe(image: str, *, docker: str = "docker", gpus: bool = False, timeout: float = 600) -> dict[str, Any]:
    argv = image_probe_argv(image, docker=docker, gpus=gpus)
    shown = [*argv[:-3], "<probe>", "--image-checks"]
    result = DockerCli(docker).run(argv, shown=shown, timeout=timeout)
    return parse_probe_output("image", result, shown)


def image_digest(image: str, *, docker: str = "docker") -> str | None:
    """The image's repo digest if it has one, else its local id."""
    return DockerCli(docker).image_digest(image)


def check_image(facts: Mapping[str, Any]) -> list[Check]:
    """Imports, versions, `vllm serve --help`, RDMA userland and kit's probe files."""
    image = facts.get("image") or {}
    checks: list[Check] = []
    imports = image.get("imports") or {}
    for mod in ("torch", "vllm", "ray"):
        res = imports.get(mod) or {}
        if res.get("ok"):
            version = (facts.get("versions") or {}).get(mod)
            checks.append(Check(f"import.{mod}", PASS, f"import {mod} ({version})"))
        else:
            status = WARN if mod == "ray" else FAIL  # the mp backend needs no Ray
            checks.append(
                Check(
                    f"import.{mod}",
                    status,
                    f"import {mod} failed: {res.get('error')}",
                    f"install {mod} in the image" + (" (needed for the Ray backend)" if mod == "ray" else ""),
                )
            )
    versions = facts.get("versions") or {}
    shown = ", ".join(f"{k} {v}" for k, v in versions.items() if v and k != "image_digest")
    checks.append(Check("versions", PASS, shown or "no versions found"))
    serve = image.get("vllm_serve_help") or {}
    if serve.get("ok"):
        checks.append(Check("vllm.serve_help", PASS, "`vllm serve --help` works"))
    else:
        checks.append(
            Check(
                "vllm.serve_help",
                FAIL,
                f"`vllm serve --help` failed: {serve.get('error')}",
                "fix the vllm install in the image",
            )
        )
    userland = (facts.get("infiniband") or {}).get("userland") or {}
    missing = [lib for lib, path in userland.items() if not path]
    torch = facts.get("torch") or {}
    if missing and torch.get("importable") and not torch.get("cuda"):
        # A CPU build of torch runs Gloo over TCP: NCCL, and so RDMA, is never used.
        checks.append(Check("rdma.userland", PASS, f"CPU-only torch {torch.get('version')}: RDMA userland not needed"))
    elif missing:
        checks.append(
            Check(
                "rdma.userland",
                WARN,
                f"{', '.join(missing)} missing: NCCL cannot use InfiniBand/RoCE from this image",
                "install rdma-core (libibverbs1, ibverbs-providers) in the image",
            )
        )
    else:
        checks.append(Check("rdma.userland", PASS, "libibverbs and libmlx5 present"))
    files = image.get("probe_files") or {}
    absent = [name for name, present in files.items() if not present]
    if absent:
        checks.append(
            Check(
                "kit.probe_files",
                WARN,
                f"{', '.join(absent)} not in the image (kit passes them with -c instead)",
                "build the image with `kit build`",
            )
        )
    else:
        checks.append(Check("kit.probe_files", PASS, "kit probe files present"))
    return checks


def verify_image(image: str, *, docker: str = "docker", gpus: bool = False) -> VerifyResult:
    started = time.monotonic()
    facts = run_image_probe(image, docker=docker, gpus=gpus)
    facts.setdefault("versions", {})["image_digest"] = image_digest(image, docker=docker)
    return VerifyResult(
        mode="image",
        checks=check_image(facts),
        nodes={image: facts},
        target=image,
        wall_s=round(time.monotonic() - started, 2),
    )
