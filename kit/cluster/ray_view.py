"""Runs inside the head container: the Ray view, plus each alive node's own VLLM_HOST_IP read by a
zero-CPU task pinned to that node (FIELD_NOTES §1 rows 1, 9: registered IP must equal it).

Runs inside the head container with the image's python3 and Ray, as
`python3 -c SOURCE GCS_PORT TIMEOUT_S` (kit/cluster/status.py reads this file and passes it).
Prints one `KIT_JSON [...]` line.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=0)  # type: ignore[untyped-decorator]
def host_ip() -> str | None:
    return os.environ.get("VLLM_HOST_IP")


def main(argv: list[str]) -> int:
    gcs_port, timeout = argv[0], float(argv[1])
    ray.init(address=os.environ["VLLM_HOST_IP"] + ":" + gcs_port, logging_level="ERROR", log_to_driver=False)
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
