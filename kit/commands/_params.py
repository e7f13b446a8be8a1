"""kit.validate for the command line: every verb is a KitCommand, whose option values are checked
once click has parsed them and before the verb runs (issue 16), plus the parameter types of
flags that are not config keys (config keys are checked by kit.config's coerce).

`kit up --model --dry-run` is the case that shaped this: click hands "--dry-run" to --model,
so a value that looks like an option is refused here (exit 2) instead of a real start.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click

from kit import validate
from kit.errors import ConfigError, UsageError


def flag_name(param: click.Parameter | None) -> str:
    """--num-prompts for (-n, --num-prompts); IMAGE for an argument."""
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.human_readable_name if param is not None else "value"


class KitCommand(click.Command):
    """A verb whose option and argument values pass kit.validate before it runs:
    not empty, at most a few KiB, no control characters, no leading '-' (unless a number),
    floats finite. `free_text` options (a prompt) may hold newlines and start with '-';
    `dash_ok` ones may start with '-'."""

    def __init__(self, *args: Any, free_text: Iterable[str] = (), dash_ok: Iterable[str] = (), **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.free_text = frozenset(free_text)
        self.dash_ok = frozenset(dash_ok) | self.free_text

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        for param in self.get_params(ctx):
            name = param.name
            if name is None or (isinstance(param, click.Option) and (param.is_flag or param.count)):
                continue
            value = ctx.params.get(name)
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if name == "set_values" and isinstance(item, str) and "=" in item:
                    check_set(param, item)
                    continue
                check_value(param, item, free_text=name in self.free_text, dash_ok=name in self.dash_ok)
        return rest


class KitGroup(click.Group):
    """A verb with sub-verbs (`kit config show`): its sub-verbs are KitCommands."""

    command_class = KitCommand


def check_set(param: click.Parameter, item: str) -> None:
    """`--set KEY=VALUE`: the value is checked as the key's value (a bad one is reported against
    `--set KEY`, at its place in VALUE), the key by the config loader (an unknown one by name)."""
    key, _, raw = item.partition("=")
    label = f"--set {key}" if validate.RULES["name"].limit >= len(key) and key.isprintable() else "--set"
    try:
        validate.text(raw, "value", dash=True) if raw else None
    except validate.Invalid as exc:
        raise ConfigError(exc.message, key=label, hint=exc.hint) from None


def check_value(
    param: click.Parameter, value: Any, *, free_text: bool = False, dash_ok: bool = False, flag: str | None = None
) -> None:
    """One parsed value of a flag or argument (None: not given)."""
    flag = flag or flag_name(param)
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{value} is not a finite number", key=flag, hint=f"pass a finite number to {flag}")
    if not isinstance(value, (str, Path)):
        return
    text = str(value)
    # --tp -1 is a (wrong) number, checked as one; a lone "-" is stdin/stdout, not an option
    dash_ok = dash_ok or validate.is_number(text) or text == "-"
    if not dash_ok:
        refuse_option_like(flag, text)
    kind = "text" if free_text else "path" if isinstance(param.type, click.Path) else "value"
    try:
        validate.text(text, kind, dash=dash_ok)
    except validate.Invalid as exc:
        raise ConfigError(exc.message, key=flag, hint=exc.hint) from None


def refuse_option_like(flag: str, text: str) -> None:
    """A value that starts with '-' is a forgotten value followed by the next option (exit 2)."""
    if text.startswith("-"):
        raise UsageError(
            f"{flag}: {validate.preview(text)} looks like an option, not a value",
            hint=f"give {flag} a value (did you forget it?); a value cannot start with '-'",
        )


class Count(click.ParamType[int]):
    """An integer in [low, high]; out of range: one line naming the flag, exit 3."""

    name = "integer"

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        number = value if isinstance(value, int) else click.INT.convert(value, param, ctx)
        try:
            validate.number(number, low=self.low, high=self.high, what="an integer")
        except validate.Invalid as exc:
            raise ConfigError(exc.message, key=flag_name(param), hint=exc.hint) from None
        return int(number)


class Number(click.ParamType[float]):
    """A finite float in [low, high] ((low, high] with above=True): nan and inf are refused."""

    name = "number"

    def __init__(self, low: float | None = None, high: float | None = None, *, above: bool = False) -> None:
        self.low, self.high, self.above = low, high, above

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number = value if isinstance(value, float) else click.FLOAT.convert(value, param, ctx)
        try:
            validate.number(number, low=self.low, high=self.high, above=self.above)
        except validate.Invalid as exc:
            raise ConfigError(exc.message, key=flag_name(param), hint=exc.hint) from None
        return float(number)


class Url(click.ParamType[str]):
    """An http(s) URL with a host: `file:///etc/passwd` or '' is refused, not replaced by a default."""

    name = "url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        refuse_option_like(flag_name(param), str(value))
        try:
            return validate.url(str(value))
        except validate.Invalid as exc:
            raise ConfigError(exc.message, key=flag_name(param), hint=exc.hint) from None


def writable(path: str | Path | None, flag: str) -> None:
    """An output file checked before the work whose result it holds (None: not given)."""
    if path is None:
        return
    try:
        validate.writable_file(path)
    except validate.Invalid as exc:
        raise ConfigError(exc.message, key=flag, hint=exc.hint) from None


def readable(path: str | Path | None, flag: str) -> None:
    """An input file (a regular, readable file: no FIFO or device) checked before any work."""
    if path is None:
        return
    try:
        validate.readable_file(path)
    except validate.Invalid as exc:
        raise ConfigError(exc.message, key=flag, hint=exc.hint) from None
