"""`kit verify`: prove the cluster is right: GPUs, versions, node facts, transport, bandwidth."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from kit.cluster import Cluster
from kit.commands._options import config_options, overrides_from
from kit.commands._params import Count, KitCommand, Number, writable
from kit.errors import ConfigError, UsageError
from kit.output import emit, progress
from kit.plan.exposure import exposures
from kit.safe import files as safefile
from kit.verify import policy
from kit.verify.latency import LATENCY_METHODS
from kit.verify.policy import EXPECTS
from kit.verify.report import VerifyResult, junit_xml, raise_if_failed

RAY_VIEW_TIMEOUT_S = 25.0  # in all: starting Python, joining Ray, a task per node (issue 25)

if TYPE_CHECKING:
    from kit.config import KitConfig
    from kit.runtime.base import NodeHandle
    from kit.verify.runner import CollectiveSpec


@click.command(name="verify", cls=KitCommand)
@click.option(
    "--host",
    "on_host",
    is_flag=True,
    help="Probe this host directly (no containers): its GPUs, node facts and a collective.",
)
@click.option(
    "--job-output",
    "job_output",
    metavar="FILE",
    help="Judge the node probes a `kit slurm --runtime pyxis|edf` job printed (its KIT_PROBE lines): "
    "GPUs, /dev/infiniband, memlock and /dev/shm as the site's enroot hooks gave them.",
)
@click.option(
    "--image",
    metavar="IMAGE",
    help="Validate an image (CI): imports, versions, its `vllm serve` parser, Ray, RDMA userland, probe files; "
    "with --config, whether that cluster config starts on it (its facts are recorded, as by kit pull).",
)
@click.option(
    "--expect",
    type=click.Choice(EXPECTS),
    default="auto",
    show_default=True,
    help="Transport policy. auto: IB+GDRDMA across nodes when nodes have IB, P2P within "
    "a node when its GPUs are NVLinked.",
)
@click.option("--nodes", "expected_nodes", type=Count(1, 16384), help="Nodes the plan expects (config: nodes).")
@click.option("--gpus-per-node", type=Count(1, 1024), help="GPUs per node the plan expects (config: gpus_per_node).")
@click.option(
    "--sizes",
    help="All-reduce message sizes  [default: 1M,32M,256M,1G on NCCL, 1M,16M on Gloo/CPU]",
)
@click.option(
    "--budget",
    "budget_s",
    type=Number(0, 3600, above=True),
    default=0.5,
    show_default=True,
    help="Seconds of timed all-reduces per message size.",
)
@click.option(
    "--collective",
    "collective_kind",
    type=click.Choice(["all-reduce", "all-to-all", "both"]),
    help="Collective(s) to probe across all GPUs of all nodes  [default: all-reduce; both when the "
    "config turns expert parallelism on (model.ep): all-to-all is what MoE experts exchange]",
)
@click.option(
    "--latency",
    type=click.Choice(["auto", "off", *LATENCY_METHODS]),
    default="auto",
    show_default=True,
    help="How to time the all-reduce at decode sizes (4 KiB-1 MiB), beside the bandwidth. auto: NCCL "
    "called directly, 64 all-reduces per CUDA graph (as decode runs them), else torch.distributed in "
    "CUDA graphs; Gloo (CPU): back to back. The output names the method.",
)
@click.option("--no-collective", is_flag=True, help="Skip the collective probe.")
@click.option(
    "--model",
    help="Check that this model's HF snapshot is identical on all nodes (config: model.id).",
)
@click.option(
    "--python",
    "python",
    default=sys.executable,
    show_default="this Python",
    help="--host: the Python (with torch) that runs the probes.",
)
@click.option("--head-address", help="--host across nodes: the head's node IP (rendezvous).")
@click.option(
    "--nnodes",
    type=Count(1, 16384),
    default=1,
    show_default=True,
    help="--host across nodes: run this on every node at once.",
)
@click.option("--node-rank", type=Count(0, 16383), default=0, show_default=True, help="--host: this node's rank.")
@click.option(
    "--master-port",
    type=Count(1, 65535),
    help="Rendezvous port (default: cluster: ports.verify; --host: a free port / 29512).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=Count(1, 86400),
    default=120,
    show_default=True,
    help="Collective timeout in seconds.",
)
@click.option("--docker", default="docker", show_default=True, help="--image: the docker CLI.")
@click.option("--gpus", is_flag=True, help="--image: give the container the GPUs.")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False), help="Also write JUnit XML.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@config_options
def command(
    on_host: bool,
    job_output: str | None,
    image: str | None,
    expect: str,
    expected_nodes: int | None,
    gpus_per_node: int | None,
    sizes: str | None,
    budget_s: float,
    collective_kind: str | None,
    latency: str,
    no_collective: bool,
    model: str | None,
    python: str,
    head_address: str | None,
    nnodes: int,
    node_rank: int,
    master_port: int | None,
    timeout_s: int,
    docker: str,
    gpus: bool,
    junit_path: str | None,
    as_json: bool,
    config_path: str | None,
    cluster: str | None,
    set_values: tuple[str, ...],
) -> None:
    """Prove the cluster is right: GPUs, versions, node facts, NCCL transport, bandwidth.

    \b
    kit verify                      every node of the cluster, through the container runtime
                                    (nodes, GPUs, model, ports from the config; flags override)
    kit verify --host               this machine directly (2 GPUs: under 30 s)
    kit verify --image IMAGE        image only, for CI (with --junit report.xml)
    kit verify --image IMAGE --config kit.yaml
                                    will this cluster config start on this image? (parser, Ray, ...)
    kit verify --job-output FILE    the containers of a pyxis/EDF job (the job's output file)
    Exits 7 when a check fails; warnings do not change the exit code.
    """
    from kit.verify import runner

    if on_host and (cluster or config_path or set_values):
        raise UsageError("--cluster, --config and --set apply to cluster mode and --image only (not --host)")
    if on_host and image:
        raise UsageError("--host and --image exclude each other")
    if nnodes > 1 and not (on_host and head_address):
        raise UsageError("--nnodes > 1 needs --host and --head-address")
    if node_rank >= nnodes:
        raise UsageError(
            f"--node-rank {node_rank} is outside 0..{nnodes - 1}", hint="ranks count from 0 to --nnodes - 1"
        )
    check_sizes(sizes)
    writable(junit_path, "--junit")  # before any probe runs, not after
    expectations = runner.Expectations(expect, expected_nodes, gpus_per_node)
    spec = runner.CollectiveSpec(sizes, budget_s, timeout_s, master_port, _collectives(collective_kind), latency)
    result: VerifyResult
    if job_output:
        from kit import safeload
        from kit.verify.job_output import verify_job_output

        if on_host or image or cluster or config_path or set_values:
            raise UsageError("--job-output judges a job's output alone (no --host, --image, --cluster, --config)")
        text = safeload.read_text(job_output, what="job output")
        result = verify_job_output(text, nodes=expected_nodes, target=job_output)
    elif image:
        from kit.verify.image import verify_image

        progress(f"verify: probing image {image}", as_json=as_json)
        plan = None
        if config_path or set_values or cluster:
            # Issue 24: "will this cluster config start on this image?" The config is resolved once
            # the image's facts are recorded: the image's own parser shapes the plan.
            overrides = overrides_from(
                {"cluster": cluster, "image": image}, set_values, {"cluster": "cluster", "image": "image"}
            )

            def plan() -> tuple[KitConfig, Mapping[str, str]]:
                resolution = Cluster.load(config_path, overrides).resolution
                return resolution.config, resolution.sources

        result = verify_image(image, docker=docker, gpus=gpus, plan=plan)
    elif on_host:
        progress("verify: probing this host", as_json=as_json)
        result = runner.verify_host(
            expectations,
            spec,
            python=python,
            model=model,
            head_address=head_address,
            nnodes=nnodes,
            node_rank=node_rank,
            collective=not no_collective,
        )
    else:
        # The cluster that runs, as it runs (its labels and kit's record: issue 25); --nodes,
        # --gpus-per-node and --model are what to expect of it, checked against the probes.
        probed = Cluster.find(config_path, overrides_from({"cluster": cluster}, set_values, {"cluster": "cluster"}))
        expected = {"nodes": expected_nodes, "gpus_per_node": gpus_per_node, "model": model}
        if collective_kind is None:
            spec = dataclasses.replace(spec, collectives=collectives_for(operated_config(probed, expected)))
        progress(f"verify: probing the nodes of cluster {probed.config.cluster}", as_json=as_json)
        result = verify_cluster(probed, expect, spec, collective=not no_collective, expected=expected)
    if junit_path:
        try:
            safefile.write_atomic(junit_path, junit_xml(result))
        except OSError as exc:
            raise ConfigError(
                f"cannot write {junit_path}: {exc.strerror}", key="--junit", hint="write somewhere else"
            ) from None
    if not (as_json and result.status == "fail"):
        # On failure with --json the CLI prints one document: the error with the result inside.
        emit(result, as_json=as_json)
    raise_if_failed(result)


def check_sizes(sizes: str | None) -> None:
    """--sizes as the probe will read it (1M,32M,1G): every size a positive number of bytes, at most
    16 GiB, so a typo is one line here instead of a probe failing on every node."""
    from kit.verify.collective import parse_size

    if sizes is None:
        return
    for part in sizes.split(","):
        try:
            size = parse_size(part)
        except (ValueError, KeyError, OverflowError):
            raise ConfigError(f"{part[:20]!r} is not a size", key="--sizes", hint="e.g. --sizes 1M,32M,1G") from None
        if not 1 <= size <= 16 << 30:
            raise ConfigError(f"{part[:20]} is not between 1 byte and 16 GiB", key="--sizes", hint="e.g. --sizes 1M,1G")


def _collectives(kind: str | None) -> tuple[str, ...]:
    return {"all-to-all": ("all-to-all",), "both": ("all-reduce", "all-to-all")}.get(kind or "", ("all-reduce",))


def collectives_for(config: KitConfig) -> tuple[str, ...]:
    """The collectives `kit verify` probes for this config: expert parallelism (MoE experts
    spread over GPUs) moves tokens with all-to-all, so its plan is verified with both."""
    return ("all-reduce", "all-to-all") if config.model.ep else ("all-reduce",)


def operated_config(cluster: Cluster, expected: Mapping[str, Any]) -> KitConfig:
    """The config the cluster runs with (kit.cluster.running), with what the flags expect of it."""
    config = cluster.operated().config
    if expected.get("nodes") is not None:
        config = config.replace(nodes=expected["nodes"])
    if expected.get("gpus_per_node") is not None:
        config = config.replace(gpus_per_node=expected["gpus_per_node"])
    if expected.get("model") is not None:
        config = config.replace(model=dataclasses.replace(config.model, id=expected["model"]))
    return config


def verify_cluster(
    cluster: Cluster,
    expect: str,
    spec: CollectiveSpec,
    *,
    collective: bool = True,
    expected: Mapping[str, Any] | None = None,
) -> VerifyResult:
    """Cluster mode from what runs: its nodes, GPUs per node, accelerator, model and ports (the
    nodes' labels and kit's record; `expected` holds what --nodes/--gpus-per-node/--model
    expect instead); the Ray view (registered IPs) through the cluster layer, as `kit status`
    reads it."""
    from kit.verify import runner

    config = operated_config(cluster, expected or {})

    def view(head: NodeHandle, nodes: Sequence[NodeHandle]) -> list[dict[str, Any]]:
        # Runs while the nodes are probed; a node that just joined must first start a Ray worker
        # process to answer (seconds on a busy CPU node), hence more patience than `kit status`.
        return cluster.ray_nodes(head, list(nodes), timeout=RAY_VIEW_TIMEOUT_S)

    # The rendezvous port: ports.verify unless --master-port. Nothing else listens on it
    # while the cluster serves (ports.mp_master is held by the mp backend).
    spec = dataclasses.replace(spec, master_port=spec.master_port or config.ports.verify)
    result = runner.verify_cluster(
        cluster.runtime,
        config.cluster,
        runner.Expectations(expect, config.nodes, config.gpus_per_node, config.accelerator),
        spec,
        model=config.model.id or None,
        collective=collective,
        ray_view=view if config.backend == "ray" else None,
        probe_env={"KIT_RAY_TEMP_DIR": config.ray.temp_dir},
    )
    result.checks.extend(policy.check_exposure(exposures(config)))
    return result
