"""What `sim replay` tells a user before and after its numbers: what it simulated, and where its trace is."""
import traces
from sim.cli import _simulated_model, main
from sim.cost_models.base import CostModelDefaults, CostModelInfo
from workloads import DEFAULT_WORKLOAD

ARGS = ["replay", str(DEFAULT_WORKLOAD), "--model", "qwen3-0.6b", "--hardware", "h200", "--max-requests", "12",
        "--no-progress"]


class _Source:
    model = {"model": "builtin", "architecture": "Qwen3ForCausalLM"}


def test_replay_says_what_it_simulates_before_its_numbers(tmp_path, capsys):
    assert main([*ARGS, "--trace", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"simulating {DEFAULT_WORKLOAD} (12 requests): sim · qwen3-0.6b on h200 · roofline")
    assert out[1].startswith("  KV cache ") and "blocks x 16 tokens" in out[1] and "max_model_len" in out[1]
    assert "sync scheduling, fcfs, max_num_seqs" in out[2] and "prefix caching on" in out[2]
    assert out.index(next(line for line in out if line.startswith("requests:"))) > 2


def test_replay_without_trace_keeps_it_under_runs_and_says_where(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(ARGS) == 0
    (kept,) = (tmp_path / "runs").iterdir()
    assert kept.name.startswith("bursty-sim-")
    assert f"trace: runs/{kept.name}" in capsys.readouterr().out
    assert traces.load(kept).meta["complete"] is True


class _Described(CostModelDefaults):
    """A cost model that says only what `describe` gives it."""

    def __init__(self, info: CostModelInfo) -> None:
        self.name, self.info = info.name, info

    def describe(self) -> CostModelInfo:
        return self.info


def test_calibrated_replay_is_labelled_with_the_profile_s_model_and_device():
    fitted = {"model": "builtin", "architecture": "Qwen3ForCausalLM"}
    cost = _Described(CostModelInfo(name="calibrated", model="builtin", hardware="cpu", fitted_model=fitted))
    model, hardware = _simulated_model(_Source(), "llama-3.1-8b", "h100", cost)
    assert model["model"] == "builtin" and hardware == "cpu"


def test_roofline_replay_of_an_engine_trace_names_the_trace_s_model_not_hf_config():
    cost = _Described(CostModelInfo(name="roofline", model="custom", hardware="h200"))
    model, hardware = _simulated_model(_Source(), {"hidden_size": 256}, None, cost)
    assert model["model"] == "builtin" and model["hf_config"] == {"hidden_size": 256} and hardware == "h200"


def test_plots_carry_what_was_simulated_and_the_slo_thresholds(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    seen = []
    real = Figure.savefig

    def spy(fig, path, *a, **kw):
        legends = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
        seen.append((fig._suptitle.get_text() if fig._suptitle else "", legends))
        return real(fig, path, *a, **kw)

    monkeypatch.setattr(Figure, "savefig", spy)
    assert main([*ARGS, "--slo", "ttft_p99=2s", "--plots", str(tmp_path / "p"), "--trace", str(tmp_path / "t")]) == 0
    assert all(title == "bursty · sim · qwen3-0.6b on h200 · roofline" for title, _ in seen)
    assert ["ttft_p99<=2000ms"] in [legends for _, legends in seen]
