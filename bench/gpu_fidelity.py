"""How well the simulator predicts real vLLM runs on GPUs: every run under bench/data/ is imported (`sim
import-run`), then replayed with the kernels measured on its GPU (the run's profile bundle), with the
per-kernel roofline, and with AIConfigurator's databases where its GPU has them, exactly as a user would
(`sim replay IMPORTED --model CONFIG --hardware NAME --cost-model BUNDLE|roofline|aiconfigurator`).

Per run and cost model it prints `<metric> error: X %` for the mean, p50, p90 and p99 of TTFT, TPOT and
latency, beside the peer simulator's error on the same run (the run's validation/summary.txt), then what
the worst metric's error is made of: the replay's and vLLM's mean time in the queue (arrival to first
scheduled), to the first token once scheduled, and in decode (first to last token). The simulator is
deterministic, so one replay per case is the figure; a replay's wall time is printed beside it.

The MoE section checks the mixture-of-experts pricing where no run measured it: one sparse
layer's MoE block from the bundle measured for Qwen3-30B-A3B on the RTX PRO 6000 against AIConfigurator's
table at MOE_TOKENS (experts activated at their balanced expectation), then the whole model's decode step
at MOE_DECODES sequences of MOE_CONTEXT tokens from each cost model, on one GPU and on two data-parallel
ranks with expert parallelism (each rank as loaded as the other).

    python bench/gpu_fidelity.py [--data bench/data/llmservingsim_vllm_runs] [--cost-models bundle,roofline,...]
                                 [--sections runs,moe]
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import traces  # noqa: E402
from sim.cli import main as sim_main  # noqa: E402
from sim.cost_models import get_cost_model  # noqa: E402
from sim.cost_models.batch import StepBatch  # noqa: E402
from sim.cost_models.deployment import Deployment  # noqa: E402
from sim.report.summary import request_metrics  # noqa: E402

METRICS = [f"{m}_{s}" for m in ("ttft", "tpot", "latency") for s in ("mean", "p50", "p90", "p99")]
PEER_ROWS = {"TTFT": "ttft", "TPOT": "tpot", "Latency": "latency", "Mean": "mean", "Median": "p50", "P90": "p90",
             "P99": "p99"}
MOE_MODEL, MOE_GPU, MOE_HARDWARE = "Qwen/Qwen3-30B-A3B-Instruct-2507", "RTXPRO6000", "rtx-pro-6000"
MOE_TOKENS = tuple(2**i for i in range(3, 12))
MOE_DECODES, MOE_CONTEXT = (1, 8, 64, 256), 1000
MOE_LAYOUTS = {"one GPU": Deployment(), "data parallel 2, expert parallel": Deployment(data_parallel_size=2,
                                                                                       enable_expert_parallel=True)}


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


def decode_batch(seqs: int, context: int, dp: int) -> StepBatch:
    """`seqs` decodes attending to `context` tokens each; under data parallelism the MoE layers carry the
    group's tokens, every rank as loaded as this one."""
    batch = StepBatch()
    for _ in range(seqs):
        batch.add(1, context - 1, decode=True)
    batch.moe_tokens = seqs * dp if dp > 1 else 0
    return batch


def moe_section(data: Path, wanted: list[str]) -> int:
    """MoE kernel times, bundle against AIConfigurator, then the MoE model's decode step per cost model."""
    bundle = bundle_for(data, MOE_MODEL, MOE_GPU)
    config = data / "models" / f"{MOE_MODEL.split('/')[-1]}.json"
    print(f"moe: {MOE_MODEL} on {MOE_HARDWARE}")
    if bundle is None or not (bundle / "tp1" / "moe.csv").is_file() or not config.is_file():
        print(f"moe: skipped (no {MOE_GPU} bundle with tp1/moe.csv or models/{config.name} under {data})")
        return 0
    cases = {"bundle": str(bundle), "aiconfigurator": "aiconfigurator", "roofline": "roofline"}
    models: dict[tuple[str, str], Any] = {}
    for name in (n for n in cases if n in wanted):
        for layout, deployment in MOE_LAYOUTS.items():
            try:
                models[(name, layout)] = get_cost_model(cases[name], model=str(config), hardware=MOE_HARDWARE,
                                                        deployment=deployment)
            except ValueError as e:
                print(f"{name}: not run ({e})")
                break
    one = "one GPU"
    if ("bundle", one) in models and ("aiconfigurator", one) in models:
        b, a = models[("bundle", one)], models[("aiconfigurator", one)]
        for tokens in MOE_TOKENS:
            tb, ta = b.timer.moe(b.moe_call(tokens)), a.timer.moe(a.moe_call(tokens))
            print(f"moe block {tokens} tokens, {b.moe_call(tokens).activated:.1f} experts, bundle: {tb * 1e6:.1f} us")
            print(f"moe block {tokens} tokens, aiconfigurator: {ta * 1e6:.1f} us")
            print(f"ratio: bundle / aiconfigurator {tb / ta:.3f}")
    for layout, deployment in MOE_LAYOUTS.items():
        dp = deployment.data_parallel_size
        for seqs in MOE_DECODES:
            batch = decode_batch(seqs, MOE_CONTEXT, dp)
            times = {}
            for name in cases:
                model = models.get((name, layout))
                if model is None:
                    continue
                times[name] = model.step_time(batch, 0).device
                moe = model.breakdown(batch)["moe"]
                print(f"step {seqs} decodes x {MOE_CONTEXT} context, {layout}, {name}: {times[name] * 1e3:.3f} ms "
                      f"(moe layers {moe * 1e3:.3f} ms)")
            if "bundle" in times and len(times) > 1:
                ratios = ", ".join(f"{n} / bundle {t / times['bundle']:.3f}" for n, t in times.items() if n != "bundle")
                print(f"ratio: {ratios}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parent / "data" / "llmservingsim_vllm_runs")
    p.add_argument("--cost-models", default="bundle,roofline,aiconfigurator")
    p.add_argument("--sections", default="runs,moe", help="runs (replays of the measured runs), moe (MoE pricing)")
    args = p.parse_args()
    wanted = args.cost_models.split(",")
    sections = args.sections.split(",")
    runs = sorted(d for d in args.data.glob("*") if (d / "vllm" / "meta.json").is_file()) if "runs" in sections else []
    if "runs" in sections and not runs:
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
    return moe_section(args.data, wanted) if "moe" in sections else 0


if __name__ == "__main__":
    sys.exit(main())
