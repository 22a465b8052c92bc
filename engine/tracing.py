"""OpenTelemetry for the engine: start-up, step and request spans, built off the hot loop.

The SDK's Python work per span is too slow for the step loop, so the loop only records monotonic
timestamps as plain items; a child process (engine.span_process) turns them into spans with explicit start and end
times. Spans always go to the trace directory as OTLP JSON lines, and to an OTLP/HTTP endpoint when one
is given.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any
from collections.abc import Sequence

import orjson
from google.protobuf.json_format import MessageToJson
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from engine.core.outputs import EngineCoreOutputs
from engine.core.request import Request
from engine.core.sched_output import SchedulerOutput
from engine.core.step_cycle import StepCost, StepTimes
from traces.outputs import open_new_nofollow

# `gen_ai.provider.name` is required by the GenAI conventions; a self-hosted engine names itself.
PROVIDER_NAME = "stepscope"


class OTLPJsonLinesExporter(SpanExporter):
    """Writes each exported batch as one ExportTraceServiceRequest JSON line and flushes it. A write the
    disk refuses is said once, in one line, and later spans are dropped: the lines before stay whole."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file = open(open_new_nofollow(Path(path), append=True), "a", encoding="utf-8")
        self._lock = threading.Lock()
        self.failed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        line = MessageToJson(encode_spans(spans), indent=None)
        with self._lock:
            if self.failed:
                return SpanExportResult.FAILURE
            try:
                self._file.write(line + "\n")
                self._file.flush()
            except OSError as e:
                self.failed = True
                print(f"engine: warning: {self.path}: cannot write spans ({e.strerror or e}); no more are written",
                      file=sys.stderr)
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock, suppress(OSError):  # a failed write leaves its line in the buffer; it is dropped
            self._file.close()


OTLP_TIMEOUT_S = 2.0  # the longest an unreachable endpoint may hold up a run (the SDK's default: 10 s)


class BoundedOTLPExporter(SpanExporter):
    """OTLP/HTTP with every export bounded by `timeout_s`, retries included. The first failure is said
    once, in one line of our own, and the endpoint is then left alone: spans still reach spans.jsonl."""

    def __init__(self, endpoint: str, timeout_s: float = OTLP_TIMEOUT_S) -> None:
        import logging

        from opentelemetry.exporter.otlp.proto.http import trace_exporter

        # The SDK logs each failed try with a traceback; the one line below says it instead.
        logging.getLogger(trace_exporter.__name__).setLevel(logging.CRITICAL)
        self.endpoint = endpoint
        self._inner = trace_exporter.OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s)
        self.failed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.failed:
            return SpanExportResult.FAILURE
        result = self._inner.export(spans)
        if result is not SpanExportResult.SUCCESS:
            self.failed = True
            print(f"engine: warning: OTLP endpoint {self.endpoint} did not take spans within {OTLP_TIMEOUT_S:g} s; "
                  "no more are sent there (they are still in the trace directory's spans.jsonl)", file=sys.stderr)
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def make_tracer_provider(spans_path: str | Path | None = None, otlp_endpoint: str | None = None,
                         service_name: str = "stepscope-engine") -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if spans_path is not None:
        provider.add_span_processor(BatchSpanProcessor(OTLPJsonLinesExporter(spans_path)))
    if otlp_endpoint:
        provider.add_span_processor(BatchSpanProcessor(BoundedOTLPExporter(otlp_endpoint),
                                                       export_timeout_millis=int(OTLP_TIMEOUT_S * 1000)))
    return provider


# What the engine hands to the span process (engine.span_process), as JSON: plain tuples and dicts, cheap
# to build on the hot loop; the SDK's spans and their OTLP encoding are made there, so they take no share
# of this process's interpreter lock.
def prepare_item(phases: list[tuple[str, float, float]]) -> tuple:
    return ("prepare", phases)


def step_item(step: int, times: tuple[float, float, float, float, float], attrs: dict[str, Any]) -> tuple:
    """times: schedule start, schedule end (= execute start), execute end, sample end, step end."""
    return ("step", step, times, attrs)


def request_item(r: Request) -> tuple:
    """GenAI semantic-convention names (provider name required since semconv 1.37; prefix-cache hits as
    `cache_read.input_tokens`), plus the `gen_ai.latency.*` breakdown vLLM puts on llm_request; the model's
    name is the span builder's."""
    p = r.sampling_params
    end = r.finished_time if r.finished_time is not None else time.monotonic()
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "text_completion",
        "gen_ai.provider.name": PROVIDER_NAME,
        "gen_ai.request.id": r.request_id,
        "gen_ai.request.max_tokens": r.max_tokens or 0,
        "gen_ai.request.temperature": p.temperature,
        "gen_ai.request.top_p": p.top_p,
        "gen_ai.request.top_k": p.top_k,
        "gen_ai.usage.input_tokens": r.num_prompt_tokens,
        "gen_ai.usage.cache_read.input_tokens": max(r.num_cached_tokens, 0),
        "gen_ai.usage.output_tokens": r.num_output_tokens,
        "gen_ai.response.finish_reasons": [r.get_finish_reason() or "unfinished"],
        "gen_ai.latency.e2e": end - r.arrival_time,
        "stepscope.num_preemptions": r.num_preemptions,
    }
    if p.seed is not None:
        attrs["gen_ai.request.seed"] = p.seed
    if p.stop:
        attrs["gen_ai.request.stop_sequences"] = list(p.stop)
    if r.first_scheduled_time is not None:
        attrs["gen_ai.latency.time_in_queue"] = r.first_scheduled_time - r.arrival_time
        if r.first_token_time is not None:
            attrs["gen_ai.latency.time_to_first_token"] = r.first_token_time - r.arrival_time
            attrs["gen_ai.latency.time_in_model_prefill"] = r.first_token_time - r.first_scheduled_time
            attrs["gen_ai.latency.time_in_model_decode"] = end - r.first_token_time
    return ("request", r.arrival_time, end, attrs)


class SpanBuilder:
    """Items in (as `json.loads` gives them back), SDK spans out with explicit start and end times.
    Times are time.monotonic() of the engine's process, placed on the wall clock by its (mono0, ns0)."""

    def __init__(self, provider: TracerProvider, model_name: str, mono0: float, ns0: int) -> None:
        self.tracer = provider.get_tracer("stepscope.engine")
        self.model_name = model_name
        self._mono0, self._ns0 = mono0, ns0

    def to_ns(self, mono: float) -> int:
        return self._ns0 + int((mono - self._mono0) * 1e9)

    def build(self, item: list) -> None:
        kind = item[0]
        if kind == "step":
            self._step_spans(*item[1:])
        elif kind == "request":
            self._request_span(*item[1:])
        else:
            self._prepare_spans(item[1])

    def _span(self, name: str, start: float, end: float, parent=None, attrs: dict | None = None):
        ctx = trace.set_span_in_context(parent) if parent is not None else None
        span = self.tracer.start_span(name, context=ctx, start_time=self.to_ns(start), attributes=attrs)
        span.end(end_time=self.to_ns(end))
        return span

    def _prepare_spans(self, phases: list) -> None:
        root = self.tracer.start_span("Prepare model", start_time=self.to_ns(phases[0][1]),
                                      attributes={"gen_ai.request.model": self.model_name})
        for name, start, end in phases:
            self._span(name, start, end, root)
        root.end(end_time=self.to_ns(phases[-1][2]))

    def _step_spans(self, step: int, times: list, attrs: dict[str, Any]) -> None:
        t_sched, t_exec, t_sample, t_update, t_end = times
        root = self.tracer.start_span("step", start_time=self.to_ns(t_sched), attributes={"step": step, **attrs})
        self._span("schedule", t_sched, t_exec, root)
        self._span("execute", t_exec, t_sample, root)
        self._span("sample", t_sample, t_update, root)
        root.end(end_time=self.to_ns(t_end))

    def _request_span(self, start: float, end: float, attrs: dict[str, Any]) -> None:
        attrs["gen_ai.request.model"] = self.model_name
        self._span(f"text_completion {self.model_name}", start, end, attrs=attrs)


class EngineSpans:
    """The engine's side of its spans: items gathered on the hot loop and sent, a batch at a time, to a
    child process (engine.span_process) that builds and exports them. Without a process of its own the
    SDK's Python work, about a millisecond a step, ran on threads of the engine's process and held its
    interpreter lock against the step loop. The child exits when its input ends, so a run that dies
    leaves every span it sent exported."""

    BATCH_ITEMS = 64
    BATCH_SECONDS = 0.25

    def __init__(self, spans_path: str | Path | None, otlp_endpoint: str | None, model_name: str) -> None:
        self._mono0 = time.monotonic()
        self._ns0 = time.time_ns()
        config = {"spans_path": None if spans_path is None else str(spans_path), "otlp_endpoint": otlp_endpoint,
                  "model_name": model_name, "mono0": self._mono0, "ns0": self._ns0}
        root = str(Path(__file__).resolve().parent.parent)  # the child imports this package, not another 'engine'
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))))
        self._proc = subprocess.Popen([sys.executable, "-m", "engine.span_process", json.dumps(config)],
                                      stdin=subprocess.PIPE, env=env)
        if self._proc.stdin is None:
            raise RuntimeError("span process: started without a pipe to its stdin")
        self._stdin = self._proc.stdin
        self._items: list[tuple] = []
        self._sent_at = self._mono0
        self._broken = False

    def to_ns(self, mono: float) -> int:
        return self._ns0 + int((mono - self._mono0) * 1e9)

    # ---- producers (cheap: one tuple into a list) -----------------------------------------------
    def prepare_model(self, phases: list[tuple[str, float, float]]) -> None:
        self._put(prepare_item(phases))

    def step(self, step: int, times: tuple[float, float, float, float, float], attrs: dict[str, Any]) -> None:
        self._put(step_item(step, times, attrs))

    def request(self, req: Request) -> None:
        self._put(request_item(req))

    def _put(self, item: tuple) -> None:
        self._items.append(item)
        if len(self._items) >= self.BATCH_ITEMS or time.monotonic() - self._sent_at >= self.BATCH_SECONDS:
            self._send()

    def _send(self) -> None:
        items, self._items = self._items, []
        self._sent_at = time.monotonic()
        if self._broken or not items:
            return
        data = orjson.dumps(items)
        try:
            self._stdin.write(len(data).to_bytes(4, "little") + data)
            self._stdin.flush()
        except OSError:
            self._broken = True
            print("engine: warning: the span process ended early; no more spans are written", file=sys.stderr)

    def flush(self) -> None:
        if self._items:
            self._send()

    def shutdown(self) -> None:
        """Send what is left and wait for the child to export it (bounded: an OTLP endpoint is)."""
        self._send()
        with suppress(OSError):
            self._stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()


class EngineTrace:
    """Everything a traced engine run writes: the trace directory tables and the spans."""

    def __init__(self, trace_dir: str | Path | None, meta: dict[str, Any], scheduler, t0: float,
                 model_name: str, otlp_endpoint: str | None = None, overwrite: bool = False) -> None:
        from traces.recorder import TraceRecorder
        from traces.schema import SPANS_FILE
        from traces.writer import TraceWriter

        self.writer = None
        self.recorder: TraceRecorder[Request] | None = None
        self._live: dict[str, Request] = {}
        spans_path = None
        if trace_dir is not None:  # the writer claims the directory first: an existing trace is never touched
            self.writer = TraceWriter(trace_dir, meta, overwrite=overwrite, write_behind=True)
            spans_path = Path(trace_dir) / SPANS_FILE
        self.spans = EngineSpans(spans_path, otlp_endpoint, model_name)
        if self.writer is not None:
            self.writer.update_meta(clock_origin_unix_ns=self.spans.to_ns(t0))
            self.recorder = TraceRecorder(self.writer, scheduler, t0)

    def on_add(self, request: Request) -> None:
        if self.recorder is not None:
            self.recorder.on_add(request)
        elif not request.is_finished():
            self._live[request.request_id] = request
        if request.is_finished():
            self.spans.request(request)

    def _pop(self, request_ids) -> list[Request]:
        """Without a trace directory, requests are followed here for their spans."""
        return [r for rid in request_ids if (r := self._live.pop(rid, None)) is not None]

    def on_abort(self, freed: dict[str, list[int]]) -> None:
        ended = self.recorder.on_abort(freed) if self.recorder is not None else self._pop(freed)
        for r in ended:
            self.spans.request(r)

    def on_step(self, step: int, so: SchedulerOutput, outputs: EngineCoreOutputs, times: StepTimes,
                cost: StepCost | None = None) -> None:
        """A live step's phases are the gaps between `times`; `cost` is a simulator's, never given here."""
        if self.recorder is not None:
            finished = self.recorder.on_step(step, so, outputs, times)
        else:
            finished = self._pop(o.request_id for o in outputs.outputs if o.finish_reason is not None)
        stats = outputs.scheduler_stats
        self.spans.step(step, times, {
            "num_scheduled_tokens": so.total_num_scheduled_tokens, "num_prefill_tokens": so.num_prefill_tokens,
            "num_decode_tokens": so.num_decode_tokens, "num_running": stats.num_running_reqs if stats else 0,
            "num_waiting": stats.num_waiting_reqs if stats else 0, "num_preempted": len(so.preempted_req_ids),
            "kv_cache_usage": stats.kv_cache_usage if stats else 0.0})
        for r in finished:
            self.spans.request(r)

    def flush(self) -> None:
        """Hand every row and span held so far to be written: the engine is idle, so a kill while it waits
        for its next arrival loses nothing it has done."""
        if self.writer is not None:
            self.writer.drain()
        self.spans.flush()

    def update_meta(self, **fields: Any) -> None:
        if self.writer is not None:
            self.writer.update_meta(**fields)

    def close(self, **final_meta: Any) -> None:
        """The trace is compacted first: a slow span exporter must not keep it in JSON lines. The spans
        are flushed even when compaction fails."""
        try:
            if self.recorder is not None:
                self.recorder.close(**final_meta)
        finally:
            self.spans.shutdown()
