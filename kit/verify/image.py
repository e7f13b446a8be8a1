"""`kit verify --image IMAGE [--config kit.yaml]`: validate an image without a cluster (for CI):
"will this cluster config start on this image?" (issue 24).

Two probes run in throwaway containers (`docker run --rm --network none --entrypoint python3
IMAGE -c <probe> ...`, through the Docker adapter's CLI helper: --docker names the binary): the
node probe (imports, RDMA userland, kit's files) and the image facts probe (vLLM version, its
`vllm serve` parser, Ray, torch/CUDA/NCCL, user), whose facts kit records by the image's id like
`kit pull` does. With a config, its plan is checked against them: every `vllm serve` option and
choice, Ray for backend: ray, and the rest of the plan. The judgement is pure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from kit.config import KitConfig
from kit.errors import ConfigError, ImageError
from kit.images import records
from kit.images.facts import ImageFacts, parse_output, probe_source
from kit.plan import checks as plan_checks
from kit.plan import image_check
from kit.runtime.docker_cli import DockerCli
from kit.verify.policy import FAIL, PASS, WARN, Check
from kit.verify.report import VerifyResult
from kit.verify.runner import parse_probe_output
from kit.verify.runner import probe_source as node_probe_source

PlanCheck = tuple[KitConfig, Mapping[str, str]]  # a resolved config and where each value came from


def image_probe_argv(image: str, *, docker: str = "docker", gpus: bool = False) -> list[str]:
    """The docker CLI argv that runs the probe once in a throwaway container."""
    return DockerCli(docker).run_argv(
        image, ["-c", node_probe_source(), "--image-checks"], entrypoint="python3", gpus=gpus
    )


def run_image_probe(image: str, *, docker: str = "docker", gpus: bool = False, timeout: float = 600) -> dict[str, Any]:
    argv = image_probe_argv(image, docker=docker, gpus=gpus)
    shown = [*argv[:-3], "<probe>", "--image-checks"]
    result = DockerCli(docker).run(argv, shown=shown, timeout=timeout)
    return parse_probe_output("image", result, shown)


def run_facts_probe(image: str, *, docker: str = "docker", timeout: float = 900) -> ImageFacts:
    """The image facts probe, its facts recorded by the image's id (kit.images.records)."""
    cli = DockerCli(docker)
    argv = cli.run_argv(image, ["-c", probe_source(), "facts"], entrypoint="python3")
    shown = [*argv[:-3], "<image facts probe>", "facts"]
    result = cli.run(argv, shown=shown, timeout=timeout)
    if result.returncode != 0:
        tail = [ln for ln in (result.stderr or result.stdout).strip().splitlines() if ln.strip()][-8:]
        raise ImageError(f"the image facts probe failed in {image} (exit {result.returncode})", details=tail)
    data = parse_output(result.stdout, image=image)
    key = records.facts_key(cli.image_digest(image) or "")  # its repo digest, else its id
    if key is None:
        return ImageFacts(data, "", image)
    records.save_facts(key, data, image=image)
    found = ImageFacts(data, key, image)
    version = (
        {"vllm_version": found.vllm_version, "vllm_version_from": "the image's probe"} if found.vllm_version else {}
    )
    records.link_facts(image, key, image_id=key, **version)
    return found


def check_facts(facts: ImageFacts) -> list[Check]:
    """What the facts say on their own: the parser was read, the versions, Ray, the user."""
    checks: list[Check] = []
    if facts.serve is None:
        error = (facts.data.get("vllm") or {}).get("error") or "no parser"
        checks.append(
            Check("vllm.parser", FAIL, f"`vllm serve`'s parser could not be built: {error}", "fix vLLM in the image")
        )
    else:
        count = len(facts.serve.get("options", []))
        checks.append(Check("vllm.parser", PASS, f"vLLM {facts.vllm_version}: `vllm serve` has {count} options"))
    shown = ", ".join(f"{k} {v}" for k, v in facts.versions().items() if v)
    checks.append(Check("image.versions", PASS, shown or "no versions found"))
    if facts.has_ray:
        checks.append(
            Check("image.ray", PASS, f"Ray {(facts.data.get('ray') or {}).get('version')} (backend: ray possible)")
        )
    else:
        checks.append(Check("image.ray", PASS, "no Ray: backend mp only (`kit build ray` adds it)"))
    name, home = facts.user()
    checks.append(Check("image.user", PASS, f"runs as {name} (home {home})"))
    return checks


def check_plan(facts: ImageFacts, plan: PlanCheck | None) -> list[Check]:
    """With a config: its plan against the image (kit.plan.image_check), one row each."""
    if plan is None:
        return []
    config, sources = plan
    rows: list[Check] = []
    if config.backend == "ray":
        why = facts.ray_problem()
        status, text = (FAIL, why) if why else (PASS, "the image has Ray for backend: ray")
        rows.append(Check("plan.ray", status, text or "", image_check.ray_fix(config) if why else None))
    else:
        rows.append(Check("plan.ray", PASS, "backend mp: Ray not needed"))
    steps: list[tuple[str, Callable[[], None]]] = [
        ("plan.serve_options", lambda: image_check.check_serve_options(config, sources, facts)),
        ("plan.config", lambda: plan_checks.check_config(config, sources)),
    ]
    for name, check in steps:
        try:
            check()
        except ConfigError as err:
            rows.append(Check(name, FAIL, err.message, err.hint))
            continue
        rows.append(Check(name, PASS, _passed(name, config)))
    return rows


def _passed(name: str, config: KitConfig) -> str:
    if name == "plan.serve_options":
        layout = f"TP={config.tp} PP={config.pp} DP={config.dp}"
        return f"every `vllm serve` option of the {config.backend} plan ({layout}) is accepted by the image"
    return "the plan's own checks pass"


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


def verify_image(
    image: str,
    *,
    docker: str = "docker",
    gpus: bool = False,
    plan: Callable[[], PlanCheck] | None = None,
) -> VerifyResult:
    """`plan`: resolves the config once the image's facts are recorded (they shape the plan)."""
    started = time.monotonic()
    facts = run_image_probe(image, docker=docker, gpus=gpus)
    facts.setdefault("versions", {})["image_digest"] = image_digest(image, docker=docker)
    checks = check_image(facts)
    try:
        image_facts = run_facts_probe(image, docker=docker)
    except ImageError as err:
        shown = f"{err.message}: {' | '.join(err.details[-3:])}" if err.details else err.message
        checks.append(Check("vllm.parser", FAIL, shown, "fix vLLM in the image (does `vllm serve --help` work?)"))
    else:
        checks += check_facts(image_facts) + check_plan(image_facts, plan() if plan else None)
    return VerifyResult(
        mode="image",
        checks=checks,
        nodes={image: facts},
        target=image,
        wall_s=round(time.monotonic() - started, 2),
    )
