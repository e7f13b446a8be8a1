"""Click glue the verbs share: the config flags (--config, --cluster, --set), options generated
from the config schema (config_flag), --json, the load flags of `kit bench` and `kit tune`, flag
values turned into config overrides, and --head / --worker into a node role. Click only: what the
verbs do lives in kit.cluster and kit.bench."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from kit import validate
from kit.commands._params import Count, Number
from kit.config import parse_scalar
from kit.config.schema import SCHEMA
from kit.errors import ConfigError, UsageError
from kit.plan.roles import Role

F = TypeVar("F", bound=Callable[..., Any])

# A schema help starting with a plain word ("number of nodes") is capitalised for --help; one
# starting with a value or a key ("gpu, or cpu", "model.dp_lb router: ...") is left as written.
_PLAIN_WORD = re.compile(r"[a-z][a-z'-]*:?( |$)")


class ConfigOption(click.Option):
    """A flag that sets one config key (issue 26: verbs as declarations): built by config_flag
    from the key's schema entry, it carries the key, so the verb's overrides need no table."""

    def __init__(self, *args: Any, config_key: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.config_key = config_key


def config_flag(
    key: str,
    *decls: str,
    help: str | None = None,
    note: str | None = None,
    choices: tuple[str, ...] | None = None,
    type: click.ParamType[Any] | None = None,
) -> Callable[[F], F]:
    """The option `decls` (e.g. "--max-model-len", or "--ep/--no-ep" for a bool) for the config
    key `key`, its type and help taken from kit.config.schema:

    - int: an integer; float: a number; choice: click.Choice of the key's choices; bool: a flag
      (unset: None, so the config decides); str, size and int_auto: text, which the config's
      coerce parses (so --tp takes `auto`) and checks with the key's bounds;
    - help: the schema's, or `help` where the verb's wording really differs, then
      "(config: KEY; NOTE)".

    A verb may narrow what the schema takes, never widen it (tests/unit/test_verb_options.py):
    `choices` a subset of the key's (`kit up` starts no pyxis node), `type` click.INT for an
    int_auto key. The value reaches the config through overrides_from, named `flag --NAME`."""
    spec = SCHEMA[key]  # a renamed key fails the verb's import, and the test that imports it
    if not decls:
        raise TypeError(f"config_flag({key!r}) needs the flag's name")
    text = help if help is not None else spec.help
    if _PLAIN_WORD.match(text):
        text = text[0].upper() + text[1:]
    where = f"config: {key}" + (f"; {note}" if note else "")
    kwargs: dict[str, Any] = {"help": f"{text.rstrip('.')} ({where}).", "cls": ConfigOption, "config_key": key}
    if spec.kind == "bool":
        kwargs.update(is_flag=True, default=None)
    elif spec.kind == "choice":
        kwargs["type"] = click.Choice(list(choices or spec.choices))
    elif type is not None:
        kwargs["type"] = type
    elif spec.kind in ("int", "float"):
        kwargs["type"] = click.INT if spec.kind == "int" else click.FLOAT
    return click.option(*decls, **kwargs)


def config_keys(command: click.Command) -> dict[str, str]:
    """The command's config-backed options: parameter name -> config key."""
    return {p.name: p.config_key for p in command.params if isinstance(p, ConfigOption) and p.name}


def config_options(func: F) -> F:
    """--config, --cluster and --set KEY=VALUE (any config key) for every verb that reads kit.yaml."""
    func = click.option(
        "--set",
        "set_values",
        multiple=True,
        metavar="KEY=VALUE",
        help="Set any config key (dotted, e.g. model.max_model_len=8192); repeatable.",
    )(func)
    func = config_flag("cluster", "--cluster")(func)
    func = click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        help="Config file (default: $KIT_CONFIG, else ./kit.yaml, else built-in defaults).",
    )(func)
    return func


def layout_options(func: F) -> F:
    """--tp, --pp, --dp and --ep/--no-ep (model.tp/pp/dp/ep; `auto` is kit.plan.layout's)."""
    func = config_flag("model.ep", "--ep/--no-ep")(func)
    func = config_flag("model.dp", "--dp")(func)
    func = config_flag("model.pp", "--pp")(func)
    func = config_flag("model.tp", "--tp")(func)
    return func


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON document (for machines).")(func)


def overrides_from(
    flags: Mapping[str, Any], set_values: tuple[str, ...] = (), keys: Mapping[str, str] | None = None
) -> dict[str, tuple[Any, str]]:
    """--set KEY=VALUE items, then flag values (not None) -> config overrides, with 'flag --x' as
    their source. `keys` (parameter name -> config key) defaults to the running command's
    config_flag options (config_keys)."""
    if keys is None:
        keys = config_keys(click.get_current_context().command)
    out: dict[str, tuple[Any, str]] = {}
    for item in set_values:
        key, sep, raw = item.partition("=")
        if not sep:
            raise UsageError(f"--set {validate.preview(item)} must look like KEY=VALUE", hint="e.g. --set model.tp=4")
        if key not in SCHEMA:
            guess = difflib.get_close_matches(key, list(SCHEMA), n=1)
            shown = key if len(key) <= 64 else validate.preview(key)
            raise ConfigError(
                "unknown key",
                key=shown,
                source=f"flag --set {shown}",
                hint=f"did you mean '{guess[0]}'?" if guess else "see `kit config show`",
            )
        out[key] = (parse_scalar(key, raw, f"flag --set {key}"), f"flag --set {key}")
    for flag, key in keys.items():
        value = flags.get(flag)
        if value is None or value == ():
            continue
        if isinstance(value, str) and SCHEMA[key].kind not in ("str", "choice", "size"):
            value = parse_scalar(key, value, f"flag --{flag.replace('_', '-')}")
        out[key] = (value, f"flag --{flag.replace('_', '-')}")
    return out


def load_options(func: F) -> F:
    """The load flags `kit bench` and `kit tune` share (their bounds imported here, not at the top:
    kit.bench pulls in requests, which the other verbs do not need)."""
    from kit.bench.load import MAX_INPUT_LEN, MAX_OUTPUT_LEN, MAX_PROMPTS
    from kit.bench.runner import MAX_IN_FLIGHT

    options = [
        click.option(
            "--dataset",
            default="fixed",
            show_default=True,
            metavar="fixed|random|FILE",
            help="Fixed lengths, random lengths (--range-ratio), or a JSONL / ShareGPT JSON file.",
        ),
        click.option(
            "--num-prompts",
            "-n",
            type=Count(1, MAX_PROMPTS),
            default=16,
            show_default=True,
            help=f"Requests per load point (at most {MAX_PROMPTS}).",
        ),
        click.option(
            "--input-len",
            type=Count(1, MAX_INPUT_LEN),
            default=32,
            show_default=True,
            help="Prompt length in words (~tokens).",
        ),
        click.option(
            "--output-len",
            type=Count(1, MAX_OUTPUT_LEN),
            default=32,
            show_default=True,
            help="Tokens to generate per request.",
        ),
        click.option(
            "--range-ratio", type=Number(0, 1), default=0.5, show_default=True, help="--dataset random: ± spread."
        ),
        click.option("--rate", help="Request rate(s) per second, Poisson arrivals; e.g. 1,2,inf (default inf)."),
        click.option(
            "--concurrency",
            "-c",
            help=f"Max requests in flight (at most {MAX_IN_FLIGHT}); a sweep like 1,2,4 (default 1; "
            f"with --rate, no limit, so -n must then be {MAX_IN_FLIGHT} or less).",
        ),
        click.option(
            "--burstiness",
            type=Number(0, 1000, above=True),
            default=1.0,
            show_default=True,
            help="Gamma shape (1 = Poisson).",
        ),
        click.option(
            "--warmup", type=Count(0, 1000), default=1, show_default=True, help="Untimed requests before measuring."
        ),
        click.option("--seed", type=Count(0, 2**63 - 1), default=0, show_default=True),
        click.option(
            "--ignore-eos/--no-ignore-eos",
            default=True,
            show_default=True,
            help="Generate exactly --output-len tokens.",
        ),
        click.option(
            "--request-timeout",
            type=Number(0, 7 * 86400, above=True),
            default=600,
            show_default=True,
            help="Seconds per request.",
        ),
        click.option(
            "--api-key-file", type=click.Path(dir_okay=False), help="File holding the API key (config: api_key_file)."
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def role_from_flags(head: bool, worker: bool, node_rank: int | None) -> Role:
    if head and worker:
        raise UsageError("--head and --worker exclude each other", hint="pass one of them")
    if worker:
        return Role("worker", 1 if node_rank is None else node_rank)
    if node_rank not in (None, 0):
        raise UsageError("the head always has node rank 0", hint="drop --node-rank or add --worker")
    return Role("head", 0)


def cluster_overrides(cluster: str | None, set_values: tuple[str, ...]) -> dict[str, tuple[Any, str]]:
    """The overrides of a verb whose only config flags are the common ones (--cluster, --set)."""
    return overrides_from({"cluster": cluster}, set_values, {"cluster": "cluster"})
