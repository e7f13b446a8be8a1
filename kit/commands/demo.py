"""`kit demo`: kit's whole job on one machine. Two container "nodes" with distinct IPs serve a
tiny model with vLLM (TP=2 across them), answer an OpenAI-style request, and are torn down.
The steps are kit.demo's; this module parses the flags and prints."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from kit.cluster import Cluster
from kit.commands._options import json_option
from kit.commands._params import Count, KitCommand
from kit.demo import (
    CPU_IMAGE,
    DEFAULT_BASE,
    STATES,
    api_key_path,
    check_settings,
    demo_settings,
    free_subnet,
    prepare,
    run,
)
from kit.output import emit, out, progress
from kit.runtime.docker import DockerRuntime


@click.command(name="demo", cls=KitCommand, free_text=("prompt",))
@click.option(
    "--keep", is_flag=True, help="Leave the cluster running (remove it later with `kit down --cluster demo`)."
)
@click.option("--gpus", is_flag=True, help="On a GPU host: use the GPU image (kit build vllm) instead of the CPU one.")
@click.option("--image", help=f"Engine image (default: {CPU_IMAGE}, built if missing).")
@click.option("--base-image", help=f"Base for building the CPU image (default: {DEFAULT_BASE}, made with debootstrap).")
@click.option(
    "--ca-bundle",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Extra CA certificates for the image build (default: this host's system bundle).",
)
@click.option("--cluster", default="demo", show_default=True, help="Cluster name.")
@click.option("--subnet", help="Subnet of the demo's Docker network (default: a free 172.30.x.0/24).")
@click.option("--prepare-only", is_flag=True, help="Only build/reuse the image and the model, then stop.")
@click.option("--prompt", default="Tell me about multi-node serving.", show_default=True)
@click.option("--max-tokens", type=Count(1, 4096), default=16, show_default=True)
@json_option
def command(
    keep: bool,
    gpus: bool,
    image: str | None,
    base_image: str | None,
    ca_bundle: Path | None,
    cluster: str,
    subnet: str | None,
    prepare_only: bool,
    prompt: str,
    max_tokens: int,
    as_json: bool,
) -> None:
    """Run kit's whole job on this machine, with Docker and no GPU:

    \b
      1. build (or reuse) the CPU engine image and a tiny model made offline
      2. start a head and a worker as two "nodes" with their own IPs (kit up)
      3. serve the model across both with --tensor-parallel-size 2 --nnodes 2 (kit serve)
      4. show kit status, ask the server a question (kit query), print the answer
      5. tear everything down (kit down), unless --keep
    """
    started = time.monotonic()
    say = functools.partial(progress, as_json=as_json)
    image = image or ("kit/vllm:v0.32.0" if gpus else CPU_IMAGE)
    check_settings(cluster=cluster, image=image, subnet=subnet, gpus=gpus)
    rt = DockerRuntime()
    prepared = prepare(rt, image, gpus=gpus, base_image=base_image, ca_bundle=ca_bundle, as_json=as_json)
    if prepare_only:
        emit(Prepared(image, prepared), as_json=as_json)
        return
    overrides = demo_settings(
        cluster=cluster,
        image=image,
        hf_cache=Path(prepared["hf_cache"]),
        api_key_file=api_key_path(),
        subnet=subnet or free_subnet(rt.used_subnets()),
        gpus=gpus,
    )
    demo = Cluster.load(None, overrides, environ={}, cwd=Path("/nonexistent"), runtime=rt)
    result: dict[str, Any] = {"cluster": demo.config.cluster, **{k: prepared[k] for k in STATES}}
    show = (lambda _: None) if as_json else out
    result.update(run(demo, prompt, max_tokens, keep=keep, gpus=gpus, say=say, show=show))
    result["api_key_file"] = demo.config.api_key_file  # where the key is, never the key (issue 25)
    if keep:
        # kit records the running cluster (its port, model, key file): these work from any folder.
        say(
            f"[5/5] left running (--keep): kit status --cluster {cluster}; kit query --cluster {cluster}; "
            f"kit down --cluster {cluster} (its API key is in {demo.config.api_key_file})"
        )
    else:
        say("[5/5] kit down")
        demo.down()
    result["kept"] = keep
    result["seconds"] = round(time.monotonic() - started, 1)
    emit(Ran(result), as_json=as_json)


@dataclass(frozen=True)
class Prepared:
    """`kit demo --prepare-only`: the image and the model (kit.demo.prepare's document)."""

    image: str
    doc: dict[str, Any]  # image_state, hf_cache, model_state, ...
    command = "demo"

    def to_dict(self) -> dict[str, Any]:
        return self.doc

    def text(self) -> str:
        d = self.doc
        return f"ready: {self.image} ({d['image_state']}), model in {d['hf_cache']} ({d['model_state']})"


@dataclass(frozen=True)
class Ran:
    """`kit demo`: the run's document (kit.demo.run's, with the cluster, what was kept, the time);
    its text is the question and the answer."""

    doc: dict[str, Any]
    command = "demo"

    def to_dict(self) -> dict[str, Any]:
        return self.doc

    def text(self) -> str:
        q = self.doc["query"]
        return (
            f"\n> {q['prompt']}\n{q['answer']}\n"
            f"[{q['completion_tokens']} tokens, finish_reason={q['finish_reason']}, {q['latency_s']} s; "
            f"served by 2 nodes with TP=2; demo took {self.doc['seconds']} s]\n"
            "(the model has random weights: the words are nonsense, the serving is real)"
        )
