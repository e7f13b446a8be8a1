"""The `vllm serve` argv for each backend and role (FIELD_NOTES §2)."""

from __future__ import annotations

from kit.config import KitConfig
from kit.plan.facts import Role
from kit.render import Arg, EnvRef


def vllm_serve_argv(config: KitConfig, role: Role) -> list[Arg]:
    """Head (Ray): the only vllm process, --distributed-executor-backend ray.
    mp backend: every node runs it; node rank and head address come from the node's env."""
    m = config.model
    argv: list[Arg] = ["vllm", "serve", m.id]
    if role.is_head:
        argv += ["--served-model-name", config.served_name, "--host", "0.0.0.0", "--port", str(config.ports.api)]
    argv += ["--tensor-parallel-size", str(config.tp), "--pipeline-parallel-size", str(config.pp)]
    if m.max_model_len is not None:
        argv += ["--max-model-len", str(m.max_model_len)]
    if config.backend == "ray":
        argv += ["--distributed-executor-backend", "ray"]
    elif config.nodes > 1:
        argv += [
            "--nnodes",
            str(config.nodes),
            "--node-rank",
            EnvRef("KIT_NODE_RANK"),
            "--master-addr",
            EnvRef("KIT_HEAD_ADDRESS"),
            "--master-port",
            str(config.ports.mp_master),
        ]
        if not role.is_head:
            argv.append("--headless")
    argv += list(m.extra_args)
    return argv
