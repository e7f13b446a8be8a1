"""A small OpenAI-style HTTP client for the vLLM server (requests imported lazily)."""

from __future__ import annotations

import json
import time
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
) -> ChatResult:
    url = f"{base_url}/v1/chat/completions"
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
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
