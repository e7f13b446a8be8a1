"""Supervision of a serving group (issue 18): every node supervised on its own node, the restart
coordinated through the head, the whole group restarted together.

Two halves live here:
- in the node containers (standard library only, shipped as one zip file, kit/supervise/bundle.py):
  `agent` (one per node: runs the node's serve script in its own process group, scans its engine
  processes, reports to the coordinator, obeys its orders), `coordinator` (on the head: gathers the
  reports, judges liveness with kit/health/liveness.py, drives `policy`, records `events`), `protocol`
  (the HTTP control protocol between them), `procs` (process groups and /proc), `watch` (the
  head's /health, /metrics and one-token probes over urllib);
- on the host (kit's own dependencies): `plan` (what to supervise, from the config), `host`
  (install, start, follow and stop supervision through the container runtime), `hooks` (the
  small pieces `kit up`, `kit serve`, `kit status` and `kit logs` call).

Nothing here imports a host module from an in-container one: tests/unit/test_supervise_bundle.py
runs the bundle with `python3 -I -S` to prove it.
"""
