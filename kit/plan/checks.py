"""Checks that refuse a bad plan before anything starts (FIELD_NOTES §1 rows 1, 8): host-independent,
the same on every node. (The node's own network is checked where it is planned: kit.plan.network.)"""

from __future__ import annotations

from collections.abc import Mapping

from kit.config import KitConfig
from kit.config.schema import SECRET_ENV_NAMES
from kit.errors import ConfigError, ImageRefError
from kit.images import vllm_releases as versions
from kit.images.facts import ImageFacts
from kit.images.reference import is_image_ref
from kit.plan import image_check
from kit.plan.layout import ModelFacts
from kit.plan.replicas import replica_gpus, replicas_per_node, router_mode


def _src(sources: Mapping[str, str], key: str) -> str:
    return sources.get(key, "default")


def check_image(config: KitConfig, sources: Mapping[str, str]) -> None:
    image = config.image
    if config.runtime == "apptainer" and (image.endswith(".sif") or image.startswith("/")):
        return
    if config.runtime in ("pyxis", "edf", "enroot") and image.startswith("/"):
        return  # a squashfs file (kit pull --runtime enroot)
    ref = image.removeprefix("docker://") if config.runtime == "apptainer" else image
    if not is_image_ref(ref):
        raise ImageRefError(
            f"{image!r} is not a valid image reference",
            key="image",
            source=_src(sources, "image"),
            hint="write it like vllm/vllm-openai:v0.11.0 or registry:5000/org/name@sha256:…"
            + {"apptainer": " (or a .sif path)", "pyxis": " (or a .sqsh path)", "edf": " (or a .sqsh path)"}.get(
                config.runtime, ""
            ),
        )


def check_topology(config: KitConfig, sources: Mapping[str, str], *, model: ModelFacts | None = None) -> None:
    """TP×PP(×DP) must equal the GPUs the cluster has; TP must divide the model's heads when known
    (kit.sizing's rule); DP ranks spread evenly over the nodes; EP needs a MoE model whose experts
    split over TP×DP. `model` is None when this host does not have the model's config.json."""
    # The cluster name and the node and GPU counts are checked when the config loads (kit.validate).
    for key, value in (("model.tp", config.tp), ("model.pp", config.pp), ("model.dp", config.dp)):
        if value < 1:
            raise ConfigError(
                f"must be at least 1, got {value}", key=key, source=_src(sources, key), hint="use 1 or more, or auto"
            )
    total = config.nodes * config.gpus_per_node
    if router_mode(config):
        check_replicas(config, sources)
    elif config.dp > 1 or config.model.ep:
        check_data_parallel(config, sources, experts=None if model is None else model.experts)
    elif config.tp * config.pp != total:
        unit = "GPUs" if config.accelerator == "gpu" else "ranks"
        raise ConfigError(
            f"TP×PP = {config.tp}×{config.pp} = {config.tp * config.pp} but the cluster has "
            f"nodes×gpus_per_node = {config.nodes}×{config.gpus_per_node} = {total} {unit}",
            key="model.tp",
            source=_src(sources, "model.tp"),
            hint=f"make model.tp × model.pp equal {total} (common: tp={config.gpus_per_node}, "
            f"pp={config.nodes}), or change nodes/gpus_per_node",
        )
    if model is not None and not model.splits_heads(config.tp):
        raise _heads_error(config, sources, model)
    if config.gpus != "all":
        ids = [g.strip() for g in config.gpus.split(",")]
        if not all(g.isdigit() for g in ids) or len(set(ids)) != len(ids):
            raise ConfigError(
                f"{config.gpus!r} is not a GPU selection",
                key="gpus",
                source=_src(sources, "gpus"),
                hint="use 'all' or distinct indices like '0,1,2,3'",
            )
        if config.accelerator == "gpu" and len(ids) != config.gpus_per_node:
            raise ConfigError(
                f"selects {len(ids)} GPUs but gpus_per_node is {config.gpus_per_node}",
                key="gpus",
                source=_src(sources, "gpus"),
                hint="select exactly gpus_per_node GPUs, or change gpus_per_node",
            )


def _heads_error(config: KitConfig, sources: Mapping[str, str], model: ModelFacts) -> ConfigError:
    """Why TP does not split the model's heads (ModelFacts.splits_heads said so), naming which."""
    tp = config.tp
    if model.heads is not None and model.heads % tp:
        message = f"tensor parallel size {tp} does not divide the model's {model.heads} attention heads"
        hint = "choose a TP that divides the head count (and raise PP instead)"
    elif model.kv_heads is not None and model.kv_heads % tp and tp % model.kv_heads:
        message = f"tensor parallel size {tp} and the model's {model.kv_heads} KV heads do not divide each other"
        hint = "choose a TP that divides the KV head count or is a multiple of it"
    else:
        message = f"tensor parallel size {tp} does not divide the model's linear-attention heads"
        hint = "choose a TP that divides the linear-attention head counts"
    return ConfigError(message, key="model.tp", source=_src(sources, "model.tp"), hint=hint)


def check_data_parallel(config: KitConfig, sources: Mapping[str, str], *, experts: int | None = None) -> None:
    """DP/EP rules, each refused before anything starts (issue 10).

    vLLM's own rules (vllm 0.32.0, vllm/engine/arg_utils.py `create_engine_config` and
    vllm/config/parallel.py `ParallelConfig`): every DP rank is one engine of TP×PP workers, so the
    cluster holds TP×PP×DP GPUs; `--data-parallel-size-local` may not exceed `--data-parallel-size`;
    a replica may span nodes only with `--nnodes`, which "requires `--data-parallel-backend mp`"
    and a world size divisible by the node count. vLLM has no rule against DP with PP > 1 when a
    replica stays inside a node (PCP, not PP, "does not support data parallelism yet"); kit starts
    each node's DP ranks with `--data-parallel-size-local` and no `--nnodes`, so it refuses the
    layouts where a replica would have to span nodes. The MoE layers of all ranks form one group of
    TP×DP GPUs (docs/serving/data_parallel_deployment.md), which EP splits the experts over.
    """
    total = config.nodes * config.gpus_per_node
    unit = "GPUs" if config.accelerator == "gpu" else "ranks"
    tp, pp, dp = config.tp, config.pp, config.dp
    if tp * pp * dp != total:
        raise ConfigError(
            f"TP×PP×DP = {tp}×{pp}×{dp} = {tp * pp * dp} but the cluster has "
            f"nodes×gpus_per_node = {config.nodes}×{config.gpus_per_node} = {total} {unit}",
            key="model.dp",
            source=_src(sources, "model.dp"),
            hint=f"make model.tp × model.pp × model.dp equal {total} (DP+EP: tp=1, pp=1, dp={total}; "
            "or dp: auto), or change nodes/gpus_per_node",
        )
    if dp > 1 and dp % config.nodes and tp * pp > config.gpus_per_node:
        raise ConfigError(
            f"a DP replica of TP×PP = {tp}×{pp} = {tp * pp} {unit} does not fit in one node's "
            f"{config.gpus_per_node}: vLLM lets a replica span nodes only with --nnodes, which "
            "requires --data-parallel-backend mp (vllm/engine/arg_utils.py), and kit keeps each replica in a node",
            key="model.pp" if pp > 1 else "model.tp",
            source=_src(sources, "model.pp" if pp > 1 else "model.tp"),
            hint=f"make tp × pp ≤ gpus_per_node ({config.gpus_per_node}) and raise dp, "
            "or use dp: 1 with TP×PP across the nodes, or model.dp_lb: router (replicas that span nodes "
            "behind one router)",
        )
    if dp > 1 and dp % config.nodes:
        raise ConfigError(
            f"DP = {dp} ranks do not divide evenly over {config.nodes} nodes "
            "(each node runs the same number of ranks: --data-parallel-size-local)",
            key="model.dp",
            source=_src(sources, "model.dp"),
            hint=f"make model.dp a multiple of nodes ({config.nodes}), with tp × pp × dp/nodes = "
            f"gpus_per_node ({config.gpus_per_node})",
        )
    # With both checks passed, tp × pp × (dp / nodes) = gpus_per_node: every replica fits in a node.
    if dp > 1 and config.backend == "ray" and config.accelerator == "cpu":
        raise ConfigError(
            "the Ray DP backend (--data-parallel-backend ray) runs its engines with vLLM's Ray "
            "executor, which vLLM's CPU build does not support",
            key="backend",
            source=_src(sources, "backend"),
            hint="use backend: mp with accelerator: cpu",
        )
    if config.model.ep and experts is not None:
        if experts == 0:
            raise ConfigError(
                f"expert parallelism needs a mixture-of-experts model, and {config.model.id} has no experts",
                key="model.ep",
                source=_src(sources, "model.ep"),
                hint="set model.ep: false (DP alone still replicates the model), or serve a MoE model",
            )
        if experts % (tp * dp):
            raise ConfigError(
                f"the model's {experts} experts do not divide over the EP group of TP×DP = {tp}×{dp} = "
                f"{tp * dp} {unit}",
                key="model.ep",
                source=_src(sources, "model.ep"),
                hint=f"choose tp × dp dividing {experts} (e.g. dp = "
                f"{_largest_divisor(experts, total)}), or set model.ep: false",
            )


def check_replicas(config: KitConfig, sources: Mapping[str, str]) -> None:
    """model.dp_lb router (issue 29): DP independent replicas of TP×PP GPUs behind vLLM's router,
    each one spanning whole nodes or sharing a node with others (kit.plan.replicas)."""
    total = config.nodes * config.gpus_per_node
    unit = "GPUs" if config.accelerator == "gpu" else "ranks"
    tp, pp, dp, per_node = config.tp, config.pp, config.dp, config.gpus_per_node
    size = replica_gpus(config)
    if config.backend != "mp":
        raise ConfigError(
            "router replicas run vLLM's own multi-node backend (each replica its own `vllm serve`, "
            "spanning nodes with --nnodes), not one Ray cluster",
            key="backend",
            source=_src(sources, "backend"),
            hint="set backend: mp with model.dp_lb: router",
        )
    if config.model.ep:
        raise ConfigError(
            "expert parallelism needs one DP group (the experts spread over every rank), and router "
            "replicas are independent servers",
            key="model.ep",
            source=_src(sources, "model.ep"),
            hint="use model.dp_lb: internal or hybrid with model.ep, or set model.ep: false",
        )
    if size * dp != total:
        raise ConfigError(
            f"{dp} replica(s) of TP×PP = {tp}×{pp} = {size} {unit} need {size * dp}, but the cluster has "
            f"nodes×gpus_per_node = {config.nodes}×{per_node} = {total}",
            key="model.dp",
            source=_src(sources, "model.dp"),
            hint=f"make model.tp × model.pp × model.dp equal {total} (or model.dp: auto)",
        )
    if (size >= per_node and size % per_node) or (size < per_node and per_node % size):
        raise ConfigError(
            f"a replica of TP×PP = {size} {unit} neither fills whole nodes of {per_node} nor divides one",
            key="model.tp",
            source=_src(sources, "model.tp"),
            hint=f"make tp × pp a multiple of gpus_per_node ({per_node}: a replica over whole nodes) "
            f"or a divisor of it (several replicas on one node)",
        )
    slots = replicas_per_node(config)
    taken = {v: k for k, v in vars(config.ports).items() if k not in ("ray_min_worker", "ray_max_worker")}
    # Each replica on a node has its own port from each base (its coordinator's too, supervised).
    for name in ("replica", "mp_master", *(("supervisor",) if config.supervise.enabled else ())):
        base = getattr(config.ports, name)
        for port in range(base + 1, base + slots):
            if port in taken or port > 65535:
                raise ConfigError(
                    f"{slots} replicas on a node use ports.{name} {base}-{base + slots - 1}, and port {port} "
                    + (f"is ports.{taken[port]}" if port in taken else "is out of range"),
                    key=f"ports.{name}",
                    source=_src(sources, f"ports.{name}"),
                    hint=f"move ports.{name} so that the {slots} ports from it are free",
                )


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, at_most + 1) if n % d == 0)


def check_ports(config: KitConfig, sources: Mapping[str, str]) -> None:
    ports = vars(config.ports)
    for name, value in ports.items():
        if not 1 <= value <= 65535:
            raise ConfigError(
                f"port {value} is out of range",
                key=f"ports.{name}",
                source=_src(sources, f"ports.{name}"),
                hint="use a port between 1 and 65535",
            )
    low, high = config.ports.ray_min_worker, config.ports.ray_max_worker
    if low > high:
        raise ConfigError(
            f"ray_min_worker {low} is above ray_max_worker {high}",
            key="ports.ray_min_worker",
            source=_src(sources, "ports.ray_min_worker"),
            hint="make the worker port range low ≤ high",
        )
    seen: dict[int, str] = {}
    for name, value in ports.items():
        if name in ("ray_min_worker", "ray_max_worker"):
            continue
        if value in seen:
            raise ConfigError(
                f"port {value} is used by both ports.{seen[value]} and ports.{name}",
                key=f"ports.{name}",
                source=_src(sources, f"ports.{name}"),
                hint="give every service its own port",
            )
        if low <= value <= high:
            raise ConfigError(
                f"port {value} lies inside the Ray worker port range {low}-{high}",
                key=f"ports.{name}",
                source=_src(sources, f"ports.{name}"),
                hint="move it or the ray_min_worker/ray_max_worker range",
            )
        seen[value] = name


def check_env(config: KitConfig, sources: Mapping[str, str]) -> None:
    """Secrets never travel as environment variables. (Names, values and mounts are checked with
    every other value by kit.validate when the config loads.)"""
    for name in config.env:
        if name.upper() in SECRET_ENV_NAMES:
            raise ConfigError(
                f"{name} must not be passed as an environment variable (it would show in docker inspect)",
                key="env",
                source=_src(sources, "env"),
                hint="put the secret in a file and set hf_token_file / api_key_file / ray_token_file",
            )


def check_vllm_options(config: KitConfig, sources: Mapping[str, str]) -> None:
    """What the image's parser cannot tell (kit.images.vllm_releases): a backend the target
    release accepts but silently replaces is refused here, not found as a slowdown in production
    (issue 19); the shape of hybrid DP load balancing. Whether the image has an option or a choice
    at all is its parser's to say (kit.plan.image_check, issue 24)."""
    target = config.vllm
    m = config.model
    where = f"vLLM {target} from {target.source}"
    if m.all2all != "auto" and (problem := versions.all2all_problem(m.all2all, target.version)):
        message, fix = problem
        raise ConfigError(f"{message} ({where})", key="model.all2all", source=_src(sources, "model.all2all"), hint=fix)
    if m.dp_lb == "hybrid" and (config.backend != "mp" or config.dp < 2 or config.nodes < 2):
        raise ConfigError(
            f"{m.dp_lb} DP load balancing gives every node its own API server over its DP ranks: it needs "
            f"backend mp, model.dp > 1 and nodes > 1 (got backend {config.backend}, dp {config.dp}, "
            f"nodes {config.nodes})",
            key="model.dp_lb",
            source=_src(sources, "model.dp_lb"),
            hint="use model.dp_lb: internal (one endpoint on the head)",
        )


# Apptainer options that break a kit node (FIELD_NOTES §4): a private 64 MB /tmp and /dev/shm
# (Ray breaks there), a cleaned environment (SLURM_* and kit's APPTAINERENV_ variables dropped).
APPTAINER_REFUSED = {
    "-c": "a private /tmp and /dev/shm of 64 MB, where Ray and NCCL break",
    "--contain": "a private /tmp and /dev/shm of 64 MB, where Ray and NCCL break",
    "-C": "a private /tmp, /dev/shm and network namespace, where Ray and NCCL break",
    "--containall": "a private /tmp, /dev/shm and network namespace, where Ray and NCCL break",
    "-e": "a cleaned environment: SLURM_* and kit's node environment would be dropped",
    "--cleanenv": "a cleaned environment: SLURM_* and kit's node environment would be dropped",
}


def check_runtime_options(config: KitConfig, sources: Mapping[str, str]) -> None:
    """The runtime-specific keys (issue 28): honoured by their runtime, refused with any other one
    (never silently ignored), and Apptainer's options each one option word that keeps a node whole."""
    if config.runtime != "docker":
        for key, value in (("docker.user", config.docker.user), ("docker.read_only", config.docker.read_only)):
            if value:
                raise ConfigError(
                    f"{key} is for runtime docker; with {config.runtime} the containers already run as you "
                    "(Apptainer) or as the runtime maps you, on a read-only image",
                    key=key,
                    source=_src(sources, key),
                    hint=f"unset {key}",
                )
    if config.runtime != "docker":
        for key in ("ipc_host", "shm_size"):
            if _src(sources, key) != "default" and (key == "shm_size" or not config.ipc_host):
                raise ConfigError(
                    f"{key} is for runtime docker: {config.runtime} containers always share the host's IPC "
                    "namespace and /dev/shm",
                    key=key,
                    source=_src(sources, key),
                    hint=f"unset {key}",
                )
    options = {"apptainer.gpu_args": config.apptainer.gpu_args, "apptainer.extra_args": config.apptainer.extra_args}
    for key, words in options.items():
        if config.runtime != "apptainer":
            if _src(sources, key) != "default":
                raise ConfigError(
                    f"{key} is for runtime apptainer, not {config.runtime}",
                    key=key,
                    source=_src(sources, key),
                    hint=f"unset {key}, or use runtime apptainer",
                )
            continue
        for word in words:
            name = word.split("=", 1)[0]
            if not word.startswith("-") or any(c.isspace() for c in word):
                raise ConfigError(
                    f"{word!r} is not one option word: each item is one Apptainer option, like --nvccli "
                    "or --bind=/scratch (an extra word would be read as the image)",
                    key=key,
                    source=_src(sources, key),
                    hint="write options with their value attached (--opt=value), one per item",
                )
            if name in APPTAINER_REFUSED:
                raise ConfigError(
                    f"{name} gives the node {APPTAINER_REFUSED[name]}",
                    key=key,
                    source=_src(sources, key),
                    hint=f"remove {name} (kit binds what a node needs itself)",
                )


def check_config(
    config: KitConfig,
    sources: Mapping[str, str],
    *,
    model: ModelFacts | None = None,
    facts: ImageFacts | None = None,
) -> None:
    """Every host-independent check, in the order a user would want to hear about them; with the
    image's recorded facts, the plan against the image's own parser and Ray (issue 24)."""
    check_image(config, sources)
    check_topology(config, sources, model=model)
    check_vllm_options(config, sources)
    check_ports(config, sources)
    check_env(config, sources)
    check_runtime_options(config, sources)
    image_check.check_extra_args(config, sources)
    if facts is not None:
        image_check.check_image(config, sources, facts)
