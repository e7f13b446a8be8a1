"""kit.sizing.layout_candidates / pick_layout (issue 10): TP×PP vs DP+EP on the real MoE configs,
and `kit plan`'s text and --json through click's CliRunner."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kit import sizing
from kit.cli import cli
from kit.errors import ConfigError

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
MOE = [
    "deepseek-v3",
    "qwen3.5-397b-a17b-gptq-int4",
    "wizardlm-2-8x22b",
    "qwen3.5-18b-reap-a3b",
    "gpt-oss-20b",
    "gpt-oss-120b",
]


def arch(name: str) -> sizing.Architecture:
    return sizing.parse_architecture(json.loads((MODELS / name / "config.json").read_text()))


def candidates(
    name: str, gpu: str, gpus_per_node: int, nodes: int, length: int, **kw: Any
) -> tuple[sizing.LayoutFit, ...]:
    return sizing.layout_candidates(
        arch(name),
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        gpu_memory_bytes=sizing.gpu_memory_bytes(gpu),
        max_model_len=length,
        **kw,
    )


def by_name(layouts: tuple[sizing.LayoutFit, ...]) -> dict[str, sizing.LayoutFit]:
    return {c.name: c for c in layouts}


@pytest.mark.parametrize("name", MOE)
def test_every_layout_follows_vllms_rules(name: str) -> None:
    a = arch(name)
    assert a.moe is not None
    layouts = candidates(name, "H200", 8, 2, 8192)
    kinds = {c.kind for c in layouts}
    assert kinds == {"tp×pp", "dp+ep"}
    for c in layouts:
        assert c.layout.tp * c.layout.pp * c.layout.dp == c.layout.gpus == 16
        assert 8 % c.layout.tp == 0 and a.num_attention_heads % c.layout.tp == 0
        if c.layout.dp > 1:
            assert c.layout.pp == 1 and c.layout.ep_size == c.layout.tp * c.layout.dp  # EP spans TP × DP; no DP × PP
            assert c.layout.dp % c.nodes == 0  # DP ranks spread evenly over the nodes
            assert "--enable-expert-parallel" in c.vllm_args()
            if a.moe.num_experts % c.layout.ep_size:
                assert not c.fits and "do not divide" in c.why_not
        else:
            assert c.layout.ep_size == 1 and "--data-parallel-size" not in c.vllm_args()
        assert c.weights_per_gpu == c.dense_weights_per_gpu + c.expert_weights_per_gpu
        assert c.kv_room_per_gpu == c.budget_per_gpu - c.weights_per_gpu - c.overhead_per_gpu
        if c.fits:
            assert c.max_concurrent_seqs == c.seqs_per_replica * c.layout.dp >= 1
            assert c.scheduled_seqs == min(c.seqs_per_replica, c.max_num_seqs) * c.layout.dp


def test_ep_splits_experts_over_all_gpus_and_copies_the_rest_per_dp_rank() -> None:
    a = arch("deepseek-v3")
    w = sizing.estimate_weights(a)
    layouts = by_name(candidates("deepseek-v3", "H200", 8, 2, 32768))
    dp16 = layouts["DP16+EP16 (TP1)"]
    # 256 experts / EP 16 = 16 experts of each MoE layer per GPU.
    assert dp16.expert_weights_per_gpu == math.ceil(sum(w.layer_expert_bytes) * 16 / 256)
    # TP 1: attention, dense layers, shared experts, embeddings and lm_head are whole on every GPU.
    assert dp16.dense_weights_per_gpu == pytest.approx(w.loaded_bytes - sum(w.layer_expert_bytes), abs=1)
    # MLA: a DP rank holds its own sequences' latent, once (TP would copy it on every rank).
    assert dp16.kv_per_sequence_per_gpu == 61 * 576 * 2 * 32768
    tp8 = layouts["TP8×PP2"]
    assert tp8.expert_weights_per_gpu > dp16.expert_weights_per_gpu  # the 31-layer stage / 8
    assert tp8.dense_weights_per_gpu < dp16.dense_weights_per_gpu


def test_deepseek_on_two_h200_nodes_recommends_dp_ep() -> None:
    layouts = candidates("deepseek-v3", "H200", 8, 2, 32768)
    best, why = sizing.pick_layout(layouts)
    assert best is not None and (best.layout.tp, best.layout.pp, best.layout.dp, best.layout.ep_size) == (1, 1, 16, 16)
    assert "max-num-seqs 256" in why and "\n" not in why
    pp16 = by_name(layouts)["TP1×PP16"]
    assert pp16.max_concurrent_seqs > best.max_concurrent_seqs  # more KV, but one engine
    assert pp16.scheduled_seqs == 256 < best.scheduled_seqs
    assert best.vllm_args()[:7] == [
        "--tensor-parallel-size",
        "1",
        "--data-parallel-size",
        "16",
        "--data-parallel-size-local",
        "8",
        "--enable-expert-parallel",
    ]


def test_meluxina_guide_keeps_tp_pp_because_dp_copies_weights() -> None:
    best, why = sizing.pick_layout(candidates("qwen3.5-397b-a17b-gptq-int4", "A100-40GB", 4, 2, 262144))
    assert best is not None and best.layout.dp == 1
    assert "copies attention and dense weights" in why


def test_gpt_oss_short_context_prefers_dp_ep_engines() -> None:
    best, why = sizing.pick_layout(candidates("gpt-oss-20b", "H100-80GB", 8, 1, 8192))
    assert best is not None and best.name == "DP8+EP8 (TP1)" and best.scheduled_seqs == 8 * 256
    assert why.startswith("DP8+EP8 (TP1) runs 2048 concurrent 8192-token sequences vs 256 for TP8×PP1")
    best120, _ = sizing.pick_layout(candidates("gpt-oss-120b", "H100-80GB", 8, 1, 131072))
    assert best120 is not None and best120.name == "TP8×PP1"


def test_experts_that_do_not_divide_by_ep_are_refused() -> None:
    layouts = candidates("wizardlm-2-8x22b", "H100-80GB", 8, 2, 4096)  # 8 experts, EP 16
    dp = [c for c in layouts if c.layout.dp > 1]
    assert dp and not any(c.fits for c in dp)
    assert all("8 experts do not divide by EP 16" in c.why_not for c in dp)
    best, why = sizing.pick_layout(layouts)
    assert best is not None and best.layout.dp == 1 and "no DP+EP layout fits" in why


def test_too_small_gpus_fit_nothing() -> None:
    layouts = candidates("deepseek-v3", "A100-40GB", 8, 1, 4096)
    assert not any(c.fits for c in layouts)
    assert sizing.pick_layout(layouts) == (
        None,
        "no layout holds the weights and one full-length sequence on these GPUs",
    )


def test_dense_models_get_tp_pp_only() -> None:
    layouts = candidates("qwen2.5-7b", "A100-80GB", 8, 1, 4096)
    assert layouts and all(c.layout.dp == 1 and c.layout.ep_size == 1 for c in layouts)


def test_layout_refusals() -> None:
    with pytest.raises(ConfigError, match="nodes"):
        sizing.layout_candidates(arch("gpt-oss-20b"), nodes=0, gpus_per_node=8, gpu_memory_bytes=80 * sizing.GiB)
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        sizing.layout_candidates(
            arch("gpt-oss-20b"), nodes=1, gpus_per_node=8, gpu_memory_bytes=80 * sizing.GiB, gpu_memory_utilization=2
        )


# --------------------------------------------------------------------------- kit plan (CliRunner)

DEEPSEEK = [str(MODELS / "deepseek-v3"), "--gpu", "H200", "--gpus-per-node", "8", "--nodes", "2"]


def plan(*args: str) -> str:
    result = CliRunner().invoke(cli, ["plan", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_plan_text_compares_layouts_and_explains_the_pick() -> None:
    out = plan(*DEEPSEEK, "--max-model-len", "32768")
    section = out[out.index("Layouts on 2 node(s) × 8 GPUs") :]
    for name in ("TP8×PP2", "TP1×PP16", "DP2+EP16 (TP8)", "* DP16+EP16 (TP1)"):
        assert name in section
    assert "weights/GPU (dense + experts)" in section and "KV room/GPU" in section and "runs at once" in section
    line = next(x for x in section.splitlines() if "recommended:" in x)
    assert "DP16+EP16 (TP1) runs 496 concurrent 32768-token sequences vs 262 for 2× TP1×PP8 (router)" in line
    assert "--data-parallel-size 16 --data-parallel-size-local 8 --enable-expert-parallel" in section
    # one recommendation only: the smallest-fit block defers to the layout comparison
    assert "Recommendation" not in out and out.index("Fewest nodes, largest TP") < out.index("Layouts on")
    assert "note: on these nodes DP16+EP16 (TP1) runs more at once: see the recommendation below" in out


def test_plan_json_carries_every_candidate() -> None:
    doc = json.loads(plan(*DEEPSEEK, "--max-model-len", "32768", "--json"))
    layouts = doc["result"]["layouts"]
    assert layouts["recommended"] == "DP16+EP16 (TP1)" and "EP" in layouts["why"]
    cands = layouts["candidates"]
    assert len([c for c in cands if c["kind"] != "replicas"]) == 8
    replicas = [c for c in cands if c["kind"] == "replicas"]  # issue 29: replicas behind a router
    assert replicas and all(c["dp"] >= 2 and c["ep"] == 1 for c in replicas)
    for c in cands:
        for key in ("tp", "pp", "dp", "ep", "weights_per_gpu", "kv_room_per_gpu", "max_concurrent_seqs", "fits"):
            assert key in c
    dp16 = next(c for c in cands if c["name"] == "DP16+EP16 (TP1)")
    assert (dp16["tp"], dp16["pp"], dp16["dp"], dp16["ep"], dp16["kind"]) == (1, 1, 16, 16, "dp+ep")
    assert dp16["scheduled_seqs"] == 496 and "--enable-expert-parallel" in dp16["vllm_args"]
    assert "layer_expert_bytes" not in doc["result"]["weights"]


def test_plan_refused_layouts_say_why_and_dense_compares_replicas() -> None:
    out = plan(str(MODELS / "wizardlm-2-8x22b"), "--gpu", "H100-80GB", "--nodes", "2", "--max-model-len", "4096")
    assert "8 experts do not divide by EP 16" in out
    # A dense model: TP×PP against replicas behind the router (issue 29), no DP+EP.
    doc = json.loads(plan(str(MODELS / "qwen2.5-7b"), "--gpu", "A100-80GB", "--json"))
    kinds = {c["kind"] for c in doc["result"]["layouts"]["candidates"]}
    assert kinds == {"tp×pp", "replicas"}
    assert "(router)" in plan(str(MODELS / "qwen2.5-7b"), "--gpu", "A100-80GB")
