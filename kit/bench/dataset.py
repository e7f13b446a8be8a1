"""The prompts of a benchmark: fixed or random lengths, or a user's JSONL / ShareGPT-style file.

kit carries no tokenizer, so generated prompts are counted in words of a fixed vocabulary (about
one token each with common BPE tokenizers); the token counts reported come from the server's
`usage`. Every dataset is deterministic for a given seed.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit import safeload
from kit.errors import ConfigError

# Plain lower-case English words: one BPE token each in most vocabularies.
_WORD_TEXT = (
    "the of and to in is it you that he was for on are as with his they at be this have from or one "
    "had by word but not what all were we when your can said there use an each which she do how their "
    "if will up other about out many then them these so some her would make like him into time has look "
    "two more write go see number no way could people my than first water been call who oil its now find"
)
WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class Prompt:
    """One request: chat messages and the number of tokens to generate."""

    messages: tuple[dict[str, str], ...]
    output_len: int
    input_len: int  # requested (words for generated prompts, 0 when unknown)

    def to_dict(self) -> dict[str, Any]:
        return {"messages": list(self.messages), "output_len": self.output_len, "input_len": self.input_len}


def _text(rng: random.Random, words: int, salt: int) -> str:
    # A distinct first word per request keeps the server's prefix cache from making later
    # requests cheaper than the first (vLLM's random dataset does the same with offsets).
    body = [WORDS[(salt * 7919 + i) % len(WORDS)] if i == 0 else rng.choice(WORDS) for i in range(max(words, 1))]
    return " ".join(body)


def _lengths(rng: random.Random, base: int, ratio: float, count: int) -> list[int]:
    """Uniform in [base*(1-ratio), base*(1+ratio)] like vLLM's --random-range-ratio; at least 1."""
    low, high = max(1, round(base * (1 - ratio))), max(1, round(base * (1 + ratio)))
    return [rng.randint(low, high) for _ in range(count)]


def fixed(num: int, input_len: int, output_len: int, seed: int = 0) -> list[Prompt]:
    rng = random.Random(seed)
    return [Prompt(({"role": "user", "content": _text(rng, input_len, i)},), output_len, input_len) for i in range(num)]


def random_lengths(num: int, input_len: int, output_len: int, range_ratio: float, seed: int = 0) -> list[Prompt]:
    if not 0 <= range_ratio < 1:
        raise ConfigError(f"{range_ratio} is outside [0, 1)", key="--range-ratio", hint="e.g. --range-ratio 0.5")
    rng = random.Random(seed)
    ins = _lengths(rng, input_len, range_ratio, num)
    outs = _lengths(rng, output_len, range_ratio, num)
    return [
        Prompt(({"role": "user", "content": _text(rng, n_in, i)},), n_out, n_in)
        for i, (n_in, n_out) in enumerate(zip(ins, outs, strict=True))
    ]


def _bad(path: Path, line: int | None, what: str) -> ConfigError:
    where = f"{path}:{line}" if line else str(path)
    return ConfigError(
        f"{where}: {what}",
        key="--dataset",
        hint='each JSONL line needs "prompt" (text) or "messages" (chat list), optionally "output_len"; '
        'or a ShareGPT JSON list with "conversations"',
    )


def _from_entry(entry: Any, path: Path, line: int | None, default_output: int) -> Prompt:
    if not isinstance(entry, dict):
        raise _bad(path, line, f"expected a JSON object, got {type(entry).__name__}")
    out = entry.get("output_len", entry.get("max_tokens", default_output))
    if not isinstance(out, int) or isinstance(out, bool) or out < 1:
        raise _bad(path, line, f"output_len must be a positive integer, got {out!r}")
    if "conversations" in entry:  # ShareGPT: the first human turn is the prompt
        turns = entry["conversations"]
        if not isinstance(turns, list):
            raise _bad(path, line, '"conversations" must be a list')
        human = next(
            (t.get("value") for t in turns if isinstance(t, dict) and t.get("from") in ("human", "user")), None
        )
        if not isinstance(human, str) or not human:
            raise _bad(path, line, "no human turn with text in conversations")
        return Prompt(({"role": "user", "content": human},), out, 0)
    if "messages" in entry:
        msgs = entry["messages"]
        ok = (
            isinstance(msgs, list)
            and msgs
            and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in msgs
            )
        )
        if not ok:
            raise _bad(path, line, '"messages" must be a non-empty list of {"role": str, "content": str}')
        return Prompt(tuple({"role": m["role"], "content": m["content"]} for m in msgs), out, 0)
    prompt = entry.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise _bad(path, line, 'no "prompt" text, "messages" or "conversations"')
    return Prompt(({"role": "user", "content": prompt},), out, 0)


def _json(text: str, path: Path, line: int | None) -> Any:
    if not safeload.json_depth_ok(text):  # json.loads recurses once per level
        raise _bad(path, line, "not valid JSON (nested too deeply)")
    try:
        return json.loads(text)
    except ValueError as exc:
        where = line or getattr(exc, "lineno", None)
        raise _bad(path, where, f"not valid JSON ({getattr(exc, 'msg', exc)})") from None


def load_file(path: Path, num: int | None, default_output: int, seed: int = 0) -> list[Prompt]:
    """JSONL (one object a line) or a JSON list (ShareGPT); `num` prompts, cycling if needed.
    Read with kit.safeload's bounds: a regular UTF-8 file of at most 64 MB (a FIFO or /dev/zero
    is refused, not read forever)."""
    try:
        text = safeload.read_text(path, what="dataset")
    except ConfigError as err:
        raise ConfigError(err.message, key="--dataset", hint=err.hint) from None
    entries: list[Prompt] = []
    if text.lstrip().startswith("["):
        entries = [_from_entry(e, path, None, default_output) for e in _json(text, path, None)]
    else:
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                entries.append(_from_entry(_json(line, path, lineno), path, lineno, default_output))
    if not entries:
        raise _bad(path, None, "no prompts in the file")
    if num is None:
        return entries
    if seed:
        entries = random.Random(seed).sample(entries, len(entries))
    return [entries[i % len(entries)] for i in range(num)]
