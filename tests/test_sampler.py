import pytest
import torch

from engine.core.sampling_params import SamplingParams
from engine.model_executor.layers.sampler import Sampler, SamplingMetadata, build_sampling_metadata

V = 32


def params(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, logprobs=None):
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, logprobs=logprobs)


def sample(logits, plist, generators=None):
    meta = build_sampling_metadata(plist, generators or {}, logits.device)
    return Sampler()(logits, meta)


def crafted(n):
    """Probabilities 0.5, 0.3, 0.15, then 0.05 spread over the other tokens."""
    probs = torch.full((V,), 0.05 / (V - 3))
    probs[:3] = torch.tensor([0.5, 0.3, 0.15])
    return probs.log().expand(n, V).clone()


def test_greedy_is_argmax():
    logits = torch.randn(6, V, generator=torch.Generator().manual_seed(0))
    out = sample(logits, [params(temperature=0.0)] * 6)
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))
    assert out.logprobs_tensors is None


def test_top_k_one_equals_greedy():
    logits = torch.randn(8, V, generator=torch.Generator().manual_seed(1))
    out = sample(logits, [params(temperature=1.5, top_k=1)] * 8)
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))


def test_mixed_greedy_and_random_batch():
    torch.manual_seed(0)
    logits = torch.randn(4, V) * 0.1  # flat, so random rows rarely hit the argmax
    plist = [params(temperature=0.0), params(temperature=1.0)] * 2
    meta = build_sampling_metadata(plist, {}, "cpu")
    assert not meta.all_greedy and not meta.all_random
    picks = torch.stack([Sampler()(logits, meta).sampled_token_ids for _ in range(50)])
    assert (picks[:, [0, 2]] == logits.argmax(-1)[[0, 2]]).all()
    assert len(set(picks[:, 1].tolist())) > 1


def test_top_p_never_picks_excluded_tokens():
    torch.manual_seed(0)
    # mass of {0}=0.5 < 0.7, {0,1}=0.8 >= 0.7: only tokens 0 and 1 may be drawn
    picks = sample(crafted(4000), [params(top_p=0.7)] * 4000).sampled_token_ids
    assert set(picks.tolist()) == {0, 1}


def test_min_p_never_picks_excluded_tokens():
    torch.manual_seed(0)
    # min_p 0.35 * max 0.5 = 0.175: token 2 (0.15) and the tail are dropped
    picks = sample(crafted(4000), [params(min_p=0.35)] * 4000).sampled_token_ids
    assert set(picks.tolist()) == {0, 1}


def test_top_k_never_picks_excluded_tokens():
    torch.manual_seed(0)
    picks = sample(crafted(4000), [params(top_k=3)] * 4000).sampled_token_ids
    assert set(picks.tolist()) == {0, 1, 2}


def test_temperature_sampling_matches_softmax():
    torch.manual_seed(0)
    n, temp = 20000, 0.7
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0])
    picks = sample(logits.expand(n, -1).clone(), [params(temperature=temp)] * n).sampled_token_ids
    observed = torch.bincount(picks, minlength=8).float()
    expected = torch.softmax(logits / temp, -1) * n
    chi2 = ((observed - expected) ** 2 / expected).sum().item()
    assert chi2 < 24.3  # chi-square 0.999 quantile for 7 degrees of freedom


def test_seeded_row_reproducible_across_batch_composition():
    logits_seq = [torch.randn(5, V, generator=torch.Generator().manual_seed(s)) for s in range(6)]
    alone = torch.Generator().manual_seed(42)
    solo = [sample(lg[2:3], [params(top_p=0.9)], {0: alone}).sampled_token_ids.item() for lg in logits_seq]
    gens = {2: torch.Generator().manual_seed(42), 4: torch.Generator().manual_seed(7)}
    plist = [params(temperature=0.0), params(top_k=5), params(top_p=0.9), params(min_p=0.1), params()]
    batched = [sample(lg, plist, gens).sampled_token_ids[2].item() for lg in logits_seq]
    assert batched == solo


def test_logprobs_are_raw_log_softmax_with_rank():
    torch.manual_seed(0)
    logits = torch.randn(5, V)
    out = sample(logits, [params(temperature=0.5, top_k=3, logprobs=4)] * 3 + [params(logprobs=2)] * 2)
    raw = logits.log_softmax(-1)
    lp = out.logprobs_tensors
    assert lp.logprob_token_ids.shape == (5, 5) and lp.logprobs.shape == (5, 5)
    assert torch.equal(lp.logprob_token_ids[:, 0], out.sampled_token_ids)
    assert torch.allclose(lp.logprobs, raw.gather(1, lp.logprob_token_ids))
    assert torch.equal(lp.logprob_token_ids[:, 1:], raw.topk(4, -1).indices)
    order = raw.argsort(-1, descending=True)
    expected_rank = (order == out.sampled_token_ids[:, None]).int().argmax(-1) + 1
    assert torch.equal(lp.selected_token_ranks, expected_rank)


def test_metadata_leaves_out_unused_knobs():
    meta = build_sampling_metadata([params(temperature=0.0, top_k=-1), params(temperature=0.0)], {}, "cpu")
    assert isinstance(meta, SamplingMetadata)
    assert meta.all_greedy and meta.temperature is None
    assert meta.top_k is None and meta.top_p is None and meta.min_p is None and meta.max_num_logprobs is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_runs_on_cuda_with_seeded_rows():
    logits = torch.randn(4, V, device="cuda")
    gens = {1: torch.Generator(device="cuda").manual_seed(3)}
    plist = [params(temperature=0.0), params(top_p=0.8, logprobs=2), params(top_k=4), params()]
    out = sample(logits, plist, gens)
    assert out.sampled_token_ids.device.type == "cuda" and out.logprobs_tensors.logprobs.shape == (4, 3)
    assert out.sampled_token_ids[0].item() == logits[0].argmax().item()
