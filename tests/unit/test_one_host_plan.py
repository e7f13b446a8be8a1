"""One GPU box in one command (issue 28): `kit serve MODEL --gpus 2,3 --port 8001` needs no kit.yaml,
two such servers on one host share no port, GPU or name, and a node that would share one with a
running node of another cluster is refused before anything starts, --dry-run included.

The runtime here is tests/conftest.py's FakeRuntime (its running nodes are what the host holds);
tests/integration/test_one_host.py runs two real servers side by side on the CPU image."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kit.plan.host_share import clashes, derived_ports, held_gpus, host_ports, one_host_name, parse_ports_label
from kit.plan.roles import HEAD, Role
from kit.runtime.base import NodeHandle
from tests.conftest import FakeRuntime, make_config, run_kit


def serve_plan(*args: str) -> dict[str, Any]:
    code, out, err = run_kit(["serve", *args, "--dry-run", "--json"])
    assert code == 0, err
    plan: dict[str, Any] = json.loads(out)["result"]
    return plan


def label(argv: list[str], key: str) -> str | None:
    return next((a.split("=", 2)[2] for a in argv if a.startswith(f"--label={key}=")), None)


def test_one_command_serves_a_model_on_a_gpu_subset_without_kit_yaml(kit_env: Path) -> None:
    plan = serve_plan("Qwen/Qwen2.5-7B-Instruct", "--gpus", "2,3", "--port", "8001", "--tp", "2")
    assert plan["cluster"] == "qwen2.5-7b-instruct-8001" and plan["backend"] == "mp"
    assert plan["parallel"]["tp"] == 2 and len(plan["nodes"]) == 1
    argv = plan["node"]["argv"]
    assert '--gpus="device=2,3"' in argv and "--env=KIT_NNODES=1" in argv
    assert label(argv, "kit.gpus") == "2,3" and label(argv, "kit.host-ports") == "8001"
    assert "--port 8001" in plan["nodes"][0]["script"] and "--tensor-parallel-size 2" in plan["nodes"][0]["script"]
    code, out, _ = run_kit(["serve", "Qwen/Qwen2.5-7B-Instruct", "--gpus", "2,3", "--port", "8001", "--dry-run"])
    assert code == 0 and out.startswith("# --- the node this host starts first (kit serve MODEL):\ndocker run")


def test_two_servers_on_one_host_share_no_port_gpu_or_name(kit_env: Path) -> None:
    a = serve_plan("org/a", "--gpus", "0,1", "--port", "8000", "--supervise")
    b = serve_plan("org/b", "--gpus", "2,3", "--port", "8001", "--supervise")
    assert a["node"]["container"] != b["node"]["container"]
    ports_a = parse_ports_label(label(a["node"]["argv"], "kit.host-ports") or "")
    ports_b = parse_ports_label(label(b["node"]["argv"], "kit.host-ports") or "")
    assert ports_a == [(8000, 8000), (29570, 29570)] and ports_b == [(8001, 8001), (29571, 29571)]
    assert not set(ports_a) & set(ports_b)
    # with Ray (asked for) every Ray port of the two lies in a block of its own
    ray_a, ray_b = (
        make_config(backend="ray", nodes=1, **{"ports.api": api, **dict(derived_ports(api, "ray").items())})
        for api in (8000, 8001)
    )
    spans_a, spans_b = host_ports(ray_a, HEAD).values(), host_ports(ray_b, HEAD).values()
    assert not [(x, y) for x in spans_a for y in spans_b if x[0] <= y[1] and y[0] <= x[1]]


def test_keys_the_user_set_win_over_what_one_host_decides(kit_env: Path) -> None:
    (kit_env / "kit.yaml").write_text("cluster: mine\nports:\n  supervisor: 31000\n")
    plan = serve_plan("org/a", "--port", "8005", "--supervise")
    assert plan["cluster"] == "mine"
    assert parse_ports_label(label(plan["node"]["argv"], "kit.host-ports") or "") == [(8005, 8005), (31000, 31000)]
    (kit_env / "kit.yaml").write_text("nodes: 2\n")
    code, _, err = run_kit(["serve", "org/a", "--dry-run"])
    assert code == 3 and "serves on this host alone, but nodes is 2" in err, err
    code, _, err = run_kit(["serve", "org/a", "--model", "org/b", "--dry-run"])
    assert code == 2 and "MODEL and --model" in err


class HostRuntime(FakeRuntime):
    """FakeRuntime whose find_nodes keeps to the cluster asked for, as the real adapters do."""

    def find_nodes(self, cluster: str) -> list[NodeHandle]:
        return [n for n in super().find_nodes(cluster) if n.cluster == cluster]


def running(cluster: str, **labels: str) -> NodeHandle:
    return NodeHandle(f"kit-{cluster}-head", cluster, "head", 0, "running", labels={"kit.cluster": cluster, **labels})


@pytest.mark.parametrize(
    ("holder", "args", "message"),
    [
        ({"kit.host-ports": "8001 29571"}, ["--port", "8001"], "port 8001 (ports.api) is held by cluster other"),
        ({"kit.host-ports": "12000-12999"}, ["--port", "12500"], "port 12500 (ports.api) is held"),
        ({"kit.gpus": "3"}, ["--gpus", "2,3", "--port", "8009"], "GPU 3 is held by cluster other"),
        ({"kit.gpus": "all"}, ["--gpus", "0", "--port", "8009"], "every GPU is held by cluster other"),
    ],
)
def test_a_clash_with_another_clusters_running_node_is_refused_before_anything_starts(
    holder: dict[str, str], args: list[str], message: str, kit_env: Path, use_runtime: Callable[[Any], None]
) -> None:
    runtime = HostRuntime(running("other", **holder))
    use_runtime(runtime)
    for extra in (["--dry-run"], []):
        code, out, err = run_kit(["serve", "org/model", *args, *extra])
        assert code == 3 and message in err and "kit down --cluster other" in err, err
        assert out == "" and runtime.started == [] and runtime.calls == []


def test_kit_up_refuses_a_clash_too_and_ignores_its_own_cluster_and_other_networks(
    kit_env: Path, use_runtime: Callable[[Any], None]
) -> None:
    use_runtime(FakeRuntime(running("other", **{"kit.host-ports": "6379 8000"})))
    code, _, err = run_kit(["up", "--dry-run", "--nodes", "1", "--backend", "ray"])
    assert code == 3 and "port 6379 (ports.ray_gcs) is held by cluster other" in err, err
    use_runtime(FakeRuntime(running("kit", **{"kit.host-ports": "6379 8000", "kit.gpus": "all"})))
    assert run_kit(["up", "--dry-run", "--nodes", "1"])[0] == 0  # its own node: replaced, not a clash
    use_runtime(FakeRuntime(running("other", **{"kit.host-ports": "8000"})))
    sim = ["up", "--dry-run", "--nodes", "1", "--accelerator", "cpu", "--network", "simnet"]
    assert run_kit(sim)[0] == 0  # a simulation network's node has its own IP: no host port


def test_what_a_node_holds() -> None:
    cfg = make_config(backend="mp", nodes=2, **{"supervise.enabled": True})
    assert host_ports(cfg, HEAD) == {"ports.api": (8000, 8000), "ports.supervisor": (29570, 29570),
                                     "ports.mp_master": (29500, 29500)}  # fmt: skip
    assert host_ports(cfg, Role("worker", 1)) == {}
    ray = host_ports(make_config(backend="ray"), Role("worker", 1))
    assert "ports.ray_gcs" not in ray and ray["ports.ray_min_worker"] == (11000, 11999)
    assert held_gpus(make_config(gpus="2, 3", gpus_per_node=2)) == "2,3"
    assert held_gpus(make_config(accelerator="cpu")) is None
    assert clashes({"ports.api": (8000, 8000)}, None, [("x", "n", {"kit.host-ports": "junk 7999-8001 -"})])


@pytest.mark.parametrize(
    ("model", "port", "name"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", 8001, "qwen2.5-7b-instruct-8001"),
        ("/home/alice/models/Llama-3.2-3B-Instruct/", 8000, "llama-3.2-3b-instruct-8000"),
        ("org/" + "x" * 80, 9000, "x" * 50 + "-9000"),
        ("org/@@@", 8000, "model-8000"),
    ],
)
def test_one_host_names(model: str, port: int, name: str) -> None:
    assert one_host_name(model, port) == name
