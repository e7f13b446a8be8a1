"""Property-based tests (hypothesis) over every piece of shell kit generates (issue 16): node
entrypoints (Ray head/worker, mp), serve scripts (every role, DP/EP), SLURM launchers (Docker,
Apptainer, pyxis and CSCS EDF × Ray and mp × with and without DP/EP) and the tunnel hint. The
pyxis/EDF launchers run under a fake pyxis-aware srun (tests/pyxis_fake.py: enroot and pyxis
cannot be installed here) that refuses what pyxis would and emulates the container.

For arbitrary strings in every user-controlled field (newlines, quotes, $(...), backticks, ;,
&&, lines that end a here-document, a leading '-', unicode) either kit refuses the value with a
KitError before it writes anything, or the artefact passes `bash -n` (and shellcheck, on fewer
examples), and run under bash with stub binaries (tests/unit/shellstubs.py) it runs nothing
else (the canary payloads leave no file) and hands each value to the stub's argv verbatim, as
one word. The values are put into an otherwise valid config (make_config) directly, so the
renderers are tested whatever the validation layer refuses; one test goes through the real CLI
(`kit slurm`) and accepts its refusal instead.

More examples: KIT_PROPERTY_EXAMPLES=200 pytest tests/unit/test_shell_properties.py
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import io
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from kit.cli import main
from kit.commands.query import tunnel_hint
from kit.config import KitConfig
from kit.errors import KitError
from kit.plan.network import NodeNet
from kit.plan.node import LOCAL_MODEL_PREFIXES, plan_node
from kit.plan.roles import HEAD, Role
from kit.plan.scripts import serve_script
from kit.plan.slurm import plan_launcher, plan_slurm_files, sbatch_line
from tests.conftest import make_config, shellcheck_text
from tests.unit.shellstubs import Stubs, calls, make_stubs

EXAMPLES = int(os.environ.get("KIT_PROPERTY_EXAMPLES", "8"))
# No shrinking (each example runs several processes: shrinking a failure would take minutes; the
# failing example is printed as found) and no example database in the repository.
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# The launcher property runs every launcher on 16 variants through bash and the stubs: a quarter
# of the examples each (plus the all-hostile one) keeps the unit tier in its 90 s on CI's 2 cores
# (issue 26); KIT_PROPERTY_EXAMPLES=64 runs the long search.
FEW = settings(PROPERTY, max_examples=max(2, EXAMPLES // 4))
# shellcheck judges a script's structure, which the values do not change (each is one quoted
# word): once per distinct launcher, on the all-hostile example (issue 26).
ONCE = settings(PROPERTY, phases=[Phase.explicit])

CANARY = "@CANARY@"  # replaced by a path in the example's own directory
FRAGMENTS = [
    f"$(touch {CANARY})",
    f"`touch {CANARY}`",
    f"; touch {CANARY}",
    f" && touch {CANARY}",
    f"\nKIT_HEAD_SCRIPT_EOF\n)\ntouch {CANARY}\n",
    f"\nKIT_WORKER_SCRIPT_EOF\ntouch {CANARY}\n",
    f"\nKIT_PY\ntouch {CANARY}\n",
    f"'; touch {CANARY}; '",
    f'"; touch {CANARY}; "',
    f"\\'$(touch {CANARY})",
    "\n",
    "'",
    '"',
    "\\",
    "-",
    "--trust-remote-code",
    "--help",
    "${HOME}",
    "$((1+1))",
    "#",
    "*",
    "~",
    "!",
    "{a,b}",
    "\t",
    "é日本",
    "EOF",
    "2147483641",  # kit's rank sentinel: a value holding it must still arrive verbatim
    "${KIT_NODE_RANK}",
]
# Any text but NUL (no argv or environment can carry it; shell_quote refuses it) and lone
# surrogates (not encodable).
ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=6)
VALUE = st.lists(st.one_of(st.sampled_from(FRAGMENTS), ANY_TEXT), min_size=1, max_size=4).map("".join)
# A path component: what a file name may hold.
NAME = VALUE.map(lambda v: v.replace("/", "_")).filter(lambda v: v not in ("", ".", "..") and len(v.encode()) < 200)
HOSTILE = "x\nKIT_HEAD_SCRIPT_EOF\n)\n$(touch @CANARY@)`touch @CANARY@`; touch @CANARY@ && '\"--x"


@dataclasses.dataclass(frozen=True)
class Values:
    """One hostile value per user-controlled field of the config."""

    cluster: str
    model: str
    served: str
    extra: str
    temp_dir: str
    hf_cache: str
    secret: str  # a file name: hf_token_file, api_key_file, ray_token_file live in the example dir
    env: str
    mount: str
    interface: str
    image: str


VALUES = st.builds(
    Values,
    cluster=VALUE,
    model=VALUE,
    served=VALUE,
    extra=VALUE,
    temp_dir=VALUE,
    hf_cache=NAME,
    secret=NAME,
    env=VALUE,
    mount=NAME.map(lambda v: v.replace(":", "_")),  # ':' separates HOST:CONTAINER[:ro] in mounts
    interface=VALUE,
    image=VALUE,
)
ALL_HOSTILE = Values(*([HOSTILE] * 5), "hf-" + HOSTILE.replace("/", "_"), "s-" + HOSTILE, HOSTILE, "m-" + HOSTILE,
                     HOSTILE, HOSTILE)  # fmt: skip


@dataclasses.dataclass
class Example:
    """One example's directory: the canary, the secret files, the stubs' records, containers."""

    root: Path
    values: Values

    @property
    def canary(self) -> Path:
        return self.root / "canary" / "pwned"

    def v(self, field: str) -> str:
        return str(getattr(self.values, field)).replace(CANARY, str(self.canary))

    def path(self, *parts: str) -> str:
        return str(self.root.joinpath(*parts))

    @property
    def record(self) -> Path:
        return self.root / "record"

    def secret_file(self, kind: str, name: str | None = None) -> str:
        path = self.root / kind / (name or self.v("secret"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{kind}-content")
        return str(path)

    def calls(self, program: str) -> list[list[str]]:
        return [c[1:] for c in calls(self.record) if c[0] == program]

    def assert_nothing_ran(self) -> None:
        assert not self.canary.exists(), "a value was executed"
        assert not any(self.canary.parent.iterdir())


@contextmanager
def example_dir(values: Values) -> Iterator[Example]:
    with tempfile.TemporaryDirectory(prefix="kit-prop-") as tmp:
        ex = Example(Path(tmp), values)
        for sub in ("canary", "record", "containers"):
            (ex.root / sub).mkdir()
        yield ex


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Stubs:
    return make_stubs(tmp_path_factory.mktemp("stubs"))


# What a runtime refuses by design (each refusal has its own tests): Apptainer's bind paths hold
# no ',' or ':' and its environment values no '$' or '`' (it splits and expands them); pyxis'
# mount paths no ',' ':' or blanks; the EDF's none of those nor '$', and no '$' or empty value in
# its environment. In the values given to those runtimes here, these characters are replaced,
# so every other hostile byte still goes through the launcher.
UNFIT_PATH = {"apptainer": r"[,:]", "pyxis": r"[,:\s]", "edf": r"[,:$\s]"}
UNFIT_ENV = {"apptainer": r"[$`]", "edf": r"[$]"}


def fit(value: str, pattern: str | None) -> str:
    return re.sub(pattern, "_", value) if pattern else value


def hostile_config(ex: Example, *, runtime: str = "docker", backend: str = "ray", dp: bool = False) -> KitConfig:
    """A valid config (make_config), then every user-controlled field set to the example's value."""
    layout: dict[str, object] = {"nodes": 2, "gpus_per_node": 2, "model.tp": 2, "model.pp": 2}
    if dp:
        layout = {"nodes": 2, "gpus_per_node": 2, "model.tp": 1, "model.pp": 1, "model.dp": 4, "model.ep": True}
    base = make_config(runtime=runtime, backend=backend, **layout)
    path, secret = UNFIT_PATH.get(runtime), fit(ex.v("secret"), UNFIT_PATH.get(runtime))
    image = ex.v("image") if runtime == "docker" else ex.path("images", secret)
    env = fit(ex.v("env"), UNFIT_ENV.get(runtime)) or ("x" if runtime == "edf" else "")
    if runtime != "docker":  # every node checks it can read an image file before anything starts
        Path(image).parent.mkdir(parents=True, exist_ok=True)
        Path(image).write_bytes(b"")
    return dataclasses.replace(
        base,
        cluster=fit(ex.v("cluster"), UNFIT_ENV.get(runtime)) or "c",  # KIT_CLUSTER is in the environment
        image=image,
        interface=fit(ex.v("interface"), r"\s" if runtime in ("pyxis", "edf") else None),  # node table: words
        hf_cache=ex.path("hf", fit(ex.v("hf_cache"), path)),
        hf_token_file=ex.secret_file("hf", secret),
        api_key_file=ex.secret_file("key", secret),
        ray_token_file=ex.secret_file("ray", secret) if backend == "ray" else None,
        env={"NCCL_IB_HCA": env},
        mounts=(f"{ex.path('src', fit(ex.v('mount'), path))}:/data",),
        model=dataclasses.replace(
            base.model, id=hub_id(ex.v("model")), served_name=ex.v("served"), extra_args=("--x", ex.v("extra"))
        ),
        ray=dataclasses.replace(base.ray, temp_dir=fit(ex.v("temp_dir"), path if runtime == "apptainer" else None)),
        # 0: the scripts give up at once (the config layer refuses 0; set here, past it)
        timeouts=dataclasses.replace(base.timeouts, join=0),
    )


def hub_id(model: str) -> str:
    """The example's model as a hub id: a value that starts like a path (/, ~, .) would be a model
    directory, mounted and checked on every node (tests/unit/test_local_model.py covers those)."""
    return "org" + model if model.startswith(LOCAL_MODEL_PREFIXES) else model


def refused(make: Any) -> Any:
    """make(), or None when kit refuses the values with a KitError (before writing anything)."""
    try:
        return make()
    except KitError:
        return None


def bash_n(text: str) -> None:
    result = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def shellcheck(text: str) -> None:
    shellcheck_text(text)


def run(text: str, ex: Example, stubs: Stubs, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", text, "kit-test", *args],
        env=stubs.env(ex.record, ex.root / "containers", **env),
        cwd=ex.root,
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_serve_argv(argv: list[str], ex: Example, cfg: KitConfig, *, head: bool, ip: str = "10.0.0.1") -> None:
    """vllm serve MODEL ... with every configured value verbatim, as one word each."""
    assert argv[:2] == ["serve", hub_id(ex.v("model"))]
    assert argv[-2:] == ["--x", ex.v("extra")]
    if head:
        assert f"--served-model-name={cfg.served_name}" in argv
        assert f"--host={ip}" in argv  # the head's node IP, not 0.0.0.0


# ---- Docker entrypoints (the node scripts) and serve scripts, as `kit up` / `kit serve` run them


NET = {"head": NodeNet("10.0.0.1", "eth0", "10.0.0.1"), "worker": NodeNet("10.0.0.2", "eth0", "10.0.0.1")}


def run_node(ex: Example, stubs: Stubs, cfg: KitConfig, role: Role) -> subprocess.CompletedProcess[str] | None:
    spec = refused(lambda: plan_node(cfg, role, NET[role.kind]))
    if spec is None:
        return None
    bash_n(spec.script)
    env = {k: v for k, v in spec.env.items() if "\x00" not in v}
    # The node's environment as the container gets it (docker --env), kit's paths in the example dir.
    env.update(VLLM_CONFIG_ROOT=ex.path("cfg"), RAY_AUTH_TOKEN_PATH=cfg.ray_token_file or "")
    return run(spec.script, ex, stubs, **env)


@pytest.mark.parametrize("backend", ["ray", "mp"])
@pytest.mark.parametrize("who", ["head", "worker"])
@PROPERTY
@given(values=VALUES)
@example(values=ALL_HOSTILE)
def test_node_entrypoints_run_nothing_and_pass_values_verbatim(
    backend: str, who: str, values: Values, stubs: Stubs
) -> None:
    with example_dir(values) as ex:
        cfg = hostile_config(ex, backend=backend)
        role = HEAD if who == "head" else Role("worker", 1)
        result = run_node(ex, stubs, cfg, role)
        ex.assert_nothing_ran()
        if result is None:
            return
        if backend == "mp":
            assert result.returncode == 0 and "KIT_READY role=" in result.stdout, result.stderr
            return
        starts = [argv for argv in ex.calls("ray") if argv[:1] == ["start"]]
        assert starts, result.stdout + result.stderr
        assert f"--temp-dir={ex.v('temp_dir')}" in starts[0] or who == "worker"
        assert starts[0][1:3] == (["--head", "--node-ip-address=10.0.0.1"] if who == "head" else
                                   ["--address=10.0.0.1:6379", "--node-ip-address=10.0.0.2"])  # fmt: skip


@pytest.mark.parametrize("backend", ["ray", "mp"])
@pytest.mark.parametrize("layout", ["tp-pp", "dp-ep"])
@PROPERTY
@given(values=VALUES)
@example(values=ALL_HOSTILE)
def test_serve_scripts_run_nothing_and_pass_values_verbatim(
    backend: str, layout: str, values: Values, stubs: Stubs
) -> None:
    with example_dir(values) as ex:
        cfg = hostile_config(ex, backend=backend, dp=layout == "dp-ep")
        roles = [HEAD] if backend == "ray" else [HEAD, Role("worker", 1)]
        for role in roles:
            script = refused(lambda role=role: serve_script(cfg, role))
            if script is None:
                ex.assert_nothing_ran()
                return
            bash_n(script)
            node = {"VLLM_HOST_IP": NET[role.kind].ip, "KIT_NODE_RANK": str(role.rank), "KIT_HEAD_ADDRESS": "10.0.0.1"}
            # The API key file where the container sees it (/run/kit/secrets/api_key).
            key = ex.root / "containers" / "root" / "run" / "kit" / "secrets" / "api_key"
            key.parent.mkdir(parents=True, exist_ok=True)
            key.write_text("sk-test")
            result = run(script, ex, stubs, KIT_CONTAINER_ROOT=str(key.parents[3]), **node)
            assert result.returncode == 0, result.stderr
            argv = ex.calls("vllm")[-1]
            assert_serve_argv(argv, ex, cfg, head=role.is_head)
            if layout == "dp-ep" and backend == "mp" and not role.is_head:
                assert argv[argv.index("--data-parallel-start-rank") + 1] == "2"  # node 1 × 2 ranks per node
        ex.assert_nothing_ran()


# ---- SLURM launchers: the launcher, srun's node step, the container, the scripts inside it ------

RUNTIMES = ("docker", "apptainer", "pyxis", "edf")
VARIANTS = [(rt, be, lay) for rt in RUNTIMES for be in ("ray", "mp") for lay in ("tp-pp", "dp-ep")]


def launcher_text(ex: Example, cfg: KitConfig) -> str:
    """The launcher (written with its EDF files beside it, in the example's directory)."""
    files = plan_slurm_files(cfg, ex.path("launcher.sbatch"))
    for name, text in files.items():
        Path(name).write_text(text)
    return files[ex.path("launcher.sbatch")]


def run_launcher(ex: Example, stubs: Stubs, text: str, nodes: int) -> subprocess.CompletedProcess[str]:
    job = f"{os.getpid()}{abs(hash(ex.root)) % 100000}"
    return run(
        text,
        ex,
        stubs,
        SLURM_JOB_ID=job,
        SLURM_JOB_NUM_NODES=str(nodes),
        SLURM_JOB_NODELIST="node1",
        SLURM_SUBMIT_HOST="login1",
        SLURM_STEP_GPUS="0,1",  # srun's, in every task of a step with GPUs (Docker takes these)
        USER="alice",
        KIT_STUB_RAY_BLOCK="10",  # until the head's entry stops it, after vllm serve
    )


def check_launcher_run(ex: Example, cfg: KitConfig, result: subprocess.CompletedProcess[str]) -> None:
    """Every node's container got every value verbatim; the scripts inside ran the engines with them."""
    out = result.stdout + result.stderr
    assert "KIT_SERVER_READY url=http://10.9.0.1:8000 model=" in result.stdout, out
    assert "tunnel: ssh -N -L 8000:10.9.0.1:8000 alice@login1" in result.stdout, out
    runtime = cfg.runtime
    if runtime in ("pyxis", "edf"):
        check_enroot_steps(ex, cfg, out)
    else:
        runs = [argv for argv in ex.calls(runtime) if argv[:1] == (["run"] if runtime == "docker" else ["exec"])]
        assert len(runs) == cfg.nodes, out
        envs = ex.calls("apptainer-env") if runtime == "apptainer" else [a for a in runs]
        assert len(envs) == cfg.nodes, out
        env = "" if runtime == "apptainer" else "--env="  # Apptainer: APPTAINERENV_, never --env
        mount = "--volume" if runtime == "docker" else "--bind"
        for argv, given in zip(runs, envs, strict=True):
            assert f"{env}KIT_CLUSTER={cfg.cluster}" in given and f"{env}NCCL_IB_HCA={cfg.env['NCCL_IB_HCA']}" in given
            assert f"{mount}={cfg.hf_cache}:/kit/hf-cache" in argv
            assert f"{mount}={cfg.hf_token_file}:/run/kit/secrets/hf_token:ro" in argv
            assert f"{mount}={cfg.mounts[0]}" in argv
            assert cfg.image in argv
            if runtime == "docker":
                assert f"--label=kit.cluster={cfg.cluster}" in argv
        head, *workers = runs
        assert f"{mount}={cfg.api_key_file}:/run/kit/secrets/api_key:ro" in head
        assert not any(f"{mount}={cfg.api_key_file}:/run/kit/secrets/api_key:ro" in w for w in workers)
        if cfg.ray_token_file:
            assert all(f"{mount}={cfg.ray_token_file}:/run/kit/secrets/ray_token:ro" in argv for argv in runs)
    if cfg.interface and cfg.interface != "auto":
        assert ["-4", "-o", "addr", "show", "dev", cfg.interface] in ex.calls("ip")
    vllm = ex.calls("vllm")
    serving = 1 if cfg.backend == "ray" else cfg.nodes
    assert len(vllm) == serving, out
    assert_serve_argv(vllm[0], ex, cfg, head=True, ip="10.9.0.1")
    for argv in vllm[1:]:
        assert_serve_argv(argv, ex, cfg, head=False)
    if cfg.backend == "ray":
        head_start = next(a for a in ex.calls("ray") if a[:2] == ["start", "--head"])
        assert f"--temp-dir={cfg.ray.temp_dir}" in head_start
        assert any(a[:2] == ["start", "--address=10.9.0.1:6379"] for a in ex.calls("ray"))  # the worker joined


def check_enroot_steps(ex: Example, cfg: KitConfig, out: str) -> None:
    """pyxis/EDF: the head's step and the workers' step each started a container (the fake srun
    accepted every option), with the mounts and the environment verbatim; only the head's mounts
    the API key; the node table gave each node its own address."""
    container = ("--container-image=", "--environment=")
    steps = [argv for argv in ex.calls("srun") if any(a.startswith(container) for a in argv)]
    steps.sort(key=lambda argv: not any(a.startswith("--nodelist=") for a in argv))  # the head's first
    assert len(steps) == 2, out  # the head's, the workers'
    envs = ex.calls("container-env")
    assert len(envs) == 2, out
    mounts = []
    for argv in steps:
        if cfg.runtime == "pyxis":
            [image] = [a.removeprefix("--container-image=") for a in argv if a.startswith("--container-image=")]
            assert image == cfg.image
            [listed] = [a.removeprefix("--container-mounts=") for a in argv if a.startswith("--container-mounts=")]
            mounts.append(listed.split(","))
            assert "--no-container-mount-home" in argv and "--no-container-entrypoint" in argv
        else:
            [edf] = [a.removeprefix("--environment=") for a in argv if a.startswith("--environment=")]
            data = tomllib.loads(Path(edf).read_text())
            assert data["image"] == cfg.image and data["entrypoint"] is False
            mounts.append(data["mounts"])
    for env in envs:
        assert f"KIT_CLUSTER={cfg.cluster}" in env and f"NCCL_IB_HCA={cfg.env['NCCL_IB_HCA']}" in env
    for listed in mounts:
        assert f"{cfg.hf_cache}:/kit/hf-cache" in listed
        assert f"{cfg.hf_token_file}:/run/kit/secrets/hf_token:ro" in listed and cfg.mounts[0] in listed
        if cfg.ray_token_file:
            assert f"{cfg.ray_token_file}:/run/kit/secrets/ray_token:ro" in listed
    head, workers = mounts
    assert f"{cfg.api_key_file}:/run/kit/secrets/api_key:ro" in head
    assert f"{cfg.api_key_file}:/run/kit/secrets/api_key:ro" not in workers
    interface = "ib0" if cfg.interface == "auto" else cfg.interface
    assert f"kit: node 1 on node2: 10.9.0.1 via {interface}" in out
    if cfg.backend == "mp":  # the worker's rank came from the node table, inside its container
        worker = ex.calls("vllm")[-1]
        for flag, rank in (("--node-rank", "1"), ("--data-parallel-start-rank", "2")):
            assert flag not in worker or worker[worker.index(flag) + 1] == rank, worker


@pytest.mark.parametrize(("runtime", "backend", "layout"), VARIANTS)
@FEW
@given(values=VALUES)
@example(values=ALL_HOSTILE)
def test_slurm_launchers_run_nothing_and_pass_values_verbatim(
    runtime: str, backend: str, layout: str, values: Values, stubs: Stubs
) -> None:
    with example_dir(values) as ex:
        cfg = hostile_config(ex, runtime=runtime, backend=backend, dp=layout == "dp-ep")
        text = refused(lambda: launcher_text(ex, cfg))
        if text is None:
            ex.assert_nothing_ran()
            return
        bash_n(text)
        result = run_launcher(ex, stubs, text, cfg.nodes)
        ex.assert_nothing_ran()
        check_launcher_run(ex, cfg, result)


@pytest.mark.parametrize(("runtime", "backend", "layout"), VARIANTS[::3])
@ONCE
@given(values=VALUES)
@example(values=ALL_HOSTILE)
def test_generated_shell_passes_shellcheck(runtime: str, backend: str, layout: str, values: Values) -> None:
    with example_dir(values) as ex:
        cfg = hostile_config(ex, runtime=runtime, backend=backend, dp=layout == "dp-ep")
        texts = [refused(lambda: launcher_text(ex, cfg)), refused(lambda: serve_script(cfg, HEAD))]
        for role in (HEAD, Role("worker", 1)):
            texts.append(refused(lambda role=role: plan_node(cfg, role, NET[role.kind]).script))
        for text in texts:
            if text is not None:
                shellcheck(text)


# ---- the tunnel hint (kit query --tunnel-hint) --------------------------------------------------


@PROPERTY
@given(host=VALUE, login=VALUE, user=VALUE)
@example(host="x$(touch @CANARY@)", login="h`touch @CANARY@`\nKIT_EOF", user="-oProxyCommand=touch @CANARY@")
def test_tunnel_hint_runs_nothing_and_passes_values_verbatim(host: str, login: str, user: str, stubs: Stubs) -> None:
    with example_dir(Values(*([""] * 11))) as ex:
        host, login, user = (v.replace(CANARY, str(ex.canary)) for v in (host, login, user))
        url = f"http://{host.replace('/', '_').replace('@', '_').replace('?', '_').replace('#', '_')}:8000"
        hint = refused(lambda: tunnel_hint(url, login, user))
        if hint is None:
            return
        comment = hint.rsplit("\n", 1)[1]
        assert comment == "# then, on the laptop: kit query --url http://127.0.0.1:8000"
        bash_n(hint)
        result = run(hint, ex, stubs)  # pasted: the whole hint, the comment line included
        assert result.returncode == 0, result.stderr
        ex.assert_nothing_ran()
        [argv] = ex.calls("ssh")
        assert argv[:3] == ["-N", "-L", argv[2]] and argv[2].startswith("8000:") and argv[2].endswith(":8000")
        login = login or "LOGIN_HOST"
        assert argv[3] == (login if "@" in login else f"{user or getpass.getuser()}@{login}")


# ---- through the real CLI: refused before anything is written, or a launcher that is safe -------


def kit_main(args: list[str]) -> tuple[int, str]:
    """`kit ARGS` in this process (kit.cli.main: exit codes as the CLI gives them), its output."""
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(args)
        except SystemExit as exc:
            code = exc.code
    return int(code or 0), out.getvalue() + err.getvalue()


@FEW
@given(values=VALUES)
@example(values=ALL_HOSTILE)
def test_kit_slurm_refuses_or_writes_a_safe_launcher(values: Values, stubs: Stubs) -> None:
    with example_dir(values) as ex:
        doc = {
            "cluster": "prop",  # refused unless a plain name: the other fields are the ones tested here
            "runtime": "apptainer",
            "image": ex.path("images", ex.v("secret")),
            "backend": "mp",
            "accelerator": "cpu",
            "nodes": 2,
            "gpus_per_node": 1,
            "interface": ex.v("interface"),
            "hf_cache": ex.path("hf", ex.v("hf_cache")),
            "hf_token_file": ex.secret_file("hf"),
            "api_key_file": ex.secret_file("key"),
            "env": {"NCCL_IB_HCA": ex.v("env")},
            "model": {"id": ex.v("model"), "served_name": ex.v("served"), "extra_args": ["--x", ex.v("extra")]},
            "ray": {"temp_dir": ex.v("temp_dir")},
            "slurm": {"time": "00:10:00"},
        }
        config = ex.root / "kit.yaml"
        config.write_text(yaml.safe_dump(doc, allow_unicode=True))
        out = ex.root / "launcher.sbatch"
        code, output = kit_main(["slurm", "--config", str(config), "-o", str(out)])
        if code != 0:
            assert code in (2, 3), output
            assert not out.exists() and "Traceback" not in output
            ex.assert_nothing_ran()
            return
        text = out.read_text()
        bash_n(text)
        launcher = run_launcher(ex, stubs, text, 2)
        ex.assert_nothing_ran()
        vllm = ex.calls("vllm")
        assert len(vllm) == 2, launcher.stdout + launcher.stderr
        model = yaml.safe_load(config.read_text())["model"]  # what kit read (YAML turns \r into \n)
        assert vllm[0][:2] == ["serve", model["id"]] and vllm[0][-2:] == model["extra_args"]


# ---- #SBATCH lines and values no command line can carry ---------------------------------------


@settings(PROPERTY, max_examples=200)
@given(value=VALUE)
@example(value="gpu\n$(touch x)")
def test_sbatch_lines_are_one_comment_line_or_refused(value: str) -> None:
    """An #SBATCH line is a comment to bash: safe while it stays one line (sbatch strips one pair
    of double quotes, so quotes and backslashes are refused too)."""
    line = refused(lambda: sbatch_line("partition", value))
    if line is None:
        return
    assert "\n" not in line and "\r" not in line and line.startswith("#SBATCH --partition=")
    bash_n(line)


@pytest.mark.parametrize("field", ["model", "served", "extra", "temp_dir", "env", "interface", "cluster", "image"])
def test_a_nul_byte_is_refused_by_every_renderer(field: str) -> None:
    """No argv, environment or script can carry NUL: kit refuses it (a KitError) instead of
    writing a script that bash would truncate."""
    values = dataclasses.replace(Values(*(["ok"] * 11)), **{field: "a\x00b"})
    with example_dir(values) as ex:
        cfg = hostile_config(ex, runtime="docker", backend="ray")
        with pytest.raises(KitError, match="NUL"):
            plan_launcher(cfg)
        if field in ("model", "served", "extra"):
            with pytest.raises(KitError, match="NUL"):
                serve_script(cfg, HEAD)
