"""Run a command and write its peak resident set size (bytes) to a file: `python peak_rss.py
OUT COMMAND...`; exits with the command's exit code.

Why a launcher: Linux carries the memory high-water mark of a process across fork and exec
(ru_maxrss of a child forked by a 200 MB pytest starts at 200 MB). This small, fresh process
forks the command, so the command's figure is its own (plus this launcher's ~10 MB at most).
"""

import os
import subprocess
import sys

if __name__ == "__main__":
    out, argv = sys.argv[1], sys.argv[2:]
    child = subprocess.Popen(argv)
    _, status, usage = os.wait4(child.pid, 0)
    with open(out, "w") as handle:
        handle.write(str(usage.ru_maxrss * 1024))
    sys.exit(os.waitstatus_to_exitcode(status))
