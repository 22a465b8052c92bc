"""The engine's span process: `python -m engine.span_process CONFIG_JSON`, started by
`engine.tracing.EngineSpans`. It reads batches of items from stdin (a 4-byte little-endian length, then a
JSON list), builds their spans (`SpanBuilder`) and exports them; at the end of its input, the engine's
shutdown or death, it flushes what it holds and exits. Ctrl-C is the engine's to handle: the engine
closes the input when it has sent everything. It runs niced: where cores are few, a step of the engine
goes before a span."""
from __future__ import annotations

import json
import os
import signal
import sys
from contextlib import suppress

import orjson

from engine.tracing import SpanBuilder, make_tracer_provider


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the engine ends it by closing its input, spans exported
    with suppress(AttributeError, OSError):  # background work: the engine's steps go first for a core
        os.nice(10)
    config = json.loads(argv[0])
    provider = make_tracer_provider(config["spans_path"], config["otlp_endpoint"])
    builder = SpanBuilder(provider, config["model_name"], config["mono0"], config["ns0"])
    stdin = sys.stdin.buffer
    try:
        while len(head := stdin.read(4)) == 4:
            size = int.from_bytes(head, "little")
            data = stdin.read(size)
            if len(data) < size:  # the engine died mid-batch: what came whole is exported
                break
            for item in orjson.loads(data):
                builder.build(item)
    finally:
        provider.force_flush()
        provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
