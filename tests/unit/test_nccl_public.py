"""`kit diagnose --json` on real NCCL logs from public issues and from our 2x H200 runs (issue 11).

For each log: the exact cross-node transport, the intra-node transports and the NCCL version,
compared field by field. Then the robustness of reading: any size and encoding, no traceback,
bounded memory.
"""

from __future__ import annotations

import codecs
import io
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kit.commands.diagnose import command
from kit.verify import policy
from kit.verify.diagnose import classify_file, classify_lines, detect_encoding, read_lines
from kit.verify.nccl import summarize_lines

PUBLIC = Path(__file__).parents[1] / "fixtures" / "nccl_public"
RECORDED = Path(__file__).parents[1] / "fixtures" / "verify"
RECORDED_NCCL = Path(__file__).parents[1] / "fixtures" / "recorded" / "nccl"  # see its README.md

# file -> (cross-node transports, intra-node transports, NCCL version)
EXPECTED: dict[str, tuple[list[str], list[str], str | None]] = {
    # old channel formats and prefixes
    "nccl226_ring_no_brackets_socket.log": (["NET/Socket"], [], "2.4.7"),
    "nccltests29_ring_cudadev_brackets.log": ([], ["P2P/IPC"], None),
    "nccl224_mpirun_prefix_ib_gdr.log": (["NET/IB+GDRDMA"], ["P2P/IPC"], None),
    "ray11675_pid_ip_prefix_ib.log": (["NET/IB"], ["P2P/IPC"], None),
    "ray16979_pid_prefix_torch_version.log": ([], ["P2P/IPC"], "2.7.8"),
    "vllm15100_rayworkerwrapper_ib_gdr.log": (["NET/IB+GDRDMA"], ["P2P/IPC"], None),
    "vllm2734_ray_ansi_dedup.log": ([], ["P2P/IPC"], None),
    "awsofi715_cloudwatch_libfabric_pxn.log": (["NET/AWS Libfabric+GDRDMA"], ["P2P/CUMEM"], None),
    "easydistill4_python_logging_prefix.log": ([], ["P2P/IPC"], None),
    "nccl147_interleaved_records.log": ([], ["P2P/IPC"], None),
    "deepep106_ibext_gdrdma_glued_lines.log": (["NET/IBext+GDRDMA"], [], None),
    # SHM's old name
    "horovod893_direct_shm_ib.log": (["NET/IB"], ["SHM"], None),
    # NET within one node
    "nccl707_single_process_net_ib_loopback.log": ([], ["NET/IB+GDRDMA"], "2.7.6"),
    # plugins
    "nccltests373_ibext_v8_same_hostname.log": (["NET/IBext_v8"], [], None),
    "nccl1120_ibext_v6_no_prefix.log": (["NET/IBext_v6"], [], None),
    "awsofi161_network_aws_libfabric.log": ([], [], "2.10.3"),
    # version forms
    "nccl300_mpirun_banner_lo.log": ([], [], "2.5.6"),
    "horovod3752_mpirun_cuda_driver.log": ([], [], "2.14.3"),
    "nccl1297_vllm_worker_no_banner.log": ([], [], "2.20.5"),
    "pytorch122571_torch_tuple_ngc_env.log": ([], [], "2.19.3"),
}

# Our own 2x H200 runs (one host; NCCL_P2P_DISABLE / NCCL_SHM_DISABLE forced the others).
H200: dict[Path, tuple[list[str], list[str], str | None]] = {
    RECORDED_NCCL / "h200x2_p2p_cumem.log": ([], ["P2P/CUMEM"], "2.28.9"),
    RECORDED_NCCL / "h200x2_p2p_ipc.log": ([], ["P2P/IPC"], "2.28.9"),
    RECORDED_NCCL / "h200x2_shm.log": ([], ["SHM"], "2.28.9"),
    RECORDED_NCCL / "h200x2_socket.log": ([], ["NET/Socket"], "2.28.9"),
    RECORDED / "h200x2_collective_p2p.log": ([], ["P2P/CUMEM"], "2.28.9"),
    RECORDED / "h200x2_collective_shm.log": ([], ["SHM"], "2.28.9"),
    RECORDED / "h200x2_collective_socket.log": ([], ["NET/Socket"], "2.28.9"),
}


def diagnose_json(*paths: Path | str) -> dict[str, Any]:
    res = CliRunner().invoke(command, [*map(str, paths), "--json"])
    assert res.exit_code == 0, res.output
    result: dict[str, Any] = json.loads(res.output)["result"]
    return result


def three_fields(doc: dict[str, Any]) -> tuple[list[str], list[str], str | None]:
    t = doc["transport"] or {"cross_node": [], "intra_node": [], "nccl_version": None}
    return t["cross_node"], t["intra_node"], t["nccl_version"]


def test_every_public_fixture_is_in_the_table_and_names_its_source() -> None:
    files = sorted(p.name for p in PUBLIC.glob("*.log"))
    assert files == sorted(EXPECTED)
    for name in files:
        head = (PUBLIC / name).read_text().splitlines()[0]
        assert head.startswith("# source: https://github.com/"), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_public_log(name: str) -> None:
    doc = diagnose_json(PUBLIC / name)[str(PUBLIC / name)]
    assert three_fields(doc) == EXPECTED[name]


@pytest.mark.parametrize("path", sorted(H200), ids=lambda p: p.name)
def test_h200_logs(path: Path) -> None:
    assert three_fields(diagnose_json(path)[str(path)]) == H200[path]


def test_all_at_once_in_one_call() -> None:
    paths = [PUBLIC / n for n in sorted(EXPECTED)]
    got = diagnose_json(*paths)
    assert {Path(p).name: three_fields(d) for p, d in got.items()} == EXPECTED


def transport(name: str) -> dict[str, Any]:
    t: dict[str, Any] = diagnose_json(PUBLIC / name)[str(PUBLIC / name)]["transport"]
    return t


def test_plugins_and_gdrdma_reported() -> None:
    t = transport("awsofi715_cloudwatch_libfabric_pxn.log")
    assert (t["net_plugin"], t["gdrdma"]) == ("AWS Libfabric", True)
    # PXN proxy ranks `(2)` and `/Shared` stay in the raw vias, not in the transport name
    assert "NET/AWS Libfabric/1(2)/GDRDMA/Shared" in t["vias"]
    t = transport("nccltests373_ibext_v8_same_hostname.log")
    assert (t["net_plugin"], t["gdrdma"], t["cuda_driver"]) == ("IBext_v8", False, "12.2")
    assert t["ib_devices"] == {"mlx5_2:1": "RoCE", "mlx5_3:1": "RoCE", "mlx5_0:1": "RoCE", "mlx5_1:1": "RoCE"}
    t = transport("deepep106_ibext_gdrdma_glued_lines.log")
    assert (t["net_plugin"], t["gdrdma"], t["inter"]) == ("IBext", True, {"plugin": 5})
    assert transport("vllm2734_ray_ansi_dedup.log")["plugins"] == ["IBext"]  # loaded, unused here
    assert transport("awsofi161_network_aws_libfabric.log")["plugins"] == ["AWS Libfabric"]


def test_intra_node_via_net_is_not_cross_node() -> None:
    t = transport("nccl707_single_process_net_ib_loopback.log")
    assert t["intra_via_net"] is True and t["inter"] == {} and t["intra"] == {"ib-gdr": 6}
    res = CliRunner().invoke(command, [str(PUBLIC / "nccl707_single_process_net_ib_loopback.log")])
    assert "NCCL 2.7.6: intra-node via NET: NET/IB+GDRDMA x6; cross-node none" in res.output
    # One hostname for three nodes: the hostname alone proves nothing, nNodes 3 wins.
    assert transport("nccltests373_ibext_v8_same_hostname.log")["intra_via_net"] is False


SYNTHETIC = PUBLIC / "synthetic"


def test_same_bus_id_on_two_ranks_means_two_hosts() -> None:
    """Hostnames redacted to one name: ranks 0 and 8 (7 and 15) report the same GPU bus id, which
    NCCL refuses within one host (`Duplicate GPU detected`), so the log spans two hosts and the
    NET links are cross-node. Synthetic, modelled on NVIDIA/nccl#527 (see the fixtures README)."""
    path = SYNTHETIC / "nccl527_redacted_hosts_same_bus_ids.log"
    assert three_fields(diagnose_json(path)[str(path)]) == (["NET/AWS Libfabric+GDRDMA"], ["P2P/IPC"], "2.9.9")


def init(host: str, pid: int, rank: int, bus: str, comm: str = "0x7") -> str:
    return (
        f"{host}:{pid}:{pid} [0] NCCL INFO ncclCommInitRank comm 0x5{pid} rank {rank} nranks 2 cudaDev 0 "
        f"nvmlDev 0 busId {bus} commId {comm} - Init COMPLETE"
    )


def test_same_bus_id_from_init_lines() -> None:
    """Containers that all call themselves `node`: one bus id for both ranks of a communicator."""
    lines = [
        init("node", 11, 0, "1b000"),
        init("node", 22, 1, "1b000"),
        "node:11:12 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
        "node:22:23 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [receive] via NET/IB/0/GDRDMA",
    ]
    assert summarize_lines(lines).cross_node == ["NET/IB+GDRDMA"]
    # Different bus ids prove nothing: the same name and no node count still read as one host.
    lines[1] = init("node", 22, 1, "1c000")
    assert summarize_lines(lines).intra_node == ["NET/IB+GDRDMA"]


def test_bus_ids_never_mislabel_one_host() -> None:
    # One host, P2P and SHM off: NCCL 2.18+ brackets hold the cuda device, and each process sees
    # its GPU as device 0 (CUDA_VISIBLE_DEVICES per process, as vLLM and Ray do): not a bus id.
    lines = [
        "h:1:1 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
        "h:2:2 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
        "h:1:3 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
        "h:2:4 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [receive] via NET/Socket/0",
    ]
    assert (summarize_lines(lines).cross_node, summarize_lines(lines).intra_node) == ([], ["NET/Socket"])
    # One process's log with lines of two communicators and no commIds (NCCL <= 2.17 bus ids in
    # the brackets): GPU 1b000 is rank 0 of one and rank 2 of the other. Rank 0 then has two bus
    # ids, so the rank map mixes communicators and proves nothing; NCCL's `nNodes 1` decides.
    lines = [
        "h:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 3 nNodes 1 localRanks 3 localRank 0 MNNVL 0",
        "h:1:3 [0] NCCL INFO Channel 00 : 0[1b000] -> 1[1c000] [send] via NET/Socket/0",
        "h:1:3 [0] NCCL INFO Channel 00 : 2[1b000] -> 0[1d000] [send] via NET/Socket/0",
    ]
    assert (summarize_lines(lines).cross_node, summarize_lines(lines).intra_node) == ([], ["NET/Socket"])
    # NCCL itself says one node: nothing overrides it.
    one = [init("h", 1, 0, "1b000"), init("h", 2, 1, "1b000"), "h:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 1"]
    one.append("h:1:3 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0")
    assert summarize_lines(one).cross_node == []


def test_version_sources() -> None:
    assert transport("nccl1297_vllm_worker_no_banner.log")["nccl_version_source"] == "nccl=="
    assert transport("nccl300_mpirun_banner_lo.log")["nccl_version_source"] == "banner"
    # Synthetic lines (no public log shows these forms): an environment dump, nccl-tests' codes.
    s = summarize_lines(["[INFO] [launch.py:138:main] 0 NCCL_VERSION=2.15.5-1"])
    assert (s.version, s.version_source) == ("2.15.5", "NCCL_VERSION")
    s = summarize_lines(["# nccl-tests version 2.13.8 nccl-headers=21903 nccl-library=22105"])
    assert (s.version, s.version_source) == ("2.21.5", "nccl-library")
    s = summarize_lines(["NCCL_VERSION=2.15.5-1", "n:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4"])
    assert (s.version, s.versions) == ("2.21.5", ["2.21.5", "2.15.5"])  # the banner wins
    s = summarize_lines(["torch NCCL version: (2, 21, 5)"])
    assert s.version == "2.21.5"


def test_torch_version_tuple() -> None:
    """torch.cuda.nccl.version() is what torch loaded; an image's NCCL_VERSION need not be."""
    t = transport("pytorch122571_torch_tuple_ngc_env.log")
    got = (t["nccl_version"], t["nccl_version_source"], t["nccl_versions"])
    assert got == ("2.19.3", "torch", ["2.19.3", "2.15.5"])
    # Synthetic forms: on the call's own line, and in Python's REPL after a blank line.
    assert summarize_lines(["torch.cuda.nccl.version() = (2, 21, 5)"]).version == "2.21.5"
    assert summarize_lines([">>> torch.cuda.nccl.version()", "", "(2, 26, 2)"]).version == "2.26.2"
    # A tuple that does not answer the call is no version.
    assert summarize_lines(["(2, 19, 3)"]).version is None
    assert summarize_lines(["print(torch.cuda.nccl.version())", "done", "(2, 19, 3)"]).version is None


def test_cuda_driver_is_not_an_nccl_version() -> None:
    s = summarize_lines(["h:1:1 [0] NCCL INFO cudaDriverVersion 12040"])
    assert (s.version, s.versions, s.cuda_driver) == (None, [], "12.4")
    res = CliRunner().invoke(command, ["-"], input=b"h:1:1 [0] NCCL INFO cudaDriverVersion 12040\n")
    assert "NCCL version unknown, CUDA driver 12.4:" in res.output


def test_mixed_versions_are_a_finding() -> None:
    diag = classify_lines(["a:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4", "NCCL version 2.18.1+cuda12.1"])
    assert [f.rule for f in diag.findings] == ["nccl-version-mixed"]


@pytest.mark.parametrize(
    ("via", "label", "plugin", "gdr"),
    [  # synthetic lines for plugin names no public log showed
        ("NET/IBext_v10/0/GDRDMA", "NET/IBext_v10+GDRDMA", "IBext_v10", True),
        ("NET/IBext_v10/3(11)/GDRDMA/Shared", "NET/IBext_v10+GDRDMA", "IBext_v10", True),
        ("NET/OFI/0", "NET/OFI", "OFI", False),
        ("NET/IB/1(4)/GDRDMA(PCI)/Shared", "NET/IB+GDRDMA", None, True),
    ],
)
def test_plugin_forms(via: str, label: str, plugin: str | None, gdr: bool) -> None:
    s = summarize_lines([f"a:1:1 [0] NCCL INFO Channel 00/1 : 0[0] -> 8[0] [send] via {via}"])
    assert (s.cross_node, s.inter_plugin, s.inter_gdrdma) == ([label], plugin, gdr)


# --- the --expect policy on plugin nets ------------------------------------------------------


def plugin_check(via: str, expect: str, *, ib_ports: bool) -> policy.Check:
    lines = [
        "a:1:1 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 0 nranks 2 cudaDev 0 busId 60 commId 0x9 - Init START",
        "b:2:2 [0] NCCL INFO ncclCommInitRank comm 0x2 rank 1 nranks 2 cudaDev 0 busId 60 commId 0x9 - Init START",
        f"a:1:7 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via {via}",
    ]
    ib = [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "link_layer": "InfiniBand", "rate": "400"}]
    node: dict[str, Any] = {"infiniband": {"devices": ib if ib_ports else [], "dev_infiniband": ["uverbs0"]}}
    coll = {"ok": True, "correct": True, "backend": "nccl", "nnodes": 2, "world_size": 2, "results": []}
    checks = policy.check_collective(coll, summarize_lines(lines), expect=expect, nodes={"a": node, "b": node})
    return next(c for c in checks if c.name == "transport.inter")


@pytest.mark.parametrize(
    ("via", "expect", "ib_ports", "status"),
    [
        ("NET/AWS Libfabric/0/GDRDMA/Shared", "ib-gdr", False, "pass"),
        ("NET/AWS Libfabric/0/GDRDMA/Shared", "ib", False, "pass"),
        ("NET/AWS Libfabric/0/GDRDMA/Shared", "auto", False, "pass"),
        ("NET/IBext_v8/1", "ib", True, "pass"),
        ("NET/IBext_v8/1", "ib-gdr", True, "fail"),
        ("NET/IBext_v8/1", "auto", True, "fail"),  # RDMA ports present: auto wants GDRDMA
        ("NET/IBext_v8/1", "socket-ok", True, "pass"),
        ("NET/IBext_v10/0/GDRDMA", "auto", True, "pass"),
        ("NET/OFI/0", "ib-gdr", False, "fail"),
        ("NET/OFI/0", "auto", False, "pass"),  # no RDMA port the probe can see: plugin accepted
    ],
)
def test_expect_policy_on_plugins(via: str, expect: str, ib_ports: bool, status: str) -> None:
    c = plugin_check(via, expect, ib_ports=ib_ports)
    assert c.status == status, c
    plugin = via.split("/")[1]
    assert f"net plugin {plugin}" in c.reason


def test_intra_node_via_net_policy_says_so() -> None:
    s = summarize_lines((PUBLIC / "nccl707_single_process_net_ib_loopback.log").read_text().splitlines())
    coll = {"ok": True, "correct": True, "backend": "nccl", "nnodes": 1, "world_size": 4, "results": []}
    checks = {c.name: c for c in policy.check_collective(coll, s, expect="auto", nodes={"n": {}})}
    assert checks["transport.inter"].status == "pass"  # no cross-node link claimed
    assert checks["transport.intra"].status == "warn"
    assert checks["transport.intra"].reason.startswith("intra-node via NET")


# --- any size, any encoding ---------------------------------------------------------------

LOG = (
    "a:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
    "a:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
    "a:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA\n"
)
WANT = (["NET/IB+GDRDMA"], ["P2P/CUMEM"], "2.21.5")


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("utf8", LOG.encode()),
        ("utf8-bom", codecs.BOM_UTF8 + LOG.encode()),
        ("crlf", LOG.replace("\n", "\r\n").encode()),
        ("cr-only", LOG.replace("\n", "\r").encode()),
        ("utf16-le-bom", codecs.BOM_UTF16_LE + LOG.replace("\n", "\r\n").encode("utf-16-le")),
        ("utf16-be-bom", codecs.BOM_UTF16_BE + LOG.encode("utf-16-be")),
        ("utf16-le-no-bom", LOG.encode("utf-16-le")),
        ("latin1-and-garbage", b"\xe9t\xe9 \xfd garbage \x80\x81\n" + LOG.encode() + b"\xc3\x28\n"),
        ("nul-bytes", b"\x00\x00\x00\n" + LOG.encode()),
    ],
)
def test_encodings(tmp_path: Path, name: str, data: bytes) -> None:
    path = tmp_path / f"{name}.log"
    path.write_bytes(data)
    assert three_fields(diagnose_json(path)[str(path)]) == WANT


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("empty", b""),
        ("one-byte", b"\xff"),
        ("odd-utf16", codecs.BOM_UTF16_LE + b"a\x00b"),
        ("binary", bytes(range(256)) * 64),
        ("gzip-magic", b"\x1f\x8b\x08\x00" + bytes(4000)),
    ],
)
def test_no_traceback_on_anything(tmp_path: Path, name: str, data: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    doc = diagnose_json(path)[str(path)]
    assert doc["findings"] == [] and doc["transport"] is None


def test_stdin_is_read_streaming() -> None:
    res = CliRunner().invoke(command, ["-", "--json"], input=LOG.encode("utf-16"))
    assert res.exit_code == 0, res.output
    assert three_fields(json.loads(res.output)["result"]["/dev/stdin"]) == WANT


def test_detect_encoding() -> None:
    assert detect_encoding(codecs.BOM_UTF16_LE + b"a\x00") == ("utf-16-le", 2)
    assert detect_encoding("plain text here".encode("utf-16-be")) == ("utf-16-be", 0)
    assert detect_encoding(b"plain") == ("utf-8", 0)


def test_long_lines_come_in_pieces() -> None:
    pieces = list(read_lines(io.BytesIO(b"x" * 300_000 + b"\nend\n"), max_line=1 << 16))
    assert [len(p) for p in pieces] == [65536, 65536, 65536, 65536, 37857, 4]


CUT_RECORD = "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA\n"


def test_a_record_cut_at_64k_reads_whole(tmp_path: Path) -> None:
    """The reviewer's repro: `via NET/I` | `B/0/GDRDMA` across the 64K piece boundary."""
    pad = "x" * (65536 - CUT_RECORD.index("IB/0") - 1)
    path = tmp_path / "cut.log"
    path.write_text("h:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n" + pad + CUT_RECORD)
    assert three_fields(diagnose_json(path)[str(path)]) == (["NET/IB+GDRDMA"], [], "2.21.5")


@pytest.mark.parametrize("max_line", [100, 1000, 1 << 16])
def test_glued_records_without_newlines_are_counted_once(max_line: int) -> None:
    record = "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC "
    data = ("garbage " * 20 + record * 5_000).encode()
    pieces = list(read_lines(io.BytesIO(data), max_line=max_line))
    assert "".join(pieces) == data.decode()  # nothing lost, nothing read twice
    assert max(map(len, pieces)) <= 2 * max_line  # memory stays bounded
    assert summarize_lines(pieces).intra_labels == {"P2P/IPC": 5_000}


@pytest.mark.parametrize(
    "tail",
    ["\ufffd", "\x1b[0m", "\x1b[32m[repeated 7x across cluster]\x1b[0m", "\x00", "\u00e9t\u00e9"],
    ids=["replacement-char", "ansi-reset", "ray-dedup", "nul", "latin"],
)
def test_via_label_keeps_only_what_nccl_prints(tail: str) -> None:
    s = summarize_lines([f"h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC{tail}"])
    assert s.intra_labels == {"P2P/IPC": 1}


def test_utf16_cut_at_an_odd_byte(tmp_path: Path) -> None:
    path = tmp_path / "u16.log"
    path.write_bytes("a:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC".encode("utf-16-le") + b"\n")
    assert three_fields(diagnose_json(path)[str(path)]) == ([], ["P2P/IPC"], None)


def _peak(path: Path) -> int:
    tracemalloc.start()
    try:
        classify_file(str(path))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_does_not_grow_with_the_log(tmp_path: Path) -> None:
    """Bounded memory, shown by scaling: 10x the lines, about the same peak. (The 200 MB case
    and its MB/s run in benchmarks/diagnose_stream.py.)"""
    block = (
        "(RayWorkerWrapper pid=7, ip=10.0.0.2) b:7:9 [1] NCCL INFO Channel 03/0 : 9[1] -> 1[1] [send] "
        "via NET/IB/1/GDRDMA\n"
        "INFO 05-11 14:14:53 [gpu_model_runner.py:1347] Model loading took 28.7797 GiB\n"
        "a:5:6 [0] NCCL INFO Channel 01/0 : 0[0] -> 7[7] via P2P/IPC/read\n"
        "a:5:6 [0] NCCL WARN something odd happened here\n"
    )
    small, big = tmp_path / "small.log", tmp_path / "big.log"
    small.write_text(block * 500)
    big.write_text(block * 5_000)  # ~1.4 MB
    peak_small, peak_big = _peak(small), _peak(big)
    assert peak_big < 2 * peak_small + (256 << 10), (peak_small, peak_big)
    one_line = tmp_path / "no-newline.bin"
    one_line.write_bytes(b"\x07" * (4 << 20))  # 4 MB, no newline at all
    assert _peak(one_line) < 2 << 20


def test_lines_of_several_communicators_without_init_lines() -> None:
    """vLLM with TP 2 x PP 2 on two nodes, InitRank lines filtered out: each node's TP group
    numbers its ranks 0 and 1, so rank 1 lives on both nodes. The rank map then proves
    nothing, and the PP link over IB stays cross-node (synthetic, shaped like vllm15100)."""
    lines = [
        "a:10:10 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
        "a:11:11 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read",
        "b:20:20 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
        "b:21:21 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read",
        "a:10:12 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
    ]
    s = summarize_lines(lines)
    assert (s.cross_node, s.intra_node) == (["NET/IB+GDRDMA"], ["P2P/CUMEM"])


def test_one_host_that_nccl_calls_two_nodes() -> None:
    """With P2P and SHM disabled NCCL 2.28 reports `nNodes 2 localRanks 1` for two GPUs of one
    machine (tests/fixtures/verify/h200x2_collective_socket.log); same hostname and bootstrap
    IP decide: intra-node via NET."""
    s = summarize_lines((RECORDED / "h200x2_collective_socket.log").read_text().splitlines())
    text = (RECORDED / "h200x2_collective_socket.log").read_text()
    assert "nNodes 2 localRanks 1" in text
    assert (s.cross_node, s.intra_node, s.intra_via_net) == ([], ["NET/Socket"], True)
