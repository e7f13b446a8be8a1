"""Verification: probes that run inside nodes, NCCL transport parsing, the policy gate.

`probe.py` and `collective.py` are self-contained scripts (standard library at import time) that
kit copies into containers; everything else is kit-side.
"""
