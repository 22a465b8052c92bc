"""Incremental detokenization and stop-string matching for one request, as vLLM's output processor does.

Tokens arrive a few at a time; byte-level BPE can split one UTF-8 character over several tokens, so text
is only emitted once the bytes form whole characters. Stop strings are searched only in new text (plus
the few characters before it that a stop string could straddle), and while a request runs the last
len(longest stop)-1 characters are held back so a stop string that will be cut is never half-shown.
"""
from __future__ import annotations

from transformers import PreTrainedTokenizerBase

try:
    from tokenizers.decoders import DecodeStream
    HAS_DECODE_STREAM = True
except ImportError:  # tokenizers < 0.21
    HAS_DECODE_STREAM = False

_PROMPT_CONTEXT = 6  # prompt tokens fed first so the first output token decodes in context
_REPLACEMENT = "\ufffd"


class _PrefixOffsetStream:
    """Fallback decoder: re-decode a short window and emit only the new suffix once it is whole."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, context_ids: list[int], skip_special_tokens: bool):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(context_ids)
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
        if not isinstance(text, str):  # only a batch of id lists decodes to a list
            raise TypeError(f"{type(self.tokenizer).__name__}.decode gave {type(text).__name__} for one id list")
        return text

    def step(self, token_id: int) -> str | None:
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT):
            return None
        del self.ids[:self.read_offset]  # the window now starts at the old read offset
        self.prefix_offset, self.read_offset = 0, len(self.ids)
        return new_text[len(prefix_text):]


class _FastStream:
    """tokenizers' DecodeStream on the fast tokenizer's Rust backend."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, context_ids: list[int], skip_special_tokens: bool):
        self.backend = tokenizer.backend_tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stream = DecodeStream(ids=context_ids or None, skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str | None:
        try:
            return self.stream.step(self.backend, token_id)
        except Exception:  # the stream rejects a prefix it cannot extend: restart without context
            self.stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
            return self.stream.step(self.backend, token_id)


def _prompt_context(tokenizer: PreTrainedTokenizerBase, prompt_token_ids: list[int]) -> list[int]:
    """The longest short prompt suffix that decodes to whole characters (none if the prompt ends mid-char)."""
    for n in range(min(_PROMPT_CONTEXT, len(prompt_token_ids)), 0, -1):
        suffix = list(prompt_token_ids[-n:])
        if _REPLACEMENT not in tokenizer.decode(suffix):
            return suffix
    return []


def find_stop_string(text: str, num_new_chars: int, stop: list[str]) -> tuple[str, int] | None:
    """The stop string that completes first within the last `num_new_chars` chars, and where it starts."""
    best: tuple[int, int, str] | None = None
    for s in stop:
        if not s:
            continue
        idx = text.find(s, max(0, len(text) - num_new_chars - len(s) + 1))
        if idx != -1 and (best is None or (idx + len(s), idx) < best[:2]):
            best = (idx + len(s), idx, s)
    return None if best is None else (best[2], best[1])


class IncrementalDetokenizer:
    """Turns one request's output tokens into text, stop-string checks and publishable deltas."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_token_ids: list[int], stop: list[str],
                 include_stop_str_in_output: bool, skip_special_tokens: bool = True,
                 use_decode_stream: bool = True):
        self.stop = [s for s in stop if s]
        self.include_stop_str_in_output = include_stop_str_in_output
        # Only text that a stop string might cut needs holding back; included stop strings are shown anyway.
        held = bool(self.stop) and not include_stop_str_in_output
        self.stop_buffer_length = max(map(len, self.stop)) - 1 if held else 0
        self.token_ids: list[int] = []
        self._text = ""
        self._sent_offset = 0
        stream_cls = _FastStream if use_decode_stream and HAS_DECODE_STREAM else _PrefixOffsetStream
        context = _prompt_context(tokenizer, prompt_token_ids)
        self._stream = stream_cls(tokenizer, context, skip_special_tokens)

    @property
    def output_text(self) -> str:
        return self._text

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Append tokens, extend output_text; return the matched stop string if one appeared (and then
        truncate output_text per include_stop_str_in_output), else None. `stop_terminated` means the last
        token is a stop/EOS token the engine ends on: it is kept in token_ids but not decoded into text."""
        if not new_token_ids:
            return None
        self.token_ids.extend(new_token_ids)
        to_decode = new_token_ids[:-1] if stop_terminated else new_token_ids
        pieces = [p for p in map(self._stream.step, to_decode) if p]
        if not pieces:
            return None
        new_text = "".join(pieces)
        self._text += new_text
        if not self.stop:
            return None
        hit = find_stop_string(self._text, len(new_text), self.stop)
        if hit is None:
            return None
        stop_str, start = hit
        self._text = self._text[:start + len(stop_str) if self.include_stop_str_in_output else start]
        return stop_str

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """Text to publish: while running, hold back the last len(longest stop)-1 chars so a stop string is
        never half-shown; when delta, only what was not returned before."""
        end = len(self._text) if finished else max(0, len(self._text) - self.stop_buffer_length)
        if not delta:
            return self._text[:end]
        start, self._sent_offset = self._sent_offset, max(self._sent_offset, end)
        return self._text[start:end] if end > start else ""
