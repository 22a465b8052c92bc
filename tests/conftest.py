"""Shared pytest setup: GPU-marked tests skip where CUDA is absent (and where torch is absent); under
CI=true any other skip (a missing package above all) fails the run, naming the test (tests/ci_skips.py)."""
import os

import pytest
from ci_skips import ci_violation, skip_reason

_violations: list[str] = []


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _check(report) -> None:
    if os.environ.get("CI") != "true" or not report.skipped or hasattr(report, "wasxfail"):
        return
    line = ci_violation(report.nodeid, skip_reason(report.longrepr), getattr(report, "keywords", {}))
    if line is not None:
        _violations.append(line)


def pytest_runtest_logreport(report):
    _check(report)


def pytest_collectreport(report):
    _check(report)


def pytest_sessionfinish(session, exitstatus):
    if _violations and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _violations:
        terminalreporter.section("CI: skips that are not allowed", red=True)
        for line in _violations:
            terminalreporter.line(f"CI: {line}")
