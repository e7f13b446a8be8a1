"""`kit query`: list the server's models and send a chat completion."""

from __future__ import annotations

import getpass
import urllib.parse
from dataclasses import dataclass
from typing import Any

import click

from kit.cluster import Cluster
from kit.cluster.running import key_hint
from kit.commands._options import cluster_overrides, config_options, json_option
from kit.commands._params import Count, KitCommand, Number, Url, readable
from kit.errors import UsageError
from kit.net import openai as client
from kit.output import emit, out, warn
from kit.render import shell_words
from kit.safe import text as safetext


def tunnel_argv(
    url: str, login_host: str | None, user: str | None = None, *, ssh_port: int = 22
) -> tuple[list[str], int]:
    """The SSH port-forward that reaches the server at `url` from a laptop, and the local port;
    `login_host` may name its user (USER@HOST), and `ssh_port` its SSH port."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise UsageError(
            f"--url {url!r} is not a URL with a valid port", hint="pass it like http://HOST:8000"
        ) from None
    host = parts.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"  # IPv6 in ssh -L
    login = login_host or "LOGIN_HOST"
    destination = login if "@" in login else f"{user or getpass.getuser()}@{login}"
    options = ["-p", str(ssh_port)] if ssh_port != 22 else []
    return ["ssh", "-N", *options, "-L", f"{port}:{host}:{port}", destination], port


def tunnel_hint(url: str, login_host: str | None, user: str | None = None, *, ssh_port: int = 22) -> str:
    """The tunnel as lines to paste: every word of the command shell-quoted (its host, login host
    and user come from flags and the environment); the comment line holds only the port number."""
    argv, port = tunnel_argv(url, login_host, user, ssh_port=ssh_port)
    return f"{shell_words(argv)}\n# then, on the laptop: kit query --url http://127.0.0.1:{port}"


@click.command(name="query", cls=KitCommand, free_text=("prompt", "system"))
@click.option("--url", type=Url(), help="Server URL (default: the head of the cluster, port ports.api).")
@click.option("--api-key-file", type=click.Path(dir_okay=False), help="File holding the API key.")
@click.option("--model", help="Model name to ask (default: the first one the server lists).")
@click.option("--prompt", "-p", default="Say hello in one short sentence.", show_default=True)
@click.option("--system", "-s", help="A system message before the prompt.")
@click.option(
    "--image",
    metavar="FILE|URL",
    help="An image with the prompt (OpenAI image_url content part): a file (sent as a data: URL) or an http(s) URL.",
)
@click.option("--max-tokens", type=Count(1, 10_000_000), default=32, show_default=True)
@click.option("--temperature", type=Number(0), default=0.0, show_default=True)
@click.option("--stream", is_flag=True, help="Stream the answer as it is generated.")
@click.option(
    "--timeout",
    type=Number(0, 7 * 86400, above=True),
    default=300,
    show_default=True,
    help="Seconds each request may take, answer included (kit ends within this plus a few seconds).",
)
@click.option("--tunnel-hint", "tunnel", is_flag=True, help="Only print the SSH port-forward to reach the server.")
@click.option("--login-host", help="[USER@]HOST of the login node for --tunnel-hint (config: tunnel.login_host).")
@click.option("--ssh-port", type=Count(1, 65535), help="Its SSH port (config: tunnel.ssh_port).")
@config_options
@json_option
def command(
    url: str | None,
    api_key_file: str | None,
    model: str | None,
    prompt: str,
    system: str | None,
    image: str | None,
    max_tokens: int,
    temperature: float,
    stream: bool,
    timeout: float,
    tunnel: bool,
    login_host: str | None,
    ssh_port: int | None,
    config_path: str | None,
    cluster: str | None,
    set_values: tuple[str, ...],
    as_json: bool,
) -> None:
    """List models (/v1/models) and send one chat completion (/v1/chat/completions); print the
    answer, latency and tokens/s.

    It asks the cluster that runs at the port and with the key file it was started with (its
    labels and kit's record), so `kit query --cluster demo` works from any folder.

    \b
    Examples:
      kit query
      kit query --cluster demo
      kit query --prompt "What is NCCL?" --max-tokens 64 --stream
      kit query --system "Answer in French." --prompt "What is in this picture?" --image cat.png
      kit query --url http://127.0.0.1:8000 --api-key-file ~/.kit/api_key
      kit query --tunnel-hint --login-host login.cluster.example --ssh-port 2222
    """
    readable(api_key_file, "--api-key-file")
    picture = client.image_url(image) if image else None  # read and checked before any request
    target = Cluster.find(config_path, cluster_overrides(cluster, set_values))
    running = target.running()
    operated = target.operated(running)  # the cluster's port, served name and key file (issue 25)
    config = operated.config
    warn([d.line(target.name) for d in target.drift(running)], as_json=as_json)
    base = (url or target.url(list(running.nodes))).rstrip("/")
    if tunnel:
        login = login_host or config.tunnel.login_host
        port = ssh_port or config.tunnel.ssh_port
        emit(Tunnel(base, login, port), as_json=as_json)
        return
    key_file = api_key_file or config.api_key_file
    key = client.read_key(key_file)
    with key_hint(
        None if url else target.name,
        key_file,
        "flag --api-key-file" if api_key_file else operated.sources["api_key_file"],
    ):
        models = client.list_models(base, key, timeout=timeout)
    name = model or (models[0]["id"] if models else config.served_name)
    # What the server streams is printed as it comes, secrets and control characters out (a
    # secret cut between two pieces too: the redactor holds back a few characters).
    shown = safetext.StreamRedactor()

    def show(delta: str) -> None:
        if not as_json:
            out(shown.feed(delta), nl=False, raw=True)  # the redactor made it safe

    answer = client.chat(
        base,
        key,
        name,
        prompt,
        max_tokens=max_tokens,
        temperature=temperature,
        stream=stream,
        on_text=show,
        timeout=timeout,
        system=system,
        image=picture,
    )
    if stream and not as_json:
        out(shown.end(), raw=True)
    asked = Asked(base, [m["id"] for m in models], name, prompt, system, image, answer, streamed=stream)
    emit(asked, as_json=as_json)


@dataclass(frozen=True)
class Tunnel:
    """`kit query --tunnel-hint`: the SSH port-forward that reaches the server at `url`."""

    url: str
    login_host: str | None
    ssh_port: int
    command = "query"

    def to_dict(self) -> dict[str, Any]:
        argv, _ = tunnel_argv(self.url, self.login_host, ssh_port=self.ssh_port)
        return {"url": self.url, "tunnel": shell_words(argv)}

    def text(self) -> str:
        return tunnel_hint(self.url, self.login_host, ssh_port=self.ssh_port)


@dataclass(frozen=True)
class Asked:
    """`kit query`: the server's models, the question and the chat completion's answer."""

    url: str
    models: list[str]
    model: str
    prompt: str
    system: str | None
    image: str | None  # as given: a file's content is not repeated
    answer: client.ChatResult
    streamed: bool = False  # the answer was printed as it came
    command = "query"

    def to_dict(self) -> dict[str, Any]:
        a = self.answer
        return {
            "url": self.url,
            "models": self.models,
            "model": self.model,
            "prompt": self.prompt,
            "system": self.system,
            "image": self.image,
            "answer": a.text,
            "finish_reason": a.finish_reason,
            "usage": {"prompt_tokens": a.prompt_tokens, "completion_tokens": a.completion_tokens},
            "latency_s": round(a.latency_s, 3),
            "first_token_s": None if a.first_token_s is None else round(a.first_token_s, 3),
            "tokens_per_s": None if a.tokens_per_s is None else round(a.tokens_per_s, 1),
        }

    def text(self) -> str:
        """The server's words (model ids, finish reason) one line each (kit's printer makes the
        whole of it terminal-safe and redacted)."""
        r = self.to_dict()
        models = ", ".join(safetext.one_line(m, 120) for m in self.models)
        lines = [f"models at {self.url}: {models or '(none)'}"]
        if not self.streamed:
            lines += [f"> {self.prompt}", r["answer"]]
        rate = f"{r['tokens_per_s']} tokens/s" if r["tokens_per_s"] is not None else "- tokens/s"
        finish = safetext.one_line(str(r["finish_reason"]), 40)
        lines.append(
            f"[{safetext.one_line(self.model, 120)}: finish_reason={finish}, {r['usage']['completion_tokens']} tokens, "
            f"{r['latency_s']} s, {rate}]"
        )
        return "\n".join(lines)
