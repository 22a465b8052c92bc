"""`sim plan --plots`: the figures a person reads at a glance. A rate where requests did not finish is
marked, not drawn as a wall that squashes every real latency; a plot with nothing to show is not written;
no legend covers the data."""
import dataclasses

import pytest

import sim.plan.plots as plots
from sim.cli import main
from sim.plan.config import PlanConfig
from sim.plan.search import ConfigResult
from sim.plan.table import rank
from sim.plan.plots import write_plan_plots
from traces.metrics import parse_slo
from workloads import DEFAULT_WORKLOAD

SLO = "ttft_p99=500ms,tpot_p99=20ms"
CONFIG = PlanConfig(replicas=1, router="least_outstanding", hardware="h100", model="llama-3.1-8b",
                    max_model_len=8192, block_size=16, max_num_seqs=32)


def _point(rate: float, ttft_s: float, tpot_s: float) -> dict:
    labels = [s.label for s in parse_slo(SLO)]
    return {"rate": rate, "meets": ttft_s <= 0.5 and tpot_s <= 0.02, labels[0]: ttft_s, labels[1]: tpot_s}


def _results(failed: bool = True, met: bool = True) -> dict[PlanConfig, ConfigResult]:
    """Two configurations as the rate search leaves them; with `failed`, the top rates of each left
    requests unfinished (slo_check's 1e18 s)."""
    out = {}
    for replicas, scale in ((1, 1.0), (2, 0.7)):
        points = [_point(r, 0.1 * scale * r / 4, 0.008 * scale * (1 + r / 16)) for r in (4, 8, 12)]
        if failed:
            points += [_point(r, 1e18, 1e18) for r in (16, 32)]
        out[dataclasses.replace(CONFIG, replicas=replicas)] = ConfigResult(
            max_rate=12.0 if met else 0.0, mean_output_tokens=100.0, user_tok_s=80.0 / scale if met else None,
            attainment=1.0, points=points)
    return out


def _draw(tmp_path, monkeypatch, prices=None, **kw):
    """write_plan_plots on the results, keeping each figure it saves (by file name) to look into."""
    results = _results(**kw)
    rows = rank(list(results.items()), prices or {})
    figures = {}
    save = plots.save_png

    def keep(fig, path, *args, **kwargs):
        figures[path.name] = fig
        save(fig, path, *args, **kwargs)

    monkeypatch.setattr(plots, "save_png", keep)
    written = write_plan_plots(rows, {c.key: r for c, r in results.items()}, parse_slo(SLO), ["replicas"],
                               tmp_path, "test")
    return written, figures


def test_a_rate_where_requests_did_not_finish_leaves_the_latency_axis_on_real_latencies(tmp_path, monkeypatch):
    _, figures = _draw(tmp_path, monkeypatch)
    for ax in figures["latency_vs_rate.png"].axes:
        lo, hi = ax.get_ylim()
        assert hi < 1e6, (ax.get_title(), hi)  # in ms; a wall at 1e18 s drew the axis up to 1e9 ms
        assert hi < 0.5e3 * 10 if "ttft" in ax.get_title() else hi < 20 * 10


def test_a_rate_where_requests_did_not_finish_is_still_marked(tmp_path, monkeypatch):
    _, figures = _draw(tmp_path, monkeypatch)
    for ax in figures["latency_vs_rate.png"].axes:
        marked = [line for line in ax.get_lines() if line.get_marker() == "x"]
        assert sorted(x for line in marked for x in line.get_xdata()) == [16, 16, 32, 32], ax.get_title()


def test_no_cost_frontier_without_prices(tmp_path, monkeypatch):
    written, _ = _draw(tmp_path, monkeypatch)
    assert [p.name for p in written] == ["latency_vs_rate.png", "pareto.png"]
    assert not (tmp_path / "cost_frontier.png").exists()


def test_the_plan_command_lists_no_cost_frontier_without_prices(tmp_path, capsys):
    assert main(["plan", str(DEFAULT_WORKLOAD), "--slo", "ttft_p99=2s,tpot_p99=80ms", "--max-requests", "20",
                 "--rate-tol", "0.5", "--plots", str(tmp_path), "--no-progress", "--jobs", "1"]) == 0
    listed = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("plots:"))
    assert "cost_frontier" not in listed and "latency_vs_rate.png" in listed
    assert not (tmp_path / "cost_frontier.png").exists()


def test_a_cost_frontier_is_drawn_with_prices(tmp_path, monkeypatch):
    written, _ = _draw(tmp_path, monkeypatch, prices={"h100": 2.5})
    assert "cost_frontier.png" in [p.name for p in written] and (tmp_path / "cost_frontier.png").stat().st_size


def test_no_pareto_plot_when_no_configuration_met_the_slos(tmp_path, monkeypatch):
    written, _ = _draw(tmp_path, monkeypatch, met=False)
    assert [p.name for p in written] == ["latency_vs_rate.png"]


@pytest.mark.parametrize("name", ["latency_vs_rate.png", "cost_frontier.png", "pareto.png"])
def test_no_legend_covers_the_axes(tmp_path, monkeypatch, name):
    _, figures = _draw(tmp_path, monkeypatch, prices={"h100": 2.5})
    fig = figures[name]
    fig.canvas.draw()
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    assert legends
    for legend in legends:
        box = legend.get_window_extent()
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent()), (name, ax.get_title())


def test_a_rate_whose_percentile_fell_among_the_unfinished_is_marked_failed():
    from sim.plan.plots import split_points

    points = [{"rate": 1.0, "ttft": 0.2}, {"rate": 2.0, "ttft": None}, {"rate": 3.0}]
    assert split_points(points, "ttft") == ([(1.0, 0.2)], [2.0])
