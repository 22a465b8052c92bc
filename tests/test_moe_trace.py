"""A MoE model's routing counters in the steps table: a tiny Qwen3-MoE engine run on CPU writes them, dense
and simulated runs write nulls, traces from before the columns load, and the TUI's step view shows them."""
from __future__ import annotations

import asyncio
import shutil

import pyarrow.parquet as pq
import pytest
from transformers import Qwen3MoeConfig

import traces
from engine import LLM, SamplingParams
from engine.builtin import BUILTIN_DIR
from engine.core import CacheConfig, SchedulerConfig
from sim.core.simulator import Simulator
from sim.core.sources import SimRequest
from traces.schema import MOE_COLUMNS
from tui.app import StepscopeApp
from tui.loader import open_trace
from tui.model import RunIndex
from test_tui_reasons import _FixedCost

EXPERTS, TOP_K = 8, 2


def tiny_moe_model(path, num_layers: int):
    """A Qwen3-MoE config.json (every layer sparse: 8 experts, top-2) and the built-in tokenizer; dummy weights."""
    Qwen3MoeConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=4096,
                   num_hidden_layers=num_layers, intermediate_size=96, moe_intermediate_size=32, num_experts=EXPERTS,
                   num_experts_per_tok=TOP_K, norm_topk_prob=True, max_position_embeddings=512,
                   tie_word_embeddings=False).save_pretrained(path)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(BUILTIN_DIR / f, path / f)
    return str(path)


def engine_trace(path, model=None, prompt_lengths=(5, 11, 17)):
    """Greedy requests of 4 tokens each through the engine, traced into `path`."""
    llm = LLM(model, device="cpu", max_model_len=256, kv_cache_memory=8 << 20, trace=str(path),
              load_format="auto" if model is None else "dummy")
    prompts = [{"prompt_token_ids": list(range(10, 10 + n))} for n in prompt_lengths]
    llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False)
    llm.shutdown()
    return path


@pytest.fixture(scope="module")
def moe_trace(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return engine_trace(root / "trace", tiny_moe_model(root / "model", num_layers=2))


def test_a_moe_engine_run_counts_each_steps_routing(moe_trace):
    steps = traces.load(moe_trace).steps
    counted = steps[steps["num_scheduled_tokens"] > 0]
    assert len(counted) and counted[list(MOE_COLUMNS)].notna().all().all()
    tokens = counted["num_scheduled_tokens"]
    most, mean = counted["moe_experts_active_max"], counted["moe_experts_active_mean"]
    assert ((TOP_K <= mean) & (mean <= most) & (most <= EXPERTS)).all()
    assert (most <= TOP_K * tokens).all()  # no more experts than the step's (token, expert) pairs
    busiest = counted["moe_expert_tokens_max"]
    assert ((busiest >= -(-TOP_K * tokens // EXPERTS)) & (busiest <= tokens)).all()


def test_a_single_token_step_activates_exactly_top_k_experts_once_each(tmp_path):
    """One request: every step after its prefill runs one token through each layer's top-2 experts."""
    steps = traces.load(engine_trace(tmp_path / "trace", tiny_moe_model(tmp_path / "model", 1), (3,))).steps
    decode = steps[steps["num_scheduled_tokens"] == 1]
    assert len(decode)
    assert (decode["moe_experts_active_max"] == TOP_K).all() and (decode["moe_experts_active_mean"] == TOP_K).all()
    assert (decode["moe_expert_tokens_max"] == 1).all()


def test_a_dense_engine_run_writes_the_moe_columns_as_null(tmp_path):
    steps = traces.load(engine_trace(tmp_path / "dense")).steps
    assert set(MOE_COLUMNS) <= set(steps.columns) and steps[list(MOE_COLUMNS)].isna().all().all()


def test_a_simulated_run_writes_the_moe_columns_as_null(tmp_path):
    reqs = [SimRequest(request_id=f"r{i}", arrival=0.0, prompt_token_ids=list(range(100 * i, 100 * i + 20)),
                       max_tokens=8, add_time=0.0) for i in range(3)]
    Simulator(SchedulerConfig(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64),
              CacheConfig(block_size=8, num_gpu_blocks=40, enable_prefix_caching=False),
              _FixedCost(), tmp_path / "sim", {}).run(reqs)
    steps = traces.load(tmp_path / "sim").steps
    assert len(steps) and steps[list(MOE_COLUMNS)].isna().all().all()


def without_moe_columns(src, dst):
    """A copy of trace `src` as written before the MoE columns existed."""
    shutil.copytree(src, dst)
    table = pq.read_table(dst / "steps.parquet")
    pq.write_table(table.drop_columns(list(MOE_COLUMNS)), dst / "steps.parquet")
    return dst


def test_a_trace_from_before_the_moe_columns_loads_without_them(moe_trace, tmp_path):
    old = without_moe_columns(moe_trace, tmp_path / "old")
    steps = traces.load(old).steps
    assert len(steps) == len(traces.load(moe_trace).steps) and not set(MOE_COLUMNS) & set(steps.columns)
    assert not RunIndex(open_trace(old)).has_moe


def step_view_text(path, step_keys=()) -> str:
    """The step view's summary as the user sees it, after pressing `step_keys`."""
    async def go():
        async with StepscopeApp(RunIndex(open_trace(path))).run_test(size=(160, 40)) as pilot:
            for key in step_keys:
                await pilot.press(key)
            await pilot.pause()
            return str(pilot.app.query_one("#step-summary").render())
    return asyncio.run(go())


def test_the_step_view_shows_a_moe_steps_routing(moe_trace):
    row = traces.load(moe_trace).steps.iloc[1]
    text = step_view_text(moe_trace, ["n"])
    assert f"Step {row['step']} " in text
    assert (f"MoE routing: {row['moe_experts_active_mean']:.1f} experts active per layer (most "
            f"{row['moe_experts_active_max']}) · busiest expert {row['moe_expert_tokens_max']} of "
            f"{row['num_scheduled_tokens']} tokens") in text


def test_the_step_view_of_a_trace_without_counters_says_nothing_of_moe(moe_trace, tmp_path):
    assert "MoE" not in step_view_text(without_moe_columns(moe_trace, tmp_path / "old"))


def test_a_moe_trace_gives_the_simulator_its_recorded_routing(moe_trace):
    from sim.cost_models.routing import routing_model

    recorded = routing_model(str(moe_trace))
    steps = traces.load(moe_trace).steps
    one = steps[steps["num_scheduled_tokens"] == recorded.tokens[0]]["moe_experts_active_mean"].mean()
    assert recorded.rank_load(recorded.tokens[0], EXPERTS, TOP_K, 1)[0] == pytest.approx(one)


def test_a_dense_trace_as_routing_is_one_line(tmp_path):
    from sim.cost_models.routing import routing_model

    with pytest.raises(ValueError, match="recorded no MoE routing"):
        routing_model(str(engine_trace(tmp_path / "dense", prompt_lengths=(5,))))
