"""The warning lines of the verbs that start or render a cluster (issue 26: one pipeline, where
`kit up` and `kit serve` each had their own copy, and `kit slurm` a third): pure, from the config,
the layout and the model cache's decision. The verbs only print them (kit.output.warn) and put
them in their --json document's `warnings`.

Two moments: `before` is said before anything starts (the model not complete in hf_cache, with
its fix: issue 19), `after` once the plan is valid (a dry run) or the start is done, so the last
lines a person sees are what the cluster leaves open or could only guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kit.cluster.model import ModelCache
from kit.cluster.resolve import guessed_warning
from kit.config import KitConfig
from kit.images.vllm_releases import unknown_warning
from kit.layout import Layout
from kit.plan.exposure import Exposure
from kit.plan.image_check import unchecked_warning

# `kit slurm` with an interface set and the API on the node IP (issue 17).
API_ON_INTERFACE = (
    "the API listens on the head's address on the interface set (interface), which the login host may "
    "not reach: set api_listen: all (every interface) if the tunnel cannot connect"
)


@dataclass(frozen=True)
class Warnings:
    before: tuple[str, ...]  # said before anything starts
    after: tuple[str, ...]  # said once the plan is valid or the start is done

    @property
    def lines(self) -> list[str]:
        """Every line, in the order --json's `warnings` lists them."""
        return [*self.before, *self.after]

    def plus(self, *lines: str | None) -> Warnings:
        """These with more `after` lines (None: nothing to say)."""
        return Warnings(self.before, self.after + tuple(line for line in lines if line))


def start_warnings(config: KitConfig, layout: Layout, cache: ModelCache, exposed: Sequence[Exposure]) -> Warnings:
    """What a start says: the model cache's line; then what the plan leaves open (`exposed`, from
    kit.plan.exposure: which parts a verb starts is its choice), a layout this host could only
    guess, and a vLLM release kit could not tell (rendered for kit's default)."""
    after = [e.warning() for e in exposed]
    after += [line for line in (guessed_warning(layout), unknown_warning(config.vllm)) if line]
    return Warnings((cache.warning,) if cache.warning else (), tuple(after))


def launcher_warnings(config: KitConfig, layout: Layout, cache: ModelCache) -> Warnings:
    """What `kit slurm` says of its launcher: a start's lines (its layout is never guessed: a
    guessed one is refused), an API on an interface the login host may not reach, and an image
    whose parser kit has no record of (each container checks it first: issue 24)."""
    api = API_ON_INTERFACE if config.interface != "auto" and config.api_listen == "node-ip" else None
    unchecked = unchecked_warning(config) if config.image_options is None else None
    return start_warnings(config, layout, cache, ()).plus(api, unchecked)
