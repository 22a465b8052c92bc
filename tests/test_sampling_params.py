"""SamplingParams validation: a bad value raises one ValueError naming the field."""
import pytest

from engine.core import SamplingParams


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2), ("min_p", 1.5),
    ("max_tokens", 0), ("min_tokens", -1), ("logprobs", -1), ("n", 2), ("stop_token_ids", [-3]),
    ("stop", [""]), ("seed", 1.5),
])
def test_invalid_value_names_the_field(field, value):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}"):
        SamplingParams(**{field: value})


def test_min_tokens_above_max_tokens_is_rejected():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)


def test_single_stop_string_becomes_a_list():
    assert SamplingParams(stop="###").stop == ["###"]


def test_zero_temperature_is_greedy():
    assert SamplingParams(temperature=0.0).greedy and not SamplingParams(temperature=0.7).greedy
