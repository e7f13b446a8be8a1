"""`kit --help` wall time vs `python -c "import click"` (issue 3: target ratio <= 2).

kit's verbs are imported lazily (kit/cli.py), so `--help` must not import docker-py, spython
or requests. Both commands run side by side, alternating, in fresh interpreters; the medians
are compared. Also reports whether any heavy module was imported. Not a timed test: run it.

    python benchmarks/cli_help.py [--runs 15] [--python PYTHON] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

HEAVY = ("docker", "spython", "requests", "jinja2", "yaml")
TARGET = 2.0


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def heavy_imports(python: str) -> list[str]:
    code = (
        "import sys\nfrom kit.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY:' + ','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    last = [ln for ln in out.splitlines() if ln.startswith("HEAVY:")][-1]
    return [m for m in last.removeprefix("HEAVY:").split(",") if m]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    kit_help = [args.python, "-m", "kit", "--help"]
    click_import = [args.python, "-c", "import click"]
    for argv in (kit_help, click_import):  # warm the page cache and .pyc files
        timed(argv)
    kit_times, click_times = [], []
    for _ in range(args.runs):
        kit_times.append(timed(kit_help))
        click_times.append(timed(click_import))
    kit_median, click_median = statistics.median(kit_times), statistics.median(click_times)
    ratio = kit_median / click_median
    heavy = heavy_imports(args.python)
    result = {
        "runs": args.runs,
        "kit_help_median_ms": round(kit_median * 1e3, 1),
        "import_click_median_ms": round(click_median * 1e3, 1),
        "ratio": round(ratio, 2),
        "target": TARGET,
        "heavy_modules_imported": heavy,
        "ok": ratio <= TARGET and not heavy,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"kit --help        median {result['kit_help_median_ms']:7.1f} ms  ({args.runs} runs)")
        print(f"import click      median {result['import_click_median_ms']:7.1f} ms  ({args.runs} runs)")
        print(f"ratio             {ratio:.2f}  (target <= {TARGET})")
        print(f"heavy imports     {', '.join(heavy) if heavy else 'none'}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
