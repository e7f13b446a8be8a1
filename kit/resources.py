"""Where kit's non-Python files are: containers/ (Dockerfiles) and the in-container probe files.

An installed wheel carries containers/ as package data at kit/_containers (pyproject's hatch
force-include); a source checkout (editable install) uses the repository's top-level containers/.
"""

from __future__ import annotations

from pathlib import Path

from kit.errors import ImageError, UsageError

PACKAGE_DIR = Path(__file__).resolve().parent
# kit's in-container probes: plain-stdlib scripts copied to /opt/kit/probe/ by every image.
PROBE_FILES = ("probe.py", "collective.py")


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


def probe_files() -> list[Path]:
    files = [PACKAGE_DIR / "verify" / name for name in PROBE_FILES]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ImageError(f"kit's probe files are missing: {', '.join(missing)}", hint="reinstall kit")
    return files
