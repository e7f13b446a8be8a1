"""The enroot adapter: the only module that runs `enroot` (issue 20). kit drives enroot for images
only: under pyxis and the CSCS EDF, srun starts the containers (kit.plan.slurm_enroot), so enroot
is an ImageStore here and no ContainerRuntime.

- `enroot import -o OUT docker://[USER@][REGISTRY#]IMAGE[:TAG]` writes a squashfs file. It
  refuses an existing OUT and writes OUT in place, so a killed import would leave a file that
  looks finished: kit imports to a hidden temporary name in the same folder and renames it only
  on success (a failure or Ctrl-C removes it; a SIGKILL leaves only the hidden `.NAME.partial-PID`).
- Registry credentials: `$ENROOT_CONFIG_PATH/.credentials`, netrc format (default
  ~/.config/enroot/.credentials), e.g. `machine nvcr.io login $oauthtoken password <key>` (NGC
  also needs the same line for authn.nvidia.com). kit never reads or passes them.
- The source digest: a reference pinned by digest gives it; otherwise `enroot digest URI`
  (enroot 4) prints the registry's manifest digest for this host's architecture, and kit pins the
  import to it (what the file holds is what the digest names). enroot 3 has no `digest` command:
  then no digest is recorded (digest_source None) and the pull says so.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kit import proc
from kit.errors import CommandError, ImageError, ImageRefError, RuntimeUnavailable
from kit.plan.container_args import enroot_image
from kit.runtime import files
from kit.runtime.base import ImageInfo, ImageStore, OnProgress, Progress, PullPlan, PullResult

CREDENTIALS = "$ENROOT_CONFIG_PATH/.credentials (netrc format; default ~/.config/enroot/.credentials)"


def find_binary() -> str:
    if shutil.which("enroot"):
        return "enroot"
    raise RuntimeUnavailable(
        "`enroot` is not on PATH",
        hint="install enroot (github.com/NVIDIA/enroot) or run kit pull on a node that has it",
    )


def import_uri(ref: str) -> str:
    """docker://[REGISTRY#]IMAGE[:TAG|@DIGEST] for a Docker reference (the `#` separates the registry)."""
    if ref.startswith("/"):
        raise ImageRefError(
            f"{ref!r} is already a file: there is nothing to import",
            key="image",
            hint="give a Docker reference such as nvcr.io/nvidia/vllm:25.01-py3",
        )
    return "docker://" + enroot_image(ref)


def sqsh_name(ref: str) -> str:
    """A file name for a reference: nvcr.io/nvidia/vllm:25.01-py3 -> nvcr.io_nvidia_vllm_25.01-py3.sqsh."""
    return files.image_file_name(ref, ".sqsh")


class EnrootImages(ImageStore):
    """Squashfs images through the enroot CLI (kit.proc: argv lists, a child killed on Ctrl-C).
    The binary is looked up on first use, so planning (--dry-run) works without enroot."""

    name = "enroot"

    def __init__(
        self,
        image_dir: str = "~/.local/share/kit/images",
        *,
        binary: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.image_dir = image_dir
        self._binary = binary
        self.environ = dict(os.environ if environ is None else environ)

    @property
    def binary(self) -> str:
        if self._binary is None:
            self._binary = find_binary()
        return self._binary

    def _run(self, args: list[str], *, what: str) -> Any:
        return proc.run([self.binary, *args], env=self.environ, what=what)

    def image_path(self, ref: str) -> Path:
        """The squashfs a reference means here: a path as given, else <image_dir>/<sqsh_name(ref)>."""
        if ref.startswith("/") or ref.endswith(".sqsh"):
            return Path(ref).expanduser()
        return Path(self.image_dir).expanduser() / sqsh_name(ref)

    def image_info(self, ref: str) -> ImageInfo | None:
        return files.file_info(ref, self.image_path(ref))

    def remove_image(self, ref: str) -> bool:
        return files.remove_file(self.image_path(ref))

    def plan_pull(self, ref: str) -> PullPlan:
        """`enroot import --output SQSH URI` into <image_dir>/<sqsh_name(ref)>. The import runs
        under a temporary name; an unpinned reference is first resolved (`enroot digest`) and the
        import pinned to that digest (see pull)."""
        uri = import_uri(ref)  # refuses a file and a malformed reference
        dest = Path(self.image_dir).expanduser() / sqsh_name(ref)
        argv = ("enroot", "import", "--output", str(dest), uri)
        return PullPlan(ref=ref, runtime=self.name, source=uri, destination=str(dest), argv=argv)

    def digest(self, uri: str) -> str | None:
        """`enroot digest URI` (enroot 4): the manifest digest; None where enroot has no such command."""
        try:
            result = self._run(["digest", uri], what=f"{self.binary} digest")
        except CommandError as err:
            if re.search(r"usage|unknown|invalid command", err.stderr, re.IGNORECASE):
                return None  # enroot 3
            raise ImageError(f"cannot resolve {uri}", details=err.details, hint=_pull_hint(err.stderr)) from None
        found = files.DIGEST_RE.search(result.stdout)
        return found.group(0) if found else None

    def pull(self, plan: PullPlan, *, on_progress: OnProgress) -> PullResult:
        """Run the planned import atomically (see the module). The result's digest is "" when
        this enroot cannot resolve one (nothing is then recorded)."""
        dest = Path(plan.destination)
        started = time.monotonic()
        uri = plan.source
        pinned = files.DIGEST_RE.search(uri.rpartition("@")[2]) if "@" in uri else None
        digest, where = (pinned.group(0), "reference") if pinned else (None, None)
        source = uri
        if digest is None:
            on_progress(Progress(f"resolving the digest of {uri}"))
            digest = self.digest(uri)
            if digest is None:
                on_progress(
                    Progress("no `enroot digest` here (enroot < 4): no digest is recorded (pin IMAGE@sha256:…)")
                )
            else:
                where, source = "enroot digest", f"{uri}@{digest}"  # import exactly what the digest names
        with files.partial_file(dest) as partial:
            partial.unlink(missing_ok=True)  # enroot refuses an existing output file
            on_progress(Progress(f"importing {source} -> {dest} (enroot downloads the layers, then builds a squashfs)"))
            argv = [str(partial) if word == plan.destination else word for word in plan.argv]
            argv = [source if word == uri else word for word in argv]
            try:
                self._run(argv[1:], what=f"{self.binary} import")
            except CommandError as err:
                raise ImageError(
                    f"import of {source} failed (exit {err.returncode})",
                    details=err.details,
                    hint=_pull_hint(err.stderr),
                ) from None
            if not partial.is_file() or partial.stat().st_size == 0:
                raise ImageError(f"import of {source} wrote no file", hint="retry; check disk space")
            partial.replace(dest)
        record = files.write_record(dest, source, {}, started, digest=(digest, where))
        shown = f"{record.size / 1e9:.2f} GB in {record.seconds} s, digest {digest or 'unknown'}"
        on_progress(Progress(f"{dest}: {shown}"))
        return PullResult(ref=plan.ref, runtime=self.name, digest=digest or "", seconds=record.seconds, file=record)


def _pull_hint(stderr: str) -> str:
    text = stderr.lower()
    if "no space left" in text:
        return "free space where enroot works (ENROOT_CACHE_PATH, ENROOT_TEMP_PATH) and in the image folder"
    if "401" in text or "unauthorized" in text or "denied" in text:
        return f"check the image name and the registry credentials in {CREDENTIALS}"
    if "404" in text or "not found" in text or "manifest unknown" in text:
        return "check the image name and tag"
    return "check the reference, network access to the registry, and free space (ENROOT_CACHE_PATH)"
