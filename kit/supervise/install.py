"""Writes a supervised run's files into a node container: the bundle, supervise.json and the serve
script (argv[2]: {path: {"text"|"b64", "mode"}}), and the control token (from the environment,
never argv). A fresh run keeps the previous run's events as events.prev.jsonl. Values arrive as
data: nothing is interpolated into code or shell.

Runs inside a node container with its python3 (standard library only), as
`python3 -c SOURCE RUN_DIR FILES_JSON` (kit/cluster/supervision.py reads this file and passes it).
"""

from __future__ import annotations

import base64
import json
import os
import sys


def write(path: str, data: bytes, mode: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    run_dir, files = argv[0], json.loads(argv[1])
    os.makedirs(run_dir, exist_ok=True)
    for name in ("state.json", "resume"):
        if os.path.exists(os.path.join(run_dir, name)):
            os.unlink(os.path.join(run_dir, name))
    if os.path.exists(os.path.join(run_dir, "events.jsonl")):
        os.replace(os.path.join(run_dir, "events.jsonl"), os.path.join(run_dir, "events.prev.jsonl"))
    for path, item in files.items():
        data = base64.b64decode(item["b64"]) if "b64" in item else item["text"].encode()
        write(path, data, int(item.get("mode", 0o644)))
    write(os.path.join(run_dir, "token"), os.environ["KIT_SUPERVISE_TOKEN"].encode(), 0o600)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
