"""SamplingParams validation: a bad value raises one ValueError naming the field."""
import numpy as np
import pytest

from engine.core import SamplingParams


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2), ("min_p", 1.5),
    ("max_tokens", 0), ("min_tokens", -1), ("logprobs", -1), ("n", 2), ("stop_token_ids", [-3]),
    ("stop", [""]), ("seed", 1.5), ("seed", 2**64), ("seed", 2**63), ("seed", -(2**63) - 1), ("seed", True),
    ("stop_token_ids", [True]), ("stop_token_ids", [2.0]),
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


@pytest.mark.parametrize("seed", [0, 2**63 - 1, -(2**63)])
def test_seed_in_the_signed_64_bit_range_is_accepted(seed):
    assert SamplingParams(seed=seed).seed == seed


def test_seed_minus_one_means_no_seed_as_in_vllm():
    assert SamplingParams(seed=-1).seed is None


def test_numpy_integers_are_accepted_as_plain_ints():
    params = SamplingParams(seed=np.int64(7), stop_token_ids=[np.int32(3)])
    assert (params.seed, params.stop_token_ids) == (7, [3])
    assert type(params.seed) is int and type(params.stop_token_ids[0]) is int


def test_stop_token_ids_are_checked_against_the_vocabulary_size():
    SamplingParams(stop_token_ids=[4095]).verify_token_ids(4096)
    with pytest.raises(ValueError, match=r"SamplingParams\.stop_token_ids: 4096 is outside the vocabulary"):
        SamplingParams(stop_token_ids=[4096]).verify_token_ids(4096)
