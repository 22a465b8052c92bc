"""The engine's start-up line counts KV blocks the way the scheduler, the trace and the TUI do."""
import logging

import traces
from engine import LLM, SamplingParams


def test_startup_line_counts_the_usable_blocks_the_trace_reports(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="stepscope"):
        llm = LLM(device="cpu", num_gpu_blocks_override=40, max_model_len=128, trace=str(tmp_path))
    llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    llm.shutdown()
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("KV cache:"))
    assert line.startswith("KV cache: 39 usable blocks of 16 tokens (624 tokens; +1 null block")
    assert int(traces.load(tmp_path).steps["kv_blocks_total"].iloc[0]) == 39
