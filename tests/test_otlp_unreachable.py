"""An OTLP endpoint nothing listens on costs a run at most ~2 s, is said once in one line, and never keeps
the trace from being compacted."""
import socket
import time

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import traces
from engine import LLM, SamplingParams
from engine.tracing import OTLP_TIMEOUT_S, BoundedOTLPExporter


def _closed_port_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1/traces"


def _some_spans():
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.get_tracer("t").start_span("s").end()
    return memory.get_finished_spans()


def test_unreachable_endpoint_fails_within_the_bound_then_is_left_alone(capsys):
    exporter = BoundedOTLPExporter(_closed_port_endpoint())
    spans = _some_spans()
    t0 = time.monotonic()
    assert exporter.export(spans) is SpanExportResult.FAILURE
    first = time.monotonic() - t0
    t0 = time.monotonic()
    assert exporter.export(spans) is SpanExportResult.FAILURE
    again = time.monotonic() - t0
    exporter.shutdown()
    assert first <= OTLP_TIMEOUT_S + 1.0 and again < 0.05
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("engine: warning: OTLP endpoint http://127.0.0.1:")


def test_engine_run_with_unreachable_endpoint_ends_quickly_with_a_compacted_trace(tmp_path, capfd):
    llm = LLM(device="cpu", kv_cache_memory=16 << 20, max_model_len=128, trace=str(tmp_path),
              otlp_traces_endpoint=_closed_port_endpoint())
    llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], SamplingParams(max_tokens=3, temperature=0.0), use_tqdm=False)
    t0 = time.monotonic()
    llm.shutdown()
    assert time.monotonic() - t0 <= OTLP_TIMEOUT_S + 1.5
    assert (tmp_path / "steps.parquet").is_file() and traces.load(tmp_path).complete
    # The span process says it on the stderr it shares with the engine (a file descriptor, not sys.stderr).
    warnings = [line for line in capfd.readouterr().err.splitlines() if "OTLP endpoint" in line]
    assert len(warnings) == 1
