"""Workloads shared by `engine run` and `sim replay`: YAML specs, public trace importers, request streams.

Torch-free on purpose: the simulator must be able to replay the exact requests the engine saw. The
modules (numpy, pydantic) load on first use, so naming the default workload costs nothing.
"""
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workloads.errors import WorkloadError
    from workloads.generate import WorkloadRequest
    from workloads.importers import TraceRow, read_trace
    from workloads.spec import WorkloadSpec
    from workloads.workload import Workload, load_workload, workload_from_dict

WORKLOADS_DIR = Path(__file__).resolve().parent
DEFAULT_WORKLOAD = WORKLOADS_DIR / "bursty.yaml"

_LAZY = {"WorkloadError": "workloads.errors", "WorkloadRequest": "workloads.generate", "TraceRow": "workloads.importers",
         "read_trace": "workloads.importers", "WorkloadSpec": "workloads.spec", "Workload": "workloads.workload",
         "load_workload": "workloads.workload", "workload_from_dict": "workloads.workload"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'workloads' has no attribute {name!r}")


__all__ = [
    "DEFAULT_WORKLOAD", "WORKLOADS_DIR", "TraceRow", "Workload", "WorkloadError", "WorkloadRequest",
    "WorkloadSpec", "load_workload", "read_trace", "workload_from_dict",
]
