"""Where kit's non-Python files are: containers/ (Dockerfiles), the in-container probe files, and
local build inputs (a CPU torch wheel in pip's find-links folders).

An installed wheel carries containers/ as package data at kit/_containers (pyproject's hatch
force-include); a source checkout (editable install) uses the repository's top-level containers/.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from pathlib import Path

from kit import proc
from kit.errors import ImageError, KitError, UsageError

PACKAGE_DIR = Path(__file__).resolve().parent
# kit's in-container probes: plain-stdlib scripts copied to /opt/kit/probe/ by every image.
PROBE_FILES = ("probe.py", "collective.py", "latency.py")  # latency.py: collective.py loads it


def containers_dir() -> Path:
    for candidate in (PACKAGE_DIR / "_containers", PACKAGE_DIR.parent / "containers"):
        if candidate.is_dir():
            return candidate
    raise ImageError(
        "kit's containers/ folder is missing from this installation",
        hint="reinstall kit (the wheel ships it as kit/_containers)",
    )


def image_names() -> list[str]:
    """Folders under containers/ that kit can build (those with a Dockerfile)."""
    root = containers_dir()
    return sorted(p.name for p in root.iterdir() if (p / "Dockerfile").is_file())


def container_dir(name: str) -> Path:
    names = image_names()
    if name not in names:
        raise UsageError(f"no image named {name!r} under containers/", hint=f"pick one of: {', '.join(names)}")
    return containers_dir() / name


# Programs kit runs inside containers with the image's python3 (`python3 -c SOURCE ARGS...`):
# shipped as files of the package, so they are linted, typed and tested like the rest of kit
# (issue 26: no program kept in a string). Each says in its docstring what it may import.
PROGRAMS = (
    "verify/probe.py",
    "verify/collective.py",
    "verify/latency.py",  # sent after collective.py's source, as one program (issue 30)
    "cluster/ray_view.py",
    "cluster/ray_barrier.py",  # the Ray head's barrier (node_ray_head.sh.j2)
    "supervise/install.py",
    "supervise/stop.py",
    "supervise/boot.py",
    "images/vllm_probe.py",  # issue 24: the image facts probe, and the launchers' in-container check
)


@functools.cache
def program_source(name: str) -> str:
    """The text of one of PROGRAMS (kit/<name>)."""
    if name not in PROGRAMS:
        raise ValueError(f"{name} is not one of kit's in-container programs")
    try:
        return (PACKAGE_DIR / name).read_text()
    except OSError as exc:
        raise ImageError(f"kit's file {PACKAGE_DIR / name} cannot be read: {exc}", hint="reinstall kit") from None


def probe_files() -> list[Path]:
    files = [PACKAGE_DIR / "verify" / name for name in PROBE_FILES]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ImageError(f"kit's probe files are missing: {', '.join(missing)}", hint="reinstall kit")
    return files


# The CPU torch wheel the cpu image's Dockerfile installs (containers/cpu/Dockerfile).
TORCH_CPU_WHEEL = "torch-2.13.0+cpu-*.whl"


def find_links() -> list[str]:
    """pip's find-links folders: $PIP_FIND_LINKS and pip's own configuration files."""
    folders = os.environ.get("PIP_FIND_LINKS", "").split()
    try:
        listing = proc.run([sys.executable, "-m", "pip", "config", "list"], check=False, timeout=30).stdout
    except KitError:  # no pip, or it hung: no configured folders
        listing = ""
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            folders += value.strip().strip("'\"").split()
    return folders


def torch_wheelhouse(tmp: Path) -> Path | None:
    """A folder holding only the +cpu torch wheel, when pip's find-links has one (air-gapped sites
    and this project's machines); else None and the build uses PyTorch's CPU index."""
    for folder in find_links():
        if not Path(folder).is_dir():
            continue
        for wheel in sorted(Path(folder).glob(TORCH_CPU_WHEEL)):
            try:
                os.link(wheel, tmp / wheel.name)  # no copy of ~200 MB when on one filesystem
            except OSError:
                shutil.copy2(wheel, tmp / wheel.name)
            return tmp
    return None
