"""A small OpenAI-style client for the vLLM server, on kit's one bounded HTTP layer
(kit/net/http.py): each exchange ends within its deadline, every answer is read within a size
cap and checked for the shape kit reads (an HTML page, a JSON list, `choices: []`, a string
where an object belongs, a stream that goes on past --max-tokens: one line naming the URL and
what was wrong, exit 8), and the API key is redacted from whatever the server echoes."""

from __future__ import annotations

import base64
import io
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kit import safeload
from kit.errors import ConfigError, ServerError
from kit.net import http
from kit.safe import text as safetext

UNREACHABLE_HINT = "is the server up (`kit status`, `kit logs --serve`)? from a laptop, use `kit query --tunnel-hint`"
ANSWER_BYTES = 4 * 1024 * 1024  # one JSON answer: /v1/models, a whole (not streamed) completion
STREAM_BYTES = 64 * 1024 * 1024  # one streamed completion, events and all (never held in memory)
ERROR_BYTES = 64 * 1024  # what is read of an error answer
# A streamed completion carries at most one content delta per token; these many more are let
# through (a server that splits a token's text) before the stream counts as endless.
EXTRA_DELTAS = 16


@dataclass(frozen=True)
class ChatResult:
    text: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float
    first_token_s: float | None
    model: str

    @property
    def tokens_per_s(self) -> float | None:
        if not self.completion_tokens or self.latency_s <= 0:
            return None
        return self.completion_tokens / self.latency_s


def read_key(path: str | None) -> str | None:
    """The API key from its file (never from argv or env): a regular file of at most 64 KiB
    holding one word (a FIFO or /dev/zero is refused, not read forever). From then on it is
    redacted from everything kit prints or saves."""
    return safeload.read_secret(path, key="api_key_file") if path else None


def _headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _limits(timeout: float, body_bytes: int = ANSWER_BYTES) -> http.Limits:
    return http.DEFAULT.but(total_s=timeout, connect_s=min(10.0, timeout), body_bytes=body_bytes)


def _raise_for(status: int, snippet: str, url: str) -> None:
    where = safetext.redact_url(url)
    if status == 401:
        raise ServerError(
            f"{where} answered 401 Unauthorized",
            hint="pass the server's key with --api-key-file (or set api_key_file in kit.yaml)",
        )
    if status >= 400:
        raise ServerError(f"{where} answered {status}: {snippet}" if snippet else f"{where} answered {status}")
    if status != 200:
        raise ServerError(f"{where} answered {status}, not 200", hint="is this the OpenAI-style API of a vLLM server?")


class Shape:
    """Checks of an answer's JSON against what kit reads; each failure is one HttpError naming
    the URL and the field."""

    def __init__(self, url: str, what: str) -> None:
        self.where, self.what = safetext.redact_url(url), what

    def bad(self, why: str) -> http.HttpError:
        return http.HttpError(
            f"{self.where} answered 200 with {self.what} kit cannot read: {why}",
            hint="is this the OpenAI-style API of a vLLM server?",
        )

    def obj(self, value: Any, name: str) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.bad(f"{name} is {_kind(value)}, not an object")
        return value

    def items(self, value: Any, name: str, *, empty: bool = True) -> list[Any]:
        if not isinstance(value, list):
            raise self.bad(f"{name} is {_kind(value)}, not a list")
        if not value and not empty:
            raise self.bad(f"{name} is empty")
        return value

    def text(self, value: Any, name: str) -> str | None:
        if value is not None and not isinstance(value, str):
            raise self.bad(f"{name} is {_kind(value)}, not text")
        return value

    def count(self, value: Any, name: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 53:
            raise self.bad(f"{name} is {_kind(value)}, not a token count")
        return value

    def usage(self, value: Any) -> tuple[int | None, int | None]:
        if value is None:
            return None, None
        usage = self.obj(value, "usage")
        return self.count(usage.get("prompt_tokens"), "usage.prompt_tokens"), self.count(
            usage.get("completion_tokens"), "usage.completion_tokens"
        )


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def _get(url: str, key: str | None, timeout: float) -> http.Response:
    response = http.request("GET", url, headers=_headers(key), limits=_limits(timeout), hint=UNREACHABLE_HINT)
    _raise_for(response.status, response.snippet(), url)
    return response


def health(base_url: str, timeout: float = 3) -> bool:
    """GET /health answered 200 within `timeout`."""
    try:
        limits = _limits(timeout, 64 * 1024)
        return http.request("GET", f"{base_url}/health", limits=limits).status == 200
    except http.HttpError:
        return False


def list_models(base_url: str, key: str | None, *, timeout: float = 60) -> list[dict[str, Any]]:
    """GET /v1/models: each served model as {"id": ...}."""
    url = f"{base_url}/v1/models"
    shape = Shape(url, "a model list")
    doc = shape.obj(_get(url, key, timeout).json(), "the answer")
    models = []
    for i, item in enumerate(shape.items(doc.get("data"), "data")):
        entry = shape.obj(item, f"data[{i}]")
        ident = shape.text(entry.get("id"), f"data[{i}].id")
        if not ident:
            raise shape.bad(f"data[{i}] has no id")
        models.append({"id": ident})
    return models


# An image `kit query --image` sends (issue 28): a file becomes a data: URL (the content types
# vLLM's multimodal loader reads, told by the file's first bytes, not its name), at most 20 MiB.
MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_IMAGE_URL = 8192
_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
)


def image_url(source: str) -> str:
    """The `image_url.url` of a content part: an http(s) URL as given (the server fetches it), or
    a local image file as a base64 data: URL."""
    if source.startswith(("http://", "https://")):
        parts = urllib.parse.urlsplit(source)
        if not parts.hostname or parts.username or parts.password or any(c.isspace() for c in source):
            raise ConfigError(
                "is not an http(s) URL with a host (and no credentials or blanks)",
                key="--image",
                hint="pass an image file, or a URL like https://example.org/cat.png",
            )
        if len(source) > MAX_IMAGE_URL:
            raise ConfigError(f"is longer than {MAX_IMAGE_URL} characters", key="--image", hint="pass a shorter URL")
        return source
    try:
        data = safeload.read_bytes(source, max_bytes=MAX_IMAGE_BYTES, what="image file")
    except ConfigError as err:
        raise ConfigError(err.message, key="--image", hint=err.hint) from None
    mime = next((m for magic, m in _IMAGE_MAGIC if data.startswith(magic)), None)
    if mime is None and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        mime = "image/webp"
    if mime is None:
        raise ConfigError(
            f"{source} is not a PNG, JPEG, GIF, WebP or BMP image",
            key="--image",
            hint="pass an image file (or its http(s) URL)",
        )
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def chat_messages(prompt: str, *, system: str | None = None, image: str | None = None) -> list[dict[str, Any]]:
    """The `messages` of a chat completion, as OpenAI's API (and vLLM's) takes them: an optional
    system message, then the user's turn, its text alone or (with an image_url URL) a list of
    content parts, text first."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    if image is None:
        messages.append({"role": "user", "content": prompt})
    else:
        parts = [{"type": "text", "text": prompt}, {"type": "image_url", "image_url": {"url": image}}]
        messages.append({"role": "user", "content": parts})
    return messages


def chat(
    base_url: str,
    key: str | None,
    model: str,
    prompt: str,
    *,
    max_tokens: int,
    temperature: float = 0.0,
    stream: bool = False,
    on_text: Callable[[str], None] | None = None,
    timeout: float = 300,
    system: str | None = None,
    image: str | None = None,
) -> ChatResult:
    """One chat completion, whole or streamed (on_text hears each piece of text); `system` and
    `image` (an image_url URL: image_url()) as chat_messages."""
    url = f"{base_url}/v1/chat/completions"
    body: dict[str, Any] = {
        "model": model,
        "messages": chat_messages(prompt, system=system, image=image),
        "max_tokens": max_tokens,
        "temperature": temperature,
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    start = time.monotonic()
    limits = _limits(timeout, STREAM_BYTES if stream else ANSWER_BYTES)
    exchange = http.open_url("POST", url, headers=_headers(key), json_body=body, limits=limits, hint=UNREACHABLE_HINT)
    try:
        if exchange.status != 200:
            _raise_for(exchange.status, _error_snippet(exchange), url)
        if not stream:
            return _whole(exchange, url, model, start)
        return _streamed(exchange, url, model, start, max_tokens, on_text)
    finally:
        exchange.close()


def _error_snippet(exchange: http.Exchange) -> str:
    """The start of an error answer's body (never all of it: a 500 may go on for ever)."""
    kept = b""
    try:
        for piece in exchange.pieces():
            kept += piece
            if len(kept) >= ERROR_BYTES:
                break
    except http.HttpError:
        pass  # the status says enough
    return http.Response(exchange.url, exchange.status, exchange.headers, kept[:ERROR_BYTES]).snippet()


def _whole(exchange: http.Exchange, url: str, model: str, start: float) -> ChatResult:
    shape = Shape(url, "a chat completion")
    doc = shape.obj(http.decode_json(exchange.read(), url), "the answer")
    choice = shape.obj(shape.items(doc.get("choices"), "choices", empty=False)[0], "choices[0]")
    message = shape.obj(choice.get("message"), "choices[0].message")
    prompt_tokens, completion_tokens = shape.usage(doc.get("usage"))
    return ChatResult(
        text=shape.text(message.get("content"), "choices[0].message.content") or "",
        finish_reason=shape.text(choice.get("finish_reason"), "choices[0].finish_reason"),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        latency_s=time.monotonic() - start,
        first_token_s=None,
        model=shape.text(doc.get("model"), "model") or model,
    )


def _streamed(
    exchange: http.Exchange,
    url: str,
    model: str,
    start: float,
    max_tokens: int,
    on_text: Callable[[str], None] | None,
) -> ChatResult:
    shape = Shape(url, "a stream event")
    reader = http.SSEReader(exchange.limits.line_bytes)
    parts = io.StringIO()  # not a list of deltas: a million tiny ones would cost 50 bytes each
    finish: str | None = None
    usage: tuple[int | None, int | None] = (None, None)
    first: float | None = None
    deltas = 0

    def events() -> Any:
        for piece in exchange.pieces():
            yield from reader.feed(piece)
        yield from reader.end()

    try:
        for payload in events():
            if payload.strip() == "[DONE]":
                break
            event = shape.obj(http.decode_json(payload.encode(), url), "an event")
            if event.get("usage") is not None:
                usage = shape.usage(event.get("usage"))
            for i, item in enumerate(shape.items(event.get("choices", []), "choices")):
                choice = shape.obj(item, f"choices[{i}]")
                delta = shape.obj(choice.get("delta", {}), f"choices[{i}].delta")
                text = shape.text(delta.get("content"), f"choices[{i}].delta.content")
                if text:
                    deltas += 1
                    if deltas > max_tokens + EXTRA_DELTAS:
                        raise http.HttpError(
                            f"{shape.where} streamed more than {max_tokens} tokens' worth of text "
                            f"(--max-tokens {max_tokens}): kit stopped reading",
                            hint="is this a vLLM server? it honours max_tokens",
                        )
                    if first is None:
                        first = time.monotonic() - start
                    parts.write(text)
                    if on_text:
                        on_text(text)
                finish = shape.text(choice.get("finish_reason"), f"choices[{i}].finish_reason") or finish
    except http.ProtocolError as exc:  # from the SSE reader
        raise http.HttpError(f"{shape.where} {exc}") from None
    return ChatResult(
        text=parts.getvalue(),
        finish_reason=finish,
        prompt_tokens=usage[0],
        completion_tokens=usage[1],
        latency_s=time.monotonic() - start,
        first_token_s=first,
        model=model,
    )
