"""Placeholder for verbs that later issues implement."""

from __future__ import annotations

import click

from kit.errors import NotImplementedYet


def not_implemented(name: str, help_text: str) -> click.Command:
    @click.command(
        name=name,
        help=help_text + "\n\n(not implemented yet: exits 1)",
        context_settings={"ignore_unknown_options": True},
    )
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def _cmd(args: tuple[str, ...]) -> None:
        raise NotImplementedYet(f"`kit {name}` is not implemented yet")

    return _cmd
