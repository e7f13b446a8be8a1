"""`kit query --system ... --image FILE|URL` (issue 28): the request the guides' curl calls send, an
OpenAI chat completion with a system message and image_url content parts, checked against a real
loopback HTTP server that validates the body the way vLLM's OpenAI schema reads it (the tiny CPU
model in the integration tests need not understand a picture)."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kit.net.openai import MAX_IMAGE_BYTES, chat_messages
from tests.conftest import run_kit

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + b"\x00" * 17  # enough of a PNG to be told by its bytes


def valid_chat(body: dict[str, Any]) -> str | None:
    """Why the body is not an OpenAI chat completion request with these parts, or None."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "no messages"
    for message in messages:
        if message.get("role") not in ("system", "user", "assistant"):
            return f"bad role {message.get('role')!r}"
        content = message.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            return "content is neither text nor parts"
        for part in content:
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("text"), str):
                continue
            if kind == "image_url" and isinstance(part.get("image_url", {}).get("url"), str):
                continue
            return f"bad content part {part!r}"[:200]
    return None


@pytest.fixture
def server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    bodies: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def reply(self, status: int, doc: dict[str, Any]) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self.reply(200, {"data": [{"id": "tiny"}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            problem = valid_chat(body)
            if problem:
                self.reply(400, {"error": {"message": problem}})
                return
            answer = {"message": {"role": "assistant", "content": "a cat"}, "finish_reason": "stop"}
            self.reply(200, {"model": body["model"], "choices": [answer], "usage": {"completion_tokens": 2}})

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", bodies
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_system_message_and_image_file_go_as_openai_content_parts(
    server: tuple[str, list[dict[str, Any]]], kit_env: Path
) -> None:
    url, bodies = server
    image = kit_env / "cat.png"
    image.write_bytes(PNG)
    args = ["query", "--url", url, "--json", "--system", "Answer in French.\nBe brief.", "--image", str(image)]
    code, out, err = run_kit([*args, "--prompt", "What is in this picture?"])
    assert code == 0, err
    doc = json.loads(out)["result"]
    assert doc["answer"] == "a cat" and doc["system"].startswith("Answer in French") and doc["image"] == str(image)
    [body] = bodies
    assert body["messages"][0] == {"role": "system", "content": "Answer in French.\nBe brief."}
    text, picture = body["messages"][1]["content"]
    assert body["messages"][1]["role"] == "user" and text == {"type": "text", "text": "What is in this picture?"}
    assert picture["type"] == "image_url"
    prefix = "data:image/png;base64,"
    assert picture["image_url"]["url"].startswith(prefix)
    assert base64.b64decode(picture["image_url"]["url"][len(prefix) :]) == PNG
    assert "base64" not in out  # the result names the file; its bytes are not repeated


def test_an_image_url_is_passed_for_the_server_to_fetch(
    server: tuple[str, list[dict[str, Any]]], kit_env: Path
) -> None:
    url, bodies = server
    picture = "https://example.org/images/cat.jpg?size=large"
    code, _, err = run_kit(["query", "--url", url, "--image", picture, "--prompt", "Describe it."])
    assert code == 0, err
    [body] = bodies
    assert body["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Describe it."}, {"type": "image_url", "image_url": {"url": picture}}],
        }
    ]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: (d / "notes.txt").write_text("not a picture") and str(d / "notes.txt"), "is not a PNG, JPEG"),
        (lambda d: str(d / "missing.png"), "cannot read image file"),
        (lambda d: "https://user:pw@example.org/cat.png", "no credentials"),
        (lambda d: str(d), "is not a regular file"),
    ],
)
def test_a_bad_image_is_refused_before_any_request(
    make: Any, message: str, server: tuple[str, list[dict[str, Any]]], kit_env: Path
) -> None:
    url, bodies = server
    code, out, err = run_kit(["query", "--url", url, "--image", make(kit_env)])
    assert code == 3 and message in err and "--image" in err and out == "", err
    assert bodies == []


def test_an_image_past_the_bound_is_refused(kit_env: Path) -> None:
    big = kit_env / "big.png"
    with big.open("wb") as handle:
        handle.write(PNG)
        handle.truncate(MAX_IMAGE_BYTES + 1)
    code, _, err = run_kit(["query", "--url", "http://127.0.0.1:9", "--image", str(big)])
    assert code == 3 and "more than the" in err, err


def test_text_only_queries_keep_the_plain_shape() -> None:
    assert chat_messages("hi") == [{"role": "user", "content": "hi"}]
    assert chat_messages("hi", system="s")[0] == {"role": "system", "content": "s"}
