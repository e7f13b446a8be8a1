"""A FAKE of pyxis and of the CSCS Container Engine as `srun` sees them, for kit's tests (issue 20).

Neither enroot nor pyxis nor the Container Engine can be installed on these machines, so the
tests check the options kit gives srun against what pyxis itself accepts: the option table pyxis
registers (NVIDIA/pyxis args.c: spank_opts), each value parsed the way pyxis parses it
(`--container-mounts` is a comma list of SRC:DST[:FLAGS], flags joined with '+', SRC a path (or
tmpfs/umount), DST a path, each entry handed to enroot's fstab-like mount list, where a blank
splits it; `--container-env` is a comma list of variable names whose values come from srun's
environment), and the keys of an environment definition file (docs.cscs.ch, EDF reference). Any
other `--container-*` option is refused, as srun refuses an option no plugin registered. It does
not start containers: tests/unit/shellstubs.py emulates one (mounts mapped into a private root),
tests/slurm runs the step on the host with the real srun.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# pyxis' options: name -> whether it takes a value (args.c, pyxis 0.20).
PYXIS_OPTIONS = {
    "--container-image": True,
    "--container-mounts": True,
    "--container-workdir": True,
    "--container-name": True,
    "--container-save": True,
    "--container-env": True,
    "--container-mount-home": False,
    "--no-container-mount-home": False,
    "--container-remap-root": False,
    "--no-container-remap-root": False,
    "--container-entrypoint": False,
    "--no-container-entrypoint": False,
    "--container-entrypoint-log": False,
    "--container-writable": False,
    "--container-readonly": False,
}
EXCLUSIVE = [
    ("--container-mount-home", "--no-container-mount-home"),
    ("--container-remap-root", "--no-container-remap-root"),
    ("--container-entrypoint", "--no-container-entrypoint"),
    ("--container-writable", "--container-readonly"),
]
MOUNT_FLAGS = {"ro", "rw", "bind", "rbind", "private", "rprivate", "slave", "rslave", "nosuid", "nodev", "noexec"}
# The EDF's entries and their TOML types (docs.cscs.ch/software/container-engine/edf).
EDF_KEYS: dict[str, tuple[type, ...]] = {
    "base_environment": (str, list),
    "image": (str,),
    "workdir": (str,),
    "entrypoint": (bool,),
    "writable": (bool,),
    "mounts": (list,),
    "env": (dict,),
    "annotations": (dict,),
}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Invalid(Exception):
    """What pyxis (or the Container Engine) would refuse: srun fails before any task starts."""


@dataclass
class Mount:
    source: str
    target: str
    flags: tuple[str, ...] = ()


@dataclass
class Step:
    """One srun call: srun's own options, pyxis' options, the EDF (if any), the command."""

    srun: list[str] = field(default_factory=list)
    pyxis: dict[str, str | None] = field(default_factory=dict)
    environment: str | None = None
    command: list[str] = field(default_factory=list)

    @property
    def container(self) -> bool:
        return bool(self.pyxis) or self.environment is not None


def parse(argv: list[str]) -> Step:
    """srun's options up to the command. Options are `--name[=value]` (kit attaches every value)."""
    step = Step()
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        name, eq, value = argv[i].partition("=")
        if name.startswith(("--container", "--no-container")):
            if name not in PYXIS_OPTIONS:
                raise Invalid(f"srun: unrecognized option '{argv[i]}' (pyxis has no {name})")
            if PYXIS_OPTIONS[name] != bool(eq):
                raise Invalid(f"pyxis: {name}: {'argument required' if PYXIS_OPTIONS[name] else 'takes no argument'}")
            if name in step.pyxis and step.pyxis[name] != (value if eq else None):
                raise Invalid(f"pyxis: {name} specified multiple times")
            step.pyxis[name] = value if eq else None
        elif name == "--environment":
            step.environment = value
        else:
            step.srun.append(argv[i])
        i += 1
    step.command = argv[i:]
    if not step.command:
        raise Invalid("srun: fatal: no command to run")
    for a, b in EXCLUSIVE:
        if a in step.pyxis and b in step.pyxis:
            raise Invalid(f"pyxis: both {a} and {b} were specified")
    if step.pyxis and "--container-image" not in step.pyxis and "--container-name" not in step.pyxis:
        raise Invalid("pyxis: container options without --container-image or --container-name")
    return step


def parse_mounts(value: str) -> list[Mount]:
    """`--container-mounts` as pyxis reads it (args.c: spank_option_mount, parse_mount_option)."""
    if not value:
        raise Invalid("pyxis: --container-mounts: argument required")
    return [parse_mount(entry) for entry in value.split(",")]


def parse_mount(entry: str) -> Mount:
    parts = entry.split(":", 2)
    if not parts[0] or (len(parts) > 1 and not parts[1]):
        raise Invalid(f"pyxis: --container-mounts: invalid format: {entry}")
    source = parts[0]
    target = parts[1] if len(parts) > 1 else source
    flags = tuple(f for f in parts[2].split("+") if f) if len(parts) > 2 else ()
    if not (source.startswith((".", "/")) or source in ("tmpfs", "umount")):
        raise Invalid('pyxis: mount source must be a relative path, an absolute path, "tmpfs" or "umount"')
    if not target.startswith((".", "/")):
        raise Invalid("pyxis: mount target must be a relative path or an absolute path")
    if re.search(r"\s", source + target):
        raise Invalid(f"enroot: a blank splits the mount entry {entry!r}")  # "SRC DST FLAGS" lines
    if not set(flags) <= MOUNT_FLAGS:
        raise Invalid(f"enroot: unknown mount flags in {entry!r}")
    return Mount(source, target, flags)


def parse_env_names(value: str, environ: dict[str, str]) -> list[str]:
    names = value.split(",")
    for name in names:
        if not name:
            raise Invalid(f"pyxis: --container-env: invalid format: {value}")
        if not _NAME.match(name):
            raise Invalid(f"pyxis: --container-env: {name!r} is not a variable name")
        if name not in environ:  # kit exports every name it lists
            raise Invalid(f"fake pyxis: --container-env names {name}, which srun's environment does not hold")
    return names


def check_pyxis(step: Step, environ: dict[str, str], *, files: bool = False) -> tuple[list[Mount], list[str]]:
    """The mounts and environment names of a pyxis step; Invalid for what pyxis would refuse.
    With `files`, every mount source must exist (enroot fails the step otherwise)."""
    opts = step.pyxis
    image = opts.get("--container-image") or ""
    if "--container-image" in opts and not image:
        raise Invalid("pyxis: --container-image: argument required")
    if image.startswith((".", "/")) and files and not Path(image).is_file():
        raise Invalid(f"enroot: no squashfs file {image}")
    workdir = opts.get("--container-workdir")
    if workdir is not None and not workdir.startswith("/"):
        raise Invalid("fake pyxis: --container-workdir should be absolute")
    mounts = parse_mounts(opts["--container-mounts"] or "") if "--container-mounts" in opts else []
    names = parse_env_names(opts["--container-env"] or "", environ) if "--container-env" in opts else []
    if files:
        for m in mounts:
            if m.source.startswith((".", "/")) and not Path(m.source).exists():
                raise Invalid(f"enroot: mount source {m.source} does not exist")
    return mounts, names


def read_edf(path: str, *, files: bool = False) -> tuple[dict[str, Any], list[Mount]]:
    """An environment definition file as the Container Engine reads it: TOML, known keys and types,
    mounts in the pyxis form. Returns (data, mounts)."""
    import tomllib

    if not path.startswith("/"):
        raise Invalid(f"fake CE: --environment={path}: kit passes an absolute path")
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise Invalid(f"CE: cannot read the environment definition {path}: {exc}") from None
    for key, value in data.items():
        if key not in EDF_KEYS:
            raise Invalid(f"CE: unknown EDF entry {key!r} in {path}")
        if not isinstance(value, EDF_KEYS[key]):
            raise Invalid(f"CE: EDF entry {key!r} has the wrong type in {path}")
    if not data.get("image"):
        raise Invalid(f"CE: {path} names no image")
    env = data.get("env", {})
    if not all(isinstance(v, str) for v in env.values()):
        raise Invalid("CE: EDF env values must be strings")
    if any("$" in v for v in env.values()):
        raise Invalid("fake CE: a '$' in an env value would be expanded")
    mounts = []
    for entry in data.get("mounts", []):
        if not isinstance(entry, str):
            raise Invalid("CE: EDF mounts are strings")
        mounts.append(parse_mount(entry))
    if files:
        for m in mounts:
            if not Path(m.source).exists():
                raise Invalid(f"CE: mount source {m.source} does not exist")
    return data, mounts


def fail(message: str) -> None:
    print(message, file=sys.stderr)
    sys.exit(1)
