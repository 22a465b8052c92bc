"""How well the simulator predicts real vLLM runs on GPUs: every run under bench/data/ is imported (`sim
import-run`), then replayed with the kernels measured on its GPU (the run's profile bundle), with the
per-kernel roofline, and with AIConfigurator's databases where its GPU has them, exactly as a user would
(`sim replay IMPORTED --model CONFIG --hardware NAME --cost-model BUNDLE|roofline|aiconfigurator`).

Per run and cost model it prints `<metric> error: X %` for the mean, p50, p90 and p99 of TTFT, TPOT and
latency, beside the peer simulator's error on the same run (the run's validation/summary.txt), then what
the worst metric's error is made of: the replay's and vLLM's mean time in the queue (arrival to first
scheduled), to the first token once scheduled, and in decode (first to last token). The simulator is
deterministic, so one replay per case is the figure; a replay's wall time is printed beside it.

    python bench/gpu_fidelity.py [--data bench/data/llmservingsim_vllm_runs] [--cost-models bundle,roofline,...]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import traces  # noqa: E402
from sim.cli import main as sim_main  # noqa: E402
from sim.report.summary import request_metrics  # noqa: E402

METRICS = [f"{m}_{s}" for m in ("ttft", "tpot", "latency") for s in ("mean", "p50", "p90", "p99")]
PEER_ROWS = {"TTFT": "ttft", "TPOT": "tpot", "Latency": "latency", "Mean": "mean", "Median": "p50", "P90": "p90",
             "P99": "p99"}


def peer_errors(summary: Path) -> dict[str, float]:
    """The peer's % error per metric from its summary.txt (`TTFT Mean  7097.2  6815.7  -4.0%`)."""
    out = {}
    for line in summary.read_text().splitlines():
        m = re.match(r"(TTFT|TPOT|Latency) (Mean|Median|P90|P99)\s+\S+\s+\S+\s+([-+]?[\d.]+)%", line)
        if m:
            out[f"{PEER_ROWS[m[1]]}_{PEER_ROWS[m[2]]}"] = float(m[3])
    return out


def bundle_for(data: Path, model: str, gpu: str) -> Path | None:
    """The profile bundle measured for `model` (org/name) on the run's GPU."""
    for meta in sorted(data.glob(f"profiles/{gpu}/**/meta.yaml")):
        if model.lower() in str(meta.parent).lower().replace("\\", "/"):
            return meta.parent
    return None


def phases(trace_dir: Path) -> dict[str, float]:
    """Mean seconds in the queue, to the first token once scheduled, and in decode."""
    r = traces.load(trace_dir, tables=("requests",)).requests
    r = r[r["finish"].notna()]
    return {"queue": float((r["first_scheduled"] - r["arrival"]).mean()),
            "first_token": float((r["first_token"] - r["first_scheduled"]).mean()),
            "decode": float((r["finish"] - r["first_token"]).mean())}


def run_sim(argv: list[str]) -> None:
    """One `sim` command; what it prints is left out (its figures are recomputed here), its errors are not."""
    with contextlib.redirect_stdout(io.StringIO()):
        code = sim_main(argv)
    if code != 0:
        raise SystemExit(f"gpu_fidelity: `sim {' '.join(argv)}` exited {code}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parent / "data" / "llmservingsim_vllm_runs")
    p.add_argument("--cost-models", default="bundle,roofline,aiconfigurator")
    args = p.parse_args()
    wanted = args.cost_models.split(",")
    runs = sorted(d for d in args.data.glob("*") if (d / "vllm" / "meta.json").is_file())
    if not runs:
        print(f"gpu_fidelity: no runs under {args.data}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gpu_fidelity-"))
    for run in runs:
        meta = json.loads((run / "vllm" / "meta.json").read_text())
        model = meta["model"]
        config = args.data / "models" / f"{model.split('/')[-1]}.json"
        gpu = json.loads((run / "config.json").read_text())["nodes"][0]["instances"][0]["hardware"]
        imported = work / f"{run.name}-imported"
        run_sim(["import-run", str(run), "-o", str(imported), "--model-config", str(config)])
        measured = request_metrics(imported)
        peer = peer_errors(run / "validation" / "summary.txt")
        bundle = bundle_for(args.data, model, gpu)
        cases = {"bundle": str(bundle) if bundle else None, "roofline": "roofline", "aiconfigurator": "aiconfigurator"}
        print(f"run: {run.name} ({model}, {gpu}, tensor parallel {meta['engine_kwargs'].get('tensor_parallel_size', 1)})")
        for name in wanted:
            cost = cases.get(name)
            if cost is None:
                print(f"{name}: skipped (no such cost model for this run)")
                continue
            out = work / f"{run.name}-{name}"
            hardware = ["--hardware", "rtx-pro-6000"] if name != "bundle" else []
            t0 = time.perf_counter()
            try:
                run_sim(["replay", str(imported), "--cost-model", cost, "--model", str(config), *hardware,
                         "--trace", str(out), "--no-progress"])
            except SystemExit as e:
                print(f"{name}: not run ({e})")
                continue
            wall = time.perf_counter() - t0
            predicted = request_metrics(out)
            errors = {m: 100 * (predicted[m] / measured[m] - 1) for m in METRICS}
            print(f"cost model: {name}")
            for m in METRICS:
                peer_txt = f" (peer {peer[m]:+.1f} %)" if m in peer else ""
                print(f"{m} error: {errors[m]:+.1f} %{peer_txt}")
            core = [m for m in METRICS if not m.endswith("p99")]
            worst = max(core, key=lambda m: abs(errors[m]))
            within = sum(abs(errors[m]) <= 5 for m in core)
            no_worse = sum(abs(errors[m]) <= abs(peer.get(m, 0)) + 0.05 for m in core)
            print(f"within 5 %: {within}/{len(core)} of mean, p50, p90")
            print(f"no worse than the peer: {no_worse}/{len(core)}")
            a, b = phases(imported), phases(out)
            split = " | ".join(f"{k} {b[k] - a[k]:+.3f} s ({a[k]:.3f} -> {b[k]:.3f})" for k in a)
            print(f"worst: {worst} {errors[worst]:+.1f} %; mean per request, replay - vLLM: {split}")
            print(f"replay wall time: {wall:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
