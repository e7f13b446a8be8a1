"""The plan against the image it runs on (issue 24): every `vllm serve` kit renders is checked
against the image's own parser (its recorded facts, kit.images.facts), `backend: ray` against
the image's Ray, and model.extra_args against what kit manages. Pure: the facts are passed in.

One refusal line names the config key and the fix (ConfigError, exit 3). The same check runs
inside the container when kit has no record of the image (a SLURM launcher for a SIF on a shared
filesystem): `precheck` gives the launcher that step (kit/images/vllm_probe.py `check`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from kit.config import KitConfig
from kit.errors import ConfigError
from kit.images import vllm_probe
from kit.images.facts import ImageFacts
from kit.plan.replicas import plan_replicas, router_mode
from kit.plan.roles import HEAD, Role
from kit.plan.vllm import replica_serve_argv, vllm_serve_argv
from kit.render import Arg, EnvRef, Word

# vLLM's multi-node mp options (--nnodes/--node-rank/--master-addr/--master-port) are in every
# recorded parser from 0.11.1 on, in none before (tests/fixtures/vllm_parsers/).
_MP_NODES_FIX = (
    "this image's vLLM has no multi-node mp options (they came in vLLM 0.11.1): use an image with "
    "vLLM 0.11.1 or newer, or backend: ray on an image with Ray"
)
_DP_FIX = "set model.dp: 1, or use an image whose vLLM has these data-parallel options"
# The options kit writes, by the config key that makes each, and what to do when the image lacks it.
OWNERS: Mapping[str, tuple[str, str]] = {
    "--served-model-name": ("model.served_name", "use an image with a vLLM OpenAI server"),
    "--host": ("api_listen", "use an image with a vLLM OpenAI server"),
    "--port": ("ports.api", "use an image with a vLLM OpenAI server"),
    "--api-server-count": ("model.api_servers", "set model.api_servers: auto"),
    "--tensor-parallel-size": ("model.tp", "use a vLLM image"),
    "--pipeline-parallel-size": ("model.pp", "use a vLLM image"),
    "--max-model-len": ("model.max_model_len", "unset model.max_model_len"),
    "--distributed-executor-backend": ("backend", "use backend: mp"),
    "--nnodes": ("backend", _MP_NODES_FIX),
    "--node-rank": ("backend", _MP_NODES_FIX),
    "--master-addr": ("backend", _MP_NODES_FIX),
    "--master-port": ("backend", _MP_NODES_FIX),
    "--headless": ("backend", _MP_NODES_FIX),
    "--data-parallel-size": ("model.dp", _DP_FIX),
    "--data-parallel-size-local": ("model.dp", _DP_FIX),
    "--data-parallel-address": ("model.dp", _DP_FIX),
    "--data-parallel-rpc-port": ("ports.dp_rpc", _DP_FIX),
    "--data-parallel-start-rank": ("model.dp", _DP_FIX),
    "--data-parallel-backend": ("model.dp", _DP_FIX),
    "--data-parallel-hybrid-lb": ("model.dp_lb", "use model.dp_lb: internal, or an image whose vLLM has it"),
    "--enable-expert-parallel": ("model.ep", "set model.ep: false, or use an image whose vLLM has it"),
    "--all2all-backend": ("model.all2all", "set model.all2all to one of the choices above, or auto"),
    "--device-ids": ("gpus", "set vllm_version to the image's release, or record the image (kit pull)"),
}

# What model.extra_args may not set, by vLLM's dest (how the image's parser names the option,
# whichever alias the user wrote): the config key that does it instead. Kit writes or decides
# each of these; a second value in extra_args would silently override the plan kit validated.
MANAGED: Mapping[str, str] = {
    "model": "model.id",
    "model_tag": "model.id",
    "served_model_name": "model.served_name",
    "host": "api_listen",
    "port": "ports.api",
    "uds": "api_listen",
    "api_key": "api_key_file",
    "api_server_count": "model.api_servers",
    "tensor_parallel_size": "model.tp",
    "pipeline_parallel_size": "model.pp",
    "max_model_len": "model.max_model_len",
    "distributed_executor_backend": "backend",
    "nnodes": "nodes",
    "node_rank": "nodes",
    "master_addr": "head_address",
    "master_port": "ports.mp_master",
    "headless": "backend",
    "data_parallel_size": "model.dp",
    "data_parallel_size_local": "model.dp",
    "data_parallel_address": "head_address",
    "data_parallel_rpc_port": "ports.dp_rpc",
    "data_parallel_start_rank": "model.dp",
    "data_parallel_rank": "model.dp",
    "data_parallel_backend": "backend",
    "data_parallel_hybrid_lb": "model.dp_lb",
    "data_parallel_external_lb": "model.dp_lb",
    "enable_expert_parallel": "model.ep",
    "all2all_backend": "model.all2all",
    "device_ids": "gpus",
    "config": "model.extra_args",  # a vLLM config file could set any of the above unseen
}
# Their option strings in the recorded parsers (aliases included), for a config checked without a
# record of its image; tests/unit/test_image_check.py keeps this in step with every recording.
MANAGED_FLAGS: Mapping[str, str] = {
    "--model": "model",
    "--served-model-name": "served_model_name",
    "--host": "host",
    "--port": "port",
    "--uds": "uds",
    "--api-key": "api_key",
    "--api-server-count": "api_server_count",
    "-asc": "api_server_count",
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
    "--pipeline-parallel-size": "pipeline_parallel_size",
    "-pp": "pipeline_parallel_size",
    "--max-model-len": "max_model_len",
    "--distributed-executor-backend": "distributed_executor_backend",
    "--nnodes": "nnodes",
    "-n": "nnodes",
    "--node-rank": "node_rank",
    "-r": "node_rank",
    "--master-addr": "master_addr",
    "--master-port": "master_port",
    "--headless": "headless",
    "--data-parallel-size": "data_parallel_size",
    "-dp": "data_parallel_size",
    "--data-parallel-size-local": "data_parallel_size_local",
    "-dpl": "data_parallel_size_local",
    "--data-parallel-address": "data_parallel_address",
    "-dpa": "data_parallel_address",
    "--data-parallel-rpc-port": "data_parallel_rpc_port",
    "-dpp": "data_parallel_rpc_port",
    "--data-parallel-start-rank": "data_parallel_start_rank",
    "-dpr": "data_parallel_start_rank",
    "--data-parallel-rank": "data_parallel_rank",
    "-dpn": "data_parallel_rank",
    "--data-parallel-backend": "data_parallel_backend",
    "-dpb": "data_parallel_backend",
    "--data-parallel-hybrid-lb": "data_parallel_hybrid_lb",
    "--no-data-parallel-hybrid-lb": "data_parallel_hybrid_lb",
    "-dph": "data_parallel_hybrid_lb",
    "--data-parallel-external-lb": "data_parallel_external_lb",
    "--no-data-parallel-external-lb": "data_parallel_external_lb",
    "-dpe": "data_parallel_external_lb",
    "--enable-expert-parallel": "enable_expert_parallel",
    "--no-enable-expert-parallel": "enable_expert_parallel",
    "-ep": "enable_expert_parallel",
    "--all2all-backend": "all2all_backend",
    "--device-ids": "device_ids",
    "--config": "config",
}

# Secrets never travel in argv (they would show in `ps`, `docker inspect`, launchers and logs):
# options that take one, and values that look like one.
SECRET_DESTS = {"api_key", "hf_token"}
_SECRET_NAME = re.compile(r"secret|passw(or)?d|credential|(^|[-_])token$|api[-_]?key", re.IGNORECASE)
_SECRET_VALUE = re.compile(
    r"(^|[^A-Za-z0-9])(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|eyJ[\w-]{8,}\.[\w-]{8,}\.)"
    r"|[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]+:[^/\s@]+@|\bBearer\s+\S|-----BEGIN [A-Z ]*PRIVATE KEY-----"
)


def _flag_of(word: str) -> str:
    """The option a word names as vLLM reads it: '--max_model_len=4' -> '--max-model-len'."""
    flag = word.split("=", 1)[0]
    if flag.startswith("--"):
        return "--" + flag[2:].split(".", 1)[0].replace("_", "-").removesuffix("+")
    return flag


def check_extra_args(config: KitConfig, sources: Mapping[str, str], facts: ImageFacts | None = None) -> None:
    """model.extra_args cannot fight kit: an option kit manages is refused with the key to use
    instead, and anything that looks like a secret is refused (issue 24). With the image's facts
    an alias or abbreviation is resolved by its own parser; without, by MANAGED_FLAGS."""
    key, source = "model.extra_args", sources.get("model.extra_args")
    serve = facts.serve if facts is not None else None
    index = vllm_probe.option_index(serve) if serve else {}
    for word in config.model.extra_args:
        if _SECRET_VALUE.search(word):
            raise ConfigError(
                "an argument looks like a secret (a token, key or password): it would show in `ps`, "
                "`docker inspect`, launchers and logs",
                key=key,
                source=source,
                hint="put the secret in a file: api_key_file (the API key), hf_token_file (the HF token)",
            )
        if not word.startswith("-") or _is_number(word):
            continue
        flag = _flag_of(word)
        action = vllm_probe.lookup(index, flag, bool(serve.get("allow_abbrev", True)))[0] if serve else None
        dest = str(action["dest"]) if action is not None else MANAGED_FLAGS.get(flag)
        if dest in SECRET_DESTS or (dest is None and _SECRET_NAME.search(flag.lstrip("-"))):
            raise ConfigError(
                f"{flag} would put a secret in argv (it would show in `ps`, `docker inspect` and logs)",
                key=key,
                source=source,
                hint="use api_key_file for the API key (kit passes it as a file) and hf_token_file for the HF token",
            )
        if dest is not None and dest in MANAGED:
            instead = MANAGED[dest]
            fix = (
                "drop it: a vLLM config file could set any option kit manages, unseen"
                if instead == key
                else f"set {instead} instead (kit writes {flag} itself)"
            )
            raise ConfigError(
                f"{flag} is managed by kit and cannot be set in model.extra_args", key=key, source=source, hint=fix
            )


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def serve_roles(config: KitConfig) -> list[Role]:
    """The roles whose `vllm serve` differs: the head, and with the mp backend a worker."""
    return [HEAD, Role("worker", 1)] if config.backend == "mp" and config.nodes > 1 else [HEAD]


def serve_words(config: KitConfig, role: Role) -> tuple[list[str], int]:
    """The words after `vllm serve` as the node will run them (a run-time value as ${NAME}), and
    where model.extra_args begin among them."""
    return _words(config, vllm_serve_argv(config, role))


def _words(config: KitConfig, argv: Sequence[Arg]) -> tuple[list[str], int]:
    words = [_text(arg) for arg in argv[2:]]
    return words, len(words) - len(config.model.extra_args)


def _role_words(config: KitConfig, role: Role) -> tuple[list[str], int]:
    """serve_words, or (model.dp_lb router) the first replica's on its first node (the head) or
    on a headless node of it: the options every replica writes there."""
    if not router_mode(config):
        return serve_words(config, role)
    first = plan_replicas(config)[0]
    node = first.nodes[1] if first.spans_nodes and not role.is_head else first.head
    return _words(config, replica_serve_argv(config, first, node))


def every_serve_words(config: KitConfig) -> list[tuple[list[str], int]]:
    """Each distinct `vllm serve` the cluster runs: every role's, or (model.dp_lb router, issue 29)
    the first replica's on each of its nodes (the other replicas differ only in ports and GPUs)."""
    if router_mode(config):
        first = plan_replicas(config)[0]
        return [_words(config, replica_serve_argv(config, first, node)) for node in first.nodes]
    return [serve_words(config, role) for role in serve_roles(config)]


def _text(arg: str | EnvRef | Word) -> str:
    return str(arg) if not isinstance(arg, str) else arg


def owners() -> dict[str, dict[str, str]]:
    return {flag: {"key": key, "fix": fix} for flag, (key, fix) in OWNERS.items()}


def ray_fix(config: KitConfig) -> str:
    return (
        "use backend: mp (vLLM's own multi-node backend, no Ray needed), or layer Ray onto the image with "
        f"`kit build ray --base-image {config.image}` and set image to the tag it prints"
    )


def check_image(config: KitConfig, sources: Mapping[str, str], facts: ImageFacts) -> None:
    """Refuse what this image cannot run: Ray for backend: ray, then every option and choice of
    every role's `vllm serve`; the first problem, as one line."""
    if config.backend == "ray" and (why := facts.ray_problem()) is not None:
        raise ConfigError(f"{why} ({config.image})", key="backend", source=sources.get("backend"), hint=ray_fix(config))
    check_serve_options(config, sources, facts)


def check_serve_options(config: KitConfig, sources: Mapping[str, str], facts: ImageFacts) -> None:
    """model.extra_args against what kit manages, then every role's `vllm serve` against the
    image's parser."""
    where = f" ({config.image})"
    check_extra_args(config, sources, facts)
    for words, extra_start in every_serve_words(config):
        for problem in vllm_probe.check_argv(facts.data, words, owners(), extra_start):
            raise ConfigError(
                problem["message"] + where,
                key=problem["key"],
                source=sources.get(problem["key"]),
                hint=problem["fix"],
            )


def precheck_spec(config: KitConfig, role: Role, *, serve: bool) -> str:
    """The JSON the in-container check reads (vllm_probe.py `check SPEC`): who owns each option,
    where model.extra_args begin, and with Ray the fix for an image without it."""
    spec: dict[str, object] = {}
    if serve:
        words, extra_start = _role_words(config, role)
        written = {word.split("=", 1)[0] for word in words[:extra_start] if word.startswith("-")}
        mine = {flag: OWNERS[flag] for flag in sorted(written) if flag in OWNERS}
        fixes = {key: fix for key, fix in mine.values()}
        spec.update(owners={flag: key for flag, (key, _) in mine.items()}, fixes=fixes, extra_start=extra_start)
    if config.backend == "ray":
        spec["ray"] = ray_fix(config)
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


def unchecked_warning(config: KitConfig) -> str:
    """What `kit slurm` says where kit has no record of the image's parser (issue 24)."""
    return (
        f"kit has no record of {config.image}'s `vllm serve` parser, so the plan was not checked against the "
        "image in advance: each container checks it first, in seconds, before Ray or vLLM starts "
        "(`kit pull` or `kit verify --image` records it)"
    )


def words_of(argv: Sequence[str | EnvRef | Word]) -> list[str]:
    return [_text(arg) for arg in argv]
