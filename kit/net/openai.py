"""A small OpenAI-style HTTP client for the vLLM server (requests imported lazily)."""

from __future__ import annotations

import base64
import json
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from kit import safeload
from kit.errors import ConfigError, KitError, ServerError


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
    """The API key from its file (never from argv or env): a regular file of at most 64 KiB,
    so a FIFO or /dev/zero given by mistake is refused instead of read forever."""
    if not path:
        return None
    try:
        key = safeload.read_text(path, max_bytes=64 * 1024, what="API key file").strip()
    except ConfigError as err:
        raise ConfigError(err.message, key="api_key_file", hint=err.hint or "pass a readable file") from None
    if not key:
        raise ConfigError(f"{path} is empty", key="api_key_file", hint="write the key into the file")
    if any(c.isspace() for c in key) or not key.isprintable():
        raise ConfigError(
            f"{path} holds more than one word", key="api_key_file", hint="write only the key into the file"
        )
    return key


def _headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _raise_for(resp: Any, url: str) -> None:
    if resp.status_code == 401:
        raise ServerError(
            f"{url} answered 401 Unauthorized",
            hint="pass the server's key with --api-key-file (or set api_key_file in kit.yaml)",
        )
    if resp.status_code >= 400:
        body = resp.text.strip().replace("\n", " ")[:300]
        raise ServerError(f"{url} answered {resp.status_code}: {body}")


def _request(method: str, url: str, **kwargs: Any) -> Any:
    import requests

    try:
        return requests.request(method, url, timeout=kwargs.pop("timeout", 60), **kwargs)
    except requests.exceptions.RequestException as exc:
        raise ServerError(
            f"cannot reach {url}: {type(exc).__name__}",
            hint="is the server up (`kit status`, `kit logs --serve`)? from a laptop, use `kit query --tunnel-hint`",
        ) from None


def health(base_url: str, timeout: float = 3) -> bool:
    import requests

    try:
        return bool(requests.get(f"{base_url}/health", timeout=timeout).status_code == 200)
    except requests.exceptions.RequestException:
        return False


def list_models(base_url: str, key: str | None) -> list[dict[str, Any]]:
    url = f"{base_url}/v1/models"
    resp = _request("GET", url, headers=_headers(key))
    _raise_for(resp, url)
    data: list[dict[str, Any]] = resp.json().get("data", [])
    return data


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
    on_text: Any = None,
    timeout: float = 300,
    system: str | None = None,
    image: str | None = None,
) -> ChatResult:
    """One chat completion; `system` and `image` (an image_url URL: image_url()) as chat_messages."""
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
    resp = _request("POST", url, headers=_headers(key), json=body, stream=stream, timeout=timeout)
    _raise_for(resp, url)
    if not stream:
        doc = resp.json()
        choice = doc["choices"][0]
        usage = doc.get("usage") or {}
        return ChatResult(
            text=choice["message"].get("content") or "",
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            latency_s=time.monotonic() - start,
            first_token_s=None,
            model=doc.get("model", model),
        )
    parts: list[str] = []
    finish = None
    usage = {}
    first = None
    for raw in resp.iter_lines():
        line = raw.decode() if isinstance(raw, bytes) else raw
        if not line.startswith("data: "):
            continue
        payload = line[len("data: ") :]
        if payload.strip() == "[DONE]":
            break
        try:
            event = json.loads(payload)
        except ValueError as exc:
            raise KitError(f"unreadable stream event from {url}: {payload[:80]}") from exc
        if event.get("usage"):
            usage = event["usage"]
        for choice in event.get("choices", []):
            delta = choice.get("delta", {}).get("content")
            if delta:
                if first is None:
                    first = time.monotonic() - start
                parts.append(delta)
                if on_text:
                    on_text(delta)
            finish = choice.get("finish_reason") or finish
    return ChatResult(
        text="".join(parts),
        finish_reason=finish,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        latency_s=time.monotonic() - start,
        first_token_s=first,
        model=model,
    )
