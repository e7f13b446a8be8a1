"""The engine image the benchmarks run on: $KIT_TEST_IMAGE, else the demo's image, which
`kit demo --prepare-only` (or `bash deploy/demo.sh`) builds on a fresh clone. A missing image
stops the benchmark with that fix, instead of the engine trying to pull it from a registry."""

from __future__ import annotations

import os
import subprocess
import sys

from kit.demo import CPU_IMAGE


def default_image() -> str:
    return os.environ.get("KIT_TEST_IMAGE", CPU_IMAGE)


def require_image(image: str) -> None:
    found = subprocess.run(["docker", "image", "inspect", image], capture_output=True, check=False)
    if found.returncode != 0:
        sys.exit(f"image {image} is not on this host: build it with `kit demo --prepare-only`, or pass --image")
