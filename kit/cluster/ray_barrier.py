"""kit: the Ray head's barrier. Waits until every node AND the expected total of one resource are
alive in the Ray cluster (FIELD_NOTES section 1 row 17), then prints the ready mark the launchers
and `kit up` wait for.

Runs inside the head container with the image's python3 and Ray, as
`python3 -c SOURCE NODES RESOURCE EXPECTED JOIN_TIMEOUT_S GCS_ADDRESS READY_MARK`
(kit/templates/node_ray_head.sh.j2 carries this file's text as one quoted word). Imports the
standard library and Ray only. (No backquotes in this file: shellcheck reads the scripts that
carry it.)
"""

from __future__ import annotations

import sys
import time


def main(argv: list[str]) -> int:
    nodes, resource, expected = int(argv[0]), argv[1], float(argv[2])
    deadline, address, mark = time.monotonic() + float(argv[3]), argv[4], argv[5]
    import ray  # the image's, after the arguments are checked

    while True:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            break
        except Exception as exc:  # the GCS may still be starting
            if time.monotonic() > deadline:
                print(f"kit: the Ray head did not come up: {exc}", flush=True)
                return 1
            time.sleep(0.5)
    last = None
    while True:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        total = sum(n.get("Resources", {}).get(resource, 0) for n in alive)
        if (len(alive), total) != last:
            last = (len(alive), total)
            print(f"kit: {len(alive)}/{nodes} nodes and {total:g}/{expected:g} {resource} alive", flush=True)
        if len(alive) >= nodes and total >= expected:
            print(f"{mark} nodes={len(alive)} {resource}={total:g}", flush=True)
            break
        if deadline and time.monotonic() > deadline:
            # Keep the head up so late workers can still join; `kit up` reports the timeout.
            print(f"kit: still waiting for {nodes} nodes / {expected:g} {resource} (join deadline passed)", flush=True)
            deadline = 0
        time.sleep(0.5)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
