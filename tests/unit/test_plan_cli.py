"""`kit plan` through click (CliRunner) and through kit.cli.main for exit codes."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kit.cli import cli
from kit.errors import ExitCode
from tests.conftest import fake_secret, run_kit

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
QWEN397 = str(MODELS / "qwen3.5-397b-a17b-gptq-int4")
GUIDE = [QWEN397, "--gpu", "A100-40GB", "--gpus-per-node", "4", "--max-model-len", "262144"]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["plan", *args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


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


def test_exit_ok_through_main() -> None:
    code, out, _ = run_kit(["plan", *GUIDE])
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
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    args: list[str],
    fragment: str,
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    code, _, err = run_kit(["plan", *args])
    assert code == ExitCode.CONFIG
    line = err.strip().splitlines()[0]
    assert line.startswith("kit: error: ") and fragment in line and "(fix: " in line


def test_refusal_as_json() -> None:
    code, out, _ = run_kit(["plan", QWEN397, "--gpu", "TPU-v5", "--json"])
    assert code == ExitCode.CONFIG
    assert json.loads(out)["error"]["type"] == "ConfigError"


def test_gpu_and_gpu_memory_together_is_usage() -> None:
    code, _, err = run_kit(["plan", QWEN397, "--gpu", "H200", "--gpu-memory", "40GiB"])
    assert code == ExitCode.USAGE and "not both" in err


# --------------------------------------------------------------------------- hostile input (issue 16)

# A real config (Qwen2.5-7B) that each hostile case breaks in one place.
BASE = json.loads((MODELS / "qwen2.5-7b" / "config.json").read_text())


def _with(key: str, raw: str) -> str:
    """BASE as JSON text with `key` set to the literal JSON `raw` (1e26, NaN, 1e400 stay as written)."""
    return json.dumps({**BASE, key: "@@"}).replace('"@@"', raw)


# name -> (config.json content, fragment the one error line must hold)
HOSTILE_CONFIGS: dict[str, tuple[str | bytes, str]] = {
    "layers 1e12 (int)": (_with("num_hidden_layers", "1000000000000"), "num_hidden_layers: 1000000000000 is outside"),
    "layers 1e12 (float)": (_with("num_hidden_layers", "1e12"), "num_hidden_layers: 1000000000000.0 is outside"),
    "layers 1e26": (_with("num_hidden_layers", "1e26"), "num_hidden_layers: 1e+26 is outside"),
    "layers 1e400 (inf)": (_with("num_hidden_layers", "1e400"), "num_hidden_layers: inf is not an integer"),
    "layers 4.5": (_with("num_hidden_layers", "4.5"), "num_hidden_layers: 4.5 is not an integer"),
    "hidden negative": (_with("hidden_size", "-64"), "hidden_size: -64 is outside"),
    "hidden zero": (_with("hidden_size", "0"), "hidden_size: 0 is outside"),
    "hidden 1e30": (_with("hidden_size", "1" + "0" * 30), "hidden_size: 1000000000000000000000000000000 is outside"),
    "heads zero": (_with("num_attention_heads", "0"), "num_attention_heads: 0 is outside"),
    "kv heads zero": (_with("num_key_value_heads", "0"), "num_key_value_heads: 0 is outside"),
    "kv heads text": (_with("num_key_value_heads", '"eight"'), "num_key_value_heads: 'eight' is not an integer"),
    "experts huge": (_with("num_local_experts", "1000000000"), "num_local_experts: 1000000000 is outside"),
    "vocab huge": (_with("vocab_size", "100000000000"), "vocab_size: 100000000000 is outside"),
    "NaN": (_with("hidden_size", "NaN"), "NaN is not a JSON number"),
    "Infinity": (_with("intermediate_size", "-Infinity"), "-Infinity is not a JSON number"),
    "100,000-deep nesting": ('{"a":' * 100_000 + "1" + "}" * 100_000, "nested deeper than"),
    "not UTF-8": (json.dumps(BASE).encode()[:-1] + b', "x": "\xff\xfe"}', "is not UTF-8"),
    "truncated": (json.dumps(BASE)[:40], "not valid JSON"),
    "not an object": ("[1, 2, 3]", "is not a JSON object"),
    "quantization_config a number": (_with("quantization_config", "5"), "quantization_config: 5 is not an object"),
    "block size zero": (
        _with("quantization_config", '{"quant_method": "fp8", "weight_block_size": [0, 128]}'),
        "quantization_config.weight_block_size: 0 is outside",
    ),
    "vision patch zero": (
        _with("vision_config", '{"num_hidden_layers": 2, "hidden_size": 32, "patch_size": 0, "image_size": 224}'),
        "vision_config.patch_size: 0 is outside",
    ),
}


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kit: error: ") and "(fix: " in lines[0] and "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("name", list(HOSTILE_CONFIGS))
def test_hostile_config_json_is_one_line_naming_file_and_key(tmp_path: Path, name: str) -> None:
    content, fragment = HOSTILE_CONFIGS[name]
    (tmp_path / "config.json").write_bytes(content if isinstance(content, bytes) else content.encode())
    code, out, err = run_kit(["plan", str(tmp_path), "--gpu", "H100-80GB"])
    assert code == ExitCode.CONFIG and out == ""
    line = one_error_line(err)
    assert str(tmp_path / "config.json") in line and fragment in line


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["--overhead", "1e999"], ExitCode.CONFIG, "overhead: '1e999' is larger than 1 EiB"),
        (["--gpu-memory", "1e999"], ExitCode.CONFIG, "gpu_memory: '1e999' is larger than 1 EiB"),
        (["--gpu-memory", "nan"], ExitCode.CONFIG, "gpu_memory: cannot read 'nan'"),
        (["--gpu-memory-utilization", "nan"], ExitCode.CONFIG, "--gpu-memory-utilization: nan is not a finite number"),
        (["--gpu-memory-utilization", "inf"], ExitCode.CONFIG, "--gpu-memory-utilization: inf is not a finite number"),
        (["--gpus-per-node", "100000000"], ExitCode.USAGE, "--gpus-per-node 100000000 is outside 1..1,024"),
        (["--gpus-per-node", "0"], ExitCode.USAGE, "--gpus-per-node 0 is outside"),
        (["--nodes", "-1"], ExitCode.USAGE, "--nodes -1 is outside"),
        (["--max-model-len", "0"], ExitCode.USAGE, "--max-model-len 0 is outside"),
        (["--max-num-seqs", "0"], ExitCode.USAGE, "--max-num-seqs 0 is outside"),
        (["--dtype", "x" * 100_000], ExitCode.CONFIG, "--dtype: is 100000 characters long"),
        (["--kv-cache-dtype", "fp8\nrm -rf /"], ExitCode.CONFIG, "--kv-cache-dtype: contains a newline"),
        (["--gpu", ""], ExitCode.CONFIG, "--gpu: is empty"),
    ],
)
def test_bad_flags_are_one_line_with_the_flag(args: list[str], code: ExitCode, fragment: str) -> None:
    got, out, err = run_kit(["plan", str(MODELS / "qwen2.5-7b"), *args])
    assert got == code and out == ""
    assert fragment in one_error_line(err)


@pytest.mark.parametrize(
    ("model", "fragment"), [("a" * 100_000, "MODEL: is 100000 characters long"), ("x\ny", "MODEL: contains a newline")]
)
def test_bad_model_argument_is_refused(model: str, fragment: str) -> None:
    code, _, err = run_kit(["plan", model])
    assert code == ExitCode.CONFIG and fragment in one_error_line(err)


def _plan_subprocess(*args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in its own process, with a deadline: a read that never ends fails the test
    instead of hanging it (special files)."""
    return subprocess.run(
        [sys.executable, "-m", "kit", "plan", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_special_files_are_refused_without_reading_them(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fifo_dir = tmp_path / "fifo-config"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / "config.json")
    zero_dir = tmp_path / "zero-config"
    zero_dir.mkdir()
    (zero_dir / "config.json").symlink_to("/dev/zero")
    cases = [
        (str(fifo), "model: is not a directory"),
        ("/dev/zero", "model: is not a directory"),
        (str(fifo_dir), "is not a regular file"),
        (str(zero_dir), "is not a regular file"),
    ]
    for model, fragment in cases:
        result = _plan_subprocess(model, "--gpu", "H100-80GB")
        assert result.returncode == ExitCode.CONFIG and result.stdout == "", (model, result.stderr)
        line = one_error_line(result.stderr)
        assert model in line and fragment in line


def test_deepest_allowed_model_that_fits_nowhere_is_refused_in_bounded_time(tmp_path: Path) -> None:
    """1,024 layers (the bound) of a 70B-wide layer on 3 GiB GPUs: every node count up to one
    stage per layer is tried and the refusal names the last (recommend's search is quadratic
    in layers; the bound keeps it to seconds, the deadline of _plan_subprocess catches a regress)."""
    config = {**BASE, "hidden_size": 8192, "num_hidden_layers": 1024, "intermediate_size": 65536}
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = _plan_subprocess(str(tmp_path), "--gpu-memory", "3GiB", "--gpus-per-node", "1")
    assert result.returncode == ExitCode.CONFIG
    assert "does not fit even on 1024 nodes" in one_error_line(result.stderr)


# --------------------------------------------------------------------------- --fetch and hf_token_file (issue 17)

TOKEN = fake_secret("hf_", "plan-token")
QWEN_CONFIG = (MODELS / "qwen2.5-7b" / "config.json").read_bytes()


class FakeHub:
    """A loopback Hub: /ORG/NAME/resolve/main/FILE answers from `files`; gated repos answer 401
    unless the request carries `Authorization: Bearer TOKEN`. Records every Authorization header."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.gated: set[str] = set()
        self.auth: list[str | None] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hub.auth.append(self.headers.get("Authorization"))
                repo = "/".join(self.path.strip("/").split("/")[:2])
                if repo in hub.gated and self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.send_response(401)
                    self.end_headers()
                    return
                body = hub.files.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def serve(self, repo: str, body: bytes = QWEN_CONFIG, *, gated: bool = False) -> None:
        self.files[f"/{repo}/resolve/main/config.json"] = body
        if gated:
            self.gated.add(repo)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeHub]:
    fake = FakeHub()
    fake.thread.start()
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # nothing cached: --fetch goes to the hub
    for var in ("HF_HUB_CACHE", "KIT_CONFIG", "KIT_HF_TOKEN_FILE", "http_proxy", "https_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    # The variables kit forbids: a token here must never be sent.
    monkeypatch.setenv("HF_TOKEN", "env-token-never-sent")
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", "env-token-never-sent")
    monkeypatch.chdir(tmp_path)  # no ./kit.yaml
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def test_fetch_gated_model_without_hf_token_file_says_how_to_fix(hub: FakeHub) -> None:
    hub.serve("org/gated", gated=True)
    code, out, err = run_kit(["plan", "org/gated", "--fetch"])
    assert code == ExitCode.CONFIG and out == ""
    line = one_error_line(err)
    assert "org/gated is gated or private" in line and "set hf_token_file" in line
    assert hub.auth == [None]  # HF_TOKEN / HUGGING_FACE_HUB_TOKEN in the environment were not used


@pytest.mark.parametrize("how", ["--set", "kit.yaml", "KIT_HF_TOKEN_FILE"])
def test_fetch_sends_the_token_of_hf_token_file_as_bearer(
    monkeypatch: pytest.MonkeyPatch, hub: FakeHub, tmp_path: Path, how: str
) -> None:
    token_file = tmp_path / "hf_token"
    token_file.write_text(TOKEN + "\n")
    hub.serve("org/gated", gated=True)
    args = ["org/gated", "--fetch", "--json"]
    if how == "--set":
        args += ["--set", f"hf_token_file={token_file}"]
    elif how == "kit.yaml":
        (tmp_path / "kit.yaml").write_text(f"hf_token_file: {token_file}\n")
    else:
        monkeypatch.setenv("KIT_HF_TOKEN_FILE", str(token_file))
    code, out, err = run_kit(["plan", *args])
    assert code == ExitCode.OK, err
    assert json.loads(out)["result"]["architecture"]["model_type"] == "qwen2"
    assert hub.auth[0] == f"Bearer {TOKEN}"
    assert TOKEN not in out + err


def test_fetch_public_model_sends_no_token_without_hf_token_file(hub: FakeHub) -> None:
    hub.serve("org/public")
    code, out, _ = run_kit(["plan", "org/public", "--fetch"])
    assert code == ExitCode.OK and "kit plan: org/public (qwen2)" in out
    assert hub.auth and set(hub.auth) == {None}


def test_fetch_refused_token_is_not_echoed(hub: FakeHub, tmp_path: Path) -> None:
    wrong = fake_secret("hf_", "plan-wrong-token")
    (tmp_path / "hf_token").write_text(wrong + "\n")
    (tmp_path / "hf_token").chmod(0o600)  # mode 644 would add a warning line (issue 27)
    hub.serve("org/gated", gated=True)
    code, out, err = run_kit(["plan", "org/gated", "--fetch", "--set", f"hf_token_file={tmp_path / 'hf_token'}"])
    assert code == ExitCode.CONFIG
    line = one_error_line(err)
    assert "the Hub refused the token in hf_token_file" in line
    assert wrong not in out + err


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"", "hf_token_file: is empty"),
        (b"two words\n", "hf_token_file: does not hold one token"),
        (b"tok\r\nX-Injected: 1", "hf_token_file: does not hold one token"),
        (b"\xff\xfe", "is not UTF-8"),
    ],
)
def test_unusable_token_file_is_refused_before_any_request(
    hub: FakeHub, tmp_path: Path, content: bytes, fragment: str
) -> None:
    (tmp_path / "hf_token").write_bytes(content)
    hub.serve("org/gated", gated=True)
    code, _, err = run_kit(["plan", "org/gated", "--fetch", "--set", f"hf_token_file={tmp_path / 'hf_token'}"])
    assert code == ExitCode.CONFIG and fragment in one_error_line(err)
    assert hub.auth == []


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "nested deeper than"),
        (b"\xff\xfe{}", "is not UTF-8"),
        (b"[1]", "is not a JSON object"),
        (json.dumps({**BASE, "num_hidden_layers": 10**12}).encode(), "num_hidden_layers: 1000000000000 is outside"),
    ],
)
def test_fetched_config_is_read_as_carefully_as_a_local_one(hub: FakeHub, body: bytes, fragment: str) -> None:
    hub.serve("org/odd", body)
    code, _, err = run_kit(["plan", "org/odd", "--fetch"])
    assert code == ExitCode.CONFIG and fragment in one_error_line(err)


def test_fetch_unknown_model_and_bad_ids(hub: FakeHub) -> None:
    code, _, err = run_kit(["plan", "org/absent", "--fetch"])
    assert code == ExitCode.CONFIG and "answered 404" in one_error_line(err)
    code, _, err = run_kit(["plan", "org/a?b=c", "--fetch"])
    assert code == ExitCode.CONFIG and "is not a Hub model id" in one_error_line(err)
    assert hub.auth == [None]  # only the first reached the hub


def test_fetch_takes_the_hub_ids_kit_fetch_takes(hub: FakeHub) -> None:
    """One Hub-id grammar for `kit plan --fetch` and `kit fetch` (issue 26): a model without an
    organisation (gpt2) passes both; `org--x` fails both."""
    hub.serve("gpt2")
    code, out, err = run_kit(["plan", "gpt2", "--fetch"])
    assert code == ExitCode.OK, err
    assert "kit plan: gpt2 (qwen2)" in out
    code, _, err = run_kit(["plan", "org--x/y", "--fetch"])
    assert code == ExitCode.CONFIG and "is not a Hub model id" in one_error_line(err)
