#!/usr/bin/env bash
# The one prepared device check, under 8 minutes on one H200:
#   1. the gpu-marked tests (greedy output vs transformers on CUDA, Triton/flash-attn and the fused Triton MoE
#      vs the torch reference, CUDA graphs vs eager, KV sizing from --gpu-memory-utilization);
#   2. kernel-profile bundles of Qwen3-0.6B and Llama-3.1-8B on this GPU (bench/gpu_profile.py, packed into
#      $OUT), for `sim replay --cost-model BUNDLE_DIR` and the roofline's fit;
#   3. the throughput benchmark in nano-vllm's shape (Qwen3-0.6B shape, dummy weights, 256 sequences,
#      input and output lengths random in 100-1024, ignore_eos), and vLLM's when it is importable;
#   4. an engine trace of workloads/bursty.yaml, for the simulator's calibration (packed into $OUT);
#   5. async scheduling's wall time against sync (bench/async_scheduling.py).
# Missing pure-Python packages travel as wheels in .whl/ (bench/fetch_gpu_wheels.sh, run beforehand).
# STEPS="1 3" runs only those steps (a rerun after one failed).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
STEPS=${STEPS:-"1 2 3 4 5"}
want() { [[ " $STEPS " == *" $1 "* ]]; }
mkdir -p "$OUT"
export PYTHONPATH=$PWD
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

if want 1; then
echo "== 1. gpu tests"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider --continue-on-collection-errors tests/ 2>&1 | tail -30

fi
if want 2; then
echo "== 2. kernel profiles"
for model in qwen3-0.6b llama-3.1-8b; do
  timeout 100 python3 bench/gpu_profile.py --model "$model" --out "$OUT/profile_$model" 2>&1 | grep -v Warning
done
tar czf "$OUT/profiles_h200.tgz" -C "$OUT" profile_qwen3-0.6b profile_llama-3.1-8b && rm -rf "$OUT"/profile_*

fi
if want 3; then
echo "== 3. throughput"
timeout 120 python3 bench/throughput.py --device cuda --model qwen3-0.6b --num-seqs 256 \
  --min-len 100 --max-len 1024 --min-out 100 --max-out 1024 --max-model-len 4096 --max-num-batched-tokens 16384 \
  --skip-transformers --repeats 1 2>&1 | grep -v Warning

fi
if want 4; then
echo "== 4. bursty trace"
timeout 100 python3 -m engine.cli run --workload workloads/bursty.yaml --model qwen3-0.6b --max-model-len 8192 \
  --trace "$OUT/bursty_h200" --max-requests 200 --no-progress 2>&1 | tail -12
tar czf "$OUT/bursty_h200.tgz" -C "$OUT" bursty_h200 && rm -rf "$OUT/bursty_h200"

fi
if want 5; then
echo "== 5. async scheduling overlap (built-in model: host-bound steps, where overlap shows most)"
timeout 60 python3 bench/async_scheduling.py --device cuda --repeats 3 2>&1 | grep -v Warning

fi
ls -la "$OUT"
