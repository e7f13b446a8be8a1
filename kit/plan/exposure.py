"""What a planned cluster leaves open to anyone who can reach its nodes (issue 16, closed by
default): the OpenAI API without an API key, Ray without token authentication. Pure: `kit up`
and `kit serve` print each as a warning, `kit verify` reports each as a finding."""

from __future__ import annotations

from dataclasses import dataclass

from kit.config import KitConfig


@dataclass(frozen=True)
class Exposure:
    check: str  # the finding's name in `kit verify`
    message: str
    fix: str

    def warning(self) -> str:
        return f"{self.message}; {self.fix}"


def exposures(config: KitConfig, *, api: bool = True, ray: bool = True) -> list[Exposure]:
    """`api`: the API server is part of what is checked (it runs on the head); `ray`: the Ray
    cluster is (every node of the Ray backend runs a raylet; the head also the GCS)."""
    found = []
    if api and not config.api_key_file:
        found.append(
            Exposure(
                "security.api_key",
                f"no api_key_file: the API (port {config.ports.api}) answers anyone who can reach the head"
                + (" on any of its interfaces (api_listen: all)" if config.api_listen == "all" else ""),
                "set api_key_file to require a key",
            )
        )
    if ray and config.backend == "ray" and not config.ray_token_file:
        found.append(
            Exposure(
                "security.ray_token",
                f"no ray_token_file: Ray (GCS port {config.ports.ray_gcs}) accepts any client that can reach "
                "the nodes, and a Ray client can run code there",
                "set ray_token_file (the same file on every node) to turn on Ray's token authentication",
            )
        )
    return found
