"""Replicas behind one endpoint (model.dp_lb router, issue 29), the pure parts: where each replica
runs (a replica over whole nodes, several on one node), what is refused before anything starts,
each node's `vllm serve` (golden, shellcheck), the router's container and argv (the key never in
them), each replica's supervision settings, and the bench's keep-going mode."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kit.config import KitConfig
from kit.errors import ConfigError
from kit.layout import Layout
from kit.plan.checks import check_config
from kit.plan.container_args import to_docker_argv, to_docker_kwargs
from kit.plan.network import HostFacts, plan_node_net
from kit.plan.node import node_env, node_mounts
from kit.plan.paths import API_KEY_PATH
from kit.plan.replicas import plan_replicas
from kit.plan.roles import HEAD, Role
from kit.plan.router import plan_router, router_argv, router_url
from kit.plan.scripts import serve_script
from kit.plan.supervise import plan_replica_supervise
from tests.conftest import make_config, shellcheck_bin

SIM = {"network": "kitnet", "network_subnet": "10.77.0.0/24"}


def router_config(nodes: int, gpus: int, tp: int, dp: int | str, **overrides: object) -> KitConfig:
    base: dict[str, object] = {
        "backend": "mp",
        "nodes": nodes,
        "gpus_per_node": gpus,
        "model.tp": tp,
        "model.pp": 1,
        "model.dp": dp,
        "model.dp_lb": "router",
        "image": "vllm/vllm-openai:v0.33.0",
    }
    base.update(overrides)
    return make_config(**base)


def shellcheck(tmp_path: Path, text: str) -> None:
    script = tmp_path / "s.sh"
    script.write_text(text)
    done = subprocess.run([shellcheck_bin(), "-s", "bash", str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


# ---- placement ---------------------------------------------------------------------------------


def test_tp2_dp2_over_four_one_gpu_nodes_places_each_replica_over_two_nodes() -> None:
    config = router_config(4, 1, 2, 2)
    check_config(config, {})
    replicas = plan_replicas(config)
    assert [(r.nodes, r.slot, r.port, r.master_port) for r in replicas] == [
        ((0, 1), 0, 8100, 29500),
        ((2, 3), 0, 8100, 29500),
    ]
    assert config.layout == Layout(2, 1, 2, decided_by=config.layout.decided_by, router=True)
    assert config.layout.name == "tp2-dp2-router"


def test_two_tp4_replicas_share_an_eight_gpu_node_each_on_its_own_gpus_and_port() -> None:
    config = router_config(1, 8, 4, 2)
    check_config(config, {})
    assert [(r.nodes, r.slot, r.gpus, r.port) for r in plan_replicas(config)] == [
        ((0,), 0, (0, 1, 2, 3), 8100),
        ((0,), 1, (4, 5, 6, 7), 8101),
    ]


def test_tp16_dp2_over_four_eight_gpu_nodes() -> None:
    config = router_config(4, 8, 16, "auto")
    assert config.dp == 2
    check_config(config, {})
    assert [r.nodes for r in plan_replicas(config)] == [(0, 1), (2, 3)]


@pytest.mark.parametrize(
    ("layout", "overrides", "key", "words"),
    [
        ((2, 1, 1, 2), {"backend": "ray"}, "backend", "multi-node backend"),
        ((2, 1, 1, 2), {"model.ep": True}, "model.ep", "one DP group"),
        ((2, 1, 1, 3), {}, "model.dp", "need"),
        ((3, 2, 3, 2), {}, "model.tp", "whole nodes"),
        ((1, 4, 1, 4), {"ports.replica": 8998, "ports.api": 9000}, "ports.replica", "9000"),
    ],
)
def test_what_router_replicas_refuse_names_the_key(
    layout: tuple[int, int, int, int], overrides: dict[str, object], key: str, words: str
) -> None:
    config = router_config(*layout, **overrides)
    with pytest.raises(ConfigError) as err:
        check_config(config, {})
    assert err.value.key == key
    assert words in str(err.value)


def test_internal_dp_still_refuses_a_replica_over_nodes_and_points_at_the_router() -> None:
    config = router_config(4, 1, 2, 2, **{"model.dp_lb": "internal"})
    with pytest.raises(ConfigError) as err:
        check_config(config, {})
    assert "model.dp_lb: router" in (err.value.hint or "")


# ---- each node's serve script --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stem", "nodes", "gpus", "tp", "roles"),
    [
        ("router_tp2_dp2_4x1", 4, 1, 2, [HEAD, Role("worker", 1), Role("worker", 2), Role("worker", 3)]),
        ("router_tp4_dp2_1x8", 1, 8, 4, [HEAD]),
        ("router_tp1_dp2_2x1", 2, 1, 1, [HEAD, Role("worker", 1)]),
    ],
)
def test_replica_serve_scripts_golden_and_shellcheck(
    stem: str, nodes: int, gpus: int, tp: int, roles: list[Role], golden: Callable[[str, str], None], tmp_path: Path
) -> None:
    config = router_config(
        nodes, gpus, tp, nodes * gpus // tp, **({"image": "vllm/vllm-openai:v0.20.0"} if gpus == 8 else {})
    )
    for role in roles:
        text = serve_script(config, role, env={"HF_HUB_OFFLINE": "1"})
        golden(f"replicas/{stem}_{role.label}.sh", text)
        shellcheck(tmp_path, text)


def test_a_replica_over_nodes_meets_at_its_first_node() -> None:
    config = router_config(4, 1, 2, 2, **SIM)
    nets = [plan_node_net(config, {}, Role("head" if r == 0 else "worker", r), HostFacts()) for r in range(4)]
    assert [n.replica_head for n in nets] == ["10.77.0.10", "10.77.0.10", "10.77.0.12", "10.77.0.12"]
    env = node_env(config, Role("worker", 3), nets[3])
    assert env["KIT_REPLICA_HEAD_ADDRESS"] == "10.77.0.12"
    text = serve_script(config, Role("worker", 3))
    assert "--node-rank 1" in text and "--headless" in text and '--master-addr="${KIT_REPLICA_HEAD_ADDRESS}"' in text


def test_host_networking_needs_replica_head_for_a_replica_not_on_the_head() -> None:
    config = router_config(4, 1, 2, 2, head_address="192.0.2.10")
    facts = HostFacts(interfaces={"eth0": "192.0.2.13"}, default_interface="eth0", route_to_head="192.0.2.13")
    with pytest.raises(ConfigError) as err:
        plan_node_net(config, {}, Role("worker", 3), facts)
    assert err.value.key == "replica_head"
    ok = router_config(4, 1, 2, 2, head_address="192.0.2.10", replica_head="192.0.2.12")
    assert plan_node_net(ok, {}, Role("worker", 3), facts).replica_head == "192.0.2.12"
    assert plan_node_net(ok, {}, Role("worker", 1), facts).replica_head == "192.0.2.10"  # the head's replica


def test_every_replica_node_gets_the_api_key_file_its_api_server_and_supervisor_read() -> None:
    config = router_config(2, 1, 1, 2)
    assert any(m.target == API_KEY_PATH for m in node_mounts(config, Role("worker", 1)))


# ---- the router -----------------------------------------------------------------------------------


def test_the_router_listens_where_the_api_was_and_checks_keys_against_the_replicas() -> None:
    config = router_config(2, 1, 1, 2, **SIM)
    urls = ["http://10.77.0.10:8100", "http://10.77.0.11:8100"]
    spec = plan_router(config, "10.77.0.10", urls)
    assert router_url(config, "10.77.0.10") == "http://10.77.0.9:8000"
    assert spec.ip == "10.77.0.9" and spec.network == "kitnet" and spec.gpus is None
    assert spec.labels["kit.role"] == "router" and spec.image == "kit/vllm-router:0.1.17"
    argv = list(spec.script_args)
    assert argv[argv.index("--host") + 1] == "10.77.0.9" and argv[argv.index("--port") + 1] == "8000"
    assert "--worker-urls" not in argv  # each replica is added once healthy
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--api-key-validation-url"] == [
        f"{u}/v1/models" for u in urls
    ]
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    key = "the-secret-key"
    everything = json.dumps(to_docker_kwargs(spec)) + " ".join(to_docker_argv(spec))
    assert API_KEY_PATH not in everything and key not in everything  # the router never holds the key


def test_host_networking_puts_the_router_on_the_head_ip_and_without_a_key_checks_none() -> None:
    config = router_config(2, 1, 1, 2, api_key_file=None)
    argv = router_argv(config, "192.0.2.10", ["http://192.0.2.10:8100"])
    assert "--api-key-validation-url" not in argv
    assert router_url(config, "192.0.2.10") == "http://192.0.2.10:8000"
    assert plan_router(config, "192.0.2.10", []).network == "host"


# ---- supervision: one group per replica ----------------------------------------------------------------


def test_each_replica_is_its_own_supervised_group_with_its_coordinator_on_its_first_node() -> None:
    config = router_config(4, 1, 2, 2)
    doc = plan_replica_supervise(config, 3, "http://192.0.2.9:8000")
    assert doc["nodes"] == ["worker-2", "worker-3"]
    assert doc["coordinator_rank"] == 2 and doc["coordinator_address_env"] == "KIT_REPLICA_HEAD_ADDRESS"
    assert doc["api_port"] == 8100 and doc["engines"] == ["0"]
    assert doc["router_url"] == "http://192.0.2.9:8000"
    one = plan_replica_supervise(router_config(2, 1, 1, 2), 1, None)
    assert one["nodes"] == ["worker-1"] and one["coordinator_rank"] == 1
    assert one["coordinator_address_env"] == "VLLM_HOST_IP"


def test_replicas_that_share_a_node_are_groups_of_their_own_with_their_own_files_and_ports() -> None:
    """Two TP1 replicas on one 2-GPU node, supervised: each its own serve script (only its own
    `vllm serve`, exec'd), run directory, coordinator port and agent that counts only its own
    group's engines, so a failure of one never stops the other."""
    from kit.plan.supervise import run_files, slot_of

    config = router_config(1, 2, 1, 2, **{"supervise.enabled": True})
    docs = [plan_replica_supervise(config, 0, "http://192.0.2.9:8000", slot) for slot in (0, 1)]
    assert [d["replica"] for d in docs] == [0, 1]
    assert [d["port"] for d in docs] == [29570, 29571] and [d["api_port"] for d in docs] == [8100, 8101]
    assert [d["serve_script"] for d in docs] == ["/tmp/kit/serve.sh", "/tmp/kit/serve-1.sh"]
    assert [d["serve_log"] for d in docs] == ["/tmp/kit/serve.log", "/tmp/kit/serve-1.log"]
    assert [d["pid_file"] for d in docs] == ["/tmp/kit/serve.pid", "/tmp/kit/serve-1.pid"]
    assert all(d["own_engines_only"] is True for d in docs)
    assert plan_replica_supervise(router_config(2, 1, 1, 2), 1, None)["own_engines_only"] is False
    assert [run_files(k).run_dir for k in (0, 1)] == ["/tmp/kit/supervise", "/tmp/kit/supervise-1"]
    assert [slot_of(run_files(k).run_dir) for k in (0, 1, 7)] == [0, 1, 7]
    for other in ("/tmp/kit/supervise-x", "/tmp/kit/supervise-01", "/tmp/kit/supervise-", "/tmp/kit/sup", "/etc"):
        with pytest.raises(ValueError):
            slot_of(other)
    both = serve_script(config, HEAD)
    one = serve_script(config, HEAD, slot=1)
    assert "--port 8101" in one and "--port 8100" not in one and "exec vllm serve" in one and "wait -n" not in one
    assert "--port 8100" in both and "--port 8101" in both and "wait -n" in both
    with pytest.raises(ValueError):
        serve_script(config, HEAD, slot=2)


def test_the_supervised_dry_run_shows_each_replica_slots_own_script_and_settings() -> None:
    """`kit serve --supervise --dry-run` of replicas sharing a node prints what
    kit.cluster.supervised_replicas installs (it takes its scripts from the same plan_serve): a
    script per slot, and each replica's supervise.json; unsupervised, the node's one script."""
    from kit.cluster.serving import plan_serve
    from kit.commands.serve import dry_run_text, planned_replica_supervision, to_dict

    config = router_config(1, 2, 1, 2, **{"supervise.enabled": True})
    plan = plan_serve(config, supervised=True)
    assert [(n.role.rank, n.slot) for n in plan.nodes] == [(0, 0), (0, 1)]
    assert [n.script for n in plan.nodes] == [serve_script(config, HEAD, slot=k) for k in (0, 1)]
    text = dry_run_text(to_dict(plan, config.layout))
    assert "# --- head (rank 0), replica slot 1: script run inside its container" in text
    docs = planned_replica_supervision(config)
    assert [(d["replica"], d["port"], d["serve_script"]) for d in docs] == [
        (0, 29570, "/tmp/kit/serve.sh"),
        (1, 29571, "/tmp/kit/serve-1.sh"),
    ]
    assert {d["router_url"] for d in docs} == {"http://HEAD_IP:8000"}
    [whole] = plan_serve(config).nodes  # unsupervised: both replicas in one script
    assert whole.slot is None and "wait -n" in whole.script
    [spanning] = plan_serve(router_config(1, 2, 2, 1, **{"supervise.enabled": True}), supervised=True).nodes
    assert spanning.slot is None  # one replica per node: kit's usual one script


def test_supervised_replicas_on_a_node_need_a_coordinator_port_each() -> None:
    config = router_config(1, 2, 1, 2, **{"supervise.enabled": True, "ports.supervisor": 29499})
    with pytest.raises(ConfigError) as err:
        check_config(config, {})
    assert err.value.key == "ports.supervisor"
    assert (
        "2 replicas on a node use ports.supervisor 29499-29500, and port 29500 is ports.mp_master" in err.value.message
    )
    check_config(router_config(1, 2, 1, 2, **{"ports.supervisor": 29499}), {})  # unsupervised: one port


def test_stopping_a_node_asks_each_of_its_coordinators_and_ends_each_group_by_its_own_pid_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kit.cluster.supervision.stop finds the run directories in the container (not in a config):
    each coordinator there is asked to stop, then each group is ended by its own pid file; a
    directory kit does not name is left alone. (A fake runtime: the real containers are in
    tests/integration; this is which command goes where.)"""
    from kit.cluster import supervision as host
    from kit.runtime.base import ExecResult, NodeHandle

    asked: set[str] = set()
    calls: list[list[str]] = []

    class Runtime:
        def exec(self, node: NodeHandle, argv: list[str], **_: Any) -> ExecResult:
            calls.append(list(argv))
            if argv[0] == "find":
                return ExecResult(0, "/tmp/kit/supervise-1\n/tmp/kit/supervise\n/tmp/kit/supervise-old\n", "")
            if argv[:2] == ["python3", "-c"]:
                return ExecResult(0, 'KIT_SUPERVISE_STOPPED {"agent": 7}\n', "")
            if "ctl" in argv:
                asked.add(argv[argv.index("ctl") + 1])
            return ExecResult(0, "", "")

    monkeypatch.setattr(host, "is_active", lambda runtime, node, run_dir: run_dir not in asked)
    head = NodeHandle("kit-t-head", "t", "head", 0, "running", "10.0.0.10", labels={"kit.router": "true"})
    out = host.stop(Runtime(), [head], "test")  # type: ignore[arg-type]
    assert [c for c in calls if "ctl" in c] == [
        ["python3", "/tmp/kit/supervise/kit-supervise.pyz", "ctl", "/tmp/kit/supervise", "stop", "test"],
        ["python3", "/tmp/kit/supervise-1/kit-supervise.pyz", "ctl", "/tmp/kit/supervise-1", "stop", "test"],
    ]
    assert [c[3:] for c in calls if c[:2] == ["python3", "-c"]] == [
        ["/tmp/kit/supervise", "/tmp/kit/serve.pid"],
        ["/tmp/kit/supervise-1", "/tmp/kit/serve-1.pid"],
    ]
    assert out == {
        "asked_coordinator": True,
        "nodes": {"kit-t-head": {"agent": 7}, "kit-t-head (slot 1)": {"agent": 7}},
    }


# ---- the coordinator drains and readmits its replica ------------------------------------------------


class _Router:
    """A stand-in for vLLM's router admin API on loopback (the real router runs in
    tests/integration/test_replicas_cluster.py): records each call, answers `code`."""

    def __init__(self, code: int = 200) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        calls: list[tuple[str, str | None]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                calls.append((self.path, self.headers.get("Authorization")))
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                return

        self.calls = calls
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("code", [200, 500])
def test_the_coordinator_drains_on_detected_and_readmits_on_ready(tmp_path: Path, code: int) -> None:
    import time

    from kit.supervise import events as ev
    from kit.supervise.coordinator import Coordinator, CoordinatorConfig
    from kit.supervise.policy import Settings

    router = _Router(code)
    key = tmp_path / "key"
    key.write_text("k3y\n")
    settings = Settings(("worker-1",), ("0",), 10, 30, 1, 1, 300, 30)
    config = CoordinatorConfig(
        str(tmp_path), "127.0.0.1", 0, "t", "http://10.0.0.11:8100", "tiny", str(key), settings, router_url=router.url
    )
    from kit.health.liveness import Probe

    coordinator = Coordinator(
        config,
        observe=lambda: None,  # type: ignore[arg-type,return-value]
        probe=lambda engine: Probe(time.monotonic(), engine, None, 0.01),  # it answers: readmitted
        out=lambda _: None,
    )
    try:
        for count, action in enumerate(("remove", "add"), 1):
            coordinator._route(action, ev.Event(time.time(), "detected", "x", 1, 0))
            end = time.monotonic() + 10
            while time.monotonic() < end and _lines(tmp_path / "events.jsonl") < count:
                time.sleep(0.05)
    finally:
        router.close()
    found = [e.kind for e in ev.parse_lines((tmp_path / "events.jsonl").read_text().splitlines())]
    assert found == (["drained", "readmitted"] if code == 200 else ["route-failed", "route-failed"])
    assert [p.split("?")[0] for p, _ in router.calls] == ["/remove_worker", "/add_worker"]
    assert all(p.endswith("url=http%3A%2F%2F10.0.0.11%3A8100") and auth == "Bearer k3y" for p, auth in router.calls)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_partial_node_replicas_hold_their_ports_for_the_host_share_check() -> None:
    from kit.plan.host_share import host_ports

    config = router_config(1, 8, 2, 4, **{"supervise.enabled": True})
    assert host_ports(config, HEAD) == {
        "ports.replica": (8100, 8103),
        "ports.supervisor": (29570, 29573),  # each replica's coordinator: ports.supervisor + its slot
        "ports.api": (8000, 8000),
        "ports.router_metrics": (29000, 29000),
    }
    spanning = router_config(4, 1, 2, 2)
    assert host_ports(spanning, Role("worker", 1)) == {}  # a headless part binds nothing of its own
    assert host_ports(spanning, Role("worker", 2)) == {"ports.replica": (8100, 8100), "ports.mp_master": (29500, 29500)}


@pytest.mark.parametrize(("failing", "expected", "calls"), [(1, "readmitted", 1), (99, "route-failed", 0)])
def test_readmission_waits_for_an_answered_request_and_gives_up_after_its_tries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: int, expected: str, calls: int
) -> None:
    """A restarted replica goes back into the router only once it answers a one-token request:
    a failed try is tried again (READMIT_TRIES), and one that never answers is a route-failed
    event without the router being asked at all."""
    import time

    from kit.health.liveness import Probe
    from kit.supervise import coordinator as coord
    from kit.supervise import events as ev
    from kit.supervise.coordinator import Coordinator, CoordinatorConfig
    from kit.supervise.policy import Settings
    from tests.conftest import write_secret

    monkeypatch.setattr(coord, "READMIT_PAUSE_S", 0.01)
    router = _Router(200)
    key = write_secret(tmp_path / "key", "k3y\n")
    settings = Settings(("worker-1",), ("0",), 10, 30, 1, 1, 300, 30)
    config = CoordinatorConfig(
        str(tmp_path), "127.0.0.1", 0, "t", "http://10.0.0.11:8100", "tiny", str(key), settings, router_url=router.url
    )
    tries: list[str] = []

    def probe(engine: str) -> Probe:
        tries.append(engine)
        return Probe(time.monotonic(), engine, "connection refused" if len(tries) <= failing else None, 0.01)

    observe: Any = lambda: None  # noqa: E731 (never called: no tick runs)
    coordinator = Coordinator(config, observe=observe, probe=probe, out=lambda _: None)
    coordinator.state.phase = "serving"
    try:
        coordinator._route("add", ev.Event(time.time(), "ready", "x", coordinator.state.generation, 0))
        end = time.monotonic() + 10
        while time.monotonic() < end and _lines(tmp_path / "events.jsonl") < 1:
            time.sleep(0.05)
    finally:
        router.close()
    found = ev.parse_lines((tmp_path / "events.jsonl").read_text().splitlines())
    assert [e.kind for e in found] == [expected]
    assert len(tries) == min(failing + 1, coord.READMIT_TRIES)
    assert len(router.calls) == calls
    assert coordinator.routed == (expected == "readmitted")
    if expected == "route-failed":
        assert "did not answer a one-token request: connection refused" in found[0].reason


# ---- vLLM's router from the host (kit.net.router, through kit's bounded HTTP layer) ----------------


class _Admin:
    """A scripted router on loopback: `answers` maps a path (without its query) to (status, body)."""

    def __init__(self, answers: dict[str, tuple[int, bytes]]) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen: list[tuple[str, str, str | None]] = []

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                seen.append((self.command, self.path, self.headers.get("Authorization")))
                status, body = answers.get(self.path.split("?")[0], (404, b"no such route"))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                return

        self.seen = seen
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> _Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_routers_replicas_are_read_with_their_types_checked() -> None:
    from kit.net import router as router_api

    workers = {
        "workers": [
            {"url": "http://10.0.0.2:8100", "is_healthy": True, "load": 3},
            {"url": "http://10.0.0.3:8100", "is_healthy": "yes", "load": "many"},  # wrong types: not healthy, no load
            {"url": 7},  # no URL string: not a replica
            "junk",
        ]
    }
    with _Admin({"/workers": (200, json.dumps(workers).encode()), "/health": (401, b"")}) as admin:
        got = router_api.replicas(admin.url, "k3y")
        assert router_api.answers(admin.url)  # any status: it is there
    assert got == [
        router_api.RoutedReplica("http://10.0.0.2:8100", True, 3),
        router_api.RoutedReplica("http://10.0.0.3:8100", False, None),
    ]
    assert admin.seen[0] == ("GET", "/workers", "Bearer k3y")


@pytest.mark.parametrize(
    ("answers", "fragment"),
    [
        ({"/workers": (500, b"boom\n\x1b[2Jagain")}, "answered 500 to /workers: boom"),
        ({"/workers": (200, b"<html>")}, "JSON"),
        ({"/workers": (200, b"[" * 10000 + b"]" * 10000)}, "JSON"),
    ],
)
def test_a_routers_bad_answer_is_one_line_error(answers: dict[str, tuple[int, bytes]], fragment: str) -> None:
    from kit.errors import ServerError
    from kit.net import router as router_api

    with _Admin(answers) as admin, pytest.raises(ServerError) as err:
        router_api.replicas(admin.url, None)
    assert fragment in err.value.message and "\n" not in err.value.message and "\x1b" not in err.value.message


def test_adding_and_removing_a_replica_at_the_router() -> None:
    from kit.errors import ServerError
    from kit.net import router as router_api

    replica = "http://10.0.0.2:8100"
    with _Admin({"/add_worker": (200, b"{}"), "/remove_worker": (200, b"{}")}) as admin:
        assert router_api.add(admin.url, replica, "k") == "added"
        router_api.remove(admin.url, replica, "k")
    assert [(m, p) for m, p, _ in admin.seen] == [
        ("POST", "/add_worker?url=http%3A%2F%2F10.0.0.2%3A8100"),
        ("POST", "/remove_worker?url=http%3A%2F%2F10.0.0.2%3A8100"),
    ]
    with _Admin({"/add_worker": (400, b"Worker already exists"), "/remove_worker": (500, b"x")}) as admin:
        assert router_api.add(admin.url, replica, None) == "present"
        with pytest.raises(ServerError, match="did not remove"):
            router_api.remove(admin.url, replica, None)
    assert not router_api.answers(admin.url)  # closed: nothing answers there now


# ---- the plan against the image's own parser (issue 24's recorded parsers) ------------------------


def test_tp2_dp2_over_four_nodes_is_checked_against_the_recorded_parsers() -> None:
    """Every node's `vllm serve` of TP=2 × DP=2 over four one-GPU nodes (a replica over two nodes:
    --nnodes, --node-rank, --master-addr, --master-port, --headless) against vLLM's own parsers:
    the newest release has every option; 0.10.2 has no multi-node mp options, named in one line."""
    from kit.plan.image_check import check_serve_options, every_serve_words
    from tests.unit.recorded_parsers import recorded_facts

    config = router_config(4, 1, 2, 2, **{"model.extra_args": []})
    shapes = every_serve_words(config)
    assert len(shapes) == 2  # the replica's first node (its API server) and its headless part
    flags = {w.split("=", 1)[0] for words, _ in shapes for w in words if w.startswith("--")}
    assert {"--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"} <= flags
    assert "--data-parallel-size" not in flags  # replicas are no DP group
    check_serve_options(config, {}, recorded_facts())
    with pytest.raises(ConfigError) as err:
        check_serve_options(config, {}, recorded_facts("0.10.2"))
    assert "0.11.1" in str(err.value) or "--nnodes" in str(err.value)


def test_the_router_images_version_is_the_same_everywhere_it_is_written() -> None:
    """config router.image's default, containers/router/Dockerfile's pin and tests/run.sh's
    cached-by-tag build step name the same vllm-router release."""
    import re

    from kit import resources
    from kit.config import Router

    pinned = re.search(
        r"^ARG VLLM_ROUTER_VERSION=(\S+)$", (resources.container_dir("router") / "Dockerfile").read_text(), re.M
    )
    assert pinned is not None
    assert Router().image == f"kit/vllm-router:{pinned[1]}"
    run_sh = (Path(__file__).resolve().parents[1] / "run.sh").read_text()
    assert f"docker image inspect kit/vllm-router:{pinned[1]} " in run_sh and f"vllm-router=={pinned[1]}" in run_sh


@pytest.mark.parametrize(("refused", "outcome"), [(False, "admitted"), (True, "stopped")])
def test_kit_serve_supervise_waits_through_an_unanswered_readmission_but_not_a_router_refusal(
    monkeypatch: pytest.MonkeyPatch, refused: bool, outcome: str
) -> None:
    """`route-failed` of a replica that did not answer its request is its coordinator's to handle
    (liveness restarts it, the next `ready` readmits it): kit serve --supervise waits for that;
    the router refusing a replica that answers is no failure a restart mends: it stops there."""
    from kit.cluster import supervised_replicas as sr
    from kit.errors import StartError
    from kit.runtime.base import NodeHandle
    from kit.supervise import events as ev

    script = [
        ev.Event(1.0, "route-failed", "cannot add replica", 1, 0, data={"took_s": 1.0, "router_refused": refused}),
        ev.Event(2.0, "ready", "serving again", 2, 1),
        ev.Event(3.0, "readmitted", "back into the router", 2, 1),
    ]
    monkeypatch.setattr(sr.host, "read_events", lambda runtime, node, start, run_dir: script[start : start + 1])
    head = NodeHandle("kit-t-head", "t", "head", 0, "running", "10.0.0.10")
    [group] = sr.groups_on(router_config(2, 1, 1, 2), [head], coordinators=True)
    shown: list[str] = []
    try:
        sr.until_admitted(None, [group], lambda e: shown.append(e.kind), poll_s=0)  # type: ignore[arg-type]
        got = "admitted"
    except StartError as err:
        got = "stopped"
        assert "route-failed" in err.message
    assert got == outcome
    assert shown == (["route-failed", "ready", "readmitted"] if not refused else ["route-failed"])


@pytest.mark.parametrize("restarted_meanwhile", [False, True])
def test_a_router_refusal_counts_only_for_the_generation_still_serving(
    tmp_path: Path, restarted_meanwhile: bool
) -> None:
    """Measured on the CPU engine: a replica restarted while its readmission waited at the router
    made the router answer 400 (its /health check timed out); that is the restart's doing, and
    the event says the router did not refuse a serving replica."""
    import time

    from kit.health.liveness import Probe
    from kit.supervise import events as ev
    from kit.supervise.coordinator import Coordinator, CoordinatorConfig
    from kit.supervise.policy import Settings
    from tests.conftest import write_secret

    router = _Router(400)
    key = write_secret(tmp_path / "key", "k3y\n")
    settings = Settings(("worker-1",), ("0",), 10, 30, 1, 1, 300, 30)
    config = CoordinatorConfig(
        str(tmp_path), "127.0.0.1", 0, "t", "http://10.0.0.11:8100", "tiny", str(key), settings, router_url=router.url
    )
    holder: list[Coordinator] = []

    def probe(engine: str) -> Probe:
        if restarted_meanwhile:
            holder[0].state.generation += 1
        return Probe(time.monotonic(), engine, None, 0.01)

    observe: Any = lambda: None  # noqa: E731 (never called: no tick runs)
    coordinator = Coordinator(config, observe=observe, probe=probe, out=lambda _: None)
    holder.append(coordinator)
    coordinator.state.phase = "serving"
    try:
        coordinator._route("add", ev.Event(time.time(), "ready", "x", coordinator.state.generation, 0))
        end = time.monotonic() + 10
        while time.monotonic() < end and _lines(tmp_path / "events.jsonl") < 1:
            time.sleep(0.05)
    finally:
        router.close()
    (event,) = ev.parse_lines((tmp_path / "events.jsonl").read_text().splitlines())
    assert event.kind == "route-failed" and event.data["router_refused"] is (not restarted_meanwhile)
