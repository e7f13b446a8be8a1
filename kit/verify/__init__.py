"""Verification: probes that run inside nodes, NCCL transport parsing, the policy gate.

`probe.py` and `collective.py` (with `latency.py`, its decode-latency part) are self-contained
scripts (standard library at import time) that kit copies into containers; everything else is
kit-side: `runner.py` runs them, `facts.py` reads what they print into typed facts, `checks/`
judges those facts (node, cluster, transport) and
`policy.py` is the gate between the two; `nccl_log.py` reads NCCL_DEBUG=INFO lines and `nccl.py`
summarises them by transport; `diagnose.py` classifies failure lines of any log; `report.py`
renders a result (text, JSON, JUnit).
"""
