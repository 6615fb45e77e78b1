"""The hf backend's sampler: Gumbel-max draws follow softmax(logits / T), filtered tokens never come."""

from __future__ import annotations

import torch

from verl_agentic.backends.sampling import filter_logits, gumbel_max, sample_rows


def test_gumbel_max_follows_the_softmax_and_never_draws_a_filtered_token() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, float("-inf")])
    generator = torch.Generator().manual_seed(0)
    draws = torch.tensor([gumbel_max(logits, generator) for _ in range(20_000)])
    freq = torch.bincount(draws, minlength=5).float() / len(draws)
    assert freq[4] == 0
    torch.testing.assert_close(freq, logits.softmax(-1), atol=0.012, rtol=0)  # ~4 standard errors


def test_sample_rows_mixes_greedy_and_sampled_rows_and_reports_unfiltered_logprobs() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 50) * 2
    generators = [None, torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)]
    tokens, logprobs = sample_rows(logits, [0.0, 0.7, 0.7], [(-1, 1.0), (5, 1.0), (5, 1.0)], generators)
    assert tokens[0] == logits[0].argmax()
    assert int(tokens[1]) in torch.topk(logits[1] / 0.7, 5).indices.tolist()  # top-k respected
    again = sample_rows(logits[2:], [0.7], [(5, 1.0)], [torch.Generator().manual_seed(1)])[0]
    assert int(again[0]) == int(tokens[2])  # the row's own seed decides, not the batch
    expected = torch.stack([logits[0].log_softmax(-1)[tokens[0]],
                            (logits[1] / 0.7).log_softmax(-1)[tokens[1]],
                            (logits[2] / 0.7).log_softmax(-1)[tokens[2]]])
    torch.testing.assert_close(logprobs, expected)
    assert torch.isinf(filter_logits(logits[1], 5, 1.0)).sum() == 45
