"""OpenTelemetry spans of the engine: names, parents, attributes; the trace directory of a real run;
the OTLP/HTTP path against a real receiver on loopback."""
import http.server
import json
import subprocess
import sys
import threading
import time

import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import traces
from engine import LLM, SamplingParams
from engine.core import Request
from engine.tracing import SpanBuilder, prepare_item, request_item, step_item
from traces.blocks import BlockPoolIndex

PROMPTS = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (30, 12, 45)]


def _built(*items):
    """The spans the span process builds of `items`, which reach it through JSON."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    builder = SpanBuilder(provider, "tiny", time.monotonic(), time.time_ns())
    for item in orjson.loads(orjson.dumps(items)):
        builder.build(item)
    return exporter.get_finished_spans()


def test_step_span_has_schedule_execute_sample_children_with_attributes():
    t = time.monotonic()
    finished = _built(step_item(3, (t, t + 0.001, t + 0.004, t + 0.005, t + 0.006),
                                {"num_scheduled_tokens": 17, "num_running": 2}))
    by_name = {s.name: s for s in finished}
    step = by_name["step"]
    assert step.attributes["step"] == 3 and step.attributes["num_scheduled_tokens"] == 17
    for child in ("schedule", "execute", "sample"):
        assert by_name[child].parent.span_id == step.context.span_id
        assert step.start_time <= by_name[child].start_time <= by_name[child].end_time <= step.end_time
    assert by_name["execute"].end_time - by_name["execute"].start_time == pytest.approx(3e6, rel=1e-3)


def test_prepare_model_span_parents_its_phases():
    t = time.monotonic()
    finished = _built(prepare_item([("load weights", t, t + 1), ("allocate KV cache", t + 1, t + 2),
                                    ("warm up", t + 2, t + 3)]))
    root = next(s for s in finished if s.name == "Prepare model")
    children = [s.name for s in finished if s.parent is not None and s.parent.span_id == root.context.span_id]
    assert children == ["load weights", "allocate KV cache", "warm up"]


def test_request_span_uses_genai_semantic_convention_names():
    params = SamplingParams(max_tokens=4, temperature=0.5, top_p=0.9, top_k=20, seed=3, stop=["\n\n"])
    r = Request("q1", [1, 2, 3], params, arrival_time=10.0)
    r.first_scheduled_time, r.first_token_time, r.finished_time = 10.5, 11.0, 12.0
    r.num_cached_tokens = 2
    r.append_output_token_ids(5)
    r.append_output_token_ids(6)
    (span,) = _built(request_item(r))
    a = span.attributes
    assert span.name == "text_completion tiny"
    assert a["gen_ai.operation.name"] == "text_completion" and a["gen_ai.request.model"] == "tiny"
    assert a["gen_ai.request.max_tokens"] == 4 and a["gen_ai.request.temperature"] == 0.5
    assert a["gen_ai.provider.name"] == "stepscope"
    assert a["gen_ai.request.top_p"] == 0.9 and a["gen_ai.request.top_k"] == 20
    assert a["gen_ai.request.seed"] == 3 and a["gen_ai.request.stop_sequences"] == ("\n\n",)
    assert a["gen_ai.usage.cache_read.input_tokens"] == 2
    assert a["gen_ai.usage.input_tokens"] == 3 and a["gen_ai.usage.output_tokens"] == 2
    assert a["gen_ai.latency.time_in_queue"] == 0.5 and a["gen_ai.latency.time_to_first_token"] == 1.0
    assert a["gen_ai.latency.e2e"] == 2.0


@pytest.fixture(scope="module")
def engine_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace")
    llm = LLM(device="cpu", kv_cache_memory=16 << 20, max_model_len=128, block_size=8, trace=str(path))
    llm.generate(PROMPTS, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True), use_tqdm=False)
    llm.shutdown()
    return traces.load(path)


def test_engine_run_writes_a_complete_trace(engine_trace):
    t = engine_trace
    assert t.complete and t.source == "engine"
    assert t.meta["config"]["scheduler"]["max_model_len"] == 128 and t.meta["device"]["type"] == "cpu"
    assert len(t.requests) == 3 and set(t.requests["num_output_tokens"]) == {6}
    assert (t.steps["end"] >= t.steps["start"]).all() and (t.steps["execute_time"] > 0).all()


def test_engine_trace_spans_nest_under_steps(engine_trace):
    spans = engine_trace.spans
    steps = spans[spans["name"] == "step"]
    assert len(steps) == len(engine_trace.steps)
    ids = set(steps["span_id"])
    for name in ("schedule", "execute", "sample"):
        assert spans[spans["name"] == name]["parent_span_id"].isin(ids).all()
    assert (spans["name"] == "Prepare model").sum() == 1
    reqs = spans[spans["name"].str.startswith("text_completion")]
    assert len(reqs) == 3 and all(a["gen_ai.usage.output_tokens"] == 6 for a in reqs["attributes"])


def test_step_spans_line_up_with_the_steps_table(engine_trace):
    spans = engine_trace.spans
    first = spans[spans["name"] == "step"].sort_values("start").iloc[0]
    assert first["start"] == pytest.approx(engine_trace.steps["start"].iloc[0], abs=2e-3)


def test_engine_block_pool_rebuilds_to_all_free_or_cached_at_the_end(engine_trace):
    index = BlockPoolIndex.from_trace(engine_trace)
    last = index.state_at(int(engine_trace.steps["step"].max()))
    assert not any(b.holders for b in last)
    assert any(b.cached for b in last)


class _Receiver(http.server.BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        type(self).received.append((self.path, self.headers.get("Content-Type"), req))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_spans_reach_an_otlp_http_receiver():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
        llm = LLM(device="cpu", kv_cache_memory=16 << 20, max_model_len=128, otlp_traces_endpoint=endpoint)
        llm.generate(PROMPTS[:2], SamplingParams(max_tokens=3, temperature=0.0), use_tqdm=False)
        llm.shutdown()
    finally:
        server.shutdown()
    assert _Receiver.received and all(p == "/v1/traces" for p, _, _ in _Receiver.received)
    assert all(ct == "application/x-protobuf" for _, ct, _ in _Receiver.received)
    spans = [s for _, _, r in _Receiver.received for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
    names = {s.name for s in spans}
    assert {"Prepare model", "step", "schedule", "execute", "sample", "text_completion builtin"} <= names
    req = next(s for s in spans if s.name == "text_completion builtin")
    attrs = {a.key: a.value for a in req.attributes}
    assert attrs["gen_ai.usage.output_tokens"].int_value == 3
    assert attrs["gen_ai.request.model"].string_value == "builtin"


def test_requests_refused_by_the_frontend_are_in_the_trace(tmp_path):
    llm = LLM(device="cpu", kv_cache_memory=16 << 20, max_model_len=64, trace=str(tmp_path))
    llm.generate([{"prompt_token_ids": list(range(5, 105))}, {"prompt_token_ids": [5, 6, 7]}],
                 SamplingParams(max_tokens=3, temperature=0.0), use_tqdm=False)
    llm.shutdown()
    t = traces.load(tmp_path)
    rows = t.requests.set_index("request_id")
    assert rows.loc["0", "finish_reason"] == "error" and "max_model_len" in rows.loc["0", "error"]
    assert rows.loc["0", "num_prompt_tokens"] == 100 and rows.loc["1", "finish_reason"] == "length"
    assert list(t.decisions[t.decisions["event"] == "reject"]["request_id"]) == ["0"]


def test_the_span_process_exports_every_whole_batch_sent_before_its_input_breaks_off(tmp_path):
    """The engine killed mid-batch: the span process exports the batches that came whole, then exits."""
    config = {"spans_path": str(tmp_path / "spans.jsonl"), "otlp_endpoint": None, "model_name": "tiny",
              "mono0": time.monotonic(), "ns0": time.time_ns()}
    child = subprocess.Popen([sys.executable, "-m", "engine.span_process", json.dumps(config)], stdin=subprocess.PIPE)
    t = time.monotonic()
    whole = orjson.dumps([step_item(0, (t, t + 0.001, t + 0.002, t + 0.003, t + 0.004), {"num_running": 1})])
    torn = orjson.dumps([step_item(1, (t, t, t, t, t), {})])
    child.stdin.write(len(whole).to_bytes(4, "little") + whole + len(torn).to_bytes(4, "little") + torn[:-3])
    child.stdin.close()
    assert child.wait(timeout=30) == 0
    names = [s["name"] for line in (tmp_path / "spans.jsonl").read_text().splitlines()
             for rs in orjson.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert sorted(names) == ["execute", "sample", "schedule", "step"]
