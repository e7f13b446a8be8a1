"""`kit bench`: load the cluster's OpenAI endpoint and report TTFT, TPOT, ITL, E2E latency and
throughput the way `vllm bench serve` computes them; save, compare and plot results."""

from __future__ import annotations

import contextlib
import importlib.util
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kit.bench import dataset, results
from kit.bench.dataset import Prompt
from kit.bench.measure import Load
from kit.bench.runner import MAX_IN_FLIGHT, Target
from kit.bench.schedule import sweep
from kit.commands._common import config_options, json_option, resolve_cluster
from kit.commands._params import Count, KitCommand, Number, Url, readable, writable
from kit.config import KitConfig
from kit.errors import ConfigError, UsageError
from kit.output import emit, progress

if TYPE_CHECKING:
    from kit.runtime.base import Runtime

# Bounds of a load (issue 16: -n 100000000 built every prompt up front and ran out of memory).
# vLLM's own benchmarks use -n in the thousands; prompts are words of ~5 bytes.
MAX_PROMPTS = 100_000
MAX_INPUT_LEN = 1_000_000
MAX_OUTPUT_LEN = 10_000_000
MAX_PROMPT_WORDS = 20_000_000


def load_options(func: Any) -> Any:
    """The load flags `kit bench` and `kit tune` share."""
    options = [
        click.option(
            "--dataset",
            default="fixed",
            show_default=True,
            metavar="fixed|random|FILE",
            help="Fixed lengths, random lengths (--range-ratio), or a JSONL / ShareGPT JSON file.",
        ),
        click.option(
            "--num-prompts",
            "-n",
            type=Count(1, MAX_PROMPTS),
            default=16,
            show_default=True,
            help=f"Requests per load point (at most {MAX_PROMPTS}).",
        ),
        click.option(
            "--input-len",
            type=Count(1, MAX_INPUT_LEN),
            default=32,
            show_default=True,
            help="Prompt length in words (~tokens).",
        ),
        click.option(
            "--output-len",
            type=Count(1, MAX_OUTPUT_LEN),
            default=32,
            show_default=True,
            help="Tokens to generate per request.",
        ),
        click.option(
            "--range-ratio", type=Number(0, 1), default=0.5, show_default=True, help="--dataset random: ± spread."
        ),
        click.option("--rate", help="Request rate(s) per second, Poisson arrivals; e.g. 1,2,inf (default inf)."),
        click.option(
            "--concurrency",
            "-c",
            help=f"Max requests in flight (at most {MAX_IN_FLIGHT}); a sweep like 1,2,4 (default 1; "
            f"with --rate, no limit, so -n must then be {MAX_IN_FLIGHT} or less).",
        ),
        click.option(
            "--burstiness",
            type=Number(0, 1000, above=True),
            default=1.0,
            show_default=True,
            help="Gamma shape (1 = Poisson).",
        ),
        click.option(
            "--warmup", type=Count(0, 1000), default=1, show_default=True, help="Untimed requests before measuring."
        ),
        click.option("--seed", type=Count(0, 2**63 - 1), default=0, show_default=True),
        click.option(
            "--ignore-eos/--no-ignore-eos",
            default=True,
            show_default=True,
            help="Generate exactly --output-len tokens.",
        ),
        click.option(
            "--request-timeout",
            type=Number(0, 7 * 86400, above=True),
            default=600,
            show_default=True,
            help="Seconds per request.",
        ),
        click.option(
            "--api-key-file", type=click.Path(dir_okay=False), help="File holding the API key (config: api_key_file)."
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def build_load(flags: dict[str, Any]) -> Load:
    """Every load flag checked and the prompts built, before any request: nothing here talks to
    a server. The prompts are built up front, so their size is capped (-n × --input-len words)."""
    num, out_len = flags["num_prompts"], flags["output_len"]
    if num < 1 or out_len < 1 or flags["input_len"] < 1:
        raise UsageError("--num-prompts, --input-len and --output-len must be at least 1")
    kind = flags["dataset"]
    words = num * flags["input_len"] * (1 + flags["range_ratio"] if kind == "random" else 1)
    if kind in ("fixed", "random") and words > MAX_PROMPT_WORDS:
        raise ConfigError(
            f"-n {num} prompts of --input-len {flags['input_len']} words would be {int(words)} words; "
            f"kit bench builds at most {MAX_PROMPT_WORDS} up front",
            key="--num-prompts",
            hint="lower -n or --input-len",
        )
    prompts: list[Prompt]
    if kind == "fixed":
        prompts = dataset.fixed(num, flags["input_len"], out_len, seed=flags["seed"])
    elif kind == "random":
        prompts = dataset.random_lengths(num, flags["input_len"], out_len, flags["range_ratio"], seed=flags["seed"])
    else:
        prompts = dataset.load_file(Path(kind), num, out_len, seed=flags["seed"])
    description = {
        "dataset": kind,
        "input_len": flags["input_len"] if kind in ("fixed", "random") else None,
        "output_len": out_len,
        "range_ratio": flags["range_ratio"] if kind == "random" else None,
        "burstiness": flags["burstiness"],
        "ignore_eos": flags["ignore_eos"],
    }
    points = sweep(flags["rate"], flags["concurrency"])
    for point in points:
        in_flight = min(point.concurrency or num, num)
        if in_flight > MAX_IN_FLIGHT:
            what = f"--concurrency {point.concurrency}" if point.concurrency else f"-n {num} with no --concurrency"
            raise ConfigError(
                f"{what} would put {in_flight} requests in flight; kit bench keeps at most {MAX_IN_FLIGHT}",
                key="--concurrency",
                hint=f"pass --concurrency {MAX_IN_FLIGHT} or less",
            )
    return Load(
        prompts=prompts,
        points=points,
        warmup=max(0, flags["warmup"]),
        seed=flags["seed"],
        burstiness=flags["burstiness"],
        description=description,
    )


def has_matplotlib() -> bool:
    """Whether --plot can work, found without importing it: importing matplotlib writes its
    config folder under $HOME, and a refused command must write nothing."""
    if "matplotlib" in sys.modules:
        return sys.modules["matplotlib"] is not None
    return importlib.util.find_spec("matplotlib") is not None


def served_layout(script: str) -> dict[str, Any]:
    """The layout in a serve script's `vllm serve` line (pure): TP, PP, DP, EP, model and
    context length, each only where the line says it (vLLM's defaults: 1, 1, 1, off)."""
    line = next((ln for ln in script.splitlines() if " vllm serve " in f" {ln.strip()} "), None)
    if line is None:
        return {}
    try:
        argv = shlex.split(line)
    except ValueError:
        return {}
    argv = argv[argv.index("vllm") + 1 :] if "vllm" in argv else argv
    if len(argv) < 2 or argv[0] != "serve":
        return {}

    def value(flag: str) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv[:-1] else None

    def number(flag: str) -> int:
        raw = value(flag)
        return int(raw) if raw is not None and raw.isdigit() else 1

    max_len = value("--max-model-len")
    return {
        "model": argv[1],
        "tp": number("--tensor-parallel-size"),
        "pp": number("--pipeline-parallel-size"),
        "dp": number("--data-parallel-size"),
        "ep": "--enable-expert-parallel" in argv,
        "max_model_len": int(max_len) if max_len and max_len.isdigit() else None,
    }


def cluster_info(config: KitConfig, url: str, server_version: str | None, model: str) -> dict[str, Any]:
    """What was measured. A kit cluster serves `url` when this host runs its head at that
    address, or, with no node here, when it is the configured head_address: then its plan,
    image digest and nodes (kit status's view). Anything else is an external server: plan null,
    with what the server itself says (the model it serves, its /version), never the plan of a
    kit.yaml that did not start it."""
    from kit import __version__
    from kit.commands.serve import server_url

    versions = {"vllm": server_version, "kit": __version__}
    runtime: Runtime | None = None
    try:
        from kit.runtime import get_runtime

        runtime = get_runtime(config)
        running = [n for n in runtime.find_nodes(config.cluster) if n.state == "running"]
    except Exception:  # no engine here (a laptop against --url): only head_address can say
        running = []
    if running:
        ours = server_url(config, running) == url
    else:
        ours = bool(config.head_address) and url == f"http://{config.head_address}:{config.ports.api}"
    if not ours:
        return {
            "name": None,
            "plan": None,
            "url": url,
            "served_model": model,
            "image": None,
            "image_digest": None,
            "versions": versions,
            "nodes": [],
        }
    head = next((n for n in running if n.role == "head"), None)
    plan = {
        "tp": config.tp,
        "pp": config.pp,
        "dp": config.dp,
        "ep": config.model.ep,
        "nodes": config.nodes,
        "gpus_per_node": config.gpus_per_node,
        "backend": head.labels.get("kit.backend", config.backend) if head else config.backend,
        "accelerator": head.labels.get("kit.accelerator", config.accelerator) if head else config.accelerator,
        "model": config.model.id,
        "max_model_len": config.model.max_model_len,
    }
    if head is not None and runtime is not None:
        # What the head really runs (`kit serve` wrote it there), over what this kit.yaml says:
        # a server started with other settings (`kit demo`, --set on serve) is measured as it is.
        from kit.commands.serve import SERVE_SCRIPT

        with contextlib.suppress(Exception):
            served = runtime.exec(head, ["cat", SERVE_SCRIPT])
            if served.returncode == 0:
                plan.update(served_layout(served.stdout), nodes=len(running))
    return {
        "name": config.cluster,
        "plan": plan,
        "url": url,
        "served_model": model,
        "image": (head.image if head else None) or config.image,
        "image_digest": head.image_digest if head else None,
        "versions": versions,
        "nodes": [{"name": n.name, "role": n.role, "ip": n.ip, "image_digest": n.image_digest} for n in running],
    }


def resolve_target(
    config: KitConfig, url: str | None, api_key_file: str | None, model: str | None, flags: dict[str, Any]
) -> tuple[Target, str | None]:
    """The server to load (its URL, key and model name, checked with GET /v1/models: an
    unreachable URL or a wrong key is one line and exit 8 before any load is sent)."""
    from kit import client
    from kit.commands.query import default_url

    base = (url or default_url(config)).rstrip("/")
    key = client.read_key(api_key_file or config.api_key_file)
    models = client.list_models(base, key)
    name = model or (models[0]["id"] if models else config.served_name)
    target = Target(
        base_url=base, model=name, api_key=key, ignore_eos=flags["ignore_eos"], timeout_s=flags["request_timeout"]
    )
    return target, key


@click.command(name="bench", cls=KitCommand)
@click.option("--url", type=Url(), help="Server URL (default: the cluster's head, port ports.api).")
@click.option("--model", help="Model name to load (default: the first one the server lists).")
@load_options
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Where to save the results JSON.")
@click.option("--no-save", is_flag=True, help="Do not save the results.")
@click.option(
    "--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), help="Write a latency vs throughput PNG."
)
@click.option(
    "--from",
    "from_files",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --plot: plot saved results (repeatable) instead of running.",
)
@click.option(
    "--compare",
    nargs=2,
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="A.json B.json",
    help="Print B/A ratios of two saved results; runs nothing.",
)
@config_options
@json_option
def command(
    url: str | None,
    model: str | None,
    output: Path | None,
    no_save: bool,
    plot_path: Path | None,
    from_files: tuple[Path, ...],
    compare: tuple[Path, Path] | None,
    config_path: str | None,
    cluster: str | None,
    set_values: tuple[str, ...],
    as_json: bool,
    api_key_file: str | None,
    **flags: Any,
) -> None:
    """Benchmark the server: streaming chat requests at a request rate or concurrency (or sweeps
    of them), then TTFT, TPOT (first token excluded), ITL, end-to-end latency (mean, p50, p90,
    p99), request and token throughput and errors — the definitions of `vllm bench serve`.

    \b
    Results (with the cluster's plan, vLLM version and image digest) are saved under the state
    directory (or --output) after every load point, so a failure keeps what was measured.

    \b
    Examples:
      kit bench                                   # 16 requests, 32 words in, 32 tokens out
      kit bench -n 64 --concurrency 1,4,16 --plot curve.png
      kit bench --rate 2,4,8 --dataset prompts.jsonl --api-key-file ~/.config/kit/api_key
      kit bench --compare before.json after.json
      kit bench --plot tp.png --from tp1.json --from tp2.json
    """
    if compare:
        a, b = results.load(compare[0]), results.load(compare[1])
        rows = results.compare(a, b)
        emit(
            "bench",
            {"compare": [str(p) for p in compare], "rows": rows},
            as_json=as_json,
            text=lambda: results.render_compare(rows, a, b),
        )
        return
    if from_files:
        if not plot_path:
            raise UsageError(
                "--from only goes with --plot", hint="kit bench --plot out.png --from a.json --from b.json"
            )
        from kit.bench.plot import plot

        writable(plot_path, "--plot")
        docs = [results.load(p, "--from") for p in from_files]
        plot(docs, [p.stem for p in from_files], plot_path)
        emit("bench", {"plot": str(plot_path)}, as_json=as_json, text=f"wrote {plot_path}")
        return
    if plot_path and not has_matplotlib():  # fail before the run, not after it
        raise UsageError(
            "--plot needs matplotlib, which is not installed",
            hint="pip install 'kit[plot]' (or pip install matplotlib)",
        )
    from kit.bench import measure
    from kit.output import LiveLine
    from kit.state import state_dir

    load = build_load(flags)  # a malformed dataset fails here, before any request
    writable(None if no_save else output, "--output")  # and an unwritable output file
    writable(plot_path, "--plot")
    readable(api_key_file, "--api-key-file")
    config = resolve_cluster(config_path, cluster, set_values).config
    target, key = resolve_target(config, url, api_key_file, model, flags)
    version = measure.server_version(target.base_url, key)
    doc = results.new_document(
        target={"url": target.base_url, "model": target.model},
        load=load.to_dict(),
        cluster=cluster_info(config, target.base_url, version, target.model),
    )
    save_to = None if no_save else (output or results.default_path(state_dir(), config.cluster))
    progress(
        f"kit bench: {len(load.prompts)} requests x {len(load.points)} point(s) "
        f"against {target.base_url} ({target.model})",
        as_json=as_json,
    )
    live = LiveLine(as_json=as_json)
    measure.interrupt_on_sigterm()
    stopped = measure.run_load(target, load, doc, save_to=save_to, live=live)
    measure.finish(doc, stopped, save_to)
    if plot_path:
        from kit.bench.plot import plot

        plot([doc], [config.cluster], plot_path)
    summary = {k: v for k, v in doc.items()}
    summary["saved_to"] = str(save_to) if save_to else None
    summary["plot"] = str(plot_path) if plot_path else None

    def text() -> str:
        lines = [results.render(doc)]
        if save_to:
            lines.append(f"saved to {save_to}")
        if plot_path:
            lines.append(f"plot: {plot_path}")
        return "\n".join(lines)

    emit("bench", summary, as_json=as_json, text=text)
