"""Writes the run's files from its arguments (run dir, serve script, bundle, settings), then
becomes the bundle's entry command. kit's own text: no value is ever part of it.

Runs inside a node container of a SLURM job with its python3 (standard library only): the
launcher's supervised entry (templates/slurm_supervise.sh.j2) carries this file's text as one
quoted word and runs: python3 -c SOURCE RUN_DIR SERVE BUNDLE SETTINGS. (No backquotes in this
file: shellcheck reads the launcher that carries it.)
"""

from __future__ import annotations

import base64
import json
import os
import sys


def put(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "wb") as handle:
        handle.write(data)
    os.replace(path + ".tmp", path)


def main(argv: list[str]) -> int:
    run_dir, serve, packed, settings = argv[:4]
    put(json.loads(settings)["serve_script"], serve.encode())
    pyz = os.path.join(run_dir, "kit-supervise.pyz")
    put(pyz, base64.b64decode(packed))
    put(os.path.join(run_dir, "supervise.json"), settings.encode())
    os.execv(sys.executable, [sys.executable, pyz, "entry", run_dir])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
