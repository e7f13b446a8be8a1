"""The enroot adapter: the only module that runs `enroot` (issue 20). kit drives enroot for images
only: under pyxis and the CSCS EDF, srun starts the containers (kit.plan.slurm_enroot), so there
is no container runtime to drive from here.

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

import datetime as dt
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kit import __version__, proc
from kit.config import KitConfig
from kit.errors import CommandError, ImageError, ImageRefError, RuntimeUnavailable
from kit.plan.container_args import enroot_image
from kit.runtime.apptainer import partial_file

_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
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
    text, _, digest = ref.removeprefix("docker://").partition("@")
    if digest:
        text += "_" + digest.replace(":", "-")[:19]
    elif ":" not in text.rsplit("/", 1)[-1]:
        text += ":latest"
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text.replace(":", "_")).strip("._")
    return f"{name}.sqsh"


class EnrootRuntime:
    """Image operations through the enroot CLI (kit.proc: argv lists, a child killed on Ctrl-C)."""

    name = "enroot"

    def __init__(
        self, config: KitConfig | None = None, *, binary: str | None = None, environ: Mapping[str, str] | None = None
    ) -> None:
        self.binary = binary or find_binary()
        self.config = config
        self.environ = dict(os.environ if environ is None else environ)

    def _run(self, args: list[str], *, what: str) -> Any:
        return proc.run([self.binary, *args], env=self.environ, what=what)

    def digest(self, uri: str) -> str | None:
        """`enroot digest URI` (enroot 4): the manifest digest; None where enroot has no such command."""
        try:
            result = self._run(["digest", uri], what=f"{self.binary} digest")
        except CommandError as err:
            if re.search(r"usage|unknown|invalid command", err.stderr, re.IGNORECASE):
                return None  # enroot 3
            raise ImageError(f"cannot resolve {uri}", details=err.details, hint=_pull_hint(err.stderr)) from None
        found = _DIGEST_RE.search(result.stdout)
        return found.group(0) if found else None

    def pull(self, ref: str, *, image_dir: str, on_progress: Callable[[str], None]) -> dict[str, Any]:
        """`enroot import` `ref` into `image_dir/<sqsh_name(ref)>`, atomically (see the module).

        Returns {"path": the squashfs, "source": the imported URI, "digest": "sha256:…" or None,
        "digest_source": "reference" | "enroot digest" | None, "size": bytes, "seconds": duration,
        "metadata": the JSON record written beside the file} — the keys of ApptainerRuntime.pull.
        """
        uri = import_uri(ref)
        dest = Path(image_dir).expanduser() / sqsh_name(ref)
        started = time.monotonic()
        pinned = _DIGEST_RE.search(uri.rpartition("@")[2]) if "@" in uri else None
        digest, where = (pinned.group(0), "reference") if pinned else (None, None)
        source = uri
        if digest is None:
            on_progress(f"resolving the digest of {uri}")
            digest = self.digest(uri)
            if digest is None:
                on_progress("no `enroot digest` here (enroot < 4): no digest is recorded (pin IMAGE@sha256:…)")
            else:
                where, source = "enroot digest", f"{uri}@{digest}"  # import exactly what the digest names
        with partial_file(dest) as partial:
            partial.unlink(missing_ok=True)  # enroot refuses an existing output file
            on_progress(f"importing {source} -> {dest} (enroot downloads the layers, then builds a squashfs)")
            try:
                self._run(["import", "--output", str(partial), source], what=f"{self.binary} import")
            except CommandError as err:
                raise ImageError(
                    f"import of {source} failed (exit {err.returncode})",
                    details=err.details,
                    hint=_pull_hint(err.stderr),
                ) from None
            if not partial.is_file() or partial.stat().st_size == 0:
                raise ImageError(f"import of {source} wrote no file", hint="retry; check disk space")
            partial.replace(dest)
        meta = dest.with_name(dest.name + ".json")
        result: dict[str, Any] = {
            "path": str(dest),
            "source": source,
            "digest": digest,
            "digest_source": where,
            "size": dest.stat().st_size,
            "seconds": round(time.monotonic() - started, 1),
            "metadata": str(meta),
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "kit_version": __version__,
        }
        meta.write_text(json.dumps(result, indent=2) + "\n")
        on_progress(f"{dest}: {result['size'] / 1e9:.2f} GB in {result['seconds']} s, digest {digest or 'unknown'}")
        return result


def _pull_hint(stderr: str) -> str:
    text = stderr.lower()
    if "no space left" in text:
        return "free space where enroot works (ENROOT_CACHE_PATH, ENROOT_TEMP_PATH) and in the image folder"
    if "401" in text or "unauthorized" in text or "denied" in text:
        return f"check the image name and the registry credentials in {CREDENTIALS}"
    if "404" in text or "not found" in text or "manifest unknown" in text:
        return "check the image name and tag"
    return "check the reference, network access to the registry, and free space (ENROOT_CACHE_PATH)"
