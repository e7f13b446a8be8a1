"""Classify known failure lines of multi-node vLLM/Ray/NCCL logs (FIELD_NOTES section 1).

Each rule maps a message to its cause and fix; `row` is the FIELD_NOTES section 1 row it comes
from. Pure functions over text; the NCCL transport of the same log comes from kit.verify.nccl.
"""

from __future__ import annotations

import errno
import io
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, cast

from kit.verify import nccl, nccl_log


@dataclass(frozen=True)
class Rule:
    id: str
    pattern: re.Pattern[str]
    cause: str
    fix: str
    row: int | None = None  # FIELD_NOTES section 1 row
    # Lower-case literals, one of which every match contains: a cheap test before the regex
    # (logs run to hundreds of MB). Empty: always run the regex.
    hints: tuple[str, ...] = ()

    def matches(self, line: str, lower: str) -> bool:
        if self.hints and not any(h in lower for h in self.hints):
            return False
        return self.pattern.search(line) is not None


def _rule(id: str, pattern: str, cause: str, fix: str, row: int | None = None, hints: tuple[str, ...] = ()) -> Rule:
    return Rule(id, re.compile(pattern, re.IGNORECASE), cause, fix, row, hints)


_IP_FIX = (
    "use one numeric node IP per node, passed as both VLLM_HOST_IP and `ray start "
    "--node-ip-address`, with host networking (kit up does this); `kit verify` checks it"
)

RULES: tuple[Rule, ...] = (
    _rule(
        "placement-group-ip",
        r"No available node types can fulfill resource request.*node:|"
        r"Waiting for creating a placement group",
        "vLLM's idea of the node IP differs from the IP Ray registered (several NICs, container "
        "IP vs host IP), so the placement group cannot be placed",
        _IP_FIX,
        1,
        hints=("no available node types", "waiting for creating a placement group"),
    ),
    _rule(
        "node-registered-by-hostname",
        r"resource request[^\n]*'node:(?!\d+\.\d+\.\d+\.\d+')[^']+'",
        "a node was registered by hostname rather than by a numeric IP",
        "always pass a numeric IPv4 `--node-ip-address` to `ray start` (kit does)",
        2,
        hints=("resource request",),
    ),
    _rule(
        "raylet-ip-mismatch",
        r"cannot find a local Raylet with the same address",
        "the process sees a different IP (container IP) than the Raylet registered (host IP)",
        "run nodes with host networking and the same IP everywhere (VLLM_HOST_IP = Ray node IP)",
        9,
        hints=("local raylet",),
    ),
    _rule(
        "gloo-interface",
        r"Gloo connectFullMesh failed|gloo/transport/tcp/\S+.*(?:Connection refused|timed out)",
        "Gloo picked the wrong network interface (not the one that carries the node IP)",
        "set GLOO_SOCKET_IFNAME (one concrete name) and NCCL_SOCKET_IFNAME to the interface of the node IP",
        3,
        hints=("gloo",),
    ),
    _rule(
        "nccl-bootstrap-interface",
        r"Bootstrap\s*:\s*no socket interface found|NCCL WARN.*(?:socketStartConnect|"
        r"Connect to \S+ failed)",
        "NCCL bootstraps over an interface the other nodes cannot reach",
        "set NCCL_SOCKET_IFNAME to the interface that carries the node IP (or `^lo,docker`)",
        3,
        hints=("bootstrap", "nccl warn"),
    ),
    _rule(
        "nccl-unhandled-system-error",
        r"unhandled system error",
        "NCCL failed a system call at init, typically RDMA without IPC_LOCK/memlock or an unshared /dev/shm",
        "start containers with --cap-add IPC_LOCK --ulimit memlock=-1 --ipc=host (and "
        "--device /dev/infiniband when the host has IB); rerun with NCCL_DEBUG=INFO for the call",
        5,
        hints=("unhandled system error",),
    ),
    _rule(
        "shm-exhausted",
        r"Error while creating shared memory segment|/dev/shm/nccl-|"
        r"object store is using /tmp instead of /dev/shm|No space left on device.*shm",
        "/dev/shm is too small (Docker's default is 64 MB)",
        "start containers with --ipc=host, or --shm-size sized from host memory",
        6,
        hints=("shared memory segment", "/dev/shm/nccl-", "object store is using /tmp", "no space left"),
    ),
    _rule(
        "ray-version-mismatch",
        r"Version mismatch: The cluster was started with",
        "nodes run different Ray (or Python) versions: different images or pip trees",
        "use the same image digest on every node (`kit pull` on each node; `kit verify` compares versions)",
        7,
        hints=("version mismatch",),
    ),
    _rule(
        "gpu-count-mismatch",
        r"number of required GPUs exceeds the total number of available GPUs|"
        r"exceeds the total number of available GPUs",
        "tensor-parallel x pipeline-parallel size does not match the GPUs in the cluster",
        "make TP x PP equal nodes x GPUs per node (`kit plan` sizes it); wait until every node has joined",
        8,
        hints=("exceeds the total number of available gpus",),
    ),
    _rule(
        "hf-gated-or-missing",
        r"401 Client Error|GatedRepoError|Cannot access gated repo|LocalEntryNotFoundError|"
        r"does not appear to have a file named",
        "the Hugging Face token or model snapshot is only on some nodes",
        "mount the same HF cache on every node and pass the token as a file (HF_TOKEN_PATH) to every node",
        10,
        hints=(
            "401 client error",
            "gatedrepoerror",
            "gated repo",
            "localentrynotfounderror",
            "does not appear to have a file named",
        ),
    ),
    _rule(
        "collective-deadlock",
        r"Watchdog caught collective operation timeout|symm(?:etric)?[_ ]?mem.*(?:error|fail|"
        r"timeout|hang)|custom[_ ]all[_ ]?reduce.*(?:error|fail|timeout|hang)",
        "a collective hung at start-up; symmetric memory / custom all-reduce deadlocks are known in some vLLM versions",
        "try VLLM_ALLREDUCE_USE_SYMM_MEM=0 and/or `vllm serve --disable-custom-all-reduce`",
        12,
        hints=("watchdog caught", "symm", "custom"),
    ),
    _rule(
        "engine-start-timeout",
        r"Timed out waiting for engines to send initial message",
        "the engine took longer to load than vLLM's default ready timeout",
        # vLLM reads the variable from 0.14.0 on (kit.images.vllm_releases.ENGINE_READY_TIMEOUT_SINCE);
        # below it only a newer image helps.
        "raise VLLM_ENGINE_READY_TIMEOUT_S (vLLM >= 0.14.0 reads it; kit passes it through) and kit's readiness "
        "deadline; on an older image, use a newer one",
        13,
        hints=("timed out waiting for engines",),
    ),
    _rule(
        "ray-temp-dir",
        r"AF_UNIX path length cannot exceed|Failed to bind.*Address already in use|"
        r"address already in use.*(?:gcs|raylet|6379)",
        "Ray's temp dir or ports collide on a shared host",
        "pin Ray's ports and use a per-job --temp-dir (kit does under SLURM)",
        14,
        hints=("af_unix path length", "address already in use"),
    ),
    _rule(
        "gcs-unreachable",
        r"Failed to connect to GCS|Unable to connect to GCS|"
        r"Could not find any running Ray instance",
        "a worker started before the head or cannot reach it",
        "start the head first; kit's workers retry joining until a deadline",
        17,
        hints=("gcs", "could not find any running ray instance"),
    ),
    _rule(
        "cuda-oom",
        r"CUDA out of memory|OutOfMemoryError|Cuda failure 'out of memory'",
        "the GPU ran out of memory (weights + KV cache do not fit)",
        "lower --gpu-memory-utilization/--max-model-len or use more GPUs (`kit plan`)",
        None,
        hints=("out of memory", "outofmemoryerror"),
    ),
)


# One pass over a line that no rule can match (nearly all of a big log) instead of one per rule.
# (Substring tests in C beat one alternation regex of the same literals by 2x in CPython.)
_ALL_HINTS = tuple(h for r in RULES for h in r.hints) if all(r.hints for r in RULES) else ("",)


@dataclass
class Finding:
    rule: str
    cause: str
    fix: str
    row: int | None
    count: int
    first_line: int  # 1-based
    sample: str

    def to_dict(self) -> dict[str, object]:
        return {
            "rule": self.rule,
            "cause": self.cause,
            "fix": self.fix,
            "field_notes_row": self.row,
            "count": self.count,
            "first_line": self.first_line,
            "sample": self.sample,
        }


@dataclass
class Diagnosis:
    findings: list[Finding] = field(default_factory=list)
    transport: nccl.TransportSummary | None = None
    lines: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "findings": [f.to_dict() for f in self.findings],
            "transport": self.transport.to_dict() if self.transport else None,
            "lines": self.lines,
        }


_SOCKET_FALLBACK = Rule(
    "nccl-socket-fallback",
    re.compile(r"via NET/Socket"),
    "NCCL sends inter-node traffic over TCP sockets (NET/Socket): either the cluster has no RDMA "
    "network or the container cannot use it",
    "if the hosts have InfiniBand/RoCE, start containers with --device /dev/infiniband "
    "--cap-add IPC_LOCK --ulimit memlock=-1 and RDMA userland (libibverbs, libmlx5) in the image",
    4,
)


def classify_lines(lines: Iterable[str]) -> Diagnosis:
    """Every rule that matched, in first-seen order, plus the NCCL transport summary.

    One pass, one line at a time: memory stays bounded whatever the length of the log.
    """
    found: dict[str, Finding] = {}
    parser = nccl_log.NcclParser()
    n = 0
    for n, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        parser.feed(line, n)
        lower = line.lower()
        if not any(map(lower.__contains__, _ALL_HINTS)):
            continue
        for rule in RULES:
            if rule.matches(line, lower):
                if rule.id in found:
                    found[rule.id].count += 1
                else:
                    found[rule.id] = Finding(rule.id, rule.cause, rule.fix, rule.row, 1, n, line.strip()[:300])
    log = parser.result()
    summary = nccl.summarize(log)
    findings = list(found.values())
    if socket := _socket_fallback(log, summary):
        findings.append(socket)
    if mixed := _mixed_versions(summary):
        findings.append(mixed)
    has_transport = bool(summary.intra or summary.inter or summary.version or summary.cuda_driver)
    return Diagnosis(findings=findings, transport=summary if has_transport else None, lines=n)


def _socket_fallback(log: nccl_log.NcclLog, summary: nccl.TransportSummary) -> Finding | None:
    """Inter-node connections over TCP sockets, with the first one as the sample."""
    socket_inter = summary.inter.get(nccl.Transport.SOCKET.value, 0)
    if not socket_inter:
        return None
    first = next(
        (c for c in log.connections if c.transport is nccl.Transport.SOCKET and nccl.scope_of(c, log) == "inter"),
        None,
    )
    cause = _SOCKET_FALLBACK.cause
    if summary.ib_devices:
        cause += f", although NCCL lists {', '.join(sorted(summary.ib_devices))}"
    return Finding(
        _SOCKET_FALLBACK.id,
        cause,
        _SOCKET_FALLBACK.fix,
        _SOCKET_FALLBACK.row,
        socket_inter,
        first.line if first else 0,
        f"{first.host or ''} {first.src} -> {first.dst} via {first.via}".strip() if first else "",
    )


def _mixed_versions(summary: nccl.TransportSummary) -> Finding | None:
    # Only banners count: NCCL_VERSION names an image's system libnccl, which a pip torch that
    # bundles its own need not load (2x H200 image: NCCL_VERSION=2.28.3-1, torch runs 2.28.9).
    if len(summary.banner_versions) <= 1:
        return None
    return Finding(
        "nccl-version-mixed",
        f"processes report different NCCL versions: {', '.join(summary.banner_versions)}",
        "run the same image (and so the same NCCL) on every node; `kit verify` compares versions",
        7,
        len(summary.banner_versions),
        0,
        "",
    )


# --- reading logs of any size and encoding ---------------------------------------------------

_BOMS = (
    (b"\xef\xbb\xbf", "utf-8-sig"),
    (b"\xff\xfe", "utf-16-le"),
    (b"\xfe\xff", "utf-16-be"),
)


def detect_encoding(head: bytes) -> tuple[str, int]:
    """(encoding, bytes of BOM to skip) from the first bytes of a file.

    A BOM decides; without one, text where every other byte is NUL is UTF-16 (Windows tools
    and PowerShell's `>` write it); anything else is read as UTF-8, undecodable bytes replaced.
    """
    for bom, enc in _BOMS:
        if head.startswith(bom):
            return enc, len(bom)
    sample = head[:4096]
    if len(sample) >= 8:
        even, odd = sample[0::2], sample[1::2]
        if odd.count(0) > 0.4 * len(odd) and even.count(0) < 0.05 * len(even):
            return "utf-16-le", 0
        if even.count(0) > 0.4 * len(even) and odd.count(0) < 0.05 * len(odd):
            return "utf-16-be", 0
    return "utf-8", 0


def read_lines(stream: BinaryIO, *, max_line: int = nccl_log.MAX_LINE) -> Iterator[str]:
    """Text lines of a binary stream, decoded streaming (CRLF and CR as newlines, bad bytes
    replaced); a line longer than max_line characters comes in pieces, so a file without any
    newline (binary, minified) never sits in memory whole.

    A piece ends where a record begins (`_record_start`): the record cut by max_line goes on
    into the next piece, read whole and once. A piece is then at most 2 x max_line long.
    """
    buffered = stream if isinstance(stream, io.BufferedReader) else io.BufferedReader(cast(io.RawIOBase, stream))
    head = buffered.peek(4096)[:4096]
    encoding, skip = detect_encoding(head)
    if skip:
        buffered.read(skip)
    text = io.TextIOWrapper(buffered, encoding=encoding, errors="replace", newline=None)
    carry = ""
    while True:
        piece = text.readline(max_line)
        if not piece:
            break
        line, carry = carry + piece, ""
        if len(piece) == max_line and not piece.endswith("\n"):
            cut = _record_start(line)
            if cut > 0:
                line, carry = line[:cut], line[cut:]
        yield line
    if carry:
        yield carry


def _record_start(text: str) -> int:
    """Where the last record of a cut line begins: the NCCL prefix of the last `NCCL INFO` or
    `NCCL WARN` (where nccl_log.NcclParser splits glued records too), else after the last space;
    0 where there is neither."""
    at = max(text.rfind("NCCL INFO"), text.rfind("NCCL WARN"))
    if at < 0:
        return text.rfind(" ") + 1
    # A hostname has at most 255 characters: the prefix starts within that much before `at`.
    prefixes = list(nccl_log.PREFIX.finditer(text, max(0, at - 300), at + len("NCCL INFO")))
    return prefixes[-1].start() if prefixes and prefixes[-1].end() > at else at


def classify_file(path: str) -> Diagnosis:
    """classify_lines over a regular file, read streaming (standard input goes to read_lines
    directly). A special file is refused before a byte is read: a FIFO would block (it is opened
    non-blocking, so even the open returns) and a device like /dev/zero never ends."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO or a device)")
        os.set_blocking(fd, True)
        fh = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with fh:
        return classify_lines(read_lines(fh))
