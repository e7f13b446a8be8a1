"""Runs inside the head container: the Ray view, plus each alive node's own VLLM_HOST_IP read by a
zero-CPU task pinned to that node (FIELD_NOTES §1 rows 1, 9: registered IP must equal it).

Runs inside the head container with the image's python3 and Ray, as
`python3 -c SOURCE GCS_PORT TIMEOUT_S` (kit/cluster/status.py reads this file and passes it).
Prints one `KIT_JSON [...]` line; when nothing listens on the GCS port (Ray is not running in
the head: ray.init would wait for minutes) one `KIT_NO_RAY <why>` line and exit 3, within a
second (issue 25). kit also bounds the whole run inside the container (kit.runtime.base).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any


def gcs_listening(host: str, port: int, timeout: float) -> str | None:
    """None when the GCS port accepts a connection, else why not (before importing Ray at all)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"nothing answers at {host}:{port} ({exc.strerror or type(exc).__name__})"


def main(argv: list[str]) -> int:
    gcs_port, timeout = argv[0], float(argv[1])
    host = os.environ.get("VLLM_HOST_IP") or "127.0.0.1"
    missing = gcs_listening(host, int(gcs_port), min(2.0, timeout))
    if missing is not None:
        print("KIT_NO_RAY " + missing, flush=True)
        return 3
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)  # type: ignore[untyped-decorator]
    def host_ip() -> str | None:
        return os.environ.get("VLLM_HOST_IP")

    ray.init(address=host + ":" + gcs_port, logging_level="ERROR", log_to_driver=False)
    nodes = ray.nodes()
    refs = {}
    for n in nodes:
        if n.get("Alive"):
            strategy = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            refs[n["NodeID"]] = host_ip.options(scheduling_strategy=strategy).remote()
    # One shared deadline: a node that just died must not stall the whole view.
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
    ips: dict[str, Any] = {}
    for node_id, ref in refs.items():
        try:
            ips[node_id] = ray.get(ref, timeout=0) if ref in ready else None
        except Exception:  # a node that died meanwhile: no IP to compare
            ips[node_id] = None
    out = []
    for n in nodes:
        res = n.get("Resources", {})
        out.append(
            {
                "node_id": n["NodeID"],
                "alive": bool(n.get("Alive")),
                "ip": n.get("NodeManagerAddress"),
                "cpus": res.get("CPU", 0),
                "gpus": res.get("GPU", 0),
                "vllm_host_ip": ips.get(n["NodeID"]),
            }
        )
    print("KIT_JSON " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
