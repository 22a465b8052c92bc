"""Nothing silently dropped: the console summaries of `sim replay`, `sim plan` and `engine run` count the
requests refused at admission, grouped by reason."""
import re
import subprocess
import sys

import pandas as pd

import traces
from sim.cli import main as sim_main
from traces.summary import rejections
from workloads import DEFAULT_WORKLOAD

BURSTY = str(DEFAULT_WORKLOAD)


def test_rejections_are_counted_by_reason_without_per_request_numbers():
    requests = pd.DataFrame({
        "error": ["prompt has 5000 tokens, more than max_model_len=4096",
                  "prompt: 4100 tokens is longer than max_model_len=4096",
                  "prompt 10 + max_tokens 90000 needs 5000 KV blocks of 16 tokens but the cache has 100",
                  None, "step failed: boom",
                  "The decoder prompt (length 4096) plus the number of requested output tokens (at least 1) is "
                  "longer than the maximum model length of 4096"],
        "first_scheduled": [None, None, None, 0.5, 0.7, None],
    })
    assert rejections(requests) == {
        "prompt longer than max_model_len=4096": 3,
        "prompt + max_tokens need more KV blocks than the cache has (100 blocks of 16 tokens)": 1,
    }


def test_sim_replay_summary_names_rejected_requests(tmp_path, capsys):
    assert sim_main(["replay", BURSTY, "--cost-model", "roofline", "--model", "qwen3-0.6b", "--hardware", "h100",
                     "--max-requests", "40", "--max-model-len", "512", "--trace", str(tmp_path / "t"),
                     "--no-progress"]) == 0
    out = capsys.readouterr().out
    refused = int((traces.load(tmp_path / "t").requests["error"].notna()).sum())
    assert refused > 0
    assert f"\n{refused} rejected: prompt longer than max_model_len=512\n" in out


def test_sim_plan_table_names_rejected_requests(capsys):
    assert sim_main(["plan", BURSTY, "--slo", "ttft_p99=2s", "--sweep", "max_num_seqs=16,32", "--max-requests", "30",
                     "--rate-tol", "0.3", "--max-model-len", "512", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^every configuration: \d+ rejected: prompt longer than max_model_len=512$", out, re.M), out


WORKLOAD = """\
name: long-prompts
seed: 3
num_requests: 12
arrival: {process: poisson, rate: 50.0}
prompt_tokens: {dist: uniform, min: 16, max: 120}
output_tokens: {dist: uniform, min: 4, max: 8}
"""


def test_engine_run_summary_names_rejected_requests(tmp_path):
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    res = subprocess.run([sys.executable, "-m", "engine.cli", "run", "--workload", str(workload), "--trace",
                          str(tmp_path / "t"), "--device", "cpu", "--max-model-len", "64", "--kv-cache-memory",
                          str(16 << 20), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    refused = int((traces.load(tmp_path / "t").requests["error"].notna()).sum())
    assert refused > 0
    assert f"{refused} rejected: prompt longer than max_model_len=64" in res.stdout.splitlines()
