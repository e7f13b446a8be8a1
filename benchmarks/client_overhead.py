"""How much of a measured TTFT / ITL is the benchmark client itself (issue 21)?

A loopback server with a known truth: it streams OpenAI chat completions the way vLLM does
(headers at once; after --ttft-ms the role chunk and the first token back to back; then a token
every --itl-ms; the last token, the usage chunk, `data: [DONE]`), each request on its own
schedule counted from the moment the server read it, and it logs when it really sent each
chunk. The same load then goes to each client, one at a time, in rotating order, --rounds times:

- `new`: kit's runner (kit/bench/runner.py, the asyncio client);
- `old`: kit's runner as it was on --old-ref (the `requests` thread-per-request client),
  loaded from `git show REF:kit/bench/runner.py` into a temporary module;
- `vllm`: `vllm bench serve --backend openai-chat` from the CPU engine image (`docker run
  --network host`; the tiny model's tokenizer from kit demo's HF cache, read-only);
- `aiohttp`, `httpx` (with --candidates, where installed): kit's runner with its HTTP exchange
  swapped for that library's, timed where that library hands the bytes over; how the client
  was chosen;
- `new-read` (name it in --clients): kit's client stamping a piece when its read callback runs
  instead of when the event loop's wait returned (Runner.stamp_at_select = False).

Every client reports, per request, its start time, TTFT and ITLs. Per client and concurrency
the script prints the measured minus the scheduled TTFT and ITL (p50, p99 over every request
of every round), and the same against the times the server really sent (the server's own
lateness taken out: the client's share alone), with ratios to vLLM's. Clients and server use
time.perf_counter(), CLOCK_MONOTONIC on Linux, one clock for every process on the host and in
its containers, so requests are matched to the server's log exactly (kit's by prompt, vLLM's by
the request number the server writes into the first token).

Loopback only. Not a test: run it and read the table.

    python benchmarks/client_overhead.py [--rounds 3] [--concurrency 1,16,128] [--ttft-ms 50]
        [--itl-ms 20] [--output-len 32] [--clients new,old,vllm] [--candidates]
        [--image IMAGE (default: the demo's)] [--tokenizer DIR] [--json] [--out FILE]
"""

from __future__ import annotations

import argparse
import heapq
import importlib.util
import itertools
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from _images import default_image, require_image

MODEL = "tiny"

# ---------------------------------------------------------------- the server with a known truth


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _event(doc: dict[str, Any] | str) -> bytes:
    return _chunk(b"data: " + (doc if isinstance(doc, str) else json.dumps(doc)).encode() + b"\n\n")


def _answer(code: int, doc: Any) -> bytes:
    body = json.dumps(doc).encode()
    head = f"HTTP/1.1 {code} OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class Stream:
    """One request's answer: its chunks, when each is due, and when each really went out."""

    __slots__ = ("conn", "due", "k", "payloads", "sent")

    def __init__(self, conn: socket.socket, due: list[float], payloads: list[bytes], sent: list[float]) -> None:
        self.conn, self.due, self.payloads, self.sent, self.k = conn, due, payloads, sent, 0


class TruthServer:
    """One thread reads requests, one sends every chunk at its time (a heap of streams, each
    re-queued for its next chunk; precise sleeps: asyncio's timers fire up to a millisecond
    late, epoll's timeout being in ms). Both threads ask for real-time scheduling where allowed
    (root), so a busy 2-core host delays the truth less; `late` in the log shows what is left."""

    def __init__(self, port: int, ttft_s: float, itl_s: float) -> None:
        self.ttft_s, self.itl_s = ttft_s, itl_s
        self.listener = socket.create_server(("127.0.0.1", port), backlog=1024)
        self.port = self.listener.getsockname()[1]
        self.heap: list[tuple[float, int, Stream]] = []
        self.seq = itertools.count()
        self.cv = threading.Condition()
        self.log: list[dict[str, Any]] = []
        self.rid = itertools.count(1)
        self.closed: set[socket.socket] = set()
        self.realtime = False
        # The fields and sizes of vLLM 0.32's chunks (~220 bytes), as its server sends them.
        base = {"id": "chatcmpl-925ad7fb1b060773", "object": "chat.completion.chunk", "created": 1795636294}
        base["model"] = MODEL

        def choice(delta: dict[str, str], **more: Any) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **more}]}

        extra = {"prompt_token_ids": None, "prompt_text": None}
        self.role = _event({**choice({"role": "assistant", "content": ""}), **extra})
        self.word = _event(choice({"content": " w"}, token_ids=None))
        first = choice({"content": "r%d"}, token_ids=None)
        self.first = b"data: " + json.dumps(first).encode() + b"\n\n"  # framed per request, with its number
        self.base = base

    def _realtime(self) -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))  # this thread only (Linux)
            self.realtime = True
        except (AttributeError, OSError):
            pass

    def serve_forever(self) -> None:
        sys.setswitchinterval(0.0002)  # the sender gets the GIL back soon after its sleep
        threading.Thread(target=self._sender, daemon=True).start()
        sel = selectors.DefaultSelector()
        self.listener.setblocking(False)
        sel.register(self.listener, selectors.EVENT_READ, None)
        buffers: dict[socket.socket, bytearray] = {}
        while True:
            arrived: list[tuple[socket.socket, bytes, float]] = []
            for key, _ in sel.select():  # read (and stamp) every ready socket first, then answer
                if key.fileobj is self.listener:
                    conn, _addr = self.listener.accept()
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    conn.setblocking(True)
                    sel.register(conn, selectors.EVENT_READ, None)
                    buffers[conn] = bytearray()
                    continue
                conn = key.fileobj  # type: ignore[assignment]
                try:
                    data = conn.recv(65536)
                except OSError:
                    data = b""
                arrived.append((conn, data, time.perf_counter()))
            for conn, data, now in arrived:
                if not data:
                    sel.unregister(conn)
                    with self.cv:
                        self.closed.add(conn)
                    conn.close()
                    del buffers[conn]
                    continue
                buf = buffers[conn]
                buf += data
                while (request := self._take_request(buf)) is not None:
                    self._handle(conn, *request, now)

    @staticmethod
    def _take_request(buf: bytearray) -> tuple[str, bytes] | None:
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = bytes(buf[:end]).decode("latin-1")
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if len(buf) < end + 4 + length:
            return None
        body = bytes(buf[end + 4 : end + 4 + length])
        del buf[: end + 4 + length]
        return head.split("\r\n")[0], body

    def _queue(self, stream: Stream) -> None:
        heapq.heappush(self.heap, (stream.due[stream.k], next(self.seq), stream))

    def _handle(self, conn: socket.socket, request_line: str, body: bytes, now: float) -> None:
        method, path = request_line.split(" ")[:2]
        if method == "GET":
            with self.cv:
                if path == "/_log":
                    doc: Any = self.log
                    self.log = []
                else:
                    doc = {"data": [{"id": MODEL, "root": MODEL}]}
            stream = Stream(conn, [now], [_answer(200, doc)], [0.0])
        else:
            stream = self._stream(conn, json.loads(body), now)
        with self.cv:
            self._queue(stream)
            self.cv.notify()

    def _stream(self, conn: socket.socket, req: dict[str, Any], now: float) -> Stream:
        """Headers at once; the role chunk and the first token after ttft (vLLM sends both when
        prefill ends); a token every itl after that; usage and [DONE] with the last one."""
        n = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
        content = req["messages"][0]["content"]
        text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)
        rid = next(self.rid)
        first = now + self.ttft_s
        usage = {"prompt_tokens": len(text.split()), "completion_tokens": n, "total_tokens": n + len(text.split())}
        tail = _event({**self.base, "choices": [], "usage": usage}) + _event("[DONE]") + b"0\r\n\r\n"
        tokens = [_chunk(self.first.replace(b"r%d", f"r{rid}".encode()))] + [self.word] * (n - 1)
        tokens[-1] += tail
        # sent[0]: the head (at once), sent[1]: the role chunk, sent[1 + k]: token k
        sent = [0.0] * (n + 2)
        due = [now, first, first] + [first + (k - 1) * self.itl_s for k in range(2, n + 1)]
        with self.cv:
            self.log.append({"rid": rid, "key": text[:200], "t_req": now, "sent": sent})
        return Stream(conn, due, [STREAM_HEAD, self.role, *tokens], sent)

    def _sender(self) -> None:
        self._realtime()
        while True:
            with self.cv:
                while True:
                    if self.heap:
                        wait = self.heap[0][0] - time.perf_counter()
                        if wait <= 0:
                            break
                        self.cv.wait(wait)
                    else:
                        self.cv.wait()
                _due, _seq, stream = heapq.heappop(self.heap)
                if stream.conn in self.closed:
                    continue
            k = stream.k
            at = time.perf_counter()
            try:
                stream.conn.sendall(stream.payloads[k])
            except OSError:
                continue
            stream.sent[k] = at
            stream.k += 1
            if stream.k < len(stream.payloads):
                with self.cv:
                    self._queue(stream)


def get_log(port: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_log", timeout=30) as resp:
        log: list[dict[str, Any]] = json.loads(resp.read())
    return log


# ---------------------------------------------------------------- the clients (each in its own process)


def load_old_runner(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("kit_old_runner", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def candidate_runner(kind: str) -> Any:
    """kit's runner with its HTTP exchange done by aiohttp or httpx: the clock started just
    before the library is asked to send, each chunk stamped when the library hands it over."""
    from kit.bench import runner as kit_runner

    class LibraryRunner(kit_runner.Runner):
        session: Any = None

        async def _send_all(self, *args: Any) -> float:
            if kind == "aiohttp":
                import aiohttp

                connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, force_close=False)
                self.session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=3600))
            else:
                import httpx

                limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
                self.session = httpx.AsyncClient(limits=limits, timeout=None)
            try:
                result: float = await super()._send_all(*args)
                return result
            finally:
                await (self.session.close() if kind == "aiohttp" else self.session.aclose())

        async def _exchange(self, record: Any, prompt: Any, arrival: float) -> None:
            body = kit_runner.request_body(self.target, prompt)
            url = f"{self.target.base_url}/v1/chat/completions"
            sse = kit_runner.SSEBuffer()
            record.start = time.perf_counter()
            record.queue_time = record.start - arrival
            last = record.start
            if kind == "aiohttp":
                async with self.session.post(url, json=body, headers=self._headers) as resp:
                    record.status = resp.status
                    async for piece in resp.content.iter_any():
                        now = time.perf_counter()
                        for message in sse.add(piece):
                            last = kit_runner.apply_message(record, message, now, last)
            else:
                async with self.session.stream("POST", url, json=body, headers=self._headers) as resp:
                    record.status = resp.status_code
                    async for piece in resp.aiter_raw():
                        now = time.perf_counter()
                        for message in sse.add(piece):
                            last = kit_runner.apply_message(record, message, now, last)
            record.success = record.chunks > 0
            record.latency = last - record.start

    return LibraryRunner


def client_main(args: argparse.Namespace) -> None:
    """--client NAME: warm up with one request as `kit bench` does, run the load, print the
    per-request timelines as JSON."""
    from kit.bench import dataset
    from kit.bench.schedule import LoadPoint

    if args.client == "old":
        module = load_old_runner(args.old_runner)
        runner_cls, target_cls = module.Runner, module.Target
    else:
        from kit.bench.runner import Runner, Target

        if args.client == "new-read":  # kit's client, stamping when the read callback runs
            runner_cls = type("ReadStampRunner", (Runner,), {"stamp_at_select": False})
        else:
            runner_cls = Runner if args.client == "new" else candidate_runner(args.client)
        target_cls = Target
    prompts = dataset.fixed(args.n, args.input_len, args.output_len)
    runner = runner_cls(target_cls(args.url, MODEL))
    runner.run(prompts[:1], LoadPoint(float("inf"), 1))
    run = runner.run(prompts, LoadPoint(float("inf"), args.c))
    keys = [p.messages[0]["content"][:200] for p in prompts]
    out = [
        {"key": keys[r.index], "ok": r.success, "start": r.start, "ttft": r.ttft, "itl": r.itl, "error": r.error}
        for r in run.records
    ]
    print(json.dumps({"records": out, "duration": run.duration, "stopped": run.stopped}))


# ---------------------------------------------------------------- driving a round


def run_kit_client(args: argparse.Namespace, name: str, c: int, n: int, old_runner: str) -> list[dict[str, Any]]:
    argv = [sys.executable, __file__, "--client", name, "--url", f"http://127.0.0.1:{args.port}"]
    argv += ["-n", str(n), "-c", str(c), "--input-len", str(args.input_len), "--output-len", str(args.output_len)]
    argv += ["--old-runner", old_runner]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"client {name} failed: {proc.stderr.strip()[-1500:]}")
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    records: list[dict[str, Any]] = doc["records"]
    return records


def run_vllm(args: argparse.Namespace, c: int, n: int, data_dir: Path, tokenizer: Path) -> list[dict[str, Any]]:
    name = f"kit-overhead-vllm-{os.getpid()}"
    argv = ["docker", "run", "--rm", "--name", name, "--label", "kit.bench=client-overhead", "--network", "host"]
    argv += ["-v", f"{data_dir}:/data", "-v", f"{tokenizer}:/tokenizer:ro", "-e", "HF_HUB_OFFLINE=1"]
    argv += ["--entrypoint", "vllm", args.image, "bench", "serve", "--backend", "openai-chat"]
    argv += ["--base-url", f"http://127.0.0.1:{args.port}", "--endpoint", "/v1/chat/completions"]
    argv += ["--model", MODEL, "--tokenizer", "/tokenizer", "--dataset-name", "sharegpt"]
    argv += ["--dataset-path", "/data/data.json", "--sharegpt-output-len", str(args.output_len)]
    argv += ["--num-prompts", str(n), "--max-concurrency", str(c), "--request-rate", "inf", "--ignore-eos"]
    argv += ["--num-warmups", "0", "--disable-tqdm", "--save-result", "--save-detailed", "--result-dir", "/data"]
    argv += ["--result-filename", "vllm.json"]
    result = data_dir / "vllm.json"
    result.unlink(missing_ok=True)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    if proc.returncode != 0:
        sys.exit(f"vllm bench serve failed: {(proc.stdout + proc.stderr).strip()[-2000:]}")
    doc = json.loads(result.read_text())
    out = []
    for i, text in enumerate(doc["generated_texts"]):
        rid = int(text.split()[0][1:]) if text.startswith("r") else None
        out.append(
            {
                "rid": rid,
                "ok": not doc["errors"][i],
                "start": doc["start_times"][i],
                "ttft": doc["ttfts"][i],
                "itl": doc["itls"][i],
                "error": doc["errors"][i],
            }
        )
    return out


KEYS = ("ttft_sched", "itl_sched", "ttft_true", "itl_true", "to_server", "to_stamp", "late")


def overheads(records: list[dict[str, Any]], log: list[dict[str, Any]], ttft: float, itl: float) -> dict[str, Any]:
    """Per matched request, in ms: measured minus scheduled TTFT and ITL; the same minus what
    the server really did (its lateness out); the request's way from the client's clock start
    to the server reading it; each chunk's way from the server's send to the client's stamp;
    and the server's lateness against its schedule."""
    by_rid = {e["rid"]: e for e in log}
    by_key: dict[str, list[dict[str, Any]]] = {}
    for e in log:
        by_key.setdefault(e["key"], []).append(e)
    out: dict[str, list[float]] = {k: [] for k in KEYS}
    unmatched = failed = 0
    for r in records:
        if not r["ok"]:
            failed += 1
            continue
        if r.get("rid") is not None:
            entry = by_rid.get(r["rid"])
        else:  # the server read the request after the client sent it: the first such entry
            entries = [e for e in by_key.get(r["key"], []) if e["t_req"] >= r["start"]]
            entry = min(entries, key=lambda e: e["t_req"]) if entries else None
        sent = entry["sent"][1:] if entry else []  # [role chunk, token 1, ..., token n]
        if entry is None or len(r["itl"]) != len(sent) - 1 or not all(sent):
            unmatched += 1
            continue
        t_req = entry["t_req"]
        out["ttft_sched"].append((r["ttft"] - ttft) * 1e3)
        out["ttft_true"].append((r["ttft"] - (sent[0] - t_req)) * 1e3)
        out["to_server"].append((t_req - r["start"]) * 1e3)
        stamp = r["start"] + r["ttft"]
        out["to_stamp"].append((stamp - sent[0]) * 1e3)
        out["late"].append((sent[0] - t_req - ttft) * 1e3)
        for k, gap in enumerate(r["itl"], 1):
            scheduled = 0.0 if k == 1 else itl
            stamp += gap
            out["itl_sched"].append((gap - scheduled) * 1e3)
            out["itl_true"].append((gap - (sent[k] - sent[k - 1])) * 1e3)
            out["to_stamp"].append((stamp - sent[k]) * 1e3)
            out["late"].append((sent[k] - t_req - ttft - max(k - 1, 0) * itl) * 1e3)
    return {**out, "unmatched": unmatched, "failed": failed, "requests": len(records)}


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def find_tokenizer() -> Path | None:
    state = Path(os.environ.get("KIT_STATE_DIR") or Path.home() / ".local/state/kit")
    found = sorted((state / "demo-hf").glob("hub/models--kit--tiny-llama/snapshots/*/tokenizer.json"))
    return found[0].parent if found else None


def write_dataset(path: Path, n: int, input_len: int, output_len: int) -> None:
    """vLLM's side reads the same prompts kit's clients send, as ShareGPT."""
    from kit.bench import dataset

    entries = [
        {"conversations": [{"from": "human", "value": p.messages[0]["content"]}, {"from": "gpt", "value": "ok"}]}
        for p in dataset.fixed(n, input_len, output_len)
    ]
    path.write_text(json.dumps(entries))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", default="1,16,128")
    parser.add_argument("--requests", type=int, default=0, help="per run (default: max(16, 2 x concurrency))")
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=20.0)
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--clients", default="new,old,vllm")
    parser.add_argument("--candidates", action="store_true", help="also aiohttp and httpx inside kit's runner")
    parser.add_argument("--old-ref", default="main", help="git ref of the old runner")
    parser.add_argument("--image", default=default_image())
    parser.add_argument("--tokenizer", type=Path, help="tokenizer dir for vLLM (default: kit demo's tiny model)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path)
    # internal: the server and the clients run in processes of their own
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("-n", type=int, default=16, help=argparse.SUPPRESS)
    parser.add_argument("-c", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--old-runner", help=argparse.SUPPRESS)
    args = parser.parse_args()
    require_image(args.image)
    if args.serve:
        server = TruthServer(args.port, args.ttft_ms / 1e3, args.itl_ms / 1e3)
        server._realtime()
        print(server.port, int(server.realtime), flush=True)
        server.serve_forever()
        return
    if args.client:
        client_main(args)
        return

    clients = [c for c in args.clients.split(",") if c]
    if args.candidates:
        clients += [c for c in ("aiohttp", "httpx") if importlib.util.find_spec(c) and c not in clients]
    tokenizer = args.tokenizer or find_tokenizer()
    if "vllm" in clients and tokenizer is None:
        sys.exit("no tokenizer for vLLM: run `kit demo --prepare-only` or pass --tokenizer DIR")
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    ttft, itl = args.ttft_ms / 1e3, args.itl_ms / 1e3
    serve_argv = [sys.executable, __file__, "--serve", "--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms)]
    server = subprocess.Popen(serve_argv, stdout=subprocess.PIPE, text=True)
    results: dict[str, dict[int, dict[str, Any]]] = {c: {} for c in clients}
    try:
        assert server.stdout is not None
        port, realtime = server.stdout.readline().split()
        args.port, args.realtime = int(port), realtime == "1"
        with tempfile.TemporaryDirectory(prefix="kit-overhead-") as tmp:
            old_runner = Path(tmp) / "kit_old_runner.py"
            source = subprocess.run(
                ["git", "show", f"{args.old_ref}:kit/bench/runner.py"], capture_output=True, text=True, check=True
            ).stdout
            old_runner.write_text(source)
            for c in concurrencies:
                n = args.requests or max(16, 2 * c)
                data_dir = Path(tmp) / f"c{c}"
                data_dir.mkdir()
                write_dataset(data_dir / "data.json", n, args.input_len, args.output_len)
                pooled: dict[str, dict[str, Any]] = {}
                for r in range(args.rounds):
                    order = clients[r % len(clients) :] + clients[: r % len(clients)]
                    for name in order:
                        print(f"concurrency {c}, round {r + 1}/{args.rounds}: {name}", file=sys.stderr)
                        get_log(args.port)  # a clean log
                        if name == "vllm":
                            assert tokenizer is not None
                            records = run_vllm(args, c, n, data_dir, tokenizer)
                        else:
                            records = run_kit_client(args, name, c, n, str(old_runner))
                        got = overheads(records, get_log(args.port), ttft, itl)
                        into = pooled.setdefault(name, {})
                        for key, value in got.items():
                            into[key] = into.get(key, 0 if isinstance(value, int) else []) + value
                for name, got in pooled.items():
                    results[name][c] = got
    finally:
        server.kill()
        server.wait()
    report(args, clients, concurrencies, results)


def report(args: argparse.Namespace, clients: list[str], concurrencies: list[int], results: dict[str, Any]) -> None:
    rows = []
    for c in concurrencies:
        for name in clients:
            got = results[name][c]
            row: dict[str, Any] = {"concurrency": c, "client": name, "requests": got["requests"]}
            row.update({"failed": got["failed"], "unmatched": got["unmatched"]})
            for key in KEYS:
                row[f"{key}_p50"] = pct(got[key], 50)
                row[f"{key}_p99"] = pct(got[key], 99)
            rows.append(row)
    doc = {"load": {k: v for k, v in vars(args).items() if not k.startswith("_")}, "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1, default=str))
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
        return
    print(
        f"client overhead, ms, p50 / p99 over every request of {args.rounds} round(s); the server's schedule: the "
        f"first token {args.ttft_ms:g} ms after it reads a request, then one every {args.itl_ms:g} ms, "
        f"{args.output_len} tokens (server real-time: {'yes' if args.realtime else 'no'})"
    )
    print(
        "  -sched: measured minus scheduled; -true: minus what the server really did (its lateness out); "
        "to-server: clock start -> server read the request; to-stamp: server sent a chunk -> client stamped it"
    )
    cols = ("ttft_sched", "itl_sched", "ttft_true", "itl_true", "to_server", "to_stamp", "late")
    names = ("TTFT-sched", "ITL-sched", "TTFT-true", "ITL-true", "to-server", "to-stamp", "server late")
    print(f"{'conc':>4}  {'client':<14}{'reqs':>5}  " + "  ".join(f"{n:>15}" for n in names))
    by = {(r["concurrency"], r["client"]): r for r in rows}
    for c in concurrencies:
        for name in clients:
            r = by[(c, name)]
            cells = [f"{r[f'{k}_p50']:7.3f} {r[f'{k}_p99']:7.3f}" for k in cols]
            note = f"  ({r['failed']} failed, {r['unmatched']} unmatched)" if r["failed"] or r["unmatched"] else ""
            print(f"{c:>4}  {name:<14}{r['requests']:>5}  " + "  ".join(cells) + note)
        if "vllm" not in clients:
            continue
        for name in clients:
            if name == "vllm":
                continue
            ratios = []
            for k in cols[:-1]:
                pair = []
                for p in ("p50", "p99"):
                    den = by[(c, "vllm")][f"{k}_{p}"]
                    pair.append(f"{by[(c, name)][f'{k}_{p}'] / den:7.2f}" if abs(den) >= 0.01 else f"{'-':>7}")
                ratios.append(" ".join(pair))
            print(f"{'':>4}  {name + '/vllm':<14}{'':>5}  " + "  ".join(ratios))


if __name__ == "__main__":
    main()
