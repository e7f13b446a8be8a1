"""NCCL transport parser on real 2x H200 logs and on synthetic lines for every format."""

from __future__ import annotations

from pathlib import Path

import pytest

from kit.verify.nccl import Transport, classify_via, parse_log, summarize_lines

RECORDED_NCCL = Path(__file__).parents[1] / "fixtures" / "recorded" / "nccl"  # see its README.md
RECORDED = Path(__file__).parents[1] / "fixtures" / "verify"


@pytest.mark.parametrize(
    ("name", "transport", "via"),
    [
        ("h200x2_p2p_cumem.log", "p2p", "P2P/CUMEM"),
        ("h200x2_p2p_ipc.log", "p2p", "P2P/IPC"),
        ("h200x2_shm.log", "shm", "SHM/direct/direct"),
        ("h200x2_socket.log", "socket", "NET/Socket/0"),
    ],
)
def test_recorded_h200_logs(name: str, transport: str, via: str) -> None:
    path = RECORDED_NCCL / name
    s = summarize_lines(path.read_text().splitlines())
    assert list(s.intra) == [transport]
    assert s.inter == {}  # one host: even NET/Socket between its GPUs is intra-node
    assert s.version == "2.28.9"
    assert s.ib_devices == {}  # "NET/IB : Using [RO]" after "No device found" is no device
    assert s.networks == ["Socket"]  # printed even when everything goes over NVLink
    assert via in s.vias


@pytest.mark.parametrize(
    ("name", "transport"),
    [("p2p", "p2p"), ("shm", "shm"), ("socket", "socket")],
)
def test_recorded_collective_logs(name: str, transport: str) -> None:
    """Lines kit's own collective probe captured on 2x H200 (tests/gpu)."""
    s = summarize_lines((RECORDED / f"h200x2_collective_{name}.log").read_text().splitlines())
    assert s.intra_worst is Transport(transport)
    assert s.inter_worst is None


@pytest.mark.parametrize(
    ("via", "transport"),
    [
        ("P2P/CUMEM", Transport.P2P),
        ("P2P/CUMEM/read", Transport.P2P),
        ("P2P/CUMEM/CE", Transport.P2P),
        ("P2P/IPC", Transport.P2P),
        ("P2P/IPC/read", Transport.P2P),
        ("P2P/direct pointer", Transport.P2P),
        ("P2P/direct pointer/read", Transport.P2P),
        ("SHM/direct/direct", Transport.SHM),
        ("SHM/direct", Transport.SHM),
        ("NET/IB/0/GDRDMA", Transport.IB_GDR),
        ("NET/IB/1/GDRDMA(PCI)", Transport.IB_GDR),
        ("NET/IB/0", Transport.IB),
        ("NET/IBext_v8/0/GDRDMA", Transport.PLUGIN),
        ("NET/AWS Libfabric/0/GDRDMA", Transport.PLUGIN),
        ("NET/OFI/0", Transport.PLUGIN),
        ("NET/Socket/0", Transport.SOCKET),
        ("CollNet/0", Transport.OTHER),
    ],
)
def test_classify_via(via: str, transport: Transport) -> None:
    assert classify_via(via) is transport


@pytest.mark.parametrize(
    ("line", "src", "dst", "direction", "via"),
    [
        (
            "n1:10:10 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
            0,
            1,
            "",
            "P2P/CUMEM/read",
        ),
        (
            "n1:10:10 [0] NCCL INFO Channel 03/0 : 0[0] -> 1[1] via P2P/direct pointer",
            0,
            1,
            "",
            "P2P/direct pointer",
        ),
        (
            "n1:10:10 [1] NCCL INFO Channel 01 : 1[1] -> 0[0] via SHM/direct/direct",
            1,
            0,
            "",
            "SHM/direct/direct",
        ),
        (
            "n1:10:99 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA",
            8,
            0,
            "receive",
            "NET/IB/0/GDRDMA",
        ),
        (
            "n1:10:99 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA(PCI)",
            0,
            8,
            "send",
            "NET/IB/0/GDRDMA(PCI)",
        ),
        (
            "n1:10:99 [0] NCCL INFO Channel 01/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA",
            0,
            8,
            "send",
            "NET/AWS Libfabric/0/GDRDMA",
        ),
        # Ray/vLLM process tags before NCCL's own prefix: never anchor at line start.
        (
            "(RayWorkerWrapper pid=123, ip=10.0.0.2) n2:123:456 [0] NCCL INFO "
            "Channel 00/0 : 1[0] -> 0[0] "
            "[send] via NET/Socket/0",
            1,
            0,
            "send",
            "NET/Socket/0",
        ),
        (
            "\x1b[36m(VllmWorkerProcess pid=77)\x1b[0m n1:77:77 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/IPC",
            1,
            0,
            "",
            "P2P/IPC",
        ),
        # NCCL <= 2.17: bus ids in the brackets, no /0 after the channel.
        (
            "n1:10:10 [0] NCCL INFO Channel 00 : 0[1b000] -> 1[1c000] via P2P/IPC/read",
            0,
            1,
            "",
            "P2P/IPC/read",
        ),
        (
            "n1:10:10 [0] NCCL INFO Channel 00 : 3[e1000] -> 4[1b000] [send] via NET/IB/0/GDRDMA",
            3,
            4,
            "send",
            "NET/IB/0/GDRDMA",
        ),
    ],
)
def test_channel_line_formats(line: str, src: int, dst: int, direction: str, via: str) -> None:
    log = parse_log([line])
    assert len(log.connections) == 1
    c = log.connections[0]
    assert (c.src, c.dst, c.direction, c.via) == (src, dst, direction, via)


def test_ib_devices_and_version() -> None:
    lines = [
        "n1:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
        "n1:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB ib0:10.0.0.1<0>",
        "n1:1:1 [0] NCCL INFO Using network IB",
    ]
    s = summarize_lines(lines)
    assert s.version == "2.21.5"
    assert s.ib_devices == {"mlx5_0:1": "IB", "mlx5_1:1": "RoCE"}
    assert s.networks == ["IB"]


def _two_node_log(via: str) -> list[str]:
    return [
        "a:10:10 [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank 0 nranks 4 cudaDev 0 nvmlDev 0 "
        "busId 60 commId 0xabc - Init START",
        "a:11:11 [1] NCCL INFO ncclCommInitRankConfig comm 0x2 rank 1 nranks 4 cudaDev 1 nvmlDev 1 "
        "busId 70 commId 0xabc - Init START",
        "b:20:20 [0] NCCL INFO ncclCommInitRankConfig comm 0x3 rank 2 nranks 4 cudaDev 0 nvmlDev 0 "
        "busId 60 commId 0xabc - Init START",
        "b:21:21 [1] NCCL INFO ncclCommInitRankConfig comm 0x4 rank 3 nranks 4 cudaDev 1 nvmlDev 1 "
        "busId 70 commId 0xabc - Init START",
        "a:10:10 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM",
        f"a:11:30 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via {via}",
        f"b:20:31 [0] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [receive] via {via}",
        "b:20:20 [0] NCCL INFO Channel 00/0 : 2[0] -> 3[1] via P2P/CUMEM",
    ]


def test_scopes_from_hosts() -> None:
    s = summarize_lines(_two_node_log("NET/IB/0/GDRDMA"))
    assert s.intra == {"p2p": 2}
    assert s.inter == {"ib-gdr": 2}
    s = summarize_lines(_two_node_log("NET/Socket/0"))
    assert s.inter_worst is Transport.SOCKET


def test_scope_falls_back_to_transport_without_hosts() -> None:
    s = summarize_lines(
        [
            "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
            "Channel 00/0 : 1[1] -> 2[0] [send] via NET/IB/0",
        ]
    )
    assert s.intra == {"p2p": 1}
    assert s.inter == {"ib": 1}
