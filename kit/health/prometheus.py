"""vLLM's Prometheus metrics: a bounded parser of the text exposition format, per-engine
summaries, and rates from two scrapes. Pure: no I/O (kit/health/observe.py fetches /metrics).

What vLLM 0.32 (V1) exposes, read in vllm/v1/metrics/loggers.py and checked against a real scrape
of the CPU build (tests/fixtures/metrics/): every series carries `model_name` and `engine` (the DP
rank, "0" on a single-engine server); the API server on the head publishes the series of *every*
engine, the DP ranks of headless nodes included (they send their stats to it over ZMQ), and
headless nodes serve no HTTP at all. Older vLLM (V0) had no `engine` label and named the KV-cache
gauge `vllm:gpu_cache_usage_perc`: both are read here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from kit.errors import ServerError

# A scrape of a 64-engine server is a few MB (~25,000 samples, ~6 labels each); anything far
# beyond that is not vLLM talking. The sample and label caps bound what a page that stays under
# the byte cap can make kit hold (tens of MB, issue 27), the line cap what one line can.
MAX_SCRAPE_BYTES = 16 * 1024 * 1024
MAX_SAMPLES = 100_000
MAX_LABELS = 300_000
MAX_LINE = 64 * 1024

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # V1 name first, V0 fallback
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
REQUEST_SUCCESS = "vllm:request_success_total"
PREEMPTIONS = "vllm:num_preemptions_total"
SLEEP_STATE = "vllm:engine_sleep_state"  # sleep_state="awake" is 1 unless vLLM's sleep mode put it to sleep
# Histograms whose mean over an interval (Δsum / Δcount) an operator reads per engine.
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
E2E = "vllm:e2e_request_latency_seconds"
# Series that exist once per engine in every vLLM version kit knows: they decide which engines exist.
ENGINE_PRESENCE = (RUNNING, WAITING, GENERATION_TOKENS)

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE_RE = re.compile(rf"^(?P<name>{_NAME})[ \t]*(?:\{{(?P<labels>.*)\}})?[ \t]+(?P<rest>\S.*)$")
_LABEL_NAME_RE = re.compile(r"[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*\"")
# Go's strconv.ParseFloat as Prometheus writes values: decimal/exponent numbers, NaN, ±Inf.
_VALUE_RE = re.compile(r"^[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|(?i:inf|infinity|nan))\Z")
_TIMESTAMP_RE = re.compile(r"^-?\d+\Z")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class MetricsParseError(ServerError):
    """The /metrics answer is not the Prometheus text format (or is too large)."""


@dataclass(frozen=True)
class Sample:
    # Slots: a page holds up to MAX_SAMPLES of these (a __dict__ each would double their cost).
    __slots__ = ("labels", "name", "value")
    name: str  # the series name as written, e.g. vllm:prompt_tokens_total, …_bucket
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Scrape:
    """One parsed /metrics answer: every sample, and the TYPE of each metric family."""

    samples: tuple[Sample, ...]
    types: Mapping[str, str] = field(default_factory=dict)

    def names(self) -> set[str]:
        return {s.name for s in self.samples}

    def series(self, name: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name]


def parse(text: str, *, max_bytes: int = MAX_SCRAPE_BYTES, source: str = "/metrics") -> Scrape:
    """Parse the Prometheus text exposition format (0.0.4, as prometheus_client writes it).

    Raises MetricsParseError naming the line for anything else, and for text longer than max_bytes
    characters (kit/health/observe.py already stops reading at max_bytes bytes)."""
    if len(text) > max_bytes:
        raise MetricsParseError(f"{source} is over {max_bytes} bytes: not a vLLM metrics page")
    samples: list[Sample] = []
    types: dict[str, str] = {}
    seen: dict[str, str] = {}  # one copy of each name and label text: pages repeat them
    labels = 0
    for number, raw in enumerate(_lines(text), start=1):
        if len(raw) > MAX_LINE:
            raise MetricsParseError(f"{source} line {number}: over {MAX_LINE} characters: not a vLLM metrics page")
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE" and len(types) < MAX_SAMPLES:
                types[parts[2]] = parts[3].strip()
            continue  # HELP lines and free comments carry nothing kit reads
        sample = _parse_sample(line, number, source, seen)
        labels += len(sample.labels)
        if len(samples) >= MAX_SAMPLES or labels > MAX_LABELS:
            raise MetricsParseError(
                f"{source} has more than {MAX_SAMPLES} samples or {MAX_LABELS} labels: not a vLLM metrics page"
            )
        samples.append(sample)
    return Scrape(samples=tuple(samples), types=types)


def _lines(text: str) -> Iterator[str]:
    """The lines of `text` one at a time (no list of them all, no copy of the text)."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        yield text[start:end]
        start = end + 1


def _parse_sample(line: str, number: int, source: str, seen: dict[str, str] | None = None) -> Sample:
    match = _SAMPLE_RE.match(line)
    if match is None:
        raise MetricsParseError(f"{source} line {number}: not a sample: {line[:80]!r}")
    # The greedy label group ends at the line's last '}', so a quoted '}' inside a value stays in it.
    labels = _parse_labels(match.group("labels"), number, source) if match.group("labels") else {}
    fields = match.group("rest").split()
    if len(fields) > 2 or not _VALUE_RE.match(fields[0]) or (len(fields) == 2 and not _TIMESTAMP_RE.match(fields[1])):
        raise MetricsParseError(f"{source} line {number}: bad value {match.group('rest')[:40]!r}")
    name = match.group("name")
    if seen is not None:
        name = seen.setdefault(name, name)
        labels = {seen.setdefault(k, k): seen.setdefault(v, v) for k, v in labels.items()}
    return Sample(name=name, labels=labels, value=float(fields[0]))


def _parse_labels(inside: str, number: int, source: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    while pos < len(inside):
        if inside[pos:].strip() == "":
            break
        name_match = _LABEL_NAME_RE.match(inside, pos)
        if name_match is None:
            raise MetricsParseError(f"{source} line {number}: bad label at {inside[pos : pos + 40]!r}")
        value, pos = _read_quoted(inside, name_match.end(), number, source)
        labels[name_match.group(1)] = value
        rest = inside[pos:].lstrip(" \t")
        if rest.startswith(","):
            pos = len(inside) - len(rest) + 1
        elif rest:
            raise MetricsParseError(f"{source} line {number}: expected ',' between labels, got {rest[:20]!r}")
        else:
            break
    return labels


def _read_quoted(text: str, pos: int, number: int, source: str) -> tuple[str, int]:
    """The label value starting after its opening quote, unescaped, and the index after its closing quote."""
    end = text.find('"', pos)
    if end >= 0 and "\\" not in text[pos:end]:  # the common case: no escapes, no loop over characters
        return text[pos:end], end + 1
    out: list[str] = []
    while pos < len(text):
        char = text[pos]
        if char == '"':
            return "".join(out), pos + 1
        if char == "\\" and pos + 1 < len(text):
            out.append(_ESCAPES.get(text[pos + 1], "\\" + text[pos + 1]))
            pos += 2
            continue
        out.append(char)
        pos += 1
    raise MetricsParseError(f"{source} line {number}: unterminated label value")


@dataclass(frozen=True)
class EngineStats:
    """One engine (DP rank) at one scrape. None: the series is absent or NaN."""

    engine: str
    model_name: str | None
    running: float | None
    waiting: float | None
    kv_cache_usage: float | None  # 0..1
    prompt_tokens: float | None  # counters from here on
    generation_tokens: float | None
    preemptions: float | None
    request_success: Mapping[str, float]  # finished_reason -> count
    histograms: Mapping[str, tuple[float, float]]  # TTFT/ITL/E2E family -> (sum, count)
    awake: bool | None = None  # False: put to sleep on purpose (vLLM sleep mode); None: not reported

    @property
    def requests_finished(self) -> float:
        return sum(self.request_success.values())


def engine_of(sample: Sample) -> str:
    """The engine a series belongs to; a series without the label is engine 0 (V0, one engine)."""
    return sample.labels.get("engine", "0")


def engines(scrape: Scrape) -> dict[str, EngineStats]:
    """Every engine the scrape shows, by engine label (numeric order)."""
    found = sorted(
        {engine_of(s) for s in scrape.samples if s.name in ENGINE_PRESENCE}, key=lambda e: (not e.isdigit(), e.zfill(8))
    )
    by_engine: dict[str, list[Sample]] = {e: [] for e in found}
    for sample in scrape.samples:
        if sample.name.startswith("vllm:") and engine_of(sample) in by_engine:
            by_engine[engine_of(sample)].append(sample)
    return {engine: _engine_stats(engine, samples) for engine, samples in by_engine.items()}


def _engine_stats(engine: str, samples: list[Sample]) -> EngineStats:
    def total(name: str) -> float | None:
        values = [s.value for s in samples if s.name == name]
        return _finite(sum(values)) if values else None

    success: dict[str, float] = {}
    for s in samples:
        if s.name == REQUEST_SUCCESS and math.isfinite(s.value):
            reason = s.labels.get("finished_reason", "")
            success[reason] = success.get(reason, 0.0) + s.value
    kv = next((v for v in (total(name) for name in KV_CACHE) if v is not None), None)
    awake = next((s.value for s in samples if s.name == SLEEP_STATE and s.labels.get("sleep_state") == "awake"), None)
    histograms = {}
    for family in (TTFT, ITL, E2E):
        hsum, hcount = total(family + "_sum"), total(family + "_count")
        if hsum is not None and hcount is not None:
            histograms[family] = (hsum, hcount)
    return EngineStats(
        engine=engine,
        model_name=next((s.labels["model_name"] for s in samples if "model_name" in s.labels), None),
        running=total(RUNNING),
        waiting=total(WAITING),
        kv_cache_usage=kv,
        prompt_tokens=total(PROMPT_TOKENS),
        generation_tokens=total(GENERATION_TOKENS),
        preemptions=total(PREEMPTIONS),
        request_success=success,
        histograms=histograms,
        awake=None if awake is None or math.isnan(awake) else awake > 0,
    )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def increase(before: float | None, after: float | None) -> tuple[float | None, bool]:
    """How much a counter grew, and whether it was reset in between (the engine restarted): like
    Prometheus' increase(), a counter that went down counts from zero again."""
    if before is None or after is None:
        return None, False
    if after < before:
        return after, True
    return after - before, False


@dataclass(frozen=True)
class EngineRates:
    """One engine over an interval: gauges from the later scrape, rates from the counters' growth."""

    engine: str
    model_name: str | None
    running: float | None
    waiting: float | None
    kv_cache_usage: float | None
    prompt_tokens_per_s: float | None
    generation_tokens_per_s: float | None
    requests_per_s: float | None
    preemptions: float | None  # during the interval
    mean_ttft_s: float | None  # over the requests of the interval; None when none finished
    mean_itl_s: float | None
    mean_e2e_s: float | None
    generation_tokens: float | None  # the counter itself, at the later scrape
    requests_finished: float
    reset: bool  # a counter went backwards: the engine restarted between the scrapes

    def to_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def rates(t0: float, before: Scrape, t1: float, after: Scrape) -> dict[str, EngineRates]:
    """Per engine of the later scrape: tokens/s and requests/s between scrapes taken at t0 and t1
    (seconds, one clock). An engine absent from the first scrape has no rates (None)."""
    if not t1 > t0:
        raise ValueError(f"the second scrape must be later than the first (t0={t0}, t1={t1})")
    first, second = engines(before), engines(after)
    return {engine: _rates(first.get(engine), now, t1 - t0) for engine, now in second.items()}


def _rates(then: EngineStats | None, now: EngineStats, dt: float) -> EngineRates:
    def per_s(before: float | None, after: float | None) -> tuple[float | None, bool]:
        grown, was_reset = increase(before, after)
        return (None if grown is None else grown / dt), was_reset

    prompt, reset_p = per_s(then.prompt_tokens if then else None, now.prompt_tokens)
    generation, reset_g = per_s(then.generation_tokens if then else None, now.generation_tokens)
    finished, reset_r = per_s(then.requests_finished if then else None, now.requests_finished)
    preempted, _ = increase(then.preemptions if then else None, now.preemptions)
    means = {}
    for family in (TTFT, ITL, E2E):
        old, new = (then.histograms.get(family) if then else None), now.histograms.get(family)
        grown_sum, _ = increase(old[0] if old else None, new[0] if new else None)
        grown_count, _ = increase(old[1] if old else None, new[1] if new else None)
        means[family] = grown_sum / grown_count if grown_sum is not None and grown_count else None
    return EngineRates(
        engine=now.engine,
        model_name=now.model_name,
        running=now.running,
        waiting=now.waiting,
        kv_cache_usage=now.kv_cache_usage,
        prompt_tokens_per_s=prompt,
        generation_tokens_per_s=generation,
        requests_per_s=finished,
        preemptions=preempted,
        mean_ttft_s=means[TTFT],
        mean_itl_s=means[ITL],
        mean_e2e_s=means[E2E],
        generation_tokens=now.generation_tokens,
        requests_finished=now.requests_finished,
        reset=reset_p or reset_g or reset_r,
    )


def histogram_families(scrape: Scrape) -> set[str]:
    """Families declared as histograms whose _bucket, _sum and _count series all exist."""
    names = scrape.names()
    return {
        family
        for family, kind in scrape.types.items()
        if kind == "histogram" and all(family + suffix in names for suffix in ("_bucket", "_sum", "_count"))
    }


def label_names(scrape: Scrape, names: Iterable[str]) -> set[str]:
    """Every label name carried by the series named."""
    wanted = set(names)
    return {label for s in scrape.samples if s.name in wanted for label in s.labels}


# Prometheus scrape configuration (file_sd). What exists, checked on vLLM 0.32 and Ray 2.60: the
# API server on the head serves /metrics for every engine of the model; nodes started with
# `--headless` (mp backend) serve no HTTP at all; with the Ray backend every Ray node also exports
# Ray's own node metrics (CPU, memory, GPU use) on ports.ray_metrics_export, even with the
# dashboard off.


@dataclass(frozen=True)
class NodeAddress:
    role: str  # head | worker
    rank: int
    ip: str


def node_label(role: str, rank: int) -> str:
    """The node's short name, as kit's container names end (head, worker-1, …)."""
    return "head" if role == "head" else f"{role}-{rank}"


def scrape_targets(
    *,
    cluster: str,
    backend: str,
    api_port: int,
    ray_metrics_port: int,
    head_ip: str | None,
    nodes: Iterable[NodeAddress] = (),
) -> list[dict[str, object]]:
    """Prometheus file_sd target groups: the head's API server (component vllm) when its address
    is known, and with the Ray backend each known node's Ray exporter (component ray). Label
    values are strings, as file_sd requires."""

    def group(ip: str, port: int, role: str, rank: int, component: str) -> dict[str, object]:
        labels = {"cluster": cluster, "node": node_label(role, rank), "role": role, "rank": str(rank)}
        return {"targets": [f"{ip}:{port}"], "labels": {**labels, "component": component}}

    groups = [group(head_ip, api_port, "head", 0, "vllm")] if head_ip else []
    if backend == "ray":
        known = {(n.role, n.rank): n.ip for n in nodes}
        if head_ip and ("head", 0) not in known:
            known[("head", 0)] = head_ip
        for (role, rank), ip in sorted(known.items(), key=lambda item: (item[0][0] != "head", item[0][1])):
            groups.append(group(ip, ray_metrics_port, role, rank, "ray"))
    return groups
