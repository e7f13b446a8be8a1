"""The supervise bundle: the in-container half of kit/supervise as one zip file that `python3`
runs (a zipapp), built from kit's own sources. It travels as data: written into each node
container by `kit serve --supervise`, carried by the SLURM launcher as one base64 word. Only the
standard library and the pure modules listed here go in (tests/unit/test_supervise_bundle.py runs
it with `python3 -I -S`, without site-packages), so any image with a python3 runs it.

Built byte for byte the same from the same sources (fixed dates, sorted names), so a launcher
rendered twice is the same text.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from functools import lru_cache
from pathlib import Path

from kit import __version__

KIT_DIR = Path(__file__).resolve().parents[1]
# Modules shipped, as paths under kit/ (every import they make is here or in the standard library).
MODULES = (
    "errors.py",
    "health/__init__.py",
    "health/prometheus.py",
    "health/liveness.py",
    "net/__init__.py",
    "net/http.py",
    "net/wire.py",
    "safe/__init__.py",
    "safe/files.py",
    "safe/text.py",
    "safeload.py",
    "supervise/__init__.py",
    "supervise/agent.py",
    "supervise/cause.py",
    "supervise/control.py",
    "supervise/coordinator.py",
    "supervise/events.py",
    "supervise/main.py",
    "supervise/policy.py",
    "supervise/procs.py",
    "supervise/ray_alive.py",
    "supervise/protocol.py",
    "supervise/watch.py",
)
_DATE = (1980, 1, 1, 0, 0, 0)


@lru_cache(maxsize=1)
def build() -> bytes:
    """The zip file's bytes."""
    files = {
        "__main__.py": (KIT_DIR / "supervise" / "__main__.py").read_text(),
        "kit/__init__.py": f'"""kit\'s supervise bundle (kit {__version__})."""\n\n__version__ = "{__version__}"\n',
    }
    for module in MODULES:
        files[f"kit/{module}"] = (KIT_DIR / module).read_text()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, files[name])
    return out.getvalue()


def encoded() -> str:
    """The bundle as base64 text: one shell word of [A-Za-z0-9+/=] only."""
    return base64.b64encode(build()).decode("ascii")


def digest() -> str:
    return hashlib.sha256(build()).hexdigest()[:16]
