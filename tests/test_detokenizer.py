import pytest

from engine.builtin import BUILTIN_DIR
from engine.detokenizer import IncrementalDetokenizer
from engine.tokenizer import get_tokenizer

TEXTS = {
    "english": "The quick scheduler preempted 2 requests, then resumed them at step 17.",
    "chinese": "今天天气很好，我们去公园散步吧。学习语言需要很多耐心。",
    "emoji": "ok 🚀🙂 then 🦄 and 🧑‍🚀 done 🎉",
}
PROMPT = "User: tell me something 🌙\nAssistant:"


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer(BUILTIN_DIR)


def make(tok, stop=(), include=False, fast=True):
    return IncrementalDetokenizer(tok, tok.encode(PROMPT), list(stop), include, use_decode_stream=fast)


def feed(detok, ids, finished_at_end=True):
    """Feed one token at a time; return the deltas and the stop string (if any)."""
    deltas = []
    for i, tid in enumerate(ids):
        stop = detok.update([tid], stop_terminated=False)
        done = stop is not None or (finished_at_end and i == len(ids) - 1)
        deltas.append(detok.get_next_output_text(finished=done, delta=True))
        if stop is not None:
            return deltas, stop
    return deltas, None


@pytest.mark.parametrize("fast", [True, False], ids=["decode_stream", "prefix_offset"])
@pytest.mark.parametrize("name", list(TEXTS))
def test_incremental_text_equals_full_decode(tok, name, fast):
    ids = tok.encode(TEXTS[name])
    detok = make(tok, fast=fast)
    deltas, _ = feed(detok, ids)
    assert detok.output_text == tok.decode(ids, skip_special_tokens=True) == TEXTS[name]
    assert "".join(deltas) == detok.output_text


@pytest.mark.parametrize("fast", [True, False], ids=["decode_stream", "prefix_offset"])
def test_split_multibyte_char_never_yields_replacement_char(tok, fast):
    text = "a 🦄 b 龘 c"
    assert len(tok.encode("🦄")) > 1 and len(tok.encode("龘")) > 1  # both really are split
    detok = make(tok, fast=fast)
    deltas, _ = feed(detok, tok.encode(text))
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text


def test_stop_string_excluded_from_output(tok):
    detok = make(tok, stop=["STOP"])
    _, stop = feed(detok, tok.encode("first part STOP second part"))
    assert stop == "STOP" and detok.output_text == "first part "


def test_stop_string_included_in_output(tok):
    detok = make(tok, stop=["STOP"], include=True)
    _, stop = feed(detok, tok.encode("first part STOP second part"))
    assert stop == "STOP" and detok.output_text == "first part STOP"


def test_stop_string_spanning_two_tokens_is_detected(tok):
    text = "The quick scheduler preempted requests"
    ids = tok.encode(text)
    left, right = tok.decode(ids[2:3]), tok.decode(ids[3:4])
    stop = left[-2:] + right[:2]  # straddles the boundary between tokens 2 and 3
    detok = make(tok, stop=[stop])
    deltas, found = feed(detok, ids)
    assert found == stop
    assert detok.output_text == text[: text.index(stop)]
    assert len(detok.token_ids) == 4  # matched exactly when the second token arrived


def test_deltas_concatenate_to_final_text_with_stop(tok):
    detok = make(tok, stop=["公园", "never"])
    deltas, stop = feed(detok, tok.encode(TEXTS["chinese"]))
    assert stop == "公园"
    assert "".join(deltas) == detok.output_text == "今天天气很好，我们去"


def test_text_before_possible_stop_is_held_back(tok):
    detok = make(tok, stop=["</answer>"])  # longest stop 9 chars: hold back 8
    detok.update(tok.encode("the answer is 42 </"), stop_terminated=False)
    assert detok.get_next_output_text(finished=False, delta=True) == "the answer "  # 19 chars - 8
    assert detok.get_next_output_text(finished=False, delta=False) == "the answer "
    assert detok.get_next_output_text(finished=True, delta=True) == "is 42 </"


def test_stop_terminated_token_is_not_decoded(tok):
    detok = IncrementalDetokenizer(tok, [], [], False, skip_special_tokens=False)
    ids = tok.encode("bye")
    assert detok.update(ids + [tok.eos_token_id], stop_terminated=True) is None
    assert detok.output_text == "bye" and detok.token_ids == ids + [tok.eos_token_id]
