"""Issue 25: the running cluster describes itself, loading is not planning, every look has a
deadline, and answers are honest.

- kit's record of a cluster (kit.cluster.record) and what runs (kit.cluster.running): labels over
  the record over the settings, drift only for configured values, values from outside checked;
- the bounded exec (kit.runtime.base): the deadline holds inside the "container" (run here with
  the host's real sh and coreutils `timeout`), and the end-exec command kills by mark;
- kit status's Budget, and the Ray view that names a missing Ray at once;
- the verbs that only look or tear down (down, logs, status, config show, pull --dry-run) with a
  model whose weights do not fit the GPUs (the real sizing error of `kit up`), from CliRunner.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kit import labels
from kit.cli import cli
from kit.cluster import Cluster, record
from kit.cluster.running import Drift, key_hint, operated, operating_values, read_running
from kit.cluster.status import Budget, ray_view
from kit.config import load_config
from kit.errors import ServerError, StartError
from kit.plan.network import NodeNet
from kit.plan.node import node_labels
from kit.plan.roles import HEAD, Role
from kit.runtime.base import EXEC_MARK, ExecResult, NodeHandle, bounded_argv, end_exec_argv, new_exec_mark
from tests.unit.test_cluster import FakeRuntime, cpu_config

# ---- the record and what runs ---------------------------------------------------------------


def served_nodes() -> list[NodeHandle]:
    """The nodes of a cluster started for mp, a tiny model as 'tiny', port 8123, a key file."""
    config = cpu_config(**{"ports.api": 8123, "api_key_file": "/srv/keys/api_key", "cluster": "dt"})
    out = []
    for role, ip in ((HEAD, "10.9.8.10"), (Role("worker", 1), "10.9.8.11")):
        tags = node_labels(config, role, NodeNet(ip, "eth0", "10.9.8.10"))
        out.append(NodeHandle(f"kit-dt-{role.label}", "dt", role.kind, role.rank, "running", ip=ip, labels=tags))
    return out


def settings(**values: Any) -> Any:
    return load_config(
        environ={}, cwd=Path("/nonexistent"), overrides={k: (v, "kit.yaml:3") for k, v in values.items()}
    )


def test_labels_win_over_defaults_and_drift_names_only_configured_values() -> None:
    running = read_running("dt", served_nodes(), None)
    assert running.values["ports.api"] == 8123 and running.values["backend"] == "mp"
    assert running.values["model.served_name"] == "tiny" and running.values["api_key_file"] == "/srv/keys/api_key"
    assert running.origins["ports.api"] == "label kit.api-port of kit-dt-head"
    # No kit.yaml: nothing configured, nothing drifts, and the operated config is what runs.
    bare = settings(cluster="dt")
    assert Cluster(bare).drift(running) == []
    config = operated(bare, running).config
    assert (config.backend, config.ports.api, config.served_name, config.api_key_file) == (
        "mp",
        8123,
        "tiny",
        "/srv/keys/api_key",
    )
    assert (config.layout.tp, config.layout.pp, config.nodes, config.accelerator) == (2, 1, 2, "cpu")
    # A kit.yaml that disagrees: reported, and never used instead.
    other = settings(cluster="dt", **{"ports.api": 9000, "backend": "ray", "model.tp": "auto"})
    found = {d.key: d for d in Cluster(other).drift(running)}
    assert set(found) == {"ports.api", "backend"}  # tp auto is a request to plan, not a value
    assert found["ports.api"] == Drift("ports.api", 9000, "kit.yaml:3", 8123, "label kit.api-port of kit-dt-head")
    assert "kit uses what runs" in found["backend"].line("dt")
    assert operated(other, running).config.ports.api == 8123


def test_a_bad_label_is_left_out_never_trusted() -> None:
    [head, worker] = served_nodes()
    bad = dict(head.labels, **{labels.API_PORT: "99999", labels.BACKEND: "$(reboot)"})
    running = read_running("dt", [NodeHandle(head.name, "dt", "head", 0, "running", labels=bad), worker], None)
    # The worker's good labels stand in for the head's bad ones; nothing unchecked gets through.
    assert running.values["ports.api"] == 8123 and running.values["backend"] == "mp"
    alone = read_running("dt", [NodeHandle(head.name, "dt", "head", 0, "running", labels=bad)], None)
    assert "ports.api" not in alone.values and "backend" not in alone.values


def test_record_written_on_up_read_back_and_forgotten_on_down(healthy: None, tmp_path: Path) -> None:
    rt = FakeRuntime()
    key = str(tmp_path / "api_key")
    Path(key).write_text("sk-test\n")
    cluster = Cluster.from_config(cpu_config(**{"ports.api": 8123, "api_key_file": key}), runtime=rt)
    cluster.bring_up()
    doc = record.read("kc")
    assert doc is not None and set(doc["nodes"]) == {"kit-kc-head", "kit-kc-worker-1"}
    assert doc["values"]["ports.api"] == 8123 and doc["values"]["api_key_file"] == key
    assert doc["values"]["runtime"] == "docker" and doc["serve"] is None
    cluster.serve()
    assert record.read("kc")["serve"]["supervised"] is False  # type: ignore[index]
    # Found again from nothing but its name: the record (and the labels) say what runs.
    found = Cluster.find(None, {"cluster": ("kc", "flag --cluster")}, environ={}, cwd=Path("/nonexistent"), runtime=rt)
    assert found.url() == "http://10.9.8.10:8123" and found.operated().config.api_key_file == key
    assert found.down().containers == ["kit-kc-worker-1", "kit-kc-head"]
    assert record.read("kc") is None
    # With no node on this host (another host runs the head), the record's head address answers.
    rt2 = FakeRuntime()
    Cluster.from_config(cpu_config(cluster="kd", head_address="10.1.2.3"), runtime=rt2).up(HEAD)
    rt2.specs.clear()
    found = Cluster.find(None, {"cluster": ("kd", "flag")}, environ={}, cwd=Path("/nonexistent"), runtime=rt2)
    assert found.url() == "http://10.9.8.10:8000"  # the simulation network's head, as recorded


def test_nodes_started_at_once_all_stay_in_the_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes on hosts sharing kit's state folder, started at the same moment: each adds itself
    under the record's lock, none is lost (read outside the lock, most were)."""
    import threading

    monkeypatch.setenv("KIT_STATE_DIR", str(tmp_path))
    resolved = settings(cluster="kr")
    operating = {"runtime": "docker", "ports.api": 8000}
    names = [f"kit-kr-worker-{i}" for i in range(8)]
    gate = threading.Barrier(len(names))

    def start(name: str) -> None:
        gate.wait()
        record.started(resolved, {"name": name, "role": "worker"}, operating)

    threads = [threading.Thread(target=start, args=(n,)) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    doc = record.read("kr")
    assert doc is not None and sorted(doc["nodes"]) == sorted(names)


def test_record_never_holds_a_secret(tmp_path: Path) -> None:
    rt = FakeRuntime()
    (tmp_path / "k").write_text("sk-test\n")
    (tmp_path / "kit.yaml").write_text(
        "cluster: ks\nbackend: mp\naccelerator: cpu\nnodes: 1\ngpus_per_node: 1\nhf_cache: /nonexistent/hf\n"
        f"api_key_file: {tmp_path / 'k'}\nenv:\n  MY_SERVICE_PASSWORD: hf_secret_value\n  PLAIN: '1'\n"
    )
    Cluster.load(str(tmp_path / "kit.yaml"), {}, environ={}, runtime=rt).up(HEAD)
    doc = record.read("ks")
    assert doc is not None and doc["config"]["path"] == str(tmp_path / "kit.yaml")
    assert doc["config"]["set"]["env"] == [
        {"MY_SERVICE_PASSWORD": "<redacted>", "PLAIN": "1"},
        f"{tmp_path}/kit.yaml:8",
    ]
    text = record.path().read_text()
    assert "hf_secret_value" not in text and "sk-test" not in text and str(tmp_path / "k") in text


def test_record_values_match_the_labels() -> None:
    """What the record keeps of a planned config is what its node labels say (one source of truth)."""
    config = cpu_config(**{"ports.api": 8123, "api_key_file": "/srv/keys/api_key", "cluster": "dt"})
    values = operating_values(config, "10.9.8.10")
    running = read_running("dt", served_nodes(), None)
    assert {k: values[k] for k in running.values} == dict(running.values)


# ---- bounded execs ----------------------------------------------------------------------------


def test_the_deadline_holds_inside_the_container() -> None:
    """bounded_argv run with the host's sh and coreutils timeout, as inside a container."""
    started = time.monotonic()
    done = subprocess.run(bounded_argv(["sleep", "30"], 1), capture_output=True, check=False, timeout=20)
    assert done.returncode == 124 and time.monotonic() - started < 5
    ok = subprocess.run(bounded_argv(["sh", "-c", 'printf "%s" "$1"; exit 3', "x", "a b"], 5), capture_output=True)
    assert ok.returncode == 3 and ok.stdout == b"a b"  # words arrive as words; the code is the command's


def test_end_exec_kills_every_process_of_one_exec_only() -> None:
    mark, other = new_exec_mark(), new_exec_mark()
    assert len(mark) == len(other) == 24 and mark != other
    ours = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60"], env={**os.environ, EXEC_MARK: mark})
    theirs = subprocess.Popen(["sleep", "60"], env={**os.environ, EXEC_MARK: other})
    try:
        time.sleep(0.3)
        subprocess.run(end_exec_argv(mark), check=True, timeout=20)
        assert ours.wait(timeout=10) != 0
        assert theirs.poll() is None  # another exec's process is left alone
    finally:
        for p in (ours, theirs):
            p.kill()
            p.wait()


# ---- kit status's deadline and the Ray view -------------------------------------------------


def test_budget_shares_one_deadline() -> None:
    now = [0.0]
    budget = Budget(10, clock=lambda: now[0])
    assert budget.take(4, "a") == 4
    now[0] = 8.5
    assert budget.take(4, "b") == 1.5
    now[0] = 9.5
    assert budget.take(4, "c") is None
    assert budget.unreached == ["c: not asked, the 10 s of kit status were spent (--timeout)"]


class ExecRuntime(FakeRuntime):
    def __init__(self, answer: ExecResult) -> None:
        super().__init__()
        self.answer = answer
        self.timeouts: list[float | None] = []

    def exec(
        self,
        node: NodeHandle,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        self.timeouts.append(timeout)
        return self.answer


def test_ray_view_names_a_missing_ray_and_a_slow_one() -> None:
    head = served_nodes()[0]
    rt = ExecRuntime(ExecResult(3, "KIT_NO_RAY nothing answers at 10.9.8.10:6379 (Connection refused)\n", ""))
    with pytest.raises(StartError) as err:
        ray_view(rt, head, 6379, timeout=6)
    assert "no Ray in kit-dt-head: nothing answers at 10.9.8.10:6379" in err.value.message
    assert rt.timeouts == [6]  # the whole look, bounded
    rt = ExecRuntime(ExecResult(124, "", ""))
    with pytest.raises(StartError, match="did not answer within 6 s"):
        ray_view(rt, head, 6379, timeout=6)


def test_status_names_what_it_could_not_reach(healthy: None) -> None:
    """A head whose exec fails (the container restarting) and a server that refuses: every part is
    named, the containers are still shown, all within the budget."""

    class Broken(FakeRuntime):
        def exec(self, node: NodeHandle, argv: Sequence[str], **_: Any) -> ExecResult:
            raise StartError(f"{node.name} is not running")

    rt = Broken()
    cluster = Cluster.from_config(cpu_config(**{"model.dp": 2, "model.tp": 1}), runtime=rt)
    cluster.bring_up()
    started = time.monotonic()
    result = cluster.status(timeout=5)
    assert time.monotonic() - started < 5
    doc = result.to_dict()
    assert [c["name"] for c in doc["containers"]] == ["kit-kc-head", "kit-kc-worker-1"]
    assert any("the engines in kit-kc-head: kit-kc-head is not running" in u for u in doc["unreached"])
    assert doc["server"]["serving"] is False and doc["drift"] == []


# ---- a 401 says where the key is --------------------------------------------------------------


def test_a_401_names_the_key_file_and_what_to_do() -> None:
    def refused() -> None:
        raise ServerError("http://10.0.0.1:8000/v1/models answered 401 Unauthorized", hint="generic")

    for key_file, source, expected in [
        (None, "default", "kit knows no API key file for cluster demo"),
        ("/tmp/wrong", "flag --api-key-file", "/tmp/wrong does not hold the server's key"),
        ("/s/demo-api-key", "label kit.api-key-file of kit-demo-head", "`kit serve --replace` serves the key"),
    ]:
        with pytest.raises(ServerError) as err, key_hint("demo", key_file, source):
            refused()
        assert expected in (err.value.hint or "")
    with pytest.raises(ServerError) as err, key_hint(None, None, "default"):  # --url: not the cluster's
        refused()
    assert err.value.hint == "generic"


# ---- looking and tearing down whatever the model ----------------------------------------------

BIG_MODEL = {  # a 70B-class dense model: its weights alone need ~140 GB at bf16
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}


@pytest.fixture
def big_model_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with kit.yaml naming a model whose weights do not fit 2 x 8 GiB, and no other."""
    model = tmp_path / "models" / "big"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(BIG_MODEL))
    (tmp_path / "kit.yaml").write_text(
        f"cluster: dt\nnodes: 2\ngpus_per_node: 1\nmodel:\n  id: {model}\n  gpu_memory: 8GiB\n"
    )
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("KIT_") and n != "KIT_STATE_DIR"]:
        monkeypatch.delenv(name)
    return tmp_path


def invoke(args: list[str]) -> Any:
    return CliRunner().invoke(cli, args, catch_exceptions=False, standalone_mode=False)


def test_a_model_that_does_not_fit_is_refused_by_up_only(
    big_model_dir: Path, use_runtime: Callable[[Any], None]
) -> None:
    from kit.cli import main

    rt = FakeRuntime()
    use_runtime(rt)
    Cluster.from_config(cpu_config(cluster="dt")).bring_up()  # something runs under that name
    with pytest.raises(SystemExit) as up:
        main(["up", "--dry-run"])
    assert up.value.code == 3  # the sizing error, where something would start
    for args in (["config", "show", "--json"], ["pull", "--dry-run"], ["status", "--no-ray", "--json"]):
        with pytest.raises(SystemExit) as done:
            main(args)
        assert done.value.code == 0, args
    with pytest.raises(SystemExit) as logs:
        main(["logs"])
    assert logs.value.code == 0
    with pytest.raises(SystemExit) as down:
        main(["down"])
    assert down.value.code == 0 and rt.specs == {}


def test_logs_says_when_there_is_nothing_to_show(
    big_model_dir: Path, use_runtime: Callable[[Any], None], capsys: pytest.CaptureFixture[str]
) -> None:
    from kit.cli import main

    rt = FakeRuntime()
    use_runtime(rt)
    with pytest.raises(SystemExit) as none:
        main(["logs", "--events"])
    err = capsys.readouterr().err
    assert none.value.code == 1 and "no head node of cluster dt on this host" in err  # not 6: nothing failed
    Cluster.from_config(cpu_config(cluster="dt")).bring_up()

    rt.exec = lambda node, argv, **_: ExecResult(1, "", "No such file")  # type: ignore[method-assign]
    for args, line in (
        (["logs", "--events"], "no supervisor events: cluster dt is not served under supervision"),
        (["logs", "--serve"], "no server log in kit-dt-head"),
        (["logs"], "kit-dt-head has printed nothing"),
    ):
        with pytest.raises(SystemExit) as done:
            main(args)
        assert done.value.code == 0 and line in capsys.readouterr().err, args


@pytest.fixture
def healthy(monkeypatch: pytest.MonkeyPatch) -> None:
    import kit.net.openai

    monkeypatch.setattr(kit.net.openai, "health", lambda url, timeout=3: True)


def test_router_replicas_are_operated_as_replicas_from_an_empty_folder() -> None:
    """Replicas behind the router (issue 29) say so in their layout label: `kit status`, `kit
    query` and `kit metrics` from a folder without kit.yaml reach the router, not a DP group."""
    config = cpu_config(**{"cluster": "dt", "model.tp": 1, "model.dp": 2, "model.dp_lb": "router"})
    nodes = []
    for role, ip in ((HEAD, "10.9.8.10"), (Role("worker", 1), "10.9.8.11")):
        tags = node_labels(config, role, NodeNet(ip, "eth0", "10.9.8.10"))
        nodes.append(NodeHandle(f"kit-dt-{role.label}", "dt", role.kind, role.rank, "running", ip=ip, labels=tags))
    operated_config = operated(settings(cluster="dt"), read_running("dt", nodes, None)).config
    assert operated_config.model.dp_lb == "router" and operated_config.layout.router
    assert (operated_config.layout.tp, operated_config.layout.dp) == (1, 2)
