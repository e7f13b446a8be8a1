"""What `kit bench` and `kit tune` measure: the server (its URL, key and model, checked before
any load) and, when it is a kit cluster, what that cluster is (its layout, image, nodes)."""

from __future__ import annotations

from typing import Any

from kit import labels
from kit.bench.runner import Target
from kit.cluster import Cluster


def resolve_target(
    cluster: Cluster,
    url: str | None,
    api_key_file: str | None,
    model: str | None,
    *,
    ignore_eos: bool,
    timeout_s: float,
) -> tuple[Target, str | None]:
    """The server to load (its URL, key and model name, checked with GET /v1/models: an
    unreachable URL or a wrong key is one line and exit 8 before any load is sent)."""
    from kit.cluster.running import key_hint
    from kit.net import openai as client

    running = cluster.running()
    operated = cluster.operated(running)  # the port, served name and key file it runs with (issue 25)
    config = operated.config
    base = (url or cluster.url(list(running.nodes))).rstrip("/")
    key_file = api_key_file or config.api_key_file
    key = client.read_key(key_file)
    source = "flag --api-key-file" if api_key_file else operated.sources["api_key_file"]
    with key_hint(None if url else cluster.name, key_file, source):
        models = client.list_models(base, key, timeout=min(timeout_s, 60.0))
    name = model or (models[0]["id"] if models else config.served_name)
    return Target(base_url=base, model=name, api_key=key, ignore_eos=ignore_eos, timeout_s=timeout_s), key


def cluster_info(cluster: Cluster, url: str, server_version: str | None, model: str) -> dict[str, Any]:
    """What was measured. A kit cluster serves `url` when this host runs its head at that
    address, or, with no node here, when it is the configured head_address: then its plan,
    image digest and nodes (kit status's view). Anything else is an external server: plan null,
    with what the server itself says (the model it serves, its /version), never the plan of a
    kit.yaml that did not start it. The layout is the one the nodes were started with (their
    labels, kit.labels) over what this kit.yaml says: a server started with other settings
    (`kit demo`, --set) is measured as it is."""
    from kit import __version__

    found = cluster.running()  # no engine here (a laptop against --url): no nodes, the record may say
    config = cluster.operated(found).config
    versions = {"vllm": server_version, "kit": __version__}
    running = [n for n in found.nodes if n.state == "running"]
    if running:
        ours = cluster.url(running) == url
    else:
        ours = bool(config.head_address) and url == f"http://{config.head_address}:{config.ports.api}"
    if not ours:
        return {
            "name": None,
            "plan": None,
            "url": url,
            "served_model": model,
            "image": None,
            "image_digest": None,
            "versions": versions,
            "nodes": [],
        }
    head = next((n for n in running if n.role == "head"), None)
    layout = config.layout
    plan = {
        "tp": layout.tp,
        "pp": layout.pp,
        "dp": layout.dp,
        "ep": layout.ep,
        "nodes": config.nodes,
        "gpus_per_node": config.gpus_per_node,
        "backend": head.labels.get(labels.BACKEND, config.backend) if head else config.backend,
        "accelerator": head.labels.get(labels.ACCELERATOR, config.accelerator) if head else config.accelerator,
        "model": config.model.id,
        "max_model_len": config.model.max_model_len,
    }
    started = cluster.served_layout(running)
    if started is not None:
        lay = started.layout
        plan.update(tp=lay.tp, pp=lay.pp, dp=lay.dp, ep=lay.ep, nodes=len(running))
        if started.model is not None:
            plan.update(model=started.model, max_model_len=started.max_model_len)
    return {
        "name": config.cluster,
        "plan": plan,
        "url": url,
        "served_model": model,
        "image": (head.image if head else None) or config.image,
        "image_digest": head.image_digest if head else None,
        "versions": versions,
        "nodes": [{"name": n.name, "role": n.role, "ip": n.ip, "image_digest": n.image_digest} for n in running],
    }
