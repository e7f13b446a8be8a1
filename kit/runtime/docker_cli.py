"""The docker command line, for the one place the user names the binary (`kit verify --image
--docker BIN`): argv built here and run through kit.proc. Split from kit/runtime/docker.py (the
engine API adapter) for size; with it, the only modules that run Docker."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from kit import proc
from kit.errors import CommandError
from kit.runtime.base import ExecResult


@dataclass(frozen=True)
class DockerCli:
    """The docker CLI, for the one place the user names the binary (`kit verify --image
    --docker BIN`): argv built here, run through kit.proc."""

    binary: str = "docker"

    def run_argv(
        self, image: str, argv: Sequence[str], *, entrypoint: str, network: str = "none", gpus: bool = False
    ) -> list[str]:
        """`docker run --rm` of a throwaway container that runs `entrypoint argv...`."""
        words = [self.binary, "run", "--rm", "--network", network, "--entrypoint", entrypoint]
        if gpus:
            words += ["--gpus", "all"]
        return [*words, image, *argv]

    def run(self, argv: Sequence[str], *, shown: Sequence[str], timeout: float) -> ExecResult:
        """Run a run_argv() command to completion. Docker's own failure (exit 125: no such image,
        daemon down, …) is a CommandError; the container's exit code is the caller's to judge."""
        result = proc.run(argv, shown=shown, check=False, timeout=timeout)
        if result.returncode == 125:
            raise CommandError(
                f"{self.binary} could not run the container",
                argv=shown,
                returncode=125,
                stderr=result.stderr,
                hint="build or pull the image first",
            )
        return ExecResult(result.returncode, result.stdout, result.stderr)

    def image_digest(self, image: str) -> str | None:
        """The image's repo digest if it has one, else its local id (None: no such image)."""
        argv = [self.binary, "image", "inspect", "--format", "{{json .RepoDigests}} {{.Id}}", image]
        result = proc.run(argv, check=False, timeout=60)
        if result.returncode != 0 or not result.stdout.strip():
            return None
        digests, _, image_id = result.stdout.strip().rpartition(" ")
        repo = json.loads(digests or "null") or []
        return str(repo[0]) if repo else image_id
