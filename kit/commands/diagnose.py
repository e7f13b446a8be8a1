"""`kit diagnose LOGFILE…`: classify known failure lines and the NCCL transport in logs."""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from typing import Any

import click

from kit.commands._params import KitCommand, readable
from kit.errors import ConfigError
from kit.output import emit, table
from kit.verify.diagnose import Diagnosis, classify_file, classify_lines, read_lines
from kit.verify.nccl import TransportSummary


def diagnose_files(paths: list[str]) -> dict[str, Diagnosis]:
    """Each file read streaming (any size, encoding detected); `-` is standard input. Every path
    is checked first: a regular, readable file (a FIFO would block, /dev/zero never end)."""
    for path in paths:
        if path != "-":
            readable(path, "LOGFILE")
    if "-" in paths:
        check_stdin()
    results = {}
    for path in paths:
        if path == "-":
            results[STDIN] = classify_lines(read_lines(sys.stdin.buffer))
            continue
        try:
            results[path] = classify_file(path)
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}", key="LOGFILE") from None
    return results


STDIN = "/dev/stdin"  # the key `-` is reported under


def check_stdin() -> None:
    """`-` reads standard input: a pipe, a file or a terminal, but not a device like /dev/zero
    (it never ends; the same file given as a path is refused by `readable`)."""
    if sys.stdin is None:
        raise ConfigError("standard input is closed", key="LOGFILE", hint="pipe a log into `kit diagnose -`")
    try:
        st = os.fstat(sys.stdin.fileno())
    except (OSError, ValueError):
        return  # not a file descriptor (a stream in memory): nothing to refuse
    mode = st.st_mode
    if stat.S_ISCHR(mode) and st.st_rdev == os.stat(os.devnull).st_rdev:
        return  # /dev/null: an empty log
    if (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)) and not sys.stdin.isatty():
        raise ConfigError(
            "standard input is a device (like /dev/zero), not a log: it would be read for ever",
            key="LOGFILE",
            hint="pipe a log file into `kit diagnose -`, or pass its path",
        )


def transport_line(t: TransportSummary) -> str:
    """`NCCL 2.21.5: intra-node P2P/IPC x8, via NET: NET/IB+GDRDMA x4; cross-node
    NET/AWS Libfabric+GDRDMA x16 (net plugin AWS Libfabric, GDRDMA)`."""
    p2p = {k: v for k, v in t.intra_labels.items() if not k.startswith("NET/")}
    net = {k: v for k, v in t.intra_labels.items() if k.startswith("NET/")}
    intra = [", ".join(f"{k} x{v}" for k, v in sorted(p2p.items()))] if p2p else []
    if net:
        intra.append("via NET: " + ", ".join(f"{k} x{v}" for k, v in sorted(net.items())))
    cross = ", ".join(f"{k} x{v}" for k, v in sorted(t.inter_labels.items())) or "none"
    extra = []
    if t.inter_plugin:
        extra.append(f"net plugin {t.inter_plugin}")
    if t.inter_gdrdma is not None and (t.inter_plugin or "IB" in " ".join(t.inter_labels)):
        extra.append("GDRDMA" if t.inter_gdrdma else "no GDRDMA")
    version = t.version or "version unknown"  # a cudaDriverVersion line names the driver only
    if t.version_source not in (None, "banner"):
        version += f" (no banner; from {t.version_source})"
    if t.cuda_driver:
        version += f", CUDA driver {t.cuda_driver}"
    cross += f" ({', '.join(extra)})" if extra else ""
    return f"NCCL {version}: intra-node {', '.join(intra) or 'none'}; cross-node {cross}"


def render(results: dict[str, Diagnosis]) -> str:
    parts = []
    for path, diag in results.items():
        parts.append(f"{path} ({diag.lines} lines)")
        if diag.findings:
            rows = [(f.rule, f.count, f.first_line, f.cause) for f in diag.findings]
            parts.append(table(["finding", "count", "line", "cause"], rows))
            parts += [f"  {f.rule}: fix: {f.fix}" for f in diag.findings]
        else:
            parts.append("  no known failure lines")
        t = diag.transport
        if t is not None:
            parts.append("  " + transport_line(t))

        parts.append("")
    return "\n".join(parts).rstrip()


@click.command(name="diagnose", cls=KitCommand, dash_ok=("logfiles",))
@click.argument("logfiles", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def command(logfiles: tuple[str, ...], as_json: bool) -> None:
    """Classify known failure lines and NCCL transports in log files.

    Recognises the failures of FIELD_NOTES section 1 (placement group / IP mismatch, Gloo
    interface, NCCL Socket fallback, /dev/shm, Ray version mismatch, GPU count, RDMA system
    errors, engine timeouts, all-reduce deadlocks …) and prints cause and fix for each, plus the
    NCCL transport of every connection (intra- and inter-node). Use `-` for standard input.
    """
    emit(Diagnoses(diagnose_files(list(logfiles))), as_json=as_json)


@dataclass(frozen=True)
class Diagnoses:
    """Each log's diagnosis, by path."""

    files: dict[str, Diagnosis]
    command = "diagnose"

    def to_dict(self) -> dict[str, Any]:
        return {path: d.to_dict() for path, d in self.files.items()}

    def text(self) -> str:
        return render(self.files)
