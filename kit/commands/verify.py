"""`kit verify`: prove the cluster is right: GPUs, versions, node facts, transport, bandwidth."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kit.errors import UsageError
from kit.output import emit, progress
from kit.verify.policy import EXPECTS
from kit.verify.report import VerifyResult, junit_xml, raise_if_failed, render_text


@click.command(name="verify")
@click.option(
    "--host",
    "on_host",
    is_flag=True,
    help="Probe this host directly (no containers): its GPUs, node facts and a collective.",
)
@click.option(
    "--image",
    metavar="IMAGE",
    help="Validate an image only (CI): imports, versions, `vllm serve --help`, RDMA userland, probe files.",
)
@click.option("--cluster", default="default", show_default=True, help="Cluster name (labels).")
@click.option(
    "--expect",
    type=click.Choice(EXPECTS),
    default="auto",
    show_default=True,
    help="Transport policy. auto: IB+GDRDMA across nodes when nodes have IB, P2P within "
    "a node when its GPUs are NVLinked.",
)
@click.option("--nodes", "expected_nodes", type=int, help="Nodes the plan expects.")
@click.option("--gpus-per-node", type=int, help="GPUs per node the plan expects.")
@click.option("--sizes", default="1M,32M,256M,1G", show_default=True, help="All-reduce message sizes.")
@click.option(
    "--budget",
    "budget_s",
    type=float,
    default=0.5,
    show_default=True,
    help="Seconds of timed all-reduces per message size.",
)
@click.option("--no-collective", is_flag=True, help="Skip the collective probe.")
@click.option("--model", help="Check that this model's HF snapshot is identical on all nodes.")
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
    type=int,
    default=1,
    show_default=True,
    help="--host across nodes: run this on every node at once.",
)
@click.option("--node-rank", type=int, default=0, show_default=True, help="--host: this node's rank.")
@click.option("--master-port", type=int, help="Rendezvous port (default: free port / 29512).")
@click.option(
    "--timeout",
    "timeout_s",
    type=int,
    default=120,
    show_default=True,
    help="Collective timeout in seconds.",
)
@click.option("--docker", default="docker", show_default=True, help="--image: the docker CLI.")
@click.option("--gpus", is_flag=True, help="--image: give the container the GPUs.")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False), help="Also write JUnit XML.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def command(
    on_host: bool,
    image: str | None,
    cluster: str,
    expect: str,
    expected_nodes: int | None,
    gpus_per_node: int | None,
    sizes: str,
    budget_s: float,
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
) -> None:
    """Prove the cluster is right: GPUs, versions, node facts, NCCL transport, bandwidth.

    \b
    kit verify                      every node of the cluster, through the container runtime
    kit verify --host               this machine directly (2 GPUs: under 30 s)
    kit verify --image IMAGE        image only, for CI (with --junit report.xml)
    Exits 7 when a check fails; warnings do not change the exit code.
    """
    from kit.verify import runner

    if on_host and image:
        raise UsageError("--host and --image exclude each other")
    if nnodes > 1 and not (on_host and head_address):
        raise UsageError("--nnodes > 1 needs --host and --head-address")
    expectations = runner.Expectations(expect, expected_nodes, gpus_per_node)
    spec = runner.CollectiveSpec(sizes, budget_s, timeout_s, master_port)
    result: VerifyResult
    if image:
        from kit.verify.image import verify_image

        progress(f"verify: probing image {image}", as_json=as_json)
        result = verify_image(image, docker=docker, gpus=gpus)
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
        progress(f"verify: probing the nodes of cluster {cluster}", as_json=as_json)
        result = runner.verify_cluster(
            runner.get_runtime(),
            cluster,
            expectations,
            spec,
            model=model,
            collective=not no_collective,
        )
    if junit_path:
        Path(junit_path).write_text(junit_xml(result))
    if not (as_json and result.status == "fail"):
        # On failure with --json the CLI prints one document: the error with the result inside.
        emit("verify", result.to_dict(), as_json=as_json, text=lambda: render_text(result))
    raise_if_failed(result)
