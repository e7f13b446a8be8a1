"""kit's clients against a scripted hostile server (tests/hostile_server.py, loopback, one
misbehaviour per URL prefix), issue 27: `kit query`, `kit bench`, `kit metrics`, the status
probes and `kit fetch` each end within their deadline plus a few seconds, with one line naming
the URL and what was wrong (exit 8), a peak memory far under the 256 MB the README promises,
no secret in what they print or save and no escape sequence reaching the terminal.

Cases that only need kit's answer run in-process (the same functions the verbs call, with small
deadlines); the cases that must observe memory or an exit code run `kit` as a subprocess and
read its peak RSS from the kernel (os.wait4's rusage of exactly that process), several at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kit.bench import dataset, schedule
from kit.bench.runner import Runner, Target
from kit.errors import ExitCode, ServerError
from kit.health import observe
from kit.net import openai as client
from kit.safe import text as safetext
from tests.conftest import ROOT, run_kit, write_secret
from tests.hostile_server import ESCAPES, HostileServer

KEY = "sk-hostile-0123456789abcdef"
MEMORY_BOUND = 256 * 1024 * 1024  # the README's promise: whatever a server sends
SLACK_S = 3.0  # "within its deadline plus a few seconds"


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileServer]:
    with HostileServer(max_s=20) as server:
        yield server


@pytest.fixture(autouse=True)
def _forget_secrets() -> Iterator[None]:
    yield
    safetext.forget_secrets()


def timed(call: Callable[[], Any]) -> tuple[BaseException | None, float]:
    start = time.monotonic()
    try:
        call()
    except BaseException as exc:
        return exc, time.monotonic() - start
    return None, time.monotonic() - start


# ---------------------------------------------------------------- query, in-process

CHAT_CASES = [
    ("html", "answered HTML, not JSON"),
    ("json-list", "the answer is a list, not an object"),
    ("empty-choices", "choices is empty"),
    ("wrong-types", "choices[0] is a string, not an object"),
    ("usage-string", "usage.completion_tokens is a string, not a token count"),
    ("not-utf8", "is not UTF-8 text"),
    ("deep-json", "nested deeper than 64 levels"),
    ("gib-body", "announced 1073741824 bytes, more than the 4194304 kit reads"),
    ("gib-unannounced", "sent more than 4194304 bytes"),
    ("endless-chunked", "sent more than 4194304 bytes"),
    ("gzip-bomb", "sent more than 4194304 bytes once decompressed"),
    ("drip-headers", "did not answer within 1 s"),
    ("echo-auth-500", "answered 500"),
]


@pytest.mark.parametrize(("behaviour", "why"), CHAT_CASES, ids=[c[0] for c in CHAT_CASES])
def test_a_chat_answer_that_is_not_one_is_one_line_within_the_deadline(
    hostile: HostileServer, behaviour: str, why: str
) -> None:
    url = hostile.url(behaviour)
    safetext.register_secret(KEY)
    err, took = timed(lambda: client.chat(url, KEY, "tiny", "hi", max_tokens=8, timeout=1))
    assert isinstance(err, ServerError) and err.exit_code == ExitCode.SERVER, err
    assert f"{url}/v1/chat/completions" in err.message and why in err.message, err.message
    assert "\n" not in err.message and took < 1 + SLACK_S
    assert KEY not in safetext.clean(err.message)  # what the CLI prints


STREAM_CASES = [
    ("endless-sse", "streamed more than 8 tokens' worth of text (--max-tokens 8): kit stopped reading"),
    ("endless-sse-line", "sent an event-stream line over 65536 bytes"),
    ("drip-headers", "did not answer within 1 s"),
]


@pytest.mark.parametrize(("behaviour", "why"), STREAM_CASES, ids=[c[0] for c in STREAM_CASES])
def test_a_stream_that_never_ends_stops_at_max_tokens_or_a_bound(
    hostile: HostileServer, behaviour: str, why: str
) -> None:
    seen: list[str] = []
    call = lambda: client.chat(  # noqa: E731
        hostile.url(behaviour), None, "tiny", "hi", max_tokens=8, stream=True, on_text=seen.append, timeout=1
    )
    err, took = timed(call)
    assert isinstance(err, ServerError) and why in err.message, err
    assert took < 1 + SLACK_S and len(seen) <= 8 + client.EXTRA_DELTAS


def test_models_and_probes_and_scrapes_end_at_their_deadline(hostile: HostileServer) -> None:
    """The other requests kit sends: /v1/models, the status probes (/health, /metrics, the
    one-token probe) and the scrape of `kit metrics`."""
    cases: list[tuple[Callable[[], Any], str]] = [
        (lambda: client.list_models(hostile.url("models-html"), None, timeout=1), "answered HTML"),
        (lambda: client.list_models(hostile.url("models-drip"), None, timeout=1), "did not answer within 1 s"),
        (lambda: observe.scrape(hostile.url("metrics-drip"), deadline_s=1), "did not answer within 1 s"),
        (lambda: observe.scrape(hostile.url("metrics-bomb"), deadline_s=1), "once decompressed"),
        (lambda: observe.scrape(hostile.url("metrics-gib"), deadline_s=1), "sent more than 16777216 bytes"),
    ]
    for call, why in cases:
        err, took = timed(call)
        assert isinstance(err, ServerError) and why in err.message, err
        assert took < 1 + SLACK_S
    # The one-token probe: a hung engine is a failed probe at the deadline, HTML one that says so.
    hung = observe.probe(hostile.url("probe-hang"), "tiny", engine="0", deadline_s=1)
    assert hung.error and "did not answer within 1 s" in hung.error
    html = observe.probe(hostile.url("probe-html"), "tiny", engine="0", deadline_s=1)
    assert html.error and "answered 200 without a completion" in html.error
    seen, _ = observe.observe(hostile.url("metrics-bomb"), deadline_s=1)
    assert seen.metrics_error and "once decompressed" in seen.metrics_error and seen.health_error is None


def test_escape_sequences_never_reach_the_terminal(hostile: HostileServer, kit_env: Path) -> None:
    code, out, err = run_kit(["query", "--url", hostile.url("escapes"), "--timeout", "5"])
    assert code == 0, err
    assert not any(c in out + err for c in "\x1b\x07\x9b\u202e"), repr(out)
    assert "\\x1b]0;pwned\\x07" in out  # shown, as text
    code, out, err = run_kit(["query", "--url", hostile.url("models-escapes"), "--timeout", "5", "--json"])
    assert code == 0 and "\x1b" not in out and json.loads(out)["result"]["models"] == [ESCAPES]


def test_a_500_echoing_the_key_never_shows_it(hostile: HostileServer, kit_env: Path) -> None:
    key_file = write_secret(kit_env / "key", KEY + "\n")
    url = hostile.url("echo-auth-500")
    for extra in ([], ["--json"], ["--stream"]):
        code, out, err = run_kit(["query", "--url", url, "--api-key-file", str(key_file), "--timeout", "5", *extra])
        assert code == ExitCode.SERVER, err
        assert KEY not in out + err and "Bearer <redacted>" in out + err
    # A password in a URL is never printed either: --url refuses credentials (without echoing
    # them), and HF_ENDPOINT's are redacted from every line about the Hub.
    code, _, err = run_kit(["query", "--url", hostile.url("html").replace("//", "//me:pa55word-x@"), "--timeout", "5"])
    assert code == ExitCode.CONFIG and "pa55word-x" not in err


def test_a_password_in_hf_endpoint_is_never_printed(
    hostile: HostileServer, kit_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hostile.url("html").replace("//", "//me:pa55word-x@"))
    monkeypatch.setenv("HF_HOME", str(kit_env / "hf-home"))
    for args in (["fetch", "org/model", "--set", f"hf_cache={kit_env / 'hf'}"], ["plan", "org/model", "--fetch"]):
        code, out, err = run_kit(args)
        assert code in (ExitCode.CONFIG, ExitCode.SERVER), err
        assert "pa55word-x" not in out + err and "<redacted>@127.0.0.1" in err, err


# ---------------------------------------------------------------- bench, in-process


@pytest.mark.parametrize(
    ("behaviour", "why"),
    [
        ("endless-sse", "the server sent more than 4 tokens"),
        ("endless-sse-line", "the server sent an event over 1048576 bytes"),
        ("gzip-bomb", "the server sent an event over 1048576 bytes"),  # inflated a MiB at a time
        ("drip-headers", "timed out waiting for the answer"),
        ("echo-auth-500", 'HTTP 500: {"error": "upstream failed for Authorization: Bearer <redacted>"}'),
    ],
)
def test_bench_requests_fail_alone_within_their_deadline(hostile: HostileServer, behaviour: str, why: str) -> None:
    safetext.register_secret(KEY)
    runner = Runner(Target(hostile.url(behaviour), "tiny", api_key=KEY, timeout_s=1))
    err, took = timed(lambda: runner.run(dataset.fixed(1, 4, 4), schedule.LoadPoint(float("inf"), 1)))
    assert err is None and took < 1 + SLACK_S
    run = runner.run(dataset.fixed(1, 4, 4), schedule.LoadPoint(float("inf"), 1))
    record = run.records[0]
    assert not record.success and safetext.redact(record.error or "").startswith(why), record.error


# ---------------------------------------------------------------- kit itself: memory and exit codes


@dataclass
class Outcome:
    argv: list[str]
    code: int
    stdout: str
    stderr: str
    seconds: float
    peak_bytes: int

    def __str__(self) -> str:
        return f"{self.argv[3:]}: exit {self.code} in {self.seconds:.1f} s, {self.peak_bytes >> 20} MB\n{self.stderr}"


def run_measured(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 60) -> Outcome:
    """`kit ARGV` as a subprocess, its peak RSS as the kernel counted it (tests/peak_rss.py)."""
    tag = time.monotonic_ns()
    rss = cwd / f"rss-{tag}"
    launcher = [sys.executable, str(ROOT / "tests" / "peak_rss.py"), str(rss)]
    start = time.monotonic()
    done = subprocess.run(
        [*launcher, sys.executable, "-m", "kit", *argv],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    seconds = time.monotonic() - start
    return Outcome(argv, done.returncode, done.stdout, done.stderr, seconds, int(rss.read_text()))


def kit_env_for(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KIT_", "HF_", "HUGGING_FACE"))}
    env.update(KIT_STATE_DIR=str(tmp_path / "state"), PYTHONPATH=str(ROOT), HF_HOME=str(tmp_path / "hf-home"))
    return env


def test_kit_stays_bounded_whatever_the_server_sends(hostile: HostileServer, tmp_path: Path) -> None:
    """Each `kit` process: exit 8, one error line naming the URL, ended within its deadline
    (2 s) plus SLACK_S and kit's own start-up, and a peak RSS under MEMORY_BOUND."""
    key = write_secret(tmp_path / "key", KEY + "\n")
    # The heaviest of each client (the rest are bounded by the same parser, in-process above).
    runs: list[tuple[list[str], str]] = [
        (["query", "--url", hostile.url("gzip-bomb")], "once decompressed"),
        (["query", "--url", hostile.url("endless-chunked")], "sent more than 4194304 bytes"),
        (["query", "--stream", "--url", hostile.url("endless-sse")], "kit stopped reading"),
        (["metrics", "--url", hostile.url("metrics-flood")], "more than 100000 samples"),
        (
            ["bench", "--url", hostile.url("endless-sse"), "-n", "2", "--warmup", "0", "-o", str(tmp_path / "b1.json")],
            "the server sent more than 32 tokens",
        ),
        (
            ["bench", "--url", hostile.url("echo-auth-500"), "-n", "1", "--warmup", "0", "-o", f"{tmp_path}/b2.json"],
            "HTTP 500",
        ),
    ]
    flags = {
        "query": ["--timeout", "2", "--api-key-file", str(key)],
        "metrics": ["--timeout", "2", "--interval", "0.1"],
        "bench": ["--request-timeout", "2", "--api-key-file", str(key)],
    }
    env = kit_env_for(tmp_path)

    def one(argv: list[str]) -> Outcome:
        return run_measured([*argv, *flags[argv[0]]], env, tmp_path)

    with ThreadPoolExecutor(max_workers=3) as pool:
        outcomes = list(pool.map(one, [r[0] for r in runs]))
    for (_, why), outcome in zip(runs, outcomes, strict=True):
        lines = [ln for ln in outcome.stderr.splitlines() if ln.startswith("kit: error:")]
        assert outcome.code == ExitCode.SERVER, outcome
        assert len(lines) == 1 and why in lines[0] and "Traceback" not in outcome.stderr, outcome
        assert outcome.peak_bytes < MEMORY_BOUND, outcome
        # 2 s per request (metrics: two scrapes and /health; bench: /v1/models and /version
        # first), kit's start-up (a few seconds on a loaded 2-core host), SLACK_S.
        assert outcome.seconds < 3 * 2 + 8 + SLACK_S, outcome
        assert KEY not in outcome.stdout + outcome.stderr, outcome
    for saved in ("b1.json", "b2.json"):
        text = (tmp_path / saved).read_text()
        assert KEY not in text and "NaN" not in text and "Infinity" not in text
        json.loads(text)  # strict JSON
    assert "Bearer <redacted>" in (tmp_path / "b2.json").read_text()
    print("\n".join(f"{o.argv[0]} {o.argv[2]}: {o.seconds:.1f} s, {o.peak_bytes >> 20} MB" for o in outcomes))


def test_json_output_is_strict(hostile: HostileServer, kit_env: Path) -> None:
    """--json never prints NaN or Infinity (strict parsers reject them): non-finite numbers are null."""
    assert safetext.to_json({"a": float("nan"), "b": [float("inf"), -float("inf")], "c": 1.5}) == (
        '{\n  "a": null,\n  "b": [\n    null,\n    null\n  ],\n  "c": 1.5\n}'
    )
    code, out, err = run_kit(["metrics", "--url", hostile.url("metrics-nan"), "--interval", "0.1", "--json"])
    assert code == 0, err
    json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} in --json output"))
    assert json.loads(out)["result"]["engines"][0]["kv_cache_usage"] is None
