"""The Apptainer adapter: the only module that imports spython. It starts the plan unchanged.

Apptainer/spython quirks walled off here (FIELD_NOTES §4):
- spython's `pull()` returns a path even when the pull failed, several of its error paths call
  `sys.exit`, its streamed pull cannot be cancelled (the child outlives an interrupt), and a failed
  `instance start` only logs. So pulls, builds and instances go through the CLI (kit.proc, which
  kills the child on Ctrl-C and raises on a non-zero exit) and every result is checked; spython is
  used for what it does well, the Dockerfile parser behind `definition_from_dockerfile`, with
  any SystemExit turned into a KitError.
- `-e` means `--cleanenv` (drops SLURM_*): never passed. `--env` is a comma list (a value with
  ',' becomes two variables): the container environment goes through APPTAINERENV_ variables of
  the apptainer process instead (kit.plan.container_args.to_apptainer_env), at instance start and
  again at every exec into it (an instance's start environment does not reach exec'd processes).
  No `--contain`: Ray breaks in its private 64 MB /tmp and /dev/shm.
- A `docker://` pull rebuilds the SIF (two pulls are not byte-identical): the source digest is
  recorded (from the reference or the image labels) instead of a hash of the SIF
  (kit/runtime/files.py, shared with other file-backed stores).
- No private networks: ensure_network refuses (Apptainer uses the host network).
- Instances carry no labels: kit keeps each node's labels and output in its state dir,
  `$KIT_STATE_DIR` or ~/.local/state/kit, as `<cluster>/<name>.json` and `<cluster>/<name>.log`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit import proc, safeload
from kit.errors import CommandError, ConfigError, ImageError, KitError, RuntimeUnavailable, StartError
from kit.images.build import ContextPlan, definition_build_args, takes_build_args
from kit.plan.container_args import (
    APPTAINER_ENV_PREFIX,
    SINGULARITY_ENV_PREFIX,
    to_apptainer_env,
    to_apptainer_exec_argv,
    to_apptainer_start_argv,
)
from kit.plan.node import ContainerSpec
from kit.render import shell_quote
from kit.runtime import files
from kit.runtime.base import (
    EXEC_GRACE_S,
    EXEC_MARK,
    EXEC_TIMEOUT_S,
    BuildPlan,
    BuildResult,
    ContainerRuntime,
    ExecResult,
    ImageFile,
    ImageInfo,
    ImageStore,
    NodeHandle,
    OnProgress,
    Progress,
    PullPlan,
    PullResult,
    bounded_argv,
    end_exec_argv,
    new_exec_mark,
    unseen_lines,
)
from kit.safe import files as safefile
from kit.safe import text as safetext

BINARIES = ("apptainer", "singularity")  # Apptainer installs `singularity` as an alias
digest_from = files.digest_from


def find_binary() -> str:
    for name in BINARIES:
        if shutil.which(name):
            return name
    raise RuntimeUnavailable(
        "neither `apptainer` nor `singularity` is on PATH",
        hint="install Apptainer (or `module load apptainer` on an HPC login node), or use runtime: docker",
    )


def state_root(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get("KIT_STATE_DIR"):
        return Path(environ["KIT_STATE_DIR"]).expanduser()
    return Path(environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "kit"


def sif_name(ref: str) -> str:
    """A file name for an image reference: docker://vllm/vllm-openai:v0.11.0 -> vllm_vllm-openai_v0.11.0.sif."""
    return files.image_file_name(ref, ".sif")


def pull_uri(ref: str) -> str:
    return ref if files.URI_RE.match(ref) else f"docker://{ref}"


def definition_base(path: Path) -> str | None:
    """The `From:` image of an Apptainer definition file (None when it names none)."""
    for line in path.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "From":
            return value.strip()
    return None


@dataclass(frozen=True)
class ApptainerSettings:
    """What the adapter needs from the configuration (config.apptainer)."""

    image_dir: str = "~/.local/share/kit/images"  # where pulled/built SIF files go
    cache_dir: str | None = None  # APPTAINER_CACHEDIR
    tmp_dir: str | None = None  # APPTAINER_TMPDIR (room for the unpacked image)


class ApptainerRuntime(ContainerRuntime, ImageStore):
    """The binary is looked up on first use (RuntimeUnavailable without one), so planning
    (what --dry-run prints) works on a host without Apptainer."""

    name = "apptainer"

    def __init__(
        self,
        settings: ApptainerSettings | None = None,
        *,
        binary: str | None = None,
        state_dir: str | Path | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings or ApptainerSettings()
        self._binary = binary
        self.environ = dict(os.environ if environ is None else environ)
        self.state_dir = Path(state_dir) if state_dir else state_root(self.environ)

    @property
    def binary(self) -> str:
        if self._binary is None:
            self._binary = find_binary()
        return self._binary

    @property
    def images(self) -> ApptainerRuntime:
        return self  # SIF files under settings.image_dir (or the path config.image names)

    # ---- plumbing -------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        """APPTAINER_CACHEDIR / APPTAINER_TMPDIR from the settings (and the SINGULARITY_* twins)."""
        env = dict(self.environ)
        for var, value in (("CACHEDIR", self.settings.cache_dir), ("TMPDIR", self.settings.tmp_dir)):
            if value:
                path = str(Path(value).expanduser())
                Path(path).mkdir(parents=True, exist_ok=True)
                env[f"APPTAINER_{var}"] = env[f"SINGULARITY_{var}"] = path
        return env

    def _argv(self, argv: Sequence[str]) -> list[str]:
        """The planned argv (which names `apptainer`) with this host's binary."""
        return [self.binary, *argv[1:]] if argv and argv[0] == "apptainer" else [self.binary, *argv]

    def _run(
        self,
        args: Sequence[str],
        *,
        check: bool = True,
        timeout: float | None = None,
        what: str = "",
        container_env: Mapping[str, str] | None = None,
    ) -> Any:
        env = {**self._env(), **self.container_env(container_env or {})}
        return proc.run(self._argv(["apptainer", *args]), env=env, check=check, timeout=timeout, what=what)

    def container_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The container's environment as this binary's prefixed variables (never `--env`)."""
        prefix = SINGULARITY_ENV_PREFIX if Path(self.binary).name == "singularity" else APPTAINER_ENV_PREFIX
        return to_apptainer_env(env, prefix=prefix)

    def _cluster_dir(self, name: str, cluster: str | None = None) -> Path:
        """Where a node's record and log live: <state>/<cluster>/ (instances carry no labels)."""
        if cluster:
            return self.state_dir / cluster
        for pattern in (f"*/{name}.json", f"*/{name}.log"):
            for found in self.state_dir.glob(pattern):
                return found.parent
        return self.state_dir / "_"

    def log_path(self, name: str) -> Path:
        return self._cluster_dir(name) / f"{name}.log"

    def _meta(self, name: str, cluster: str | None = None) -> dict[str, Any]:
        try:
            path = self._cluster_dir(name, cluster) / f"{name}.json"
            data = safeload.load_json_file(path, max_bytes=1 << 20, what="instance record")
        except ConfigError:
            return {}
        return data if isinstance(data, dict) else {}

    # ---- images ---------------------------------------------------------------------------
    def image_path(self, ref: str) -> Path:
        """The SIF a reference means here: a path to a SIF as given, else <image_dir>/<sif_name(ref)>."""
        if ref.endswith(".sif") or ref.startswith(("/", "./", "~")):
            return Path(ref).expanduser()
        return Path(self.settings.image_dir).expanduser() / sif_name(ref)

    def image_info(self, ref: str) -> ImageInfo | None:
        return files.file_info(ref, self.image_path(ref))

    def plan_pull(self, ref: str) -> PullPlan:
        """`apptainer pull --force SIF URI` of a docker:// (or oras://, library://, https://) image
        into <image_dir>/<sif_name(ref)>. Runs written under a temporary name (see pull)."""
        uri = pull_uri(ref)
        if uri.startswith("docker://"):  # other schemes are apptainer's to check
            from kit.images.reference import parse_ref

            parse_ref(uri.removeprefix("docker://"))
        dest = Path(self.settings.image_dir).expanduser() / sif_name(ref)
        argv = ("apptainer", "pull", "--force", str(dest), uri)
        return PullPlan(ref=ref, runtime=self.name, source=uri, destination=str(dest), argv=argv)

    def pull(self, plan: PullPlan, *, on_progress: OnProgress) -> PullResult:
        """Run the planned pull atomically: the SIF is written under a temporary name (the plan's
        destination replaced) and renamed only on success; a failed or interrupted (Ctrl-C) pull
        leaves no SIF behind. The source digest is recorded beside the SIF."""
        dest = Path(plan.destination)
        started = time.monotonic()
        with files.partial_file(dest) as partial:
            on_progress(
                Progress(f"pulling {plan.source} -> {dest} (Apptainer converts the layers to SIF: this takes minutes)")
            )
            argv = [str(partial) if word == plan.destination else word for word in plan.argv]
            try:
                proc.run(self._argv(argv), env=self._env(), what=f"{self.binary} pull")
            except CommandError as err:
                raise ImageError(
                    f"pull of {plan.source} failed (exit {err.returncode})",
                    details=err.details,
                    hint=_pull_hint(err.stderr),
                ) from None
            if not partial.is_file() or partial.stat().st_size == 0:
                raise ImageError(
                    f"pull of {plan.source} reported success but wrote no image", hint="retry; check disk space"
                )
            on_progress(Progress("reading the image labels"))
            labels = self.labels(str(partial))
            partial.replace(dest)
        record = self._record(dest, plan.source, labels, started, on_progress)
        if not record.digest:
            raise ImageError(f"apptainer pull of {plan.ref} returned no digest")
        return PullResult(ref=plan.ref, runtime=self.name, digest=record.digest, seconds=record.seconds, file=record)

    def plan_build(self, context: ContextPlan, *, source: str | None = None, dest: str | None = None) -> BuildPlan:
        """A SIF of kit's image: from containers/NAME/kit-NAME.def when it bootstraps from the
        planned tag, else from the local Docker image (`docker-daemon:TAG`), or from `source`.
        The Docker build's own options (context files, build args) do not apply here."""
        definition = context.files.get(f"kit-{context.name}.def")
        args = ["apptainer", "build", "--force"]
        if source is None and definition is not None and takes_build_args(definition):
            # A layer (containers/ray): its definition bootstraps from --base-image (issue 24).
            source = str(definition)
            args += definition_build_args(context.buildargs)
        elif source is None:
            use_def = definition is not None and definition_base(definition) == context.tag
            source = str(definition) if use_def and definition is not None else f"docker-daemon:{context.tag}"
        target = Path(dest).expanduser() if dest else Path(self.settings.image_dir).expanduser() / sif_name(context.tag)
        if Path(source).is_file() and os.geteuid() != 0:
            args.append("--fakeroot")  # a definition file build needs root or fakeroot
        return BuildPlan(
            name=context.name, runtime=self.name, image=str(target), source=source, argv=(*args, str(target), source)
        )

    def build(self, plan: BuildPlan, *, on_progress: OnProgress) -> BuildResult:
        """Run the planned `apptainer build`, atomic like pull. From a local Docker image the
        digest is its image id (asked of the Docker adapter)."""
        target = Path(plan.image)
        started = time.monotonic()
        with files.partial_file(target) as partial:
            on_progress(Progress(f"building {target} from {plan.source}"))
            argv = [str(partial) if word == plan.image else word for word in plan.argv]
            try:
                proc.run(self._argv(argv), env=self._env(), what=f"{self.binary} build")
            except CommandError as err:
                raise ImageError(
                    f"build of {target} from {plan.source} failed (exit {err.returncode})",
                    details=err.details,
                    hint="for docker-daemon: the image must exist locally (`kit build`); "
                    "for a .def: apptainer needs root or --fakeroot",
                ) from None
            if not partial.is_file() or partial.stat().st_size == 0:
                raise ImageError(f"build of {target} reported success but wrote no image")
            labels = self.labels(str(partial))
            partial.replace(target)
        digest = None
        if plan.source.startswith("docker-daemon:") and files.digest_from(plan.source, labels)[0] is None:
            from kit.runtime.docker import local_image_id

            image_id = local_image_id(plan.source.removeprefix("docker-daemon:").removeprefix("//"))
            if image_id and files.DIGEST_RE.search(image_id):
                digest = (image_id, "docker image id")
        record = self._record(target, plan.source, labels, started, on_progress, digest=digest)
        return BuildResult(
            name=plan.name,
            runtime=self.name,
            image=str(target),
            digest=record.digest,
            seconds=record.seconds,
            file=record,
        )

    def labels(self, image: str) -> dict[str, str]:
        """The SIF's labels (`inspect --json --labels`); {} when it has none."""
        result = self._run(["inspect", "--json", "--labels", image], what=f"{self.binary} inspect")
        try:
            data = json.loads(result.stdout or "{}")
        except ValueError:
            raise ImageError(f"{self.binary} inspect printed no JSON for {image}") from None
        labels = (data.get("data") or {}).get("attributes", {}).get("labels") or data.get("labels") or {}
        return {str(k): str(v) for k, v in labels.items()}

    def _record(
        self,
        path: Path,
        source: str,
        labels: Mapping[str, str],
        started: float,
        on_progress: OnProgress,
        *,
        digest: tuple[str | None, str | None] | None = None,
    ) -> ImageFile:
        record = files.write_record(path, source, labels, started, digest=digest)
        on_progress(
            Progress(f"{path}: {record.size / 1e9:.2f} GB in {record.seconds} s, digest {record.digest or 'unknown'}")
        )
        return record

    def run_probe(self, ref: str, program: str, args: Sequence[str], *, timeout: float = 600) -> ExecResult:
        """`apptainer exec --containall --no-home IMAGE python3 -c PROGRAM ARGS`: the image file (a
        SIF path, or the file kit pull made for a reference) as the calling user, as Apptainer
        runs every container."""
        path = ref if ref.endswith(".sif") or ref.startswith("/") else str(self.image_path(ref))
        argv = ["exec", "--containall", "--no-home", path, "python3", "-c", program, *args]
        shown = [self.binary, *argv[:4], "python3", "-c", "<probe>", *args]
        result = proc.run(self._argv(["apptainer", *argv]), env=self._env(), check=False, timeout=timeout, shown=shown)
        return ExecResult(result.returncode, result.stdout, result.stderr)

    def remove_image(self, ref: str) -> bool:
        return files.remove_file(self.image_path(ref))

    # ---- instances --------------------------------------------------------------------------
    def ensure_network(self, name: str, subnet: str, cluster: str) -> None:
        raise ConfigError(
            f"Apptainer has no private networks (network {name!r}): instances use the host network",
            key="network",
            hint="unset network and network_subnet, or use runtime: docker for local multi-node simulation",
        )

    def _instances(self) -> list[dict[str, Any]]:
        result = self._run(["instance", "list", "--json"], what=f"{self.binary} instance list")
        try:
            data = json.loads(result.stdout or "{}")
        except ValueError:
            raise KitError(f"`{self.binary} instance list --json` printed no JSON") from None
        instances: list[dict[str, Any]] = data.get("instances") or []
        return instances

    def state(self, name: str) -> str | None:
        return "running" if any(i.get("instance") == name for i in self._instances()) else None

    def host_nodes(self) -> list[NodeHandle]:
        """The running kit instances of every cluster, with the labels kit recorded at start."""
        nodes = []
        for inst in self._instances():
            name = str(inst.get("instance", ""))
            if not name.startswith("kit-"):
                continue
            labels = self._meta(name).get("labels", {})
            if not labels.get("kit.cluster"):
                continue
            nodes.append(
                NodeHandle(name=name, cluster=labels["kit.cluster"], role=labels.get("kit.role", "?"), rank=0,
                           state="running", labels=labels)
            )  # fmt: skip
        return nodes

    def find_nodes(self, cluster: str) -> list[NodeHandle]:
        prefix = f"kit-{cluster}-"
        nodes = []
        for inst in self._instances():
            name = str(inst.get("instance", ""))
            if not name.startswith(prefix):
                continue
            meta = self._meta(name, cluster)
            labels = meta.get("labels", {})
            role = labels.get("kit.role") or ("head" if name == f"{prefix}head" else "worker")
            rank = labels.get("kit.rank") or (name.rsplit("-", 1)[-1] if role == "worker" else "0")
            nodes.append(
                NodeHandle(
                    name=name,
                    cluster=cluster,
                    role=role,
                    rank=int(rank) if str(rank).isdigit() else 0,
                    state="running",
                    ip=labels.get("kit.node-ip") or inst.get("ip") or None,
                    image=str(inst.get("img") or labels.get("kit.image", "")),
                    image_digest=_sif_digest(str(inst.get("img") or "")),
                    started_at=meta.get("started_at"),
                    labels=labels,
                )
            )
        return sorted(nodes, key=lambda n: (n.role != "head", n.rank))

    def start(self, spec: ContainerSpec) -> None:
        """`instance start` (checked: the instance must be listed), then the node script detached
        inside it, its output going to the node's log file in kit's state dir."""
        directory = self._cluster_dir(spec.name, spec.labels.get("kit.cluster"))
        directory.mkdir(parents=True, exist_ok=True)
        log = directory / f"{spec.name}.log"
        os.close(safefile.open_private(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))  # no planted link
        try:
            self._run(
                to_apptainer_start_argv(spec, spec.image)[1:],
                what=f"{self.binary} instance start",
                container_env=spec.env,
            )
        except CommandError as err:
            raise StartError(
                f"cannot start instance {spec.name} from {spec.image} (exit {err.returncode})",
                details=err.details,
                hint="check the SIF path (`kit pull --runtime apptainer`) and the bind sources",
            ) from None
        if self.state(spec.name) != "running":
            raise StartError(f"instance {spec.name} is not running after `instance start`", hint="see its log")
        meta = {
            "name": spec.name,
            "labels": dict(spec.labels),
            "image": spec.image,
            "log": str(log),
            "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        safefile.write_atomic(directory / f"{spec.name}.json", safetext.to_json(meta) + "\n")
        self._detach(to_apptainer_exec_argv(spec), log, container_env=spec.env)

    def _detach(self, argv: Sequence[str], log: Path, *, container_env: Mapping[str, str] | None = None) -> None:
        """Start argv in the background (nohup, own session) with its output appended to log."""
        script = 'log=$1; shift; nohup setsid "$@" >>"$log" 2>&1 </dev/null &'
        env = {**self._env(), **self.container_env(container_env or {})}
        proc.run(["sh", "-c", script, "kit-detach", str(log), *self._argv(argv)], env=env)

    def remove(self, name: str) -> bool:
        if self.state(name) is None:
            return False
        self._run(["instance", "stop", name], what=f"{self.binary} instance stop")
        with contextlib.suppress(FileNotFoundError):
            (self._cluster_dir(name) / f"{name}.json").unlink()
        return True

    def logs(self, name: str, *, tail: int | str = "all") -> str:
        try:
            text = self.log_path(name).read_text(errors="replace")
        except OSError:
            return ""
        if tail == "all":
            return text
        lines = text.splitlines(keepends=True)
        return "".join(lines[-int(tail) :]) if int(tail) > 0 else ""

    def wait_for_mark(
        self, name: str, marks: Sequence[str], *, timeout: float, on_progress: Callable[[str], None], what: str
    ) -> str:
        deadline = time.monotonic() + timeout
        shown = 0
        while True:
            lines = [ln for ln in self.logs(name).splitlines() if ln.strip()]
            for line in lines:
                if any(m in line for m in marks):
                    return line
            new, shown = unseen_lines(lines, shown)
            for line in new:
                on_progress(line)
            if self.state(name) is None:
                raise StartError(
                    f"instance {name} is gone before {what}",
                    details=lines[-20:],
                    hint=f"see {self.log_path(name)}; fix, then `kit up --replace`",
                )
            if time.monotonic() > deadline:
                raise StartError(
                    f"{name}: timed out after {timeout:.0f} s waiting for {what}",
                    details=lines[-20:],
                    hint="check the other nodes and `kit status`; raise timeouts.join",
                )
            time.sleep(1)

    def exec(
        self,
        node: NodeHandle,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        limit = EXEC_TIMEOUT_S if timeout is None else timeout
        mark = new_exec_mark()
        try:
            result = self._run(
                ["exec", f"instance://{node.name}", *bounded_argv(argv, limit)],
                check=False,
                timeout=limit + EXEC_GRACE_S,
                container_env={**(env or {}), EXEC_MARK: mark},
            )
        except BaseException:
            # Interrupted, or the client outlived the deadline: end what it started in the
            # instance, as the Docker adapter does (issue 25).
            with contextlib.suppress(Exception):
                self._run(["exec", f"instance://{node.name}", *end_exec_argv(mark)], check=False, timeout=EXEC_GRACE_S)
            raise
        return ExecResult(returncode=result.returncode, stdout=result.stdout, stderr=result.stderr)

    def exec_detached(self, node: NodeHandle, argv: Sequence[str]) -> None:
        log = self._cluster_dir(node.name, node.cluster) / f"{node.name}.exec.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self._detach(["apptainer", "exec", f"instance://{node.name}", *argv], log)

    def remove_cluster(self, cluster: str) -> dict[str, list[str]]:
        removed = [n.name for n in self.find_nodes(cluster) if self.remove(n.name)]
        return {"containers": removed, "networks": []}


def _sif_digest(img: str) -> str | None:
    """The source digest recorded beside a SIF by `pull`/`build`, if any."""
    digest = files.read_record(Path(img)).get("digest") if img else None
    return str(digest) if digest else None


def _pull_hint(stderr: str) -> str:
    text = stderr.lower()
    if "no space left" in text:
        return "free space in apptainer.tmp_dir / apptainer.cache_dir (the image is unpacked there)"
    if "unauthorized" in text or "denied" in text:
        return "check the image name and registry credentials (apptainer remote login / APPTAINER_DOCKER_*)"
    if "manifest unknown" in text or "not found" in text:
        return "check the image name and tag"
    return "check the reference, network access to the registry, and apptainer.tmp_dir space"


# ---- definition files (containers/*/*.def) ----------------------------------------------------


def definition_from_dockerfile(dockerfile: str, *, image: str, source: str) -> str:
    """An Apptainer definition for kit's image, generated from its Dockerfile.

    The build steps are not converted: kit's Dockerfiles are multi-stage and need their build
    context, which spython's converter flattens incorrectly. The definition bootstraps from the
    image `kit build` made (`docker-daemon`), and takes from the Dockerfile's final stage what
    Apptainer does not carry over by itself in a useful form: the environment (parsed by spython),
    the labels, and the command as the runscript.
    """
    final = dockerfile[dockerfile.rfind("\nFROM ") + 1 :] if "\nFROM " in dockerfile else dockerfile
    environ, cmd = _parse_final_stage(final)
    labels = _dockerfile_labels(final)
    lines = [
        f"# Generated by kit (containers/make-defs.py) from {source}; do not edit.",
        f"# Needs the Docker image {image} on this host (`kit build`); then, from the repository root:",
        f"#   apptainer build {sif_name(image)} {Path(source).with_name(f'kit-{Path(source).parent.name}.def')}",
        "Bootstrap: docker-daemon",
        f"From: {image}",
        "",
        "%labels",
        "    kit.managed true",
        f"    kit.source {source}",
        *[f"    {key} {value}" for key, value in labels],
        "",
        "%environment",
        *[f"    export {item.split('=', 1)[0]}={_shell_value(item.split('=', 1)[1])}" for item in environ],
        "",
        "%runscript",
        f'    exec {" ".join(cmd) if cmd else "/bin/bash"} "$@"',
        "",
    ]
    return "\n".join(lines)


def _shell_value(value: str) -> str:
    return shell_quote(value.strip('"'))


def _parse_final_stage(text: str) -> tuple[list[str], list[str]]:
    """ENV items and CMD of one Dockerfile stage, through spython's parser (SystemExit -> KitError)."""
    from spython.main.parse.parsers import DockerParser

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "Dockerfile"
        path.write_text(text)
        try:
            # spython warns about missing build-context files: irrelevant here.
            with (
                open(os.devnull, "w") as devnull,
                contextlib.redirect_stderr(devnull),
                contextlib.redirect_stdout(devnull),
            ):
                parser = DockerParser(str(path))
        except SystemExit as exc:  # spython exits on what it cannot parse
            raise KitError(f"spython could not parse the Dockerfile (exit {exc.code})") from None
    recipe = list(parser.recipe.values())[-1]
    environ = [str(e) for e in (recipe.environ or [])]
    cmd = recipe.cmd if isinstance(recipe.cmd, list) else ([recipe.cmd] if recipe.cmd else [])
    return environ, [str(c) for c in cmd]


def _dockerfile_labels(text: str) -> list[tuple[str, str]]:
    """LABEL key="value" pairs (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out: list[tuple[str, str]] = []
    for line in joined.splitlines():
        if line.strip().upper().startswith("LABEL "):
            for key, value in re.findall(r'([\w.-]+)=("(?:[^"\\]|\\.)*"|\S+)', line.strip()[6:]):
                out.append((key, value.strip('"')))
    return out
