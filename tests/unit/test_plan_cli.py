"""`kit plan` through click (CliRunner) and through kit.cli.main for exit codes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kit.cli import cli, main
from kit.errors import ExitCode

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
QWEN397 = str(MODELS / "qwen3.5-397b-a17b-gptq-int4")
GUIDE = [QWEN397, "--gpu", "A100-40GB", "--gpus-per-node", "4", "--max-model-len", "262144"]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["plan", *args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def exit_code(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["plan", *args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_guide_scenario_text_shows_inputs_then_recommendation() -> None:
    code, out = run(*GUIDE)
    assert code == 0
    assert "layers      60 (45 linear_attention, 15 full_attention)" in out
    assert "MoE experts" in out and "gptq, int4, group 128" in out
    assert "15 full_attention layers × 2 (K,V) × 2 KV heads × head_dim 256 × 2 B" in out
    assert "nodes 2, TP 4, PP 2 (8 GPUs)" in out
    assert "--tensor-parallel-size 4 --pipeline-parallel-size 2" in out
    assert out.index("Weights") < out.index("KV cache") < out.index("Fewest nodes, largest TP")
    assert "recommended: TP2×PP4" in out  # MoE: the layout comparison has the last word


def test_json_envelope() -> None:
    code, out = run(*GUIDE, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["ok"] is True and doc["command"] == "plan"
    rec = doc["result"]["recommendation"]
    assert (rec["nodes"], rec["tp"], rec["pp"]) == (2, 4, 2)
    assert rec["fits_max_num_seqs"] is False
    assert rec["superseded_by"] == doc["result"]["layouts"]["recommended"] == "TP2×PP4"
    assert doc["result"]["kv_cache"]["per_token_bytes"] == 30720
    assert doc["result"]["weights"]["loaded_bytes"] > 198.5e9


def test_estimates_only_without_a_gpu() -> None:
    code, out = run(str(MODELS / "deepseek-v3"))
    assert code == 0
    assert "MLA" in out and "Pass --gpu" in out and "Recommendation" not in out


def test_gpu_memory_size_nodes_and_overrides() -> None:
    code, out = run(
        str(MODELS / "qwen2.5-7b"),
        "--gpu-memory",
        "24GiB",
        "--gpus-per-node",
        "2",
        "--nodes",
        "1",
        "--max-model-len",
        "8192",
        "--quantization",
        "fp8",
        "--kv-cache-dtype",
        "fp8",
        "--dtype",
        "float16",
    )
    assert code == 0
    assert "fp8, per-tensor scale, other tensors float16" in out
    assert "KV cache (fp8)" in out
    assert "nodes 1, TP 2, PP 1" in out


def test_hf_cache_entry_and_index_comparison(tmp_path: Path) -> None:
    snap = tmp_path / "models--org--wizard" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    shutil.copy(MODELS / "wizardlm-2-8x22b" / "config.json", snap / "config.json")
    (snap / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 281241268224}, "weight_map": {}})
    )
    code, out = run("org/wizard", "--hf-cache", str(tmp_path))
    assert code == 0
    assert "checkpoint index says 281,241,268,224 B" in out and "(+0.00 %)" in out


def test_help_teaches_with_an_example() -> None:
    code, out = run("--help")
    assert code == 0
    assert "Examples:" in out and "kit plan" in out and "--gpu A100-40GB" in out
    assert "A100-40GB" in out and "2 GiB per GPU" in out


def test_exit_ok_through_main(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = exit_code(capsys, *GUIDE)
    assert code == ExitCode.OK and "nodes 2" in out


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            [
                QWEN397,
                "--gpu",
                "A100-40GB",
                "--gpus-per-node",
                "4",
                "--nodes",
                "1",
                "--max-model-len",
                "4096",
            ],
            "nodes: weights need",
        ),
        ([QWEN397, "--gpu", "TPU-v5"], "gpu: unknown GPU"),
        ([QWEN397, "--gpu-memory", "lots"], "gpu_memory: cannot read"),
        ([QWEN397, "--gpu", "H200", "--gpu-memory-utilization", "1.2"], "gpu_memory_utilization"),
        ([QWEN397, "--gpu", "H200", "--max-model-len", "999999"], "max_position_embeddings"),
        ([QWEN397, "--quantization", "awq"], "does not match the checkpoint"),
        (["org/not-downloaded"], "no config.json"),
    ],
)
def test_refusals_exit_with_config_code(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    args: list[str],
    fragment: str,
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    code, _, err = exit_code(capsys, *args)
    assert code == ExitCode.CONFIG
    line = err.strip().splitlines()[0]
    assert line.startswith("kit: error: ") and fragment in line and "(fix: " in line


def test_refusal_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = exit_code(capsys, QWEN397, "--gpu", "TPU-v5", "--json")
    assert code == ExitCode.CONFIG
    assert json.loads(out)["error"]["type"] == "ConfigError"


def test_gpu_and_gpu_memory_together_is_usage(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = exit_code(capsys, QWEN397, "--gpu", "H200", "--gpu-memory", "40GiB")
    assert code == ExitCode.USAGE and "not both" in err
