"""Verbs as declarations (issue 26): the config-backed options of `kit up`, `kit serve` and
`kit slurm` are generated from the config schema (kit.commands._options.config_flag), so each
option's type, choices and help come from its key's Spec, and the flag -> key mapping is read off
the command (no hand table). Every other verb's config options (--cluster, --runtime) are checked
the same way. A key renamed in kit/config/schema.py breaks these tests."""

from __future__ import annotations

import dataclasses
import importlib

import click
import pytest

from kit.cli import VERBS as ALL_VERBS
from kit.cluster.model import ModelCache
from kit.cluster.resolve import resolve
from kit.cluster.warnings import API_ON_INTERFACE, launcher_warnings, start_warnings
from kit.commands import _options
from kit.commands._options import ConfigOption, config_flag, config_keys, overrides_from
from kit.config.schema import SCHEMA
from kit.plan.exposure import exposures
from kit.plan.image_check import unchecked_warning

VERBS = ("up", "serve", "slurm")
# The config-backed options of each verb (the hand tables issue 26 removed had as many entries):
# a count that drops means an option slipped back to a plain click option.
CONFIG_OPTIONS = {"up": 18, "serve": 18, "slurm": 28, "build": 2, "pull": 2}


def command_of(verb: str) -> click.Command:
    command: click.Command = importlib.import_module(f"kit.commands.{ALL_VERBS[verb][0]}").command
    return command


def config_params(verb: str) -> list[ConfigOption]:
    return [p for p in command_of(verb).params if isinstance(p, ConfigOption)]


@pytest.mark.parametrize("verb", sorted(ALL_VERBS))
def test_every_config_option_names_a_schema_key_and_says_it(verb: str) -> None:
    params = config_params(verb)
    assert len(params) == CONFIG_OPTIONS.get(verb, len(params))
    for param in params:
        assert param.config_key in SCHEMA, f"{param.opts}: {param.config_key} is no config key"
        assert f"(config: {param.config_key}" in (param.help or ""), param.opts


@pytest.mark.parametrize("verb", sorted(ALL_VERBS))
def test_every_config_option_parses_as_its_key_does(verb: str) -> None:
    """int -> click.INT, float -> click.FLOAT, choice -> click.Choice of (a subset of) the key's
    choices, bool -> a flag that is None unless given, str/size/int_auto -> text that the
    config's coerce parses (so --tp takes `auto`); a verb may narrow, never widen."""
    for param in config_params(verb):
        spec, name = SCHEMA[param.config_key], "/".join(param.opts + param.secondary_opts)
        if spec.kind == "bool":
            assert param.is_flag and param.default is None, name
        elif spec.kind == "choice":
            assert isinstance(param.type, click.Choice), name
            assert set(param.type.choices) <= set(spec.choices), name
        elif spec.kind == "int":
            assert param.type is click.INT, name
        elif spec.kind == "float":
            assert param.type is click.FLOAT, name
        elif spec.kind == "int_auto":
            assert param.type in (click.STRING, click.INT), name  # INT: seconds only (serve --timeout)
        else:
            assert param.type is click.STRING, name
        assert not param.multiple, name


def test_the_layout_flags_take_auto_and_ep_is_a_pair() -> None:
    for verb in VERBS:
        by_name = {p.name: p for p in config_params(verb)}
        for flag in ("tp", "pp", "dp"):
            assert by_name[flag].type is click.STRING and by_name[flag].config_key == f"model.{flag}"
        assert by_name["ep"].opts == ["--ep"] and by_name["ep"].secondary_opts == ["--no-ep"]


def test_the_mapping_is_read_off_the_command() -> None:
    """overrides_from without a table: the running command's config options decide the keys and
    the source names the flag, as the hand tables did."""
    command = command_of("slurm")
    keys = config_keys(command)
    assert keys["job_output"] == "slurm.output" and keys["login_host"] == "tunnel.login_host"
    assert keys["cluster"] == "cluster" and keys["model"] == "model.id"
    with click.Context(command):
        got = overrides_from({"tp": "auto", "dp": "4", "ep": False, "job_output": "o-%j", "nodes": None})
    assert got == {
        "model.tp": ("auto", "flag --tp"),
        "model.dp": (4, "flag --dp"),
        "model.ep": (False, "flag --ep"),
        "slurm.output": ("o-%j", "flag --job-output"),
    }


def test_each_verb_keeps_its_own_narrowing() -> None:
    runtime = {verb: {p.name: p for p in config_params(verb)}["runtime"].type for verb in VERBS}
    assert [list(getattr(t, "choices", ())) for t in runtime.values()] == [
        ["docker", "apptainer"],
        ["docker", "apptainer"],
        ["docker", "apptainer", "pyxis", "edf"],
    ]
    timeouts = {verb: {p.name: p for p in config_params(verb)}.get("timeout") for verb in VERBS}
    assert timeouts["up"] is not None and timeouts["up"].config_key == "timeouts.join"
    assert timeouts["serve"] is not None and timeouts["serve"].config_key == "timeouts.ready"


def test_a_renamed_key_fails_where_the_option_is_declared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(_options.SCHEMA, "model.max_model_len")
    with pytest.raises(KeyError):
        config_flag("model.max_model_len", "--max-model-len")


def test_help_is_the_schema_s_capitalised_with_the_key() -> None:
    @config_flag("nodes", "--nodes")
    @config_flag("accelerator", "--accelerator", note="MODEL: cpu")
    @config_flag("ports.api", "--port", help="API port.")
    def command(**_: object) -> None:
        """unused"""

    helps = {p.name: p.help for p in command.__click_params__}  # type: ignore[attr-defined]
    assert helps == {
        "nodes": "Number of nodes in the cluster (config: nodes).",
        "accelerator": "gpu, or cpu (vLLM's CPU build; demo and tests) (config: accelerator; MODEL: cpu).",
        "port": "API port (config: ports.api).",
    }


# ---- one warnings pipeline (kit.cluster.warnings) ----------------------------------------------


@pytest.mark.usefixtures("kit_env")
def test_up_serve_and_slurm_say_their_lines_from_one_pipeline() -> None:
    """The model cache's line before anything starts; then what is left open, the guessed layout,
    the unknown release; a launcher adds its own two after those, in that order."""
    overrides = {"gpus_per_node": (2, "test"), "hf_cache": ("/nonexistent", "test"), "image": ("img:latest", "test")}
    resolution = resolve(None, overrides)
    config, layout = resolution.config, resolution.layout
    cache = ModelCache("m", "main", "auto", "missing", offline=False, warning="the cache line")
    said = start_warnings(config, layout, cache, exposures(config, ray=False))
    assert said.before == ("the cache line",)
    assert [line.split(" ", 1)[0] for line in said.after] == ["no", "layout", "the"]
    assert said.after[0].startswith("no api_key_file") and said.lines == [*said.before, *said.after]
    launcher = launcher_warnings(dataclasses.replace(config, interface="ib0"), layout, cache)
    assert launcher.lines == [
        "the cache line",
        *said.after[1:],
        API_ON_INTERFACE,
        unchecked_warning(config),
    ]
