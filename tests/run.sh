#!/usr/bin/env bash
# kit's test command (the README names it; .ci/run calls it).
#
#   bash tests/run.sh          set up and run everything: lint, types, unit tests, then the real
#                              tiers (Docker engine, local registry, Ray, vLLM CPU build, SLURM)
#   bash tests/run.sh unit     lint, types and unit tests only (no root, no Docker needed)
#
# The full run needs root on Debian/Ubuntu (it installs docker.io, debootstrap, docker-registry,
# slurm-wlm and munge when missing, and starts their daemons). Images are cached by tag, so a
# second run skips the builds.
set -euo pipefail
cd "$(dirname "$0")/.."
tier="${1:-all}"
# Bytecode is written (into .gitignore'd __pycache__): the tests start `python -m kit` hundreds
# of times and pytest rewrites each test module in every worker; where PYTHONDONTWRITEBYTECODE is
# set (as on this machine), each would compile it all again.
unset PYTHONDONTWRITEBYTECODE

step() { printf '\n=== %s\n' "$*"; }

step "venv and kit with its dev tools"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[dev]'
export PATH="$PWD/.venv/bin:$PATH"

step "lint and types"
ruff check kit tests benchmarks containers
ruff format --check kit tests benchmarks containers
mypy

# The unit tier runs on pytest-xdist (its tests share no state), two workers a core: many of its
# tests wait on a deadline rather than compute (2 cores: 74 s with 4 workers, 77 s with 6). The
# bad-input corpus is one group (--dist loadgroup): one worker runs its ~200 forked kit runs once.
# The real tiers below run one test at a time, as their clusters share the cores and subnets.
step "unit tests"
start=$SECONDS
pytest tests/unit -n "$(( $(nproc) * 2 ))" --dist loadgroup --durations=10
echo "unit tier: $((SECONDS - start)) s"
if [ "$tier" = "unit" ]; then
    exit 0
fi

step "Docker engine"
bash tests/infra/docker-engine.sh

step "engine image and tiny model (kit demo --prepare-only; cached by tag)"
kit demo --prepare-only
# The integration tests name the image kit/vllm-cpu:test; it is the demo's image.
docker tag kit/vllm-cpu:0.32.0 kit/vllm-cpu:test
# The Ray tests run on that image with Ray layered on by kit itself (issue 24: kit's images, like
# vLLM's since 0.18.0, carry no Ray); built once, cached by tag.
step "the Ray test image (kit build ray; cached by tag)"
if ! docker image inspect kit/vllm-cpu:test-ray >/dev/null 2>&1; then
    start=$SECONDS
    kit build ray --base-image kit/vllm-cpu:test --tag kit/vllm-cpu:test-ray
    echo "kit build ray: $((SECONDS - start)) s"
fi

# The replica tests (issue 29) put vLLM's router in front of two replicas: kit build router, the
# vllm-router wheel fetched by the host's pip (its index and CA settings), the build itself offline
# from it; built once, cached by tag (the tag is config key router.image's default).
step "the router image (kit build router; cached by tag)"
if ! docker image inspect kit/vllm-router:0.1.17 >/dev/null 2>&1; then
    start=$SECONDS
    wheels="$(mktemp -d)"
    python -m pip download --quiet --no-deps -d "$wheels" vllm-router==0.1.17
    kit build router --wheels "$wheels" --offline
    rm -rf "$wheels"
    echo "kit build router: $((SECONDS - start)) s"
fi

step "local registry and SLURM"
bash tests/infra/registry.sh
bash tests/infra/slurm.sh

step "tests: integration (real Docker, registry, Ray, vLLM), slurm (real SLURM)"
export KIT_REQUIRE_DOCKER=1 KIT_REQUIRE_SLURM=1
start=$SECONDS
pytest tests/integration tests/slurm --durations=30 "${@:2}"
echo "integration and slurm tiers: $((SECONDS - start)) s"
