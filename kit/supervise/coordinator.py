"""The coordinator, in the head container (standard library only, in the supervise bundle): a
small HTTP control endpoint on the head's node IP (ports.supervisor) for the agents' reports, a
loop that observes the server (kit/supervise/watch.py), judges it (kit/health/liveness.py) and steps the
state machine (kit/supervise/policy.py), and the record: state.json (rewritten every second, so
kit can tell a live coordinator from a dead one) and events.jsonl, both in the run directory,
plus a `KIT_EVENT {...}` line per event on its output (the job output under SLURM).

It keeps working when no kit command runs: `kit serve --supervise` only starts it and reads the
files back. A restarted head container starts it again (the node entrypoint's resume hook), and
it goes on from state.json: the head's new agent is a restarted node, so the group restarts.

The control endpoint listens on the cluster network, so it is a hardened small server (issue 27):
a cap on connections and a deadline for each (kit/supervise/control.py), the token compared in
constant time before anything else, Content-Length checked before a byte of the body is read,
bodies of at most protocol.MAX_BODY bytes read as bounded JSON. Writing state.json or
events.jsonl can fail (a full disk, no file descriptor left): that is said on the output and
supervision goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pkgutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from kit import safeload
from kit.errors import ConfigError
from kit.health import liveness
from kit.safe import files as safefile
from kit.supervise import events as ev
from kit.supervise import policy, protocol, watch
from kit.supervise.control import MAX_CONNECTIONS, REQUEST_S, ControlServer
from kit.supervise.policy import Seen, Settings, State, Tick

# model.dp_lb router (issue 29): a restarted replica goes back into the router once it answers a
# one-token request (its /health answers before its engine has computed anything); tries, pause.
READMIT_TRIES = 3
READMIT_PAUSE_S = 3.0


def ray_alive_source() -> str:
    """kit/supervise/ray_alive.py's text, from the bundle (a zip) or the package alike. Ray
    backend: before (re)starting the serve step, every node must be alive in the Ray cluster."""
    data = pkgutil.get_data("kit.supervise", "ray_alive.py")
    if data is None:  # only a broken bundle lacks it (kit/supervise/bundle.py MODULES)
        raise RuntimeError("kit/supervise/ray_alive.py is missing from the supervise bundle")
    return data.decode()


@dataclass(frozen=True)
class CoordinatorConfig:
    directory: str
    host: str  # the head's node IP: the control endpoint and the API listen there
    port: int
    token: str
    api_url: str
    model: str
    api_key_path: str | None
    settings: Settings
    ray_address: str | None = None  # Ray backend: HOST:GCS_PORT
    ray_nodes: int = 0
    interval_s: float = 1.0
    # model.dp_lb router (issue 29): this group is one replica behind vLLM's router at this URL,
    # which the coordinator takes it out of on a failure and puts it back into once ready.
    router_url: str | None = None


def load_config(directory: str, environ: dict[str, str] | None = None) -> CoordinatorConfig:
    env = dict(os.environ if environ is None else environ)
    doc = json.loads(Path(directory, "supervise.json").read_text())
    host = env.get("VLLM_HOST_IP") or "127.0.0.1"
    ray = doc.get("ray") or None
    settings = Settings(
        nodes=tuple(doc["nodes"]),
        engines=tuple(str(e) for e in doc["engines"]),
        liveness_s=float(doc["liveness_s"]),
        ready_s=float(doc["ready_s"]),
        max_restarts=int(doc["max_restarts"]),
        backoff_s=float(doc["backoff_s"]),
        stable_s=float(doc["stable_s"]),
        node_wait_s=float(doc["node_wait_s"]),
        needs_ray=ray is not None,
    )
    return CoordinatorConfig(
        directory=directory,
        host=host,
        port=int(doc["port"]),
        token=Path(directory, "token").read_text().strip(),
        api_url=f"http://{host}:{int(doc['api_port'])}",
        model=str(doc["model"]),
        api_key_path=doc.get("api_key_path"),
        settings=settings,
        ray_address=f"{host}:{int(ray['gcs_port'])}" if ray else None,
        ray_nodes=int(ray["nodes"]) if ray else 0,
        router_url=str(doc["router_url"]) if doc.get("router_url") else None,
    )


class Coordinator:
    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        observe: Callable[[], liveness.Observation] | None = None,
        probe: Callable[[str], liveness.Probe] | None = None,
        ray_alive: Callable[[], int | None] | None = None,
        out: Callable[[str], None] | None = None,
        max_connections: int = MAX_CONNECTIONS,
        request_s: float = REQUEST_S,
    ) -> None:
        self.config = config
        self.max_connections, self.request_s = max_connections, request_s
        self.settings = config.settings
        self.clock, self.wall = clock, wall
        self.observe = observe or (lambda: watch.observe(config.api_url, deadline_s=3.0, clock=clock))
        self.probe = probe or self._probe
        self.ray_alive = ray_alive or self._ray_alive
        self.out = out or (lambda line: print(line, flush=True))
        self.lock = threading.RLock()
        self.agents: dict[str, Seen] = {}
        self.started = clock()
        self.history: deque[liveness.Observation] = deque()
        self.probes: list[liveness.Probe] = []
        self.probing: set[str] = set()
        self.last_probe: dict[str, float] = {}
        self.ray_checked = -1e9
        self.ray_complete: bool | None = None
        self.generation_seen = -1
        self.listening = threading.Event()
        self.last_verdicts = ""
        self.stall: dict[str, tuple[tuple[float | None, float | None], float]] = {}
        self.bound: tuple[Any, ...] = ()
        self.routed = False  # model.dp_lb router: this replica is in the router
        self.save_error: str | None = None
        self.server: ControlServer | None = None
        self.state = self._load_state()

    # ---- state on disk ------------------------------------------------------------------------

    def _path(self, name: str) -> Path:
        return Path(self.config.directory, name)

    def _load_state(self) -> State:
        try:
            doc = safeload.load_json_file(self._path("state.json"), max_bytes=1 << 20, what="state.json")
            state = State.resumed(doc, self.clock())
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ConfigError):
            return State(phase_since=self.clock())
        if state.generation:
            self._record(
                [
                    ev.Event(
                        self.wall(),
                        "supervising",
                        f"resumed (generation {state.generation}, {state.restarts} restart(s) so far): "
                        "the coordinator restarted with its container",
                        state.generation,
                        state.restarts,
                    )
                ]
            )
        return state

    def _save(self) -> None:
        doc = {
            **self.state.to_dict(),
            "coordinator_pid": os.getpid(),
            "updated_ts": round(self.wall(), 3),
            "control": f"{self.config.host}:{self.config.port}",
            "nodes": list(self.settings.nodes),
            "engines": list(self.settings.engines),
            "max_restarts": self.settings.max_restarts,
            "agents": self._agents_view(),
        }
        if self.config.router_url is not None:
            doc["router"] = {"url": self.config.router_url, "replica": self.config.api_url, "routed": self.routed}
        try:
            safefile.write_atomic(self._path("state.json"), json.dumps(doc, sort_keys=True))
            self.save_error = None
        except OSError as exc:  # a full disk, no descriptor left: say it once, keep supervising
            why = f"cannot write state.json: {exc.strerror or exc}"
            if why != self.save_error:
                self.save_error = why
                self._say(f"kit-supervise: {why} (supervision goes on)")

    def _agents_view(self) -> dict[str, Any]:
        now = self.clock()
        with self.lock:
            seen = dict(self.agents)
        return {
            node: {
                "age_s": round(now - s.t, 1),
                "generation": s.report.generation,
                "running": s.report.running,
                "engines": [e.title for e in s.report.engines],
            }
            for node, s in seen.items()
        }

    def _record(self, events: list[ev.Event]) -> None:
        if not events:
            return
        try:
            with self.lock, self._path("events.jsonl").open("a") as handle:
                for event in events:
                    handle.write(event.line() + "\n")
        except OSError as exc:  # the events still reach the output below
            self._say(f"kit-supervise: cannot append to events.jsonl: {exc.strerror or exc}")
        for event in events:
            # Short on the output (the job output under SLURM, where other processes write too: a
            # line under PIPE_BUF is written whole); events.jsonl keeps the details.
            short = dataclasses.replace(event, reason=event.reason[:300], details=())
            self._say(f"{ev.EVENT_MARK} {short.line()}")

    def _say(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # no output left (a closed pipe): the files still say it
            self.out(line)

    # ---- the HTTP side (called from the server's threads) -------------------------------------

    def on_report(self, doc: dict[str, Any]) -> dict[str, Any]:
        report = protocol.report_from(doc)
        with self.lock:
            self.agents[report.node] = Seen(report, self.clock())
            if report.node not in self.settings.nodes:
                return protocol.Order(self.state.generation, "stop", reason="not a supervised node").to_dict()
            return policy.order_for(self.state, report.node, report.instance).to_dict()

    def on_stop(self, reason: str) -> dict[str, Any]:
        with self.lock:
            tick = Tick(now=self.clock(), wall=self.wall(), agents=dict(self.agents), started=self.started)
            self._record(policy.request_stop(self.state, tick, reason))
            return {"phase": self.state.phase}

    def status(self) -> dict[str, Any]:
        with self.lock:
            return {**self.state.to_dict(), "agents": self._agents_view()}

    # ---- the loop -----------------------------------------------------------------------------

    def tick(self) -> None:
        verdicts = None
        if self.state.phase in policy.ACTIVE:
            if self.state.generation != self.generation_seen:  # a new start: old evidence is void
                self.generation_seen = self.state.generation
                self.history.clear()
                self.probes.clear()
            verdicts = self._judge()
        if self.state.phase != "waiting":  # an answer from an earlier wait says nothing now
            self.ray_complete, self.ray_checked = None, -1e9
        elif self.settings.needs_ray and self.clock() - self.ray_checked >= 3:
            self.ray_checked = self.clock()
            alive = self.ray_alive()
            self.ray_complete = alive is not None and alive >= self.config.ray_nodes
        with self.lock:
            tick = Tick(
                now=self.clock(),
                wall=self.wall(),
                agents=dict(self.agents),
                verdicts=verdicts,
                ray_complete=self.ray_complete,
                started=self.started,
            )
            events = policy.step(self.state, tick, self.settings)
        self._record(events)
        for event in events:
            if event.kind == "detected":
                self._route("remove", event)
            elif event.kind == "ready":
                self._route("add", event)
        self._save()

    def _route(self, action: str, cause: ev.Event) -> None:
        """Replica-level recovery (issue 29): out of the router at once on a failure (the endpoint
        keeps answering from the other replicas), back in once ready; in a thread (the router
        checks a replica's /health before adding it), its outcome an event of its own."""
        router = self.config.router_url
        if router is None:
            return

        def run() -> None:
            started = self.clock()
            problem = None
            for _ in range(READMIT_TRIES if action == "add" else 0):  # in service once it answers a request
                answer = self.probe("0")
                problem = None if answer.error is None else f"it did not answer a one-token request: {answer.error}"
                if problem is None or self.state.generation != cause.generation or self.state.phase != "serving":
                    break  # answered, or its failure is being handled (the next `ready` readmits it)
                time.sleep(READMIT_PAUSE_S)
            unanswered = problem is not None  # the replica's own failure: its liveness check acts on it
            problem = problem or watch.route(
                router, action, self.config.api_url, api_key_path=self.config.api_key_path, deadline_s=40.0
            )
            kind = "drained" if action == "remove" else "readmitted"
            took = round(self.clock() - started, 2)
            if problem is None:
                where = "out of" if action == "remove" else "back into"
                reason = f"replica {self.config.api_url} {where} the router at {router}"
            else:
                kind, reason = "route-failed", f"cannot {action} replica {self.config.api_url}: {problem}"
            data: dict[str, Any] = {"took_s": took}
            if problem is not None:
                # A refusal kit serve --supervise stops on: the router refused a replica that answered
                # and still serves the generation it was asked for (a replica restarted meanwhile
                # fails its /health check at the router: that is its restart's, not the router's).
                superseded = self.state.generation != cause.generation or self.state.phase != "serving"
                data["router_refused"] = not unanswered and not superseded
            event = ev.Event(self.wall(), kind, reason, cause.generation, cause.restarts, data=data)
            with self.lock:
                self.routed = action == "add" and problem is None
                self._record([event])

        threading.Thread(target=run, daemon=True).start()

    def _judge(self) -> list[liveness.Verdict]:
        observation = self.observe()
        self.history.append(observation)
        window = max(self.settings.liveness_s * 2, 10.0)
        while self.history and observation.t - self.history[0].t > window:
            self.history.popleft()
        stalls = self._stalls(observation)
        with self.lock:
            # Kept as long as the history: judge() looks at the last liveness_s only, a stall's
            # second opinion at every pinned request since the stall began.
            self.probes = [p for p in self.probes if observation.t - p.t <= window]
            probes = list(self.probes)
        if self.state.phase == "serving":
            self._probe_due(observation, stalls, probes)
        verdicts = liveness.judge(
            list(self.history), expected=self.settings.engines, liveness_s=self.settings.liveness_s, probes=probes
        )
        verdicts = [self._second_opinion(v, stalls, probes, now=observation.t) for v in verdicts]
        self._log_verdicts(verdicts)
        return verdicts

    def _stalls(self, observation: liveness.Observation) -> dict[str, float]:
        """Busy engines whose token counters have not moved: since when (the history's clock)."""
        out = {}
        for engine, sample in observation.engines.items():
            progress = (sample.generation_tokens, sample.prompt_tokens)
            seen = self.stall.get(engine)
            if not sample.busy or seen is None or seen[0] != progress:
                self.stall[engine] = (progress, observation.t)
            elif sample.busy:
                out[engine] = seen[1]
        return out

    def _second_opinion(
        self, verdict: liveness.Verdict, stalls: dict[str, float], probes: list[liveness.Probe], *, now: float
    ) -> liveness.Verdict:
        """A busy engine judged hung (no token progress for liveness_s) is acted on only when the
        one-token request pinned to it during the stall (sent at half the liveness time) failed
        too: an engine that is slow, or whose gauges went stale, still answers it. Measured on the
        2-CPU test host: a DP rank starved of CPU right after a restart went 10 s without a token.

        The stall is timed here over the looks that answered: liveness.judge restarts its clock at
        a look whose scrape failed, so /metrics failing now and then (a busy API server) would
        keep a stopped engine "serving" for ever. No progress on any answered look for liveness_s
        and the pinned request failed as well: hung."""
        since = stalls.get(verdict.engine)
        if since is None or verdict.state not in ("hung", "serving"):
            return verdict
        mine = sorted((p for p in probes if p.engine == verdict.engine and p.t >= since), key=lambda p: p.t)
        if verdict.state == "serving":
            stalled = now - since
            if stalled >= self.settings.liveness_s and mine and mine[-1].error is not None:
                why = (
                    f"no token on any look that answered for {stalled:.0f} s (liveness {self.settings.liveness_s:g} s)"
                )
                return liveness.Verdict(verdict.engine, "hung", f"{why}; {mine[-1].error}")
            return verdict
        if mine and mine[-1].error is None:
            why = f"{verdict.reason}; but a one-token request pinned to it answered in {mine[-1].latency_s or 0:.1f} s"
            return liveness.Verdict(verdict.engine, "serving", why)
        if mine:  # the latest pinned request failed as well: hung
            return liveness.Verdict(verdict.engine, "hung", f"{verdict.reason}; {mine[-1].error}")
        if verdict.engine in self.probing:
            why = f"{verdict.reason}; a one-token request pinned to it is on its way"
            return liveness.Verdict(verdict.engine, "serving", why)
        return verdict

    def _log_verdicts(self, verdicts: list[liveness.Verdict]) -> None:
        """One output line each time what liveness says of the engines changes: the evidence behind
        a `detected` event, and the near misses an operator tunes timeouts.liveness from."""
        summary = "; ".join(
            f"engine {v.engine} {v.state}: {v.reason}"
            for v in verdicts
            if v.state not in ("serving", "idle-ok") or "pinned to it" in v.reason
        )
        summary = summary or "every engine serving or idle"
        if summary != self.last_verdicts:
            self.last_verdicts = summary
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.wall()))
            self._say(f"{stamp} liveness (generation {self.state.generation}, {self.state.phase}): {summary}")

    def _probe_due(
        self, observation: liveness.Observation, stalls: dict[str, float], probes: list[liveness.Probe]
    ) -> None:
        """A one-token request pinned to each idle engine every liveness/3 s (at least 2 s), and to
        each busy engine whose tokens stalled for liveness/2, every liveness/2 until one fails (that
        one settles it); each in a thread of its own: a hung engine makes its probe wait for the
        whole deadline."""
        failed = {p.engine for p in probes if p.error is not None and p.t >= stalls.get(str(p.engine), 1e18)}
        idle_every = max(2.0, self.settings.liveness_s / 3)
        half = self.settings.liveness_s / 2
        due = [
            e for e in liveness.idle_engines(observation) if observation.t - self.last_probe.get(e, -1e9) >= idle_every
        ]
        due += [
            e
            for e, since in stalls.items()
            if observation.t - since >= half
            and observation.t - self.last_probe.get(e, -1e9) >= half
            and e not in failed
        ]
        for engine in due:
            if engine in self.probing:
                continue
            self.probing.add(engine)
            self.last_probe[engine] = observation.t
            threading.Thread(target=self._probe_one, args=(engine,), daemon=True).start()

    def _probe_one(self, engine: str) -> None:
        try:
            result = self.probe(engine)
        finally:
            self.probing.discard(engine)
        with self.lock:
            self.probes.append(result)

    def _probe(self, engine: str) -> liveness.Probe:
        deadline = max(2.0, min(self.settings.liveness_s / 2, 10.0))
        return watch.probe(
            self.config.api_url,
            self.config.model,
            engine=engine,
            api_key_path=self.config.api_key_path,
            deadline_s=deadline,
            clock=self.clock,
        )

    def _ray_alive(self) -> int | None:
        if self.config.ray_address is None:
            return None
        try:
            done = subprocess.run(
                [sys.executable, "-c", ray_alive_source(), self.config.ray_address],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        for line in done.stdout.splitlines():
            if line.startswith("KIT_RAY_ALIVE "):
                return int(line.split()[1])
        return None

    def run(self, stop: threading.Event | None = None) -> int:
        stop = stop or threading.Event()
        server = self.server = make_server(self, max_connections=self.max_connections, request_s=self.request_s)
        self.bound = server.server_address[:2]  # the port, when the config asked for any (0)
        self.listening.set()
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        thread.start()
        self._record(
            [
                ev.Event(
                    self.wall(),
                    "supervising",
                    f"coordinator on {self.config.host}:{self.config.port}: nodes {', '.join(self.settings.nodes)}, "
                    f"engines {', '.join(self.settings.engines)}, liveness {self.settings.liveness_s:g} s, "
                    f"at most {self.settings.max_restarts} restart(s) in a row",
                    self.state.generation,
                    self.state.restarts,
                )
            ]
            if self.state.generation == 0
            else []
        )
        try:
            while not stop.is_set() and self.state.phase not in policy.TERMINAL:
                started = self.clock()
                self.tick()
                stop.wait(max(0.0, self.config.interval_s - (self.clock() - started)))
            if stop.is_set() and self.state.phase not in policy.TERMINAL:
                self.state.phase, self.state.exit_code = "stopped", 0
                self._record([ev.Event(self.wall(), "stopped", "the coordinator was stopped (SIGTERM)",
                                       self.state.generation, self.state.restarts)])  # fmt: skip
            self._save()
        finally:
            server.shutdown()
            server.server_close()
        if self.state.phase in policy.TERMINAL:
            self._path("resume").unlink(missing_ok=True)
        return self.state.exit_code or 0


class _Handler(BaseHTTPRequestHandler):
    coordinator: Coordinator
    server_version = "kit-supervise"
    timeout = REQUEST_S  # each read and write; the server's reaper bounds the whole connection

    def log_message(self, format: str, *args: Any) -> None:  # the agents report every second: no access log
        return

    def _answer(self, code: int, doc: dict[str, Any]) -> None:
        body = protocol.dumps(doc)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        if protocol.token_ok(self.coordinator.config.token, self.headers.get(protocol.TOKEN_HEADER)):
            return True
        self._answer(401, {"error": "missing or wrong token"})
        return False

    def _body(self) -> dict[str, Any]:
        """The JSON body, its length checked before a byte of it is read."""
        if self.headers.get("Transfer-Encoding"):
            raise protocol.ProtocolError("a body must come with Content-Length, not Transfer-Encoding")
        raw = (self.headers.get("Content-Length") or "0").strip()
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 19):
            raise protocol.ProtocolError("Content-Length is not a byte count")
        length = int(raw)
        if length > protocol.MAX_BODY:
            raise protocol.ProtocolError(f"body over {protocol.MAX_BODY} bytes")
        data = self.rfile.read(length)
        if len(data) != length:
            raise protocol.ProtocolError("the body is shorter than its Content-Length")
        return protocol.loads(data)

    def do_POST(self) -> None:
        if not self._authorized():
            return
        try:
            if self.path == "/v1/report":
                self._answer(200, self.coordinator.on_report(self._body()))
            elif self.path == "/v1/stop":
                self._answer(200, self.coordinator.on_stop(protocol.stop_from(self._body()).reason))
            else:
                self._answer(404, {"error": "no such endpoint"})
        except (protocol.ProtocolError, ValueError) as exc:
            self.close_connection = True
            self._answer(400, {"error": str(exc)[:200]})

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if self.path == "/v1/status":
            self._answer(200, self.coordinator.status())
        else:
            self._answer(404, {"error": "no such endpoint"})


def make_server(
    coordinator: Coordinator, *, max_connections: int = MAX_CONNECTIONS, request_s: float = REQUEST_S
) -> ControlServer:
    handler = type("Handler", (_Handler,), {"coordinator": coordinator, "timeout": request_s})
    return ControlServer(
        (coordinator.config.host, coordinator.config.port),
        handler,
        max_connections=max_connections,
        request_s=request_s,
    )


def main(directory: str) -> int:
    coordinator = Coordinator(load_config(directory))
    Path(directory, "coordinator.pid").write_text(f"{os.getpid()}\n")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return coordinator.run(stop)
