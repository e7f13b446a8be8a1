"""A corpus of bad inputs run through the real CLI (kit/__main__.py in a process of its own,
forked from one that imported kit once: tests/unit/cli_fork.py), one per row, grouped by the
classes of issue 16. Every row must end in:

- the documented exit code (kit/errors.py: 2 usage, 3 config/input, 5 image),
- one line on stderr that names the field or flag (the row's fragment), or with --json one JSON
  error document on stdout, and no traceback,
- nothing started: docker, apptainer, singularity and the SLURM/SSH binaries are recording stubs
  first on PATH, the Docker engine is a dead socket and HTTP goes through a dead proxy, so a
  container, job or request shows up as a recorded call or a different exit code,
- nothing written: the case's whole folder (work dir, KIT_STATE_DIR, HOME) is the same after,
- bounded time: each run is killed after TIMEOUT_S (a hang fails the row).

The rows run in the background (one process each, in its own folder) from when the module starts;
each row's test then checks its own result.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.unit.cli_fork import run_kit

TIMEOUT_S = 20
STUBS = ("docker", "apptainer", "singularity", "sbatch", "srun", "squeue", "scancel", "scontrol", "ssh", "vllm", "ray")
RECORDER = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["KIT_RECORD"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
sys.exit(1)
"""
# Every row runs once, in the module fixture below: under pytest-xdist (`--dist loadgroup`) the whole
# module stays on one worker, else each worker that got a row would run the whole corpus again.
pytestmark = pytest.mark.xdist_group("bad-input-corpus")
AS_ROOT = pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file: an unreadable file cannot be made")


@dataclass(frozen=True)
class Case:
    cls: int  # issue 16 class (1-8)
    code: int  # expected exit code
    needle: str  # fragment of the error line: names the field or flag
    argv: tuple[str, ...]
    files: Mapping[str, str | bytes] = field(default_factory=dict)  # inputs in the work dir
    fifos: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    chmod: Mapping[str, int] = field(default_factory=dict)
    marks: tuple[Any, ...] = ()


def c(cls: int, code: int, needle: str, *argv: str, **kw: Any) -> Case:
    return Case(cls, code, needle, argv, **kw)


def yaml_case(cls: int, code: int, needle: str, text: str | bytes, *argv: str, **kw: Any) -> Case:
    """kit.yaml in the work dir (found there like a user's), then `kit ARGV`."""
    return Case(cls, code, needle, argv or ("config", "show"), files={"kit.yaml": text, **kw.pop("files", {})}, **kw)


NL = "x\nKIT_HEAD_SCRIPT_EOF)\n$(touch PWNED)"
BIG = "a" * 100_000
DEEP_JSON = "[" * 100_000 + "]" * 100_000
LOL = ", ".join(["lol"] * 9)
BOMB = (
    "model:\n  extra_args: [&a [" + LOL + "], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b], "
    "&d [*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d], &f [*e,*e,*e,*e,*e,*e,*e,*e,*e], "
    "&g [*f,*f,*f,*f,*f,*f,*f,*f,*f], *g]\n"
)
GOOD_RESULT = json.dumps({"kind": "kit-bench", "points": []})
CFG = {"config.json": json.dumps({"num_hidden_layers": 2})}

CASES: list[Case] = [
    # --- 1. values that would reach generated shell: control characters refused up front ----
    c(1, 3, "--model: contains a newline", "slurm", "--model", NL),
    c(1, 3, "--set model.served_name: contains a newline (at char", "slurm", "--set", f"model.served_name={NL}"),
    c(1, 3, "--job-name: contains a newline", "slurm", "--job-name", "x\n#SBATCH --wrap=id"),
    c(1, 3, "--partition: contains a newline", "slurm", "--partition", "gpu\n$(id)"),
    c(1, 3, "interface: '$(touch PWNED)' is not a valid value", "slurm", "--interface", "$(touch PWNED)"),
    c(1, 3, "interface: 'a\"b' is not a valid value", "slurm", "--interface", 'a"b'),
    c(1, 3, "interface: 'e`id`' is not a valid value", "up", "--dry-run", "--interface", "e`id`"),
    yaml_case(1, 3, "hf_token_file: contains a newline", 'hf_token_file: "/tmp/t\\ntouch PWNED"\n', "slurm"),
    yaml_case(1, 3, "api_key_file: contains a newline", 'api_key_file: "/tmp/k\\n$(id)"\n', "slurm"),
    yaml_case(1, 3, "model.id: contains a newline", 'model:\n  id: "a\\nKIT_HEAD_SCRIPT_EOF"\n', "slurm"),
    yaml_case(1, 3, "model.served_name: contains a carriage return", 'model:\n  served_name: "a\\rb"\n'),
    yaml_case(1, 3, "env: A: contains a newline", 'env:\n  A: "x\\ny"\n', "up", "--dry-run"),
    yaml_case(1, 3, "model.extra_args: item 2: contains an ESC", 'model:\n  extra_args: [--x, "\\e[31m"]\n'),
    yaml_case(1, 3, "ray.temp_dir: contains a NUL byte", 'ray:\n  temp_dir: "/tmp/\\0x"\n'),
    yaml_case(1, 3, "slurm.account: contains a newline", 'slurm:\n  account: "p\\n#SBATCH -x"\n', "slurm"),
    yaml_case(1, 3, "mounts: item 1: contains a newline", 'mounts: ["/tmp:/x\\n$(id)"]\n', "up", "--dry-run"),
    yaml_case(1, 3, "image: contains the control character U+0085", 'image: "vllm/vllm\\x85"\n', "pull"),
    yaml_case(1, 3, "cluster: contains a tab", 'cluster: "a\\tb"\n', "down"),
    c(1, 3, "model.id: contains a newline", "up", "--dry-run", env={"KIT_MODEL_ID": "a\nb"}),
    c(
        1,
        3,
        "model.served_name: contains the control character U+2028",
        "serve",
        "--dry-run",
        env={"KIT_MODEL_SERVED_NAME": "a\u2028b"},
    ),
    c(1, 3, "--login-host: contains a newline", "query", "--tunnel-hint", "--login-host", "x\ntouch PWNED"),
    c(1, 3, "--served-name: contains an ESC", "serve", "--dry-run", "--served-name", "\x1b]0;x\x07"),
    # --- 2. option injection: a value that looks like an option, ids/names starting with '-' -
    c(2, 2, "--model: '--dry-run' looks like an option", "up", "--model", "--dry-run"),
    c(2, 2, "--served-name: '--dry-run' looks like an option", "serve", "--served-name", "--dry-run"),
    c(2, 2, "--model: '--trust-remote-code' looks like an option", "up", "--dry-run", "--model=--trust-remote-code"),
    c(2, 2, "--image: '--submit' looks like an option", "slurm", "--image", "--submit"),
    c(2, 2, "--out: '--submit' looks like an option", "slurm", "-o", "--submit"),
    c(2, 2, "--model: '--stream' looks like an option", "query", "--model", "--stream"),
    c(2, 2, "--url: '--json' looks like an option", "bench", "--url", "--json"),
    c(2, 2, "--cluster: '-x' looks like an option", "up", "--cluster", "-x", "--dry-run"),
    c(2, 2, "--image: '--json' looks like an option", "verify", "--image", "--json"),
    c(2, 2, "--tag: '--dry-run' looks like an option", "build", "--tag", "--dry-run"),
    c(2, 2, "--tail: '--follow' looks like an option", "logs", "--tail", "--follow"),
    c(2, 2, "--slurm: '--json' looks like an option", "down", "--slurm", "--json"),
    c(2, 2, "--layouts: '--fresh' looks like an option", "tune", "--layouts", "--fresh"),
    c(2, 2, "--cluster: '--json' looks like an option", "config", "show", "--cluster", "--json"),
    c(2, 2, "--image: '--keep' looks like an option", "demo", "--image", "--keep"),
    c(2, 2, "IMAGE: '-x' looks like an option", "pull", "--", "-x"),
    c(2, 2, "--config: '--dry-run' looks like an option", "up", "--config", "--dry-run"),
    c(2, 2, "--head-address: '--dry-run' looks like an option", "up", "--worker", "--head-address", "--dry-run"),
    c(
        2,
        2,
        "--login-host: '-oProxyCommand=id' looks like an option",
        "query",
        "--tunnel-hint",
        "--login-host",
        "-oProxyCommand=id",
    ),
    c(2, 2, "--gpu: '--json' looks like an option", "plan", "--gpu", "--json", "x"),
    yaml_case(
        2,
        3,
        "model.id: '--trust-remote-code' starts with '-'",
        "model:\n  id: --trust-remote-code\n",
        "up",
        "--dry-run",
    ),
    yaml_case(2, 3, "model.served_name: '-x' starts with '-'", "model:\n  served_name: -x\n", "serve", "--dry-run"),
    yaml_case(2, 3, "slurm.account: '-A' starts with '-'", "slurm:\n  account: -A\n", "slurm"),
    yaml_case(2, 3, "network: '--driver=host' starts with '-'", "network: --driver=host\n", "up", "--dry-run"),
    yaml_case(2, 3, "mounts: item 1: '-v:/x' starts with '-'", "mounts: ['-v:/x']\n", "up", "--dry-run"),
    yaml_case(2, 3, "hf_cache: '-x' starts with '-'", "hf_cache: -x\n", "up", "--dry-run"),
    c(2, 3, "image: '--privileged' starts with '-'", "up", "--dry-run", env={"KIT_IMAGE": "--privileged"}),
    # --- 3. inputs that raised tracebacks: loaders that cannot be blown up -------------------
    yaml_case(3, 3, "kit.yaml:2: config file is not UTF-8", b"nodes: 1\ncluster: caf\xe9\n"),
    yaml_case(
        3,
        3,
        "the YAML tag '!!python/object/apply:os.system' is not allowed",
        'nodes: !!python/object/apply:os.system ["touch PWNED"]\n',
    ),
    yaml_case(3, 3, "kit.yaml:1: cannot read the value (not a valid !!int)", 'nodes: !!int "abc"\n'),
    yaml_case(3, 3, "the YAML tag '!!binary' is not allowed", "model:\n  extra_args: !!binary aGk=\n"),
    yaml_case(3, 3, "the YAML tag '!local' is not allowed", "cluster: !local x\n"),
    yaml_case(3, 3, "expands to more than 10000 YAML nodes through its aliases", BOMB),
    yaml_case(
        3,
        3,
        "expands to more than 10000 YAML nodes through its aliases",
        "env: &e {A: x}\nmodel:\n  extra_args: &a [" + ",".join(["x"] * 200) + "]\n"
        "mounts: [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, "
        "*a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, "
        "*a, *a, *a, *a]\n",
    ),
    yaml_case(3, 3, "an alias refers to a value that contains it", "model:\n  extra_args: &a [*a]\n"),
    yaml_case(3, 3, "kit.yaml:1: nested deeper than 16 levels", "model: " + "[" * 20_000 + "]" * 20_000 + "\n"),
    yaml_case(3, 3, "kit.yaml:1: nested deeper than 16 levels", "env: " + "{a: " * 20_000 + "}" * 20_000 + "\n"),
    yaml_case(
        3, 3, "nested deeper than 16 levels", "model:\n" + "".join(" " * (2 * i) + f"k{i}:\n" for i in range(1, 40))
    ),
    yaml_case(3, 3, "config file is 300000 bytes, more than the 262144", "#" * 300_000),
    yaml_case(3, 3, "invalid YAML: unacceptable character #x0000", b"nodes: 1\n\x00\n"),
    yaml_case(3, 3, "kit.yaml:1: the top level must be a mapping", "- a\n- b\n"),
    yaml_case(3, 3, "a key must be a plain name", "? [a]\n: b\n"),
    yaml_case(3, 3, "kit.yaml:3: invalid YAML", "nodes: 1\nmodel: [\n"),
    yaml_case(3, 3, "kit.yaml:1: nodes: expected an integer, got float inf", "nodes: .inf\n"),
    yaml_case(3, 3, "kit.yaml:1: cannot read the value", "nodes: " + "9" * 5000 + "\n"),
    c(3, 3, "config file is not a regular file", "config", "show", "--config", "fifo.yaml", fifos=("fifo.yaml",)),
    c(3, 3, "/dev/zero: config file is not a regular file", "up", "--dry-run", "--config", "/dev/zero"),
    c(
        3,
        3,
        "env KIT_MODEL_EXTRA_ARGS: nested deeper than 16 levels",
        "up",
        "--dry-run",
        env={"KIT_MODEL_EXTRA_ARGS": "[" * 20_000},
    ),
    c(
        3,
        3,
        "the YAML tag '!!python/object/apply:os.system' is not allowed",
        "config",
        "show",
        "--set",
        'nodes=!!python/object/apply:os.system ["touch PWNED"]',
    ),
    c(3, 3, "--num-prompts: must be at most 100000, got 100000000", "bench", "-n", "100000000"),
    c(
        3,
        3,
        "--num-prompts: -n 100000 prompts of --input-len 1000 words",
        "bench",
        "-n",
        "100000",
        "--input-len",
        "1000",
    ),
    c(3, 3, "--out: the folder missing/dir does not exist", "slurm", "-o", "missing/dir/x.sbatch"),
    c(3, 2, "'-o' / '--out': File 'sub' is a directory", "slurm", "-o", "sub", files={"sub/keep": ""}),
    c(3, 3, "--dataset: /dev/zero: dataset is not a regular file", "bench", "--dataset", "/dev/zero"),
    c(3, 3, "--dataset: fifo: dataset is not a regular file", "bench", "--dataset", "fifo", fifos=("fifo",)),
    c(
        3,
        3,
        "--dataset: deep.json: not valid JSON (nested too deeply)",
        "bench",
        "--dataset",
        "deep.json",
        files={"deep.json": DEEP_JSON},
    ),
    c(
        3,
        3,
        "--dataset: latin.jsonl:2: dataset is not UTF-8",
        "bench",
        "--dataset",
        "latin.jsonl",
        files={"latin.jsonl": b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n'},
    ),
    c(
        3,
        3,
        "--compare: /dev/zero: results file is not a regular file",
        "bench",
        "--compare",
        "/dev/zero",
        "good.json",
        files={"good.json": GOOD_RESULT},
    ),
    c(
        3,
        3,
        "--compare: deep.json: nested deeper than 64 levels",
        "bench",
        "--compare",
        "deep.json",
        "good.json",
        files={"deep.json": DEEP_JSON, "good.json": GOOD_RESULT},
    ),
    c(
        3,
        3,
        "--from: fifo: results file is not a regular file",
        "bench",
        "--plot",
        "p.png",
        "--from",
        "fifo",
        fifos=("fifo",),
    ),
    c(3, 3, "--tail: 'abc' is not a line count", "logs", "--tail", "abc"),
    c(3, 3, "--sizes: '1Q' is not a size", "verify", "--host", "--sizes", "1Q"),
    c(3, 3, "--budget: '10x' is not a duration", "tune", "--budget", "10x"),
    c(3, 3, "MODEL: is empty", "plan", ""),
    c(
        3,
        3,
        "num_hidden_layers: 1000000000000.0 is outside 1..1,024",
        "plan",
        ".",
        "--gpu",
        "H100-80GB",
        files={"config.json": json.dumps({"num_hidden_layers": 1e12, "hidden_size": 4096})},
    ),
    c(
        3,
        3,
        "num_hidden_layers: 1e+26 is outside 1..1,024",
        "plan",
        ".",
        "--gpu",
        "H100-80GB",
        files={"config.json": json.dumps({"num_hidden_layers": 1e26, "hidden_size": 4096})},
    ),
    c(
        3,
        3,
        "config.json: cannot read JSON: nested deeper than 64 levels",
        "plan",
        ".",
        "--gpu",
        "H100-80GB",
        files={"config.json": "[" * 100_000 + "]" * 100_000},
    ),
    c(
        3,
        3,
        "overhead: '1e999' is larger than 1 EiB",
        "plan",
        ".",
        "--gpu",
        "H100-80GB",
        "--overhead",
        "1e999",
        files=CFG,
    ),
    # --- 4. accepted where a refusal is due ---------------------------------------------------
    c(4, 3, "flag --timeout: timeouts.join: must be at least 1, got 0", "up", "--dry-run", "--timeout", "0"),
    c(4, 3, "flag --timeout: timeouts.join: must be at least 1, got -5", "up", "--dry-run", "--timeout", "-5"),
    c(4, 3, "flag --timeout: timeouts.ready: must be at least 1, got 0", "serve", "--dry-run", "--timeout", "0"),
    c(4, 3, "model.max_model_len: must be at least 1, got 0", "serve", "--dry-run", "--max-model-len", "0"),
    c(4, 3, "model.max_model_len: must be at least 1, got -2", "serve", "--dry-run", "--max-model-len", "-2"),
    c(4, 3, "--served-name: is 100000 characters long", "serve", "--dry-run", "--served-name", BIG),
    yaml_case(
        4, 3, "model.served_name: is 100000 characters long", f"model:\n  served_name: {BIG}\n", "serve", "--dry-run"
    ),
    yaml_case(4, 3, "mounts: item 1: the host path 'data' is relative", "mounts: ['data:/data']\n", "up", "--dry-run"),
    yaml_case(
        4, 3, "the host path /nonexistent/kit-x of mount", "mounts: ['/nonexistent/kit-x:/data']\n", "up", "--dry-run"
    ),
    yaml_case(
        4, 3, "mounts: item 1: the container path 'data' is not absolute", "mounts: ['/tmp:data']\n", "up", "--dry-run"
    ),
    yaml_case(4, 3, "mounts: item 1: '/tmp:/x:rx' is not a mount", "mounts: ['/tmp:/x:rx']\n", "up", "--dry-run"),
    yaml_case(
        4,
        3,
        "work/keydir is not a regular file",
        "api_key_file: keydir\nruntime: apptainer\nimage: /x.sif\n",
        "up",
        "--dry-run",
        files={"keydir/x": ""},
    ),
    yaml_case(
        4,
        3,
        "hf_token_file: ",
        "hf_token_file: /nonexistent/token\nruntime: apptainer\nimage: /x.sif\n",
        "up",
        "--dry-run",
    ),
    yaml_case(
        4,
        3,
        "api_key_file: key is not readable by this user",
        "api_key_file: key\nruntime: apptainer\nimage: /x.sif\n",
        "up",
        "--dry-run",
        files={"key": "k"},
        chmod={"key": 0},
        marks=(AS_ROOT,),
    ),
    c(4, 3, "slurm.cpus_per_task: must be at least 1, got -1", "slurm", "--cpus-per-task", "-1"),
    c(4, 3, "slurm.cpus_per_task: must be at least 1, got 0", "slurm", "--cpus-per-task", "0"),
    c(4, 3, "--max-tokens: must be at least 1, got -5", "query", "--max-tokens", "-5"),
    c(4, 3, "--max-tokens: must be at least 1, got 0", "query", "--max-tokens", "0"),
    c(4, 3, "--url: 'file:///etc/passwd' is not an http:// or https:// URL", "query", "--url", "file:///etc/passwd"),
    c(4, 3, "--url: is empty", "query", "--url", ""),
    c(4, 3, "--url: 'http://' has no host", "query", "--url", "http://"),
    c(4, 3, "--url: 'http://h:99999' has an invalid port", "query", "--url", "http://h:99999"),
    c(4, 3, "--url: holds credentials", "query", "--url", "http://user:pw@h:8000"),
    c(4, 3, "--url: 'ftp://h' is not an http:// or https:// URL", "bench", "--url", "ftp://h"),
    c(4, 3, "IMAGE: is empty", "pull", ""),
    c(4, 5, "malformed image reference 'UPPER/Case:tag'", "pull", "UPPER/Case:tag"),
    c(4, 3, "nodes: must be at least 1, got 0", "up", "--dry-run", "--nodes", "0"),
    c(4, 3, "nodes: must be at most 16384, got 100000000", "serve", "--dry-run", "--set", "nodes=100000000"),
    c(4, 3, "gpus_per_node: must be at least 1, got -1", "up", "--dry-run", "--gpus-per-node", "-1"),
    c(4, 3, "model.tp: must be at least 1, got 0", "up", "--dry-run", "--tp", "0"),
    c(4, 3, "ports.api: must be at least 1, got 0", "serve", "--dry-run", "--port", "0"),
    c(4, 3, "ports.api: must be at most 65535, got 70000", "serve", "--dry-run", "--port", "70000"),
    yaml_case(4, 3, "cluster: is empty", "cluster: ''\n", "status"),
    c(4, 3, "cluster: 'a b' is not a valid value", "up", "--dry-run", "--cluster", "a b"),
    c(4, 3, "cluster: 'aaaaaaaaaaa", "down", "--cluster", "a" * 70),
    c(4, 3, "model.served_name: is empty", "serve", "--dry-run", "--set", "model.served_name="),
    c(4, 3, "--head-address: is empty", "up", "--dry-run", "--worker", "--head-address", ""),
    yaml_case(4, 3, "env: 'A': expected a plain value, got a list", "env:\n  A: [1]\n", "up", "--dry-run"),
    yaml_case(4, 3, "env: '1BAD' is not a valid variable name", "env:\n  1BAD: x\n", "up", "--dry-run"),
    yaml_case(
        4, 3, "HF_TOKEN must not be passed as an environment variable", "env:\n  HF_TOKEN: x\n", "up", "--dry-run"
    ),
    yaml_case(
        4,
        3,
        "model.extra_args: has 2000 entries; kit takes at most 1024",
        "model:\n  extra_args: [" + ", ".join(["--x"] * 2000) + "]\n",
    ),
    c(4, 3, "--budget: 0 is 0 s", "tune", "--budget", "0"),
    c(4, 3, "--budget: 192h is 691200 s", "tune", "--budget", "192h"),
    c(4, 3, "--timeout: must be at least 1, got 0", "verify", "--host", "--timeout", "0"),
    c(4, 3, "--master-port: must be at most 65535, got 70000", "verify", "--host", "--master-port", "70000"),
    c(4, 3, "--nnodes: must be at least 1, got 0", "verify", "--host", "--nnodes", "0"),
    c(4, 3, "--max-tokens: must be at least 1, got 0", "demo", "--max-tokens", "0"),
    c(4, 3, "--subnet: 'x' is not a subnet", "demo", "--subnet", "x"),
    c(4, 3, "cluster: 'a b' is not a valid value", "demo", "--cluster", "a b"),
    c(4, 3, "--rank: must be at least 0, got -1", "logs", "--rank", "-1"),
    c(4, 3, "--tag: 'Bad Tag' is not a valid image reference", "build", "--dry-run", "--tag", "Bad Tag"),
    c(4, 3, "--build-arg: '1X' is not a valid variable name", "build", "--dry-run", "--build-arg", "1X=y"),
    c(4, 3, "NAME: '../etc' is not an image folder", "build", "--dry-run", "../etc"),
    c(4, 3, "slurm.time: 'abc' is not a SLURM time", "slurm", "--time", "abc"),
    c(4, 2, "'abc' is not a SLURM job id", "down", "--slurm", "abc"),
    c(4, 2, "'1;id' is not a SLURM job id", "status", "--slurm", "1;id"),
    c(4, 3, "nodes: must be at least 1, got 0", "config", "show", "--set", "nodes=0"),
    c(4, 3, "--prompt: is empty", "query", "--prompt", ""),
    # --- 5. hangs: special files refused, NaN rates refused ----------------------------------
    c(5, 3, "LOGFILE: /dev/zero is not a regular file", "diagnose", "/dev/zero"),
    c(5, 3, "LOGFILE: fifo.log is not a regular file", "diagnose", "fifo.log", fifos=("fifo.log",)),
    c(5, 2, "is a directory", "diagnose", "."),
    c(5, 3, "--rate: nan is not a finite number", "bench", "--rate", "nan"),
    c(5, 3, "--rate: nan is not a finite number", "bench", "--rate", "1,inf,nan"),
    c(5, 3, "--rate: 1e999 is not a finite number", "bench", "--rate", "1e999"),
    c(5, 3, "--burstiness: nan is not a finite number", "bench", "--burstiness", "nan"),
    c(5, 3, "--burstiness: must be above 0, got 0", "bench", "--burstiness", "0"),
    c(5, 3, "--concurrency: 0 must be > 0", "bench", "--concurrency", "0"),
    c(5, 3, "--request-timeout: nan is not a finite number", "bench", "--request-timeout", "nan"),
    c(5, 3, "--api-key-file: /dev/zero", "query", "--url", "http://127.0.0.1:9", "--api-key-file", "/dev/zero"),
    c(
        5,
        3,
        "--api-key-file: kf is not a regular file",
        "bench",
        "--url",
        "http://127.0.0.1:9",
        "--api-key-file",
        "kf",
        fifos=("kf",),
    ),
    c(
        5,
        3,
        "--rate: 10 rates x 10 concurrencies make 100 load points",
        "bench",
        "--rate",
        "1,2,3,4,5,6,7,8,9,10",
        "--concurrency",
        "1,2,3,4,5,6,7,8,9,10",
    ),
    # --- 6. every check before the first side effect ------------------------------------------
    c(
        6,
        3,
        "--output: the folder missing does not exist",
        "bench",
        "--url",
        "http://127.0.0.1:9",
        "-o",
        "missing/x.json",
    ),
    c(
        6,
        2,
        "'--output' / '-o': File 'out' is a directory",
        "bench",
        "--url",
        "http://127.0.0.1:9",
        "-o",
        "out",
        files={"out/k": ""},
    ),
    c(
        6,
        3,
        "--plot: the folder missing does not exist",
        "bench",
        "--url",
        "http://127.0.0.1:9",
        "--plot",
        "missing/p.png",
    ),
    c(6, 3, "--burstiness: must be above 0, got 0", "bench", "--url", "http://127.0.0.1:9", "--burstiness", "0"),
    c(6, 3, "--output: the folder missing does not exist", "tune", "-o", "missing/x.json"),
    c(6, 2, "'--plot': File 'plots' is a directory", "tune", "--plot", "plots", files={"plots/k": ""}),
    c(6, 3, "--budget: 0 is 0 s", "tune", "--budget", "0", "--layouts", "tp1"),
    c(6, 3, "--junit: the folder missing does not exist", "verify", "--junit", "missing/r.xml"),
    c(6, 3, "hf_token_file: ", "slurm", "--submit", "--set", "hf_token_file=/nonexistent/token"),
    c(6, 3, "flag --timeout: timeouts.join: must be at least 1, got 0", "up", "--timeout", "0"),
    c(6, 2, "--model: '--dry-run' looks like an option", "up", "--head", "--model", "--dry-run"),
    c(6, 3, "model.max_model_len: must be at least 1, got 0", "serve", "--max-model-len", "0"),
    c(6, 3, "--dataset: nope.jsonl", "bench", "--url", "http://127.0.0.1:9", "--dataset", "nope.jsonl"),
    # --- 8. messages that name the right thing ------------------------------------------------
    c(8, 3, "--temperature: nan is not a finite number", "query", "--temperature", "nan"),
    c(8, 3, "--temperature: must be at least 0, got -1", "query", "--temperature", "-1"),
    c(8, 3, "--request-timeout: must be above 0, got -1", "bench", "--request-timeout", "-1"),
    c(8, 3, "--request-timeout: must be above 0, got 0", "tune", "--request-timeout", "0"),
    yaml_case(8, 3, "model: expected a mapping of model.* keys, got the value '5'", "model: 5\n"),
    yaml_case(8, 3, "ports: expected a mapping of ports.* keys, got a list", "ports: [1]\n"),
    yaml_case(8, 3, "modle: unknown key (fix: did you mean 'model'?)", "modle:\n  id: x\n"),
    c(8, 2, "No such command 'upp' (fix: did you mean `kit up`?)", "upp"),
    c(8, 2, "did you mean `kit serve`?", "servee"),
    c(8, 2, "did you mean `kit status`?", "stauts"),
    c(8, 2, "No such command 'frobnicate' (fix: see `kit --help`", "frobnicate"),
    c(8, 2, "No such option '--timout'", "up", "--timout", "5"),
    c(8, 3, "flag --timeout: timeouts.join", "up", "--dry-run", "--json", "--timeout", "0"),
    c(8, 2, "No such command 'upp'", "upp", "--json"),
    c(8, 3, "--rate: nan is not a finite number", "bench", "--json", "--rate", "nan"),
    c(8, 2, "--model: '--json' looks like an option", "up", "--model", "--json"),
    # --- kit fetch and kit metrics (merged after the corpus was written) ----------------------
    c(2, 2, "MODEL: '-x/y' looks like an option", "fetch", "--", "-x/y"),
    c(2, 2, "--revision: '--json' looks like an option", "fetch", "--revision", "--json", "x/y"),
    c(3, 3, "MODEL: is empty", "fetch", ""),
    c(1, 3, "MODEL: contains a newline", "fetch", "org/m\n$(touch PWNED)"),
    c(3, 3, "is not a Hub model id", "fetch", "a$(id)/b"),
    c(3, 3, "--revision: '../../etc' is not a branch, tag or commit", "fetch", "x/y", "--revision", "../../etc"),
    c(2, 2, "--workers", "fetch", "x/y", "--workers", "0"),
    c(4, 2, "--interval", "metrics", "--interval", "nan"),
    c(4, 2, "--interval", "metrics", "--interval", "0"),
    c(4, 3, "--url: 'file:///etc/passwd' is not an http(s) URL", "metrics", "--url", "file:///etc/passwd"),
    c(4, 3, "--url: is empty", "metrics", "--url", ""),
    c(2, 2, "--prometheus: '--json' looks like an option", "metrics", "--prometheus", "--json"),
    c(6, 3, "--prometheus: the folder missing does not exist", "metrics", "--prometheus", "missing/x.json"),
]


def case_id(case: Case) -> str:
    text = " ".join(case.argv)[:48]
    return f"c{case.cls}-" + "".join(ch if ch.isprintable() else "?" for ch in text)


@dataclass
class Outcome:
    rc: int | None
    stdout: str
    stderr: str
    calls: list[str]
    before: set[str]
    after: set[str]


def snapshot(root: Path) -> set[str]:
    out = set()
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        out.update(os.path.join(rel, name) for name in dirs + files)
    return {p for p in out if not p.endswith("calls.jsonl")}


def run_case(case: Case, root: Path, timeout: float = TIMEOUT_S) -> Outcome:
    work, state, home, stubs = root / "work", root / "state", root / "home", root / "bin"
    for folder in (work, state, home, stubs):
        folder.mkdir(parents=True)
    for name in STUBS:
        (stubs / name).write_text(RECORDER)
        (stubs / name).chmod(0o755)
    for rel, content in case.files.items():
        path = work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    for rel in case.fifos:
        os.mkfifo(work / rel)
    for rel, mode in case.chmod.items():
        (work / rel).chmod(mode)
    record = root / "calls.jsonl"
    env = {
        "PATH": f"{stubs}:{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(home),
        "KIT_STATE_DIR": str(state),
        "DOCKER_HOST": "unix:///nonexistent/kit-corpus.sock",  # any engine call fails loudly (exit 4)
        "HTTP_PROXY": "http://127.0.0.1:9",  # any request fails loudly (exit 8)
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "",
        "KIT_RECORD": str(record),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        **case.env,
    }
    before = snapshot(root)
    rc, stdout, stderr = run_kit(case.argv, env, work, timeout)
    calls = record.read_text().splitlines() if record.exists() else []
    return Outcome(rc, stdout, stderr, calls, before, snapshot(root))


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, concurrent.futures.Future[Outcome]]]:
    """Every runnable row queued at once and run one after the other in the background (each a
    fork: tests/unit/cli_fork.py); each test waits for its own."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    futures = {
        i: pool.submit(run_case, case, tmp_path_factory.mktemp(f"case{i}"))
        for i, case in enumerate(CASES)
        if not any(m.name == "skip" or (m.name == "skipif" and m.args[0]) for m in case.marks)
    }
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize(
    ("index", "case"), [pytest.param(i, case, id=case_id(case), marks=case.marks) for i, case in enumerate(CASES)]
)
def test_bad_input_is_refused_cleanly(
    index: int, case: Case, outcomes: dict[int, concurrent.futures.Future[Outcome]]
) -> None:
    result = outcomes[index].result()
    assert result.rc is not None, f"hung: killed after {TIMEOUT_S} s"
    seen = f"rc={result.rc}\nstdout: {result.stdout[:2000]}\nstderr: {result.stderr[:2000]}"
    assert "Traceback" not in result.stderr, seen
    assert result.rc == case.code, seen
    if "--json" in case.argv:
        doc = json.loads(result.stdout)
        assert doc["ok"] is False and doc["error"]["exit_code"] == case.code, seen
        message = doc["error"]["message"] + (f" (fix: {doc['error']['hint']})" if doc["error"]["hint"] else "")
        assert case.needle in message, seen
    else:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kit: error: "), seen
        assert case.needle in lines[0], seen
        assert result.stdout == "", seen
    assert result.calls == [], f"a container/job/ssh binary was run: {result.calls}"
    assert result.after == result.before, f"files appeared or vanished: {result.after ^ result.before}"


def test_the_corpus_covers_every_class_and_verb() -> None:
    """At least 100 rows; every class of issue 16 but 7 (open defaults: warnings, not refusals);
    every verb of `kit --help`."""
    from tests.conftest import PRODUCT_VERBS

    assert len(CASES) >= 100
    assert {case.cls for case in CASES} >= {1, 2, 3, 4, 5, 6, 8}
    verbs = {case.argv[0] if case.argv else "config" for case in CASES} | {"config"}
    assert set(PRODUCT_VERBS) <= verbs, set(PRODUCT_VERBS) - verbs


def test_the_harness_sees_calls_writes_and_hangs(tmp_path: Path) -> None:
    """The checks above can fail: a run that calls a stubbed binary is recorded, a run that
    writes a file changes the snapshot, and a run that blocks is killed and reported."""
    called = run_case(c(0, 2, "", "status", "--slurm", "123"), tmp_path / "called")
    assert called.calls and json.loads(called.calls[0])[0] == "squeue"
    wrote = run_case(c(0, 0, "", "slurm", "-o", "x.sbatch"), tmp_path / "wrote")
    assert wrote.rc == 0 and wrote.after - wrote.before == {"work/x.sbatch"}
    with socket.create_server(("127.0.0.1", 0)) as silent:  # connects, never answers
        port = silent.getsockname()[1]
        slow = c(0, 0, "", "query", "--url", f"http://127.0.0.1:{port}", env={"NO_PROXY": "127.0.0.1"})
        hung = run_case(slow, tmp_path / "hung", timeout=2)
    assert hung.rc is None
