#!/usr/bin/env python3
"""Regenerate containers/<name>/kit-<name>.def from containers/<name>/Dockerfile.

The definition bootstraps from the Docker image `kit build` makes (docker-daemon) and carries the
Dockerfile's final-stage environment, labels and command (kit.runtime.apptainer explains why the
build steps themselves are not converted). tests/unit/test_apptainer.py fails when a .def is
stale. Usage: containers/make-defs.py [--check]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from kit.runtime.apptainer import definition_from_dockerfile  # noqa: E402

# containers/<name>/ -> (repository, the Dockerfile ARG whose default is the tag): as `kit build`.
IMAGES = {"cpu": ("kit/vllm-cpu", "VLLM_CPU_VERSION"), "vllm": ("kit/vllm", "VLLM_TAG")}


def expected() -> dict[Path, str]:
    out = {}
    for name, (repository, tag_arg) in IMAGES.items():
        dockerfile = HERE / name / "Dockerfile"
        text = dockerfile.read_text()
        match = re.search(rf"^\s*ARG\s+{tag_arg}=(\S+)", text, re.MULTILINE)
        tag = match.group(1).strip("\"'") if match else "latest"
        source = f"containers/{name}/Dockerfile"
        out[HERE / name / f"kit-{name}.def"] = definition_from_dockerfile(
            text, image=f"{repository}:{tag}", source=source
        )
    return out


def main(argv: list[str]) -> int:
    stale = []
    for path, text in expected().items():
        current = path.read_text() if path.exists() else None
        if current != text:
            stale.append(path)
            if "--check" not in argv:
                path.write_text(text)
    verb = "stale" if "--check" in argv else "wrote"
    for path in stale:
        print(f"{verb} {path.relative_to(HERE.parent)}")
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
