"""Image facts, read inside the image by the image's own Python (issue 24).

    python3 vllm_probe.py facts                      one line: KIT_IMAGE_FACTS {json}
    python3 vllm_probe.py check SPEC vllm serve ...  exit 3 and one line when the image's own
                                                     `vllm serve` parser refuses an option

`facts` reports the vLLM version, the whole `vllm serve` parser as vLLM itself builds it (the
`serve` subcommand's `subparser_init` on vLLM's FlexibleArgumentParser, exactly what
`vllm/entrypoints/cli/main.py` does; every action walked: its option strings, choices, whether
it takes a value), whether Ray is importable and its version, torch/CUDA/NCCL versions, and the
user and home the image runs as. Nothing is scraped from --help text.

Standard library only at import time: vllm, torch and ray are imported inside the functions that
report them, so kit imports this module too, for the pure half (`check_argv`): the check kit
makes against a recorded parser before anything starts and the check a launcher runs inside the
container (where kit had no record) are one code. Do not import kit here.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

PROBE_VERSION = "1"
MARK = "KIT_IMAGE_FACTS "
CHECK_FAILED = 3  # kit's exit code for a refused configuration (kit.errors.ExitCode.CONFIG)


# ---- facts (inside the image) ---------------------------------------------------------------


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def flexible_parser_class() -> Any:
    """vLLM's FlexibleArgumentParser, wherever this release keeps it (vllm.utils.argparse_utils
    from 0.11, vllm.utils before)."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        from vllm.utils import FlexibleArgumentParser  # type: ignore[import-not-found,no-redef,unused-ignore]
    return FlexibleArgumentParser


def serve_parser() -> Any:
    """The `vllm serve` parser, built the way vLLM's CLI builds it."""
    import vllm.entrypoints.cli.serve as serve_cli  # type: ignore[import-not-found,unused-ignore]

    root = flexible_parser_class()(prog="vllm", description="vLLM CLI")
    subparsers = root.add_subparsers(required=False, dest="subparser")
    for command in serve_cli.cmd_init():
        if command.name == "serve":
            return command.subparser_init(subparsers)
    raise LookupError("vllm.entrypoints.cli.serve has no 'serve' subcommand")


def describe_action(action: Any) -> dict[str, Any]:
    """One argparse action as data: what a command line may say to it."""
    import argparse

    nargs = action.nargs
    choices = None if action.choices is None else sorted(str(c) for c in action.choices)
    kind = getattr(action.type, "__name__", None) if action.type is not None else None
    return {
        "flags": list(action.option_strings),
        "dest": str(action.dest),
        "takes_value": nargs != 0,
        "nargs": None if nargs is None else str(nargs),
        "choices": choices,
        "type": kind,
        "hidden": action.help == argparse.SUPPRESS,
        "action": type(action).__name__,
    }


def describe_parser(parser: Any) -> dict[str, Any]:
    actions = [describe_action(a) for a in parser._actions]
    return {
        "allow_abbrev": bool(getattr(parser, "allow_abbrev", True)),
        "options": sorted((a for a in actions if a["flags"]), key=lambda a: a["flags"][0]),
        "positionals": [a["dest"] for a in actions if not a["flags"]],
    }


def vllm_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"version": _dist_version("vllm")}
    try:
        import vllm  # type: ignore[import-not-found,unused-ignore]

        facts["version"] = facts["version"] or getattr(vllm, "__version__", None)
        facts["serve"] = describe_parser(serve_parser())
    except Exception as exc:  # a broken install is a fact to report, not a crash
        facts["error"] = _error(exc)
    return facts


def ray_facts() -> dict[str, Any]:
    import shutil

    facts: dict[str, Any] = {"cli": shutil.which("ray")}
    try:
        import ray  # type: ignore[import-not-found,unused-ignore]

        facts.update(importable=True, version=getattr(ray, "__version__", None))
    except Exception as exc:
        facts.update(importable=False, version=None, error=_error(exc))
    return facts


def torch_facts() -> dict[str, Any]:
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]
    except Exception as exc:
        return {"importable": False, "error": _error(exc)}
    facts: dict[str, Any] = {"importable": True, "version": torch.__version__, "cuda": torch.version.cuda}
    try:
        nccl = torch.cuda.nccl.version() if torch.version.cuda else None
        facts["nccl"] = ".".join(str(p) for p in nccl) if isinstance(nccl, tuple) else nccl
    except Exception as exc:
        facts["nccl"], facts["nccl_error"] = None, _error(exc)
    return facts


def user_facts() -> dict[str, Any]:
    import pwd

    uid = os.getuid()
    try:
        entry: Any = pwd.getpwuid(uid)
        name, home = entry.pw_name, entry.pw_dir
    except KeyError:
        name, home = None, None
    return {"uid": uid, "gid": os.getgid(), "name": name, "home": os.environ.get("HOME") or home}


def collect() -> dict[str, Any]:
    import platform

    return {
        "probe": "image-facts",
        "probe_version": PROBE_VERSION,
        "python": platform.python_version(),
        "vllm": vllm_facts(),
        "ray": ray_facts(),
        "torch": torch_facts(),
        "user": user_facts(),
    }


# ---- the check (pure: kit imports it too) ---------------------------------------------------


def option_index(serve: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Every option string of the parser record -> its action."""
    return {flag: action for action in serve.get("options", []) for flag in action.get("flags", [])}


def lookup(
    index: Mapping[str, Mapping[str, Any]], flag: str, allow_abbrev: bool
) -> tuple[Mapping[str, Any] | None, str]:
    """The action `flag` names as vLLM's parser reads it: underscores in a --long name are
    dashes (FlexibleArgumentParser), a dotted --name.key sets one key of a JSON option, and
    argparse takes a unique prefix where the parser allows abbreviations. (action, why not)."""
    if flag.startswith("--"):
        flag = "--" + flag[2:].split(".", 1)[0].replace("_", "-").removesuffix("+")
    elif flag.startswith("-O"):  # -O3, -O 3: --optimization-level (0.11+), else --compilation-config's -O
        flag = "--optimization-level" if "--optimization-level" in index else "-O"
    if flag in index:
        return index[flag], ""
    if allow_abbrev and flag.startswith("--"):
        found = sorted({f for f in index if f.startswith(flag)})
        actions = {id(index[f]): index[f] for f in found}
        if len(actions) == 1:
            return next(iter(actions.values())), ""
        if found:
            return None, f"{flag} is ambiguous for this parser (it could be {', '.join(found[:5])})"
    return None, ""


def scan(
    serve: Mapping[str, Any], words: Sequence[str]
) -> list[tuple[int, str, Mapping[str, Any] | None, str | None, str]]:
    """The option words of a `vllm serve` argument list (what follows `vllm serve`), each as
    (index, flag as written, its action or None, its value or None, why it is not known)."""
    index = option_index(serve)
    allow_abbrev = bool(serve.get("allow_abbrev", True))
    found = []
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("-") or word == "-" or _is_number(word):
            i += 1  # the model, or a positional
            continue
        flag, eq, attached = word.partition("=")
        if word.startswith("-O") and not word.startswith("--") and len(word) > 2:
            flag, eq, attached = "-O", "=", word[2:].removeprefix("=")
        action, why = lookup(index, flag, allow_abbrev)
        value: str | None = attached if eq else None
        takes = action is not None and action.get("takes_value")
        if takes and not eq and action is not None and i + 1 < len(words):
            optional = action.get("nargs") in ("?", "*")
            following = words[i + 1]
            if not (optional and following.startswith("-") and not _is_number(following)):
                value = following
                i += 1
        elif "." in flag and not eq and i + 1 < len(words):
            i += 1  # --json-option.key VALUE
        found.append((i, flag, action, value, why))
        i += 1
    return found


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def check_argv(
    facts: Mapping[str, Any],
    words: Sequence[str],
    owners: Mapping[str, Mapping[str, str]],
    extra_start: int,
) -> list[dict[str, str]]:
    """What this image's `vllm serve` would refuse in `words` (its arguments after `vllm
    serve`): an option it does not have, a choice it does not accept. `owners` maps each option
    kit writes to the config key that made it and the fix; words from `extra_start` on came from
    model.extra_args. A value that is still a shell variable ("${...}") is not judged."""
    vllm = facts.get("vllm") or {}
    serve = vllm.get("serve")
    release = f"vLLM {vllm.get('version') or '(unknown version)'}"
    if not isinstance(serve, Mapping):
        return []
    problems = []
    for position, flag, action, value, why in scan(serve, words):
        owner = owners.get(flag) if position < extra_start else None
        key = owner["key"] if owner else "model.extra_args"
        if action is None:
            fix = (
                owner["fix"]
                if owner
                else f"remove {flag} from model.extra_args (see `vllm serve --help=all` in the image)"
            )
            message = why or f"{release} in this image has no option {flag}"
            problems.append({"key": key, "message": message, "fix": fix})
            continue
        choices = action.get("choices")
        if choices and value is not None and "${" not in value and value not in choices:
            shown = ", ".join(choices[:12]) + (", ..." if len(choices) > 12 else "")
            problems.append(
                {
                    "key": key,
                    "message": f"{release} in this image does not accept {value!r} for {flag} (it accepts: {shown})",
                    "fix": owner["fix"] if owner else f"use one of its choices for {flag} in model.extra_args",
                }
            )
    return problems


def check_ray(facts: Mapping[str, Any]) -> str | None:
    """Why the Ray backend cannot run on this image, or None."""
    ray = facts.get("ray") or {}
    if ray.get("importable") and ray.get("cli"):
        return None
    if not ray.get("importable"):
        return f"this image has no Ray ({ray.get('error') or 'import ray failed'})"
    return "this image's Ray has no `ray` command on PATH"


def one_line(problem: Mapping[str, str]) -> str:
    return f"kit: {problem['key']}: {problem['message']}; fix: {problem['fix']}"


# ---- entry point ----------------------------------------------------------------------------


def run_check(spec_text: str, argv: Sequence[str]) -> int:
    """Inside the container, before `vllm serve` (or `ray start`) runs: the spec is the JSON kit
    rendered (owners, extra_start, ray); argv is the exact command about to run."""
    spec = json.loads(spec_text)
    fixes = spec.get("fixes", {})
    owners = {flag: {"key": key, "fix": fixes.get(key, "")} for flag, key in spec.get("owners", {}).items()}
    facts = collect() if argv else {"ray": ray_facts()}
    words = list(argv[2:]) if list(argv[:2]) == ["vllm", "serve"] else list(argv)
    problems = []
    if spec.get("ray") and (why := check_ray(facts)) is not None:
        problems.append({"key": "backend", "message": why, "fix": spec["ray"]})
    if argv:
        if facts["vllm"].get("error"):
            problems.append(
                {
                    "key": "image",
                    "message": f"vLLM does not import here: {facts['vllm']['error']}",
                    "fix": "fix the image",
                }
            )
        problems += check_argv(facts, words, owners, int(spec.get("extra_start", len(words))))
    for problem in problems[:1]:
        print(one_line(problem), file=sys.stderr, flush=True)
    return CHECK_FAILED if problems else 0


def main(argv: Sequence[str]) -> int:
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if argv[:1] == ["facts"]:
        print(MARK + json.dumps(collect(), sort_keys=True), flush=True)
        return 0
    if argv[:1] == ["check"] and len(argv) >= 2:
        return run_check(argv[1], argv[2:])
    print("usage: vllm_probe.py facts | check SPEC [vllm serve ARGS...]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
