"""One line names what a trace is a run of; the TUI header and `sim replay` share it."""
from traces.describe import describe_run


def test_engine_run_is_named_by_model_architecture_and_device():
    meta = {"source": "engine", "config": {"model": {"model": "builtin", "architecture": "Qwen3ForCausalLM"}},
            "device": {"type": "cpu"}}
    assert describe_run(meta) == "engine · builtin (Qwen3ForCausalLM) on cpu"


def test_simulated_run_names_model_hardware_and_cost_model():
    meta = {"source": "sim", "config": {"model": {"model": "llama-3.1-8b"}}, "device": {"type": "sim",
            "hardware": "h200"}, "cost_model": {"name": "roofline"}}
    assert describe_run(meta) == "sim · llama-3.1-8b on h200 · roofline"


def test_calibrated_profile_says_what_it_was_fitted_on():
    meta = {"source": "sim", "config": {"model": {"model": "builtin"}}, "device": {"type": "sim", "hardware": None},
            "cost_model": {"name": "calibrated", "fitted_on": ["runs/a"]}}
    assert describe_run(meta) == "sim · builtin · calibrated (fitted on runs/a)"


def test_vllm_run_names_vllm_and_its_version():
    meta = {"source": "engine", "vllm": {"version": "0.32.0"}, "config": {"model": {"model": "tiny"}},
            "device": {"type": "cpu"}}
    assert describe_run(meta) == "vllm 0.32.0 · tiny on cpu"


def test_missing_fields_leave_out_their_words():
    assert describe_run({}) == "?"
