"""How many Ray nodes are alive (the Ray backend's coordinator asks before it (re)starts the serve
step: every node must be back). Prints `KIT_RAY_ALIVE N`.

Runs in the head container with the image's python3 and Ray, as `python3 -c SOURCE ADDRESS`: the
coordinator reads this file from its bundle (pkgutil) and passes it, so the coordinator itself
never imports Ray.
"""

from __future__ import annotations

import sys

import ray


def main(argv: list[str]) -> int:
    ray.init(address=argv[0], logging_level="ERROR", log_to_driver=False)
    print("KIT_RAY_ALIVE", sum(1 for n in ray.nodes() if n.get("Alive")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
