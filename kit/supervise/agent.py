"""The node agent: one per node container, standard library only (it runs in the supervise
bundle). It runs this node's serve script (the same /tmp/kit/serve.sh `kit serve` writes) in its
own process group, scans the node's vLLM engine processes, reports to the coordinator on the head
every second and obeys the order it gets back: run generation N, stop the group, or stop and exit.

It never decides a restart itself: a group that exits stays down until the coordinator, which
sees every node, restarts all of them together. Only when the coordinator has been unreachable
for `orphan_s` does it stop its group on its own (a rank without its head serves nothing and may
hold ports the next start needs), and it keeps asking, so a coordinator that comes back finds it
— for `abandon_s` at most: then the supervision it belonged to is over (it gave up or was
stopped while this node was down), and the agent exits and takes its node's resume mark with it,
so a container started again later does not bring back an agent with no coordinator (issue 25).
An exit order removes the mark too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.errors import ServerError
from kit.net import http
from kit.supervise import cause, procs, protocol
from kit.supervise.protocol import EngineProc, Order, Report


@dataclass(frozen=True)
class AgentConfig:
    url: str  # the coordinator: http://HEAD_IP:PORT
    token: str
    node: str  # head, worker-1, ...
    serve_script: str  # path of the script to run
    serve_log: str
    pid_file: str  # the serve script's pid, where `kit serve` and `kit status` look for it
    interval_s: float = 1.0
    orphan_s: float = 60.0
    grace_s: float = 10.0
    tail_lines: int = 12
    abandon_s: float = 3600.0  # no coordinator for this long: the supervision is over, the agent exits
    resume_file: str | None = None  # the node's resume mark (kit/supervise/main.py): gone when it exits
    # Count only the engines of its own serve group: router replicas that share a node (issue 29)
    # each have an agent of their own in the same container.
    own_engines_only: bool = False


Post = Callable[[dict[str, Any]], dict[str, Any]]


def http_post(config: AgentConfig) -> Post:
    """POST a report through kit's bounded HTTP layer: the whole exchange within 3 s."""
    limits = http.DEFAULT.but(connect_s=3.0, total_s=3.0, body_bytes=protocol.MAX_BODY)
    headers = {"Content-Type": "application/json", protocol.TOKEN_HEADER: config.token}

    def post(doc: dict[str, Any]) -> dict[str, Any]:
        answer = http.request(
            "POST", f"{config.url}/v1/report", headers=headers, body=protocol.dumps(doc), limits=limits, proxies=False
        )
        if answer.status != 200:
            raise protocol.ProtocolError(f"the coordinator answered {answer.status}: {answer.snippet(120)}")
        return protocol.loads(answer.body)

    return post


def boot_id(proc_root: str = "/proc") -> str:
    """The container's start: its PID 1's start time (clock ticks since the host booted) and the
    kernel's boot id. A restarted container has a new PID 1, a rebooted host a new boot id."""
    try:
        stat = Path(proc_root, "1", "stat").read_text()
        start = stat[stat.rfind(")") + 2 :].split()[19]
    except (OSError, IndexError):
        start = "?"
    try:
        boot = Path(proc_root, "sys", "kernel", "random", "boot_id").read_text().strip()[:36]
    except OSError:
        boot = "?"
    return f"{boot}:{start}"


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        *,
        post: Post | None = None,
        proc_root: str = "/proc",
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] | None = None,
        only_own: bool = False,
    ) -> None:
        self.config = config
        self.post = post or http_post(config)
        self.proc_root = proc_root
        self.clock = clock
        self.log = log or _log
        self.instance = f"{config.node}-{uuid.uuid4().hex[:12]}"
        self.boot = boot_id(proc_root)
        self.group = procs.ServeGroup(config.serve_script, config.serve_log, proc_root=proc_root)
        self.scanner = cause.Scanner(config.serve_log)
        self.last_contact = clock()
        self.exiting = False
        self.orphaned = False
        self.last_error: str | None = None
        # Engines of this agent's group only (replicas sharing a node; tests on a host whose /proc
        # holds other vLLMs); otherwise every engine of the node container is its own.
        self.only_own = only_own or config.own_engines_only

    # ---- what it reports --------------------------------------------------------------------

    def report(self) -> Report:
        running = self.group.running()
        members = self.group.members()
        if not running and not members:
            self.group.poll_stop()  # writes the end of the generation into the log once
            self._forget_pid()
        node_engines = procs.engines(procs.all_procs(self.proc_root))
        if self.only_own:
            node_engines = [p for p in node_engines if p.pgid == self.group.pid]
        return Report(
            node=self.config.node,
            instance=self.instance,
            boot=self.boot,
            generation=self.group.generation,
            running=running,
            exit_code=None if running else self.group.exit_code,
            stopped=not running and not members,
            engines=tuple(EngineProc(p.pid, p.state, p.title) for p in node_engines),
            exiting=self.exiting,
            log_tail=tuple(procs.tail(self.config.serve_log, self.config.tail_lines)),
            cause=self.scanner.scan() if self.group.generation else None,
        )

    # ---- what it does -----------------------------------------------------------------------

    def obey(self, order: Order) -> None:
        group = self.group
        if order.action == "run":
            self.orphaned = False
            if group.process is not None and group.generation == order.generation:
                return  # running it, or it ended: only the coordinator restarts the group
            if group.running() or group.members():
                group.begin_stop(self.config.grace_s)
                if not group.poll_stop():
                    return  # the old generation is still going away; start at a later report
            pid = group.start(order.generation)
            self.scanner.reset()  # the new generation's log (the previous one was rotated)
            self._write_pid(pid)
            self.log(f"generation {order.generation}: started {self.config.serve_script} (pid {pid})")
        else:
            if (group.running() or group.members()) and group.stop_deadline is None:
                why = f" ({order.reason})" if order.reason else ""
                self.log(f"generation {group.generation}: stopping the serve group: {order.action}{why}")
                group.begin_stop(self.config.grace_s)
            group.poll_stop()

    def tick(self) -> int | None:
        """One report and its order; the exit code when the agent must end now."""
        report = self.report()
        try:
            order = protocol.order_from(self.post(report.to_dict()))
        except (ServerError, OSError, protocol.ProtocolError, ValueError) as exc:
            return self._unreachable(exc)
        self.last_contact = self.clock()
        if self.last_error:
            self.log(f"the coordinator answers again ({self.last_error})")
            self.last_error = None
        if order.action == "exit":
            return self._exit(order)
        self.obey(order)
        return None

    def _unreachable(self, exc: BaseException) -> int | None:
        why = exc.message if isinstance(exc, ServerError) else f"{type(exc).__name__}: {str(exc)[:120]}"
        if why != self.last_error:
            self.log(f"cannot reach the coordinator at {self.config.url}: {why}")
            self.last_error = why
        away = self.clock() - self.last_contact
        if away > self.config.abandon_s:
            self.log(f"no coordinator for {away:.0f} s: its supervision is over; exiting")
            self.shutdown()
            self._forget_resume()
            return 0
        if away > self.config.orphan_s and (self.group.running() or self.group.members()):
            if not self.orphaned:
                self.log(f"no coordinator for {away:.0f} s: stopping the serve group (it serves nothing alone)")
                self.orphaned = True
            self.group.begin_stop(self.config.grace_s)
        self.group.poll_stop()
        return None

    def _exit(self, order: Order) -> int:
        self.exiting = True
        self.log(f"ordered to exit ({order.reason or 'no reason given'}): stopping the serve group")
        self.group.stop(self.config.grace_s)
        self._forget_pid()
        self._forget_resume()  # the supervision ends here: a restarted container must not resume it
        # Say goodbye: the coordinator waits for it before it ends.
        with contextlib.suppress(ServerError, OSError, protocol.ProtocolError, ValueError):
            self.post(self.report().to_dict())
        return order.exit_code

    def shutdown(self) -> None:
        """SIGTERM to the agent (kit stops supervision, the container stops): the group goes too."""
        self.group.stop(self.config.grace_s)
        self._forget_pid()

    def run(self) -> int:
        stop = {"signal": 0}

        def on_signal(signum: int, frame: Any) -> None:
            stop["signal"] = signum

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.log(f"agent {self.instance} on node {self.config.node}: reporting to {self.config.url}")
        while not stop["signal"]:
            code = self.tick()
            if code is not None:
                self.log(f"exiting with code {code}")
                return code
            end = self.clock() + self.config.interval_s
            while not stop["signal"] and self.clock() < end:
                time.sleep(0.05)
        self.log(f"signal {stop['signal']}: stopping the serve group and exiting")
        self.shutdown()
        return 0

    def _write_pid(self, pid: int) -> None:
        with contextlib.suppress(OSError):
            Path(self.config.pid_file).write_text(f"{pid}\n")

    def _forget_resume(self) -> None:
        if self.config.resume_file:
            with contextlib.suppress(OSError):
                Path(self.config.resume_file).unlink()

    def _forget_pid(self) -> None:
        try:
            if Path(self.config.pid_file).read_text().strip() == str(self.group.pid):
                Path(self.config.pid_file).unlink()
        except (OSError, ValueError):
            pass


def _log(text: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"{stamp} kit-agent: {text}", flush=True)


def load_config(directory: str, environ: dict[str, str] | None = None) -> AgentConfig:
    """The agent's settings: the run's supervise.json and token in `directory`, and this node's
    identity and head address from the node's environment (kit sets them on every node)."""
    env = dict(os.environ if environ is None else environ)
    doc = json.loads(Path(directory, "supervise.json").read_text())
    token = Path(directory, "token").read_text().strip()
    role, rank = env.get("KIT_ROLE", "head"), int(env.get("KIT_NODE_RANK", "0") or 0)
    # The coordinator is on the head, or (router replicas, issue 29) on the replica's first node.
    where = str(doc.get("coordinator_address_env", "KIT_HEAD_ADDRESS"))
    head = env.get(where) or env.get("VLLM_HOST_IP") or "127.0.0.1"
    return AgentConfig(
        url=f"http://{head}:{int(doc['port'])}",
        token=token,
        node=protocol.node_name(role, rank),
        serve_script=str(doc.get("serve_script", "/tmp/kit/serve.sh")),
        serve_log=str(doc.get("serve_log", "/tmp/kit/serve.log")),
        pid_file=str(doc.get("pid_file", "/tmp/kit/serve.pid")),
        orphan_s=float(doc.get("orphan_s", 60)),
        grace_s=float(doc.get("grace_s", 10)),
        abandon_s=float(doc.get("abandon_s", 3600)),
        resume_file=str(Path(directory, "resume")),
        own_engines_only=doc.get("own_engines_only") is True,
    )


def main(directory: str) -> int:
    agent = Agent(load_config(directory))
    Path(directory, "agent.pid").write_text(f"{os.getpid()}\n")
    try:
        return agent.run()
    finally:
        sys.stdout.flush()
