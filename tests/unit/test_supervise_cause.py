"""The first error of a serve log (kit/supervise/cause.py, issue 25): what a failure names as its
cause, instead of the shutdown noise every rank prints after it. The logs are shaped like vLLM
0.32's (its process and logger prefixes, a traceback logged line by line, argparse's refusal)."""

from __future__ import annotations

from pathlib import Path

from kit.supervise.cause import Scanner, first_error, message

ENGINE_FAILED = """\
INFO 11-26 02:21:20 [api_server.py:1885] vLLM API server version 0.32.0
(EngineCore_DP0 pid=812) INFO 11-26 02:21:21 [core.py:93] Initializing a V1 LLM engine
(EngineCore_DP0 pid=812) ERROR 11-26 02:21:25 [core.py:708] EngineCore failed to start.
(EngineCore_DP0 pid=812) ERROR 11-26 02:21:25 [core.py:708] Traceback (most recent call last):
(EngineCore_DP0 pid=812) ERROR 11-26 02:21:25 [core.py:708]   File "/opt/vllm/core.py", line 699, in run
(EngineCore_DP0 pid=812) ERROR 11-26 02:21:25 [core.py:708]     raise ValueError(msg)
(EngineCore_DP0 pid=812) ERROR 11-26 02:21:25 [core.py:708] ValueError: max_model_len (99999) > the model's 2048
(EngineCore_DP0 pid=812) Process EngineCore_DP0:
Traceback (most recent call last):
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}
[rank0]:[W1126 02:21:26] ProcessGroupGloo: connection closed by peer
"""

PEER_GONE = """\
(EngineCore_DP0 pid=90) ERROR 11-26 03:01:02 [multiproc_executor.py:154] Worker proc VllmWorker-1 died \
unexpectedly, shutting down executor.
(APIServer pid=1) ERROR 11-26 03:01:02 [async_llm.py:480] AsyncLLM output_handler failed.
vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
RuntimeError: Connection reset by peer
"""


def test_the_first_real_error_is_the_cause_not_the_noise_after_it() -> None:
    assert first_error(ENGINE_FAILED.splitlines()) == "ValueError: max_model_len (99999) > the model's 2048"


def test_argparse_refusals_and_killed_processes_are_causes() -> None:
    lines = ["usage: vllm serve [model_tag] [options]", "vllm serve: error: unrecognized arguments: --no-such-flag"]
    assert first_error(lines) == "vllm serve: error: unrecognized arguments: --no-such-flag"
    assert first_error(["loading weights", "Killed"]) == "Killed"
    assert first_error(["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]).startswith(
        "torch.OutOfMemoryError"
    )


def test_an_error_logged_without_a_traceback_is_taken_when_nothing_better_is_there() -> None:
    lines = ["(APIServer pid=1) ERROR 11-26 03:01:02 [launcher.py:80] Port 8000 is already in use"]
    assert first_error(lines) == "Port 8000 is already in use"


def test_noise_alone_names_no_cause() -> None:
    """Only the consequences of a failure elsewhere (a peer's death): the cause is on another
    node, or outside the log (a killed container)."""
    assert first_error(PEER_GONE.splitlines()) is None
    assert first_error([]) is None and first_error(["INFO all good"]) is None


def test_prefixes_are_stripped() -> None:
    line = "(RayWorkerWrapper pid=77, ip=10.0.0.2) ERROR 11-26 03:01:02 [worker.py:1] KeyError: 'x'"
    assert message(line) == "KeyError: 'x'"


def test_the_scanner_reads_only_what_is_new_and_starts_over_on_a_new_log(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_text("INFO starting\n(EngineCore_DP0 pid=1) ERROR 11-26 02:21:25 [core.py:708] Value")
    scanner = Scanner(str(log))
    assert scanner.scan() is None  # half a line is not read yet
    with log.open("a") as out:
        out.write("Error: bad\nOSError: later, not the first\n")
    assert scanner.scan() == "ValueError: bad"
    log.write_text("INFO a new run\n")  # rotated: smaller than what was read
    assert scanner.scan() is None


# Measured on the 2-node CPU cluster (vLLM 0.32.0, TP=2 over two containers, 2026-11-28): the
# first request a fresh server gets is a one-token completion; the TP worker on the second node
# dies of SIGILL. The head's log then holds only consequences; the worker's names the death.
HEAD_AFTER_A_WORKER_DIED = """\
(EngineCore pid=675) ERROR 11-28 04:13:48 [dump_input.py:72] Dumping input data for V1 LLM engine (v0.32.0) with config
(EngineCore pid=675) ERROR 11-28 04:13:48 [core.py:1512] EngineCore encountered a fatal error.
(EngineCore pid=675) ERROR 11-28 04:13:48 [core.py:1512] Traceback (most recent call last):
(EngineCore pid=675) ERROR 11-28 04:13:48 [core.py:1512]     raise RuntimeError("cancelled")
(EngineCore pid=675) ERROR 11-28 04:13:48 [core.py:1512] RuntimeError: cancelled
(APIServer pid=32) ERROR 11-28 04:13:48 [async_llm.py:906] AsyncLLM output_handler failed.
(APIServer pid=32) ERROR 11-28 04:13:48 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore \
encountered an issue. See stack trace (above) for the root cause.
INFO:     Shutting down
"""
WORKER_THAT_DIED = """\
(Worker_TP1 pid=405) INFO 11-28 04:21:40 [cpu_worker.py:260] Explicitly set (1.0/23.54) GiB for KV cache on node 0.
(MainProcess pid=324) ERROR 11-28 04:21:44 [multiproc_executor.py:315] Worker proc VllmWorker-1 died \
unexpectedly (exit code: -4), shutting down executor.
(MainProcess pid=324) INFO 11-28 04:21:44 [multiproc_executor.py:479] [shutdown] Executor: waiting for worker exit
"""


def test_a_worker_killed_by_a_signal_is_the_cause_and_the_heads_echo_is_not() -> None:
    assert first_error(HEAD_AFTER_A_WORKER_DIED.splitlines()) is None
    cause = first_error(WORKER_THAT_DIED.splitlines())
    assert cause == "Worker proc VllmWorker-1 died unexpectedly (exit code: -4), shutting down executor."
    assert (
        first_error(["ERROR 11-28 04:21:44 [x.py:1] Worker proc VllmWorker-1 died unexpectedly (exit code: None)"])
        is None
    )
