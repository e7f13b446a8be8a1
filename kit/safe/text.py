"""Text that came from outside, made safe to show and to save (issue 27). Standard library only:
the supervise bundle uses it inside the containers.

- `redact(text)`: every secret kit knows (the API key, the HF token, the password of a URL kit
  was given) is replaced by `<redacted>`, whatever a server echoed back; the user part of any
  URL in the text too. Secrets are registered where kit reads them (kit.safeload.read_secret,
  kit.net.http for URLs), so no printer needs to know which ones there are.
- `terminal_safe(text)`: control characters (ESC sequences that set a terminal's title, write
  its clipboard or clear it; C1 controls; bidirectional overrides) shown as `\\x1b`-style text.
- `clean(text)`: both, what kit.output and kit.cli apply to every line they print.
- `strict(obj)` / `to_json(obj)`: JSON that strict parsers read (no NaN or Infinity: null),
  redacted, with control characters escaped (json's ensure_ascii).
- `StreamRedactor`: redaction across the pieces of a streamed answer (a secret cut in two).
"""

from __future__ import annotations

import json
import math
import re
import threading
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

REDACTED = "<redacted>"
# Shorter values are not redacted: replacing every "ab" would garble the output and a secret
# that short protects nothing anyway.
MIN_SECRET = 6

_lock = threading.Lock()
_secrets: set[str] = set()
_ordered: list[str] = []  # longest first, so a secret containing another is replaced whole

# C0 controls but tab and newline, DEL, C1 controls (U+009B is CSI to a UTF-8 terminal), the
# Unicode line separators, and the bidirectional marks and overrides that reorder what is shown.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# scheme://user:password@ (or scheme://token@): the credentials part of a URL inside any text.
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,20}://)[^/@\s\"'<>]{1,512}@")


def register_secret(value: str | None) -> None:
    """From now on `redact` hides `value` (and its percent-decoded form) wherever it appears."""
    if not value:
        return
    forms = {value, unquote(value)}
    forms |= {json.dumps(form)[1:-1] for form in list(forms)}  # as it appears inside JSON text
    with _lock:
        for form in forms:
            if len(form) >= MIN_SECRET and form not in _secrets:
                _secrets.add(form)
        _ordered[:] = sorted(_secrets, key=len, reverse=True)


def register_url(url: str | None) -> None:
    """Register the user and password of a URL (https://user:pass@host/) as secrets."""
    if not url:
        return
    try:
        parts = urlsplit(url)
    except ValueError:
        return
    register_secret(parts.password)
    if parts.username and parts.password is None:  # https://TOKEN@host: the user part is the token
        register_secret(parts.username)


def forget_secrets() -> None:
    """Drop every registered secret (tests)."""
    with _lock:
        _secrets.clear()
        _ordered.clear()


def longest_secret() -> int:
    return len(_ordered[0]) if _ordered else 0


def redact(text: str) -> str:
    """`text` without any secret kit knows and without URL credentials."""
    if not text:
        return text
    for secret in _ordered:
        if secret in text:
            text = text.replace(secret, REDACTED)
    if "@" in text:
        text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)
    return text


def redact_url(url: str) -> str:
    """A URL fit for a message: its user and password replaced (https://<redacted>@host/path)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact(url)
    if "@" not in parts.netloc:
        return redact(url)
    host = parts.netloc.rpartition("@")[2]
    return redact(urlunsplit((parts.scheme, f"{REDACTED}@{host}", parts.path, parts.query, parts.fragment)))


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str, *, newlines: bool = True) -> str:
    """`text` with every control character shown as an escape (`\\x1b`), so nothing a server
    wrote can move the cursor, retitle or clear a terminal, write its clipboard or reorder a
    line. Newlines (and tabs) are kept unless newlines=False: a one-line field then stays one."""
    if newlines:
        text = text.replace("\r\n", "\n")
    return (_UNSAFE if newlines else _UNSAFE_LINE).sub(_escape, text)


def clean(text: str, *, newlines: bool = True) -> str:
    """redact, then terminal_safe: what every printed line gets."""
    return terminal_safe(redact(text), newlines=newlines)


def one_line(text: str, limit: int = 200) -> str:
    """Outside text (an error body, a model id) as one short, safe line of a message."""
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return clean(flat, newlines=False)


def strict(obj: Any) -> Any:
    """A copy of `obj` that json.dumps(allow_nan=False) takes: NaN and ±Infinity become null,
    tuples lists, other objects their str(); every string (keys too) redacted."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, bool) or obj is None or isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {strict(k) if isinstance(k, str) else _key(k): strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    return redact(str(obj))


def _key(key: Any) -> Any:
    if isinstance(key, float) and not math.isfinite(key):
        return str(key)  # json would write NaN as a key anyway; keep it a string
    return key if isinstance(key, (int, float, bool)) or key is None else redact(str(key))


def to_json(obj: Any, *, indent: int | None = 2, sort_keys: bool = False) -> str:
    """Strict, redacted JSON text (control characters escaped as \\u00XX)."""
    return json.dumps(strict(obj), indent=indent, sort_keys=sort_keys, allow_nan=False)


class StreamRedactor:
    """Redact a text that arrives in pieces (a streamed answer): what `feed` returns is safe to
    print at once; the last few characters wait for the next piece (a secret may be cut in
    two), `end` gives them back."""

    def __init__(self, newlines: bool = True) -> None:
        self._held = ""
        self.newlines = newlines

    def feed(self, piece: str) -> str:
        text = self._held + piece
        keep = max(longest_secret() - 1, 0)
        if keep == 0:
            self._held = ""
            return clean(text, newlines=self.newlines)
        text = redact(text)
        cut = max(len(text) - keep, 0)
        # Never release the start of a "<redacted>" we just wrote, or the head of a URL.
        self._held = text[cut:]
        return terminal_safe(text[:cut], newlines=self.newlines)

    def end(self) -> str:
        rest, self._held = self._held, ""
        return clean(rest, newlines=self.newlines)
