"""Node IP and interface detection with the Python standard library (FIELD_NOTES §1 rows 1-3, §6).

`ip` is often missing in images and on minimal hosts, so this reads /proc/net/route and asks the
kernel through ioctls. IPv4 only, numeric only (Ray must never register a hostname).
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from pathlib import Path

SIOCGIFADDR = 0x8915


def interface_addresses() -> dict[str, str]:
    """Every interface with an IPv4 address: {name: address}."""
    out: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on this interface
            out[name] = socket.inet_ntoa(packed[20:24])
    return out


def default_route_interface(route_file: Path = Path("/proc/net/route")) -> str | None:
    """The interface of the IPv4 default route, from /proc/net/route."""
    try:
        lines = route_file.read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            return fields[0]
    return None


def route_source_ip(destination: str) -> str | None:
    """The local IPv4 address the kernel would use to reach `destination`.

    A UDP connect() only looks up the route; no packet is sent.
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((destination, 9))
            addr: str = sock.getsockname()[0]
            return addr
    except OSError:
        return None


def resolve_ipv4(host: str) -> str | None:
    """A numeric IPv4 address for host (already numeric, or resolved)."""
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(host)
    except OSError:
        return None


def has_infiniband(dev: Path = Path("/dev/infiniband")) -> bool:
    return dev.is_dir()
