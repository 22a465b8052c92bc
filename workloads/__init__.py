"""Workloads shared by `engine run` and `sim replay`: YAML specs, public trace importers, request streams.

Torch-free on purpose: the simulator must be able to replay the exact requests the engine saw.
"""
from pathlib import Path

from workloads.errors import WorkloadError
from workloads.generate import WorkloadRequest
from workloads.importers import TraceRow, read_trace
from workloads.spec import WorkloadSpec
from workloads.workload import Workload, load_workload, workload_from_dict

WORKLOADS_DIR = Path(__file__).resolve().parent
DEFAULT_WORKLOAD = WORKLOADS_DIR / "bursty.yaml"

__all__ = [
    "DEFAULT_WORKLOAD", "WORKLOADS_DIR", "TraceRow", "Workload", "WorkloadError", "WorkloadRequest",
    "WorkloadSpec", "load_workload", "read_trace", "workload_from_dict",
]
