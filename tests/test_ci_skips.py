"""Under CI=true only CUDA-only and flash-attn tests may skip; a skip for a missing package fails the run."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ci_skips import ci_violation, missing_package

HERE = Path(__file__).parent


def test_importorskip_reason_names_the_missing_package():
    assert missing_package("could not import 'triton': No module named 'triton'") == "triton"


def test_skipif_not_installed_reason_names_the_package():
    assert missing_package("ray is not installed") == "ray"


def test_gpu_marked_test_may_skip_in_ci():
    assert ci_violation("t.py::test_a", "triton is not installed", {"gpu": 1}) is None


def test_flash_attn_skip_is_allowed_in_ci():
    assert ci_violation("t.py::test_a", "flash-attn is not installed", {}) is None


def test_cuda_skip_is_allowed_in_ci():
    assert ci_violation("t.py::test_a", "needs CUDA", {}) is None


def test_missing_package_skip_names_test_and_package():
    line = ci_violation("t.py::test_a", "could not import 'vllm': No module named 'vllm'", {})
    assert line == "t.py::test_a: skipped because package 'vllm' is missing; the test extras must install it"


def test_other_skip_reasons_fail_ci_too():
    assert "only CUDA-only and flash-attn" in ci_violation("t.py::test_a", "too slow today", {})


SUITE = """
import pytest

def test_passes():
    pass

def test_needs_missing_package():
    pytest.importorskip("stepscope_no_such_package")

@pytest.mark.gpu
def test_on_cuda():
    pass
"""


def _run_suite(tmp_path, ci: bool) -> subprocess.CompletedProcess:
    for name in ("conftest.py", "ci_skips.py"):
        shutil.copy(HERE / name, tmp_path / name)
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": "true"} if ci else {})
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_ci_run_with_a_missing_package_skip_fails_naming_it(tmp_path):
    proc = _run_suite(tmp_path, ci=True)
    assert proc.returncode == 1, proc.stdout
    assert ("CI: test_suite.py::test_needs_missing_package: skipped because package 'stepscope_no_such_package' "
            "is missing") in proc.stdout
    assert "test_on_cuda" not in proc.stdout.split("CI: skips that are not allowed")[1]


def test_same_skip_outside_ci_passes(tmp_path):
    assert _run_suite(tmp_path, ci=False).returncode == 0
