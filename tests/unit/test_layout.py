"""The layout decided once (issue 17): kit.plan.layout's pure planner with and without the model's
facts, how each layout says it was decided, the resolved config carrying exactly that layout, and
the commands that show it (--dry-run of up, serve, slurm) or refuse what a host can only guess
(`kit slurm` without the model's config.json: exit 3, one line naming model.tp/model.pp)."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kit.cli import main
from kit.cluster.resolve import read_model_facts, resolve
from kit.config import KitConfig, load_config
from kit.errors import ConfigError
from kit.layout import Layout
from kit.plan import layout as lay
from kit.plan.layout import ModelFacts, plan_layout

DATA = Path(__file__).resolve().parents[1] / "data" / "models"
QWEN = "Qwen/Qwen2.5-7B-Instruct"  # 28 attention heads, 4 KV heads
DEEPSEEK = "deepseek-ai/DeepSeek-V3"  # 128 heads (MLA), 256 routed experts


@pytest.fixture(autouse=True)
def _isolate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    for name in [n for n in __import__("os").environ if n.startswith("KIT_")]:
        monkeypatch.delenv(name)


def config(**values: object) -> KitConfig:
    """A config from these dotted keys (no kit.yaml, no KIT_* environment)."""
    overrides = {k.replace("__", "."): (v, "test") for k, v in values.items()}
    return load_config(environ={}, cwd=Path("/nonexistent"), overrides=overrides).config


def hf_cache_with(tmp_path: Path, name: str, repo: str) -> Path:
    snap = tmp_path / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    shutil.copy(DATA / name / "config.json", snap / "config.json")
    return tmp_path


def facts_of(tmp_path: Path, name: str, repo: str) -> ModelFacts:
    cache = hf_cache_with(tmp_path, name, repo)
    found = read_model_facts(config(hf_cache=str(cache), model__id=repo))
    assert found is not None and found.architecture is not None
    return found


def run_kit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 0), out, err


# ---- the planner: pure ----------------------------------------------------------------------


def test_every_value_set_is_taken_as_is() -> None:
    got = plan_layout(config(nodes=2, gpus_per_node=8, model__tp=4, model__pp=4, model__dp=1), None)
    assert got == Layout(4, 4, 1, False, lay.BY_CONFIG)


def test_with_the_model_tp_splits_the_heads_and_pp_takes_the_rest(tmp_path: Path) -> None:
    # test_auto_parallel.py's case through the planner: 28 heads, 4 KV heads -> TP 4, PP 4.
    qwen = facts_of(tmp_path, "qwen2.5-7b", QWEN)
    assert (qwen.heads, qwen.kv_heads, qwen.experts) == (28, 4, 0)
    got = plan_layout(config(nodes=2, gpus_per_node=8, model__id=QWEN), qwen)
    assert got == Layout(4, 4, 1, False, lay.BY_MODEL)


def test_without_the_model_the_rule_guesses_and_says_so() -> None:
    got = plan_layout(config(nodes=2, gpus_per_node=8), None)
    assert got == Layout(8, 2, 1, False, lay.BY_NO_MODEL, guessed=True)
    assert "no model files" in got.decided_by
    # One GPU per node: the heads cannot matter, nothing is guessed.
    assert not plan_layout(config(nodes=4, gpus_per_node=1), None).guessed


def test_one_value_left_auto_fills_the_gpus_with_or_without_the_model(tmp_path: Path) -> None:
    qwen = facts_of(tmp_path, "qwen2.5-7b", QWEN)
    tp_set = config(nodes=2, gpus_per_node=4, model__tp=2, model__id=QWEN)
    pp_set = config(nodes=2, gpus_per_node=8, model__pp=4, model__id=QWEN)
    for cfg, expected in ((tp_set, (2, 4)), (pp_set, (4, 4))):
        with_model, without = plan_layout(cfg, qwen), plan_layout(cfg, None)
        assert (with_model.tp, with_model.pp) == (without.tp, without.pp) == expected
        assert with_model.decided_by == without.decided_by == lay.BY_FILL and not without.guessed


def test_gpu_memory_uses_kit_plan_and_refuses_a_cluster_too_small(tmp_path: Path) -> None:
    big = facts_of(tmp_path, "wizardlm-2-8x22b", "org/big")  # 281 GB of weights
    small = config(nodes=1, gpus_per_node=2, model__id="org/big", model__gpu_memory="A100-40GB")
    with pytest.raises(ConfigError, match=r"nodes|fit"):
        plan_layout(small, big)
    roomy = config(nodes=2, gpus_per_node=8, model__id="org/big", model__gpu_memory="H200")
    assert plan_layout(roomy, big).decided_by == lay.BY_MODEL_MEMORY


@pytest.mark.parametrize(
    ("values", "with_model", "without_model"),
    [
        # DP auto: replicas of one node's GPUs; with the model TP splits its 28 heads (4).
        ({"model__dp": "auto"}, (4, 1, 4, lay.BY_MODEL), (8, 1, 2, lay.BY_NO_MODEL_DP)),
        # A fixed DP 2: TP auto is one replica's GPUs (head-dividing with the model), PP fills it.
        ({"model__dp": 2}, (4, 2, 2, lay.BY_MODEL), (8, 1, 2, lay.BY_NO_MODEL_DP)),
        # TP set: nothing for the model to decide.
        ({"model__dp": "auto", "model__tp": 1}, (1, 1, 16, lay.BY_FILL), (1, 1, 16, lay.BY_FILL)),
        ({"model__dp": 2, "model__tp": 2}, (2, 4, 2, lay.BY_FILL), (2, 4, 2, lay.BY_FILL)),
    ],
)
def test_data_parallel_layouts(
    values: dict[str, Any], with_model: tuple[Any, ...], without_model: tuple[Any, ...], tmp_path: Path
) -> None:
    qwen = facts_of(tmp_path, "qwen2.5-7b", QWEN)
    cfg = config(nodes=2, gpus_per_node=8, model__id=QWEN, **values)
    for facts, expected in ((qwen, with_model), (None, without_model)):
        got = plan_layout(cfg, facts)
        assert (got.tp, got.pp, got.dp, got.decided_by) == expected
        assert got.guessed == (expected[3] == lay.BY_NO_MODEL_DP)


def test_expert_parallel_rides_along(tmp_path: Path) -> None:
    ds = facts_of(tmp_path, "deepseek-v3", DEEPSEEK)
    assert ds.experts == 256 and ds.kv_heads is None  # MLA: no KV heads to split
    got = plan_layout(config(nodes=2, gpus_per_node=8, model__dp="auto", model__ep=True, model__id=DEEPSEEK), ds)
    assert got == Layout(8, 1, 2, True, lay.BY_MODEL) and got.describe() == "TP=8 PP=1 DP=2 EP"


def test_one_head_rule_from_kit_sizing(tmp_path: Path) -> None:
    """ModelFacts.splits_heads is kit.sizing's valid_tp (with the architecture) or heads_split
    (with the head counts only): KV heads split or replicated, never the planner's own copy."""
    from kit import sizing

    qwen = facts_of(tmp_path, "qwen2.5-7b", QWEN)
    for tp in range(1, 33):
        assert qwen.splits_heads(tp) == sizing.valid_tp(qwen.architecture, tp)  # type: ignore[arg-type]
    raw = ModelFacts("config.json", 32, 2, None, None)
    assert raw.splits_heads(4) and raw.splits_heads(2) and not raw.splits_heads(3)  # 2 KV heads replicated over 4
    assert ModelFacts("config.json", None, None, None, None).splits_heads(7)  # nothing known: nothing refused


def test_the_resolved_config_carries_the_planned_layout(tmp_path: Path) -> None:
    """Every combination of tp/pp/dp (auto or set), with and without the model: the config the
    commands plan from holds exactly the planner's numbers, and says how they were decided."""
    cache = hf_cache_with(tmp_path, "qwen2.5-7b", QWEN)
    for tp, pp, dp, model in itertools.product(("auto", 2), ("auto", 1), ("auto", 1, 2), (QWEN, "org/absent")):
        overrides = {"nodes": 2, "gpus_per_node": 8, "model.tp": tp, "model.pp": pp, "model.dp": dp}
        overrides |= {"model.id": model, "hf_cache": str(cache)}
        r = resolve(None, {k: (v, "t") for k, v in overrides.items()})
        assert (r.config.model.tp, r.config.model.pp, r.config.model.dp) == (r.layout.tp, r.layout.pp, r.layout.dp)
        carried = r.config.layout
        assert (carried.tp, carried.pp, carried.dp, carried.ep) == (r.layout.tp, r.layout.pp, r.layout.dp, r.layout.ep)
        assert r.config.planned is not None and carried.decided_by == r.config.planned.decided_by == r.layout.decided_by
        assert (r.model is not None) == (model == QWEN)


def test_model_facts_read_once_per_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`kit up --dry-run` reads the model's config.json once (it was three times: heads, experts,
    auto layout)."""
    from kit import sizing

    cache = hf_cache_with(tmp_path, "deepseek-v3", DEEPSEEK)
    calls: list[str] = []
    real = sizing.load_model_config

    def counted(model: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append(model)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(sizing, "load_model_config", counted)
    argv = ["up", "--dry-run", "--json", "--network", "n", "--nodes", "2", "--gpus-per-node", "8", "--model", DEEPSEEK]
    with pytest.raises(SystemExit) as info:
        main([*argv, "--set", f"hf_cache={cache}", "--set", "model.ep=true"])
    assert info.value.code in (0, None) and len(calls) == 1


# ---- the commands: shown in every --dry-run, refused where a host can only guess -------------


def test_up_and_serve_dry_runs_show_how_the_layout_was_decided(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = hf_cache_with(tmp_path, "qwen2.5-7b", QWEN)
    base = ["--set", "nodes=2", "--set", "gpus_per_node=8", "--set", f"model.id={QWEN}", "--set", f"hf_cache={cache}"]
    code, out, err = run_kit(["up", "--head", "--dry-run", "--network", "n", *base], capsys)
    assert code == 0, err
    assert "# parallel: TP=4 PP=4 DP=1\n# layout decided by: auto: model files (kit plan)\n" in out
    code, out, err = run_kit(["serve", "--dry-run", "--json", *base], capsys)
    doc = json.loads(out)["result"]
    assert doc["parallel"] == {"tp": 4, "pp": 4, "dp": 1, "ep": False} and doc["layout_from"] == lay.BY_MODEL
    code, out, err = run_kit(["serve", "--dry-run", "--set", "nodes=2", "--set", "gpus_per_node=8"], capsys)
    assert f"\n# layout decided by: {lay.BY_NO_MODEL}\n" in out


def test_up_and_serve_warn_once_when_the_layout_is_guessed(capsys: pytest.CaptureFixture[str]) -> None:
    guessed = ["--set", "nodes=2", "--set", "gpus_per_node=8", "--set", "model.id=org/absent"]
    for verb in (["up", "--head", "--network", "n"], ["serve"]):
        code, out, err = run_kit([*verb, "--dry-run", "--json", *guessed], capsys)
        assert code == 0, err
        warnings = [w for w in json.loads(out)["result"]["warnings"] if "model's config.json" in w]
        assert len(warnings) == 1 and "TP=8 PP=2 DP=1" in warnings[0] and "set model.tp and model.pp" in warnings[0]
        code, out, err = run_kit([*verb, "--dry-run", *guessed], capsys)
        assert len([ln for ln in err.splitlines() if "model's config.json" in ln]) == 1
        explicit = [*guessed, "--set", "model.tp=8", "--set", "model.pp=2"]
        code, out, err = run_kit([*verb, "--dry-run", "--json", *explicit], capsys)
        assert not [w for w in json.loads(out)["result"]["warnings"] if "model's config.json" in w]


def test_slurm_refuses_a_layout_it_can_only_guess(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Deliberate change (issue 17): without the model's config.json `kit slurm` used to write
    TP = gpus_per_node, PP = nodes into the launcher, a layout the nodes (which may have the
    files) would decide otherwise. It now asks for the values: exit 3, one line."""
    base = ["slurm", "--nodes", "2", "--gpus-per-node", "4", "--model", "org/absent", "-o", str(tmp_path / "x.sbatch")]
    code, out, err = run_kit(base, capsys)
    assert code == 3 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("kit: error: model.tp: `kit slurm` cannot decide model.tp/model.pp `auto`")
    assert "(fix: set model.tp and model.pp (e.g. --tp 8 --pp 2;" in err
    assert not (tmp_path / "x.sbatch").exists()
    # The fix works: explicit values (or the model's files here) and the launcher is written.
    code, out, err = run_kit([*base, "--tp", "4", "--pp", "2", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)["result"]
    assert doc["parallel"] == {"tp": 4, "pp": 2, "dp": 1, "ep": False} and doc["layout_from"] == lay.BY_CONFIG
    cache = hf_cache_with(tmp_path, "qwen2.5-7b", QWEN)
    code, out, err = run_kit(
        ["slurm", "--nodes", "2", "--gpus-per-node", "4", "--model", QWEN, "--set", f"hf_cache={cache}"], capsys
    )
    assert code == 0, err
    # Issue 19: the same line says whether the nodes run vLLM offline (here: a config.json in a
    # snapshot no ref names, which vLLM offline would not find).
    line, warning, unchecked = err.strip().splitlines()
    assert "not checked against the image in advance" in unchecked  # issue 24: no record of it here
    assert line == (
        f"kit slurm: layout TP=4 PP=2 DP=1 (decided by: {lay.BY_MODEL}); "
        "vLLM runs online: the model is not in hf_cache on this host"
    )
    assert warning.startswith(f"warning: {QWEN} is not in hf_cache") and f"kit fetch {QWEN}" in warning
    assert "--label=kit.layout-from=auto: model files (kit plan)'" in out  # one quoted word, no comment


def test_slurm_json_dry_run_carries_the_layout(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_kit(["slurm", "--nodes", "2", "--gpus-per-node", "1", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)["result"]
    assert doc["launcher"].startswith("#!/usr/bin/env bash")
    assert doc["parallel"] == {"tp": 1, "pp": 2, "dp": 1, "ep": False} and doc["layout_from"] == lay.BY_NO_MODEL
