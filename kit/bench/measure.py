"""Run a benchmark's load points against one server and fill the results document; the
document is saved after every point so a failure or Ctrl-C leaves the partial results."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.bench import metrics, results
from kit.bench.dataset import Prompt
from kit.bench.runner import BUDGET_STOP, Runner, Target
from kit.bench.schedule import LoadPoint
from kit.errors import ServerError
from kit.net import http
from kit.output import LiveLine, bar
from kit.safe import text as safetext


@dataclass(frozen=True)
class Load:
    prompts: list[Prompt]
    points: list[LoadPoint]
    warmup: int = 1
    seed: int = 0
    burstiness: float = 1.0
    description: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **(self.description or {}),
            "num_prompts": len(self.prompts),
            "requested_output_tokens": sum(p.output_len for p in self.prompts),
            "points": [p.to_dict() for p in self.points],
            "warmup": self.warmup,
            "seed": self.seed,
        }


def interrupt_on_sigterm() -> None:
    """SIGTERM (a scheduler, `kill`) unwinds like Ctrl-C: results saved, servers torn down."""
    import signal

    def _raise(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)


def server_version(base_url: str, key: str | None, timeout: float = 5) -> str | None:
    """vLLM's GET /version ({"version": "0.32.0"}), None when the server has no such route or
    answers anything else (bounded like every request kit sends: kit/net/http.py)."""
    if timeout <= 0:
        return None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    limits = http.DEFAULT.but(total_s=timeout, connect_s=min(timeout, 10.0), body_bytes=64 * 1024)
    try:
        resp = http.request("GET", f"{base_url}/version", headers=headers, limits=limits)
        doc = resp.json() if resp.status == 200 else None
    except ServerError:
        return None
    version = doc.get("version") if isinstance(doc, dict) else None
    return safetext.one_line(version, 80) if isinstance(version, str) and version else None


def warm_up(runner: Runner, prompts: Sequence[Prompt], count: int) -> str | None:
    """Untimed requests first (vLLM's bench sends one test prompt), one at a time and bounded by
    the runner's deadline like the measured ones; returns why they were cut short (the budget),
    else None. A failed one is the server's fault: one line, exit 8."""
    if count < 1:
        return None
    run = runner.run([prompts[i % len(prompts)] for i in range(count)], LoadPoint(float("inf"), 1))
    if run.stopped == "interrupted":
        raise KeyboardInterrupt
    if run.stopped == BUDGET_STOP:
        return run.stopped
    failed = next((r for r in run.records if not r.success), None)
    if failed is not None:
        hint = "pass the server's key with --api-key-file" if failed.status == 401 else "check `kit logs --serve`"
        raise ServerError(f"the warm-up request to {runner.target.base_url} failed: {failed.error}", hint=hint)
    return None


def run_load(
    target: Target,
    load: Load,
    doc: dict[str, Any],
    *,
    save_to: Path | None,
    live: LiveLine,
    layout: str | None = None,
    deadline: float | None = None,
) -> str | None:
    """Measure every point into doc["points"]; returns why it stopped early, or None.
    `deadline` (time.monotonic()) bounds the warm-up and every point (kit tune's budget)."""
    state = {"point": ""}

    def show(done: int, failed: int, total: int) -> None:
        err = f", {failed} failed" if failed else ""
        live.update(f"{state['point']} {bar(done, total)} {done}/{total} requests{err}")

    runner = Runner(target, on_progress=show, deadline=deadline)
    try:
        state["point"] = f"{layout + ' ' if layout else ''}warm-up"
        stopped = warm_up(runner, load.prompts, load.warmup)
        if stopped:
            live.done()
            return stopped
        for number, point in enumerate(load.points, 1):
            state["point"] = f"{layout + ' ' if layout else ''}point {number}/{len(load.points)} ({point.label})"
            live.update(f"{state['point']} {bar(0, len(load.prompts))} 0/{len(load.prompts)} requests", force=True)
            run = runner.run(load.prompts, point, seed=load.seed, burstiness=load.burstiness)
            m = metrics.compute(run.records, run.duration)
            m["not_sent"] = run.not_sent
            entry: dict[str, Any] = {
                **point.to_dict(),
                "layout": layout,
                "metrics": m,
                "stopped": run.stopped,
                "requests": [r.to_dict() for r in run.records],
            }
            doc["points"].append(entry)
            if save_to is not None:
                results.save(doc, save_to)
            live.done(
                f"{state['point']}: {m['completed']}/{len(load.prompts)} ok, "
                f"{m['output_throughput']:.1f} out tok/s, TTFT p50 {m['median_ttft_ms']:.1f} ms"
                if not math.isnan(m["output_throughput"])
                else f"{state['point']}: no request finished"
            )
            if run.stopped == "interrupted":
                raise KeyboardInterrupt
            if run.stopped:
                return run.stopped
    except KeyboardInterrupt:
        live.done()
        doc["error"] = "interrupted"
        if save_to is not None:
            results.save(doc, save_to)
        raise
    return None


def failed_requests(doc: dict[str, Any]) -> tuple[int, int]:
    failed = sum(p["metrics"]["failed"] + p["metrics"].get("not_sent", 0) for p in doc["points"])
    total = sum(p["metrics"]["num_requests"] + p["metrics"].get("not_sent", 0) for p in doc["points"])
    return failed, total


def finish(
    doc: dict[str, Any], stopped: str | None, save_to: Path | None, on_error: Callable[[str], None] | None = None
) -> None:
    """Mark the document complete, or record the error, save it, and raise one clear line."""
    failed, total = failed_requests(doc)
    where = f"; partial results saved to {save_to}" if save_to else ""
    if stopped or failed:
        first = next(
            (e for p in doc["points"] for e in p["metrics"].get("errors", {})),
            None,
        )
        reason = stopped or f"{failed} of {total} requests failed"
        doc["error"] = reason if not first or first in reason else f"{reason}: {first}"
        doc["complete"] = False
        if save_to is not None:
            results.save(doc, save_to)
        if on_error:
            on_error(doc["error"])
        raise ServerError(
            f"{doc['error']} ({failed} of {total} requests not answered){where}",
            hint="see `kit logs --serve` and `kit status`",
        )
    doc["complete"] = True
    if save_to is not None:
        results.save(doc, save_to)
