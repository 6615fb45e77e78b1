"""Per-row token sampling for the hf backend: temperature, top-k / top-p, seeded Gumbel-max.

A sampled row draws its token as ``argmax(filtered_logits / T - log(-log U))`` with ``U ~ Uniform(0, 1)``
drawn from the row's own ``torch.Generator``: ``-log(-log U)`` is Gumbel noise, so this picks token ``i`` with
probability ``softmax(filtered_logits / T)[i]`` exactly, like ``torch.multinomial`` over the softmax,
but without the softmax, the normalisation and the cumulative sum (see bench/RESULTS.md, "sampler").
Greedy rows (temperature 0) take the argmax. The logprob returned is ``log_softmax(logits / T)`` at
the chosen token before any filtering: the quantity a trainer recomputes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to -inf the entries of a 1-D logits row outside its top-k and its top-p nucleus.

    ``top_k <= 0`` and ``top_p >= 1`` disable the respective filter. The nucleus is the smallest set
    of most likely tokens whose probability reaches ``top_p``.
    """
    if 0 < top_k < logits.numel():
        kth_largest = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already reach top_p (the first stays).
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop = torch.empty_like(drop_sorted).scatter_(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def gumbel_max(logits: torch.Tensor, generator: torch.Generator) -> int:
    """One token drawn from ``softmax(logits)`` (a 1-D row; -inf entries are never drawn)."""
    # -log(-log U) is Gumbel noise; torch.rand is ~6x cheaper than exponential_ with a generator here
    uniform = torch.rand(logits.shape, generator=generator, dtype=logits.dtype, device=logits.device)
    return int((logits - uniform.log_().neg_().log_()).argmax())


def sample_rows(
    logits: torch.Tensor,
    temperatures: Sequence[float],
    filters: Sequence[tuple[int, float]],
    generators: Sequence[torch.Generator | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of ``logits [rows, vocab]``; return (tokens, logprobs before filtering).

    Row ``i`` is greedy when ``generators[i]`` is None, else sampled at ``temperatures[i]`` after
    ``filter_logits(..., *filters[i])``.
    """
    scaled = logits
    if any(t not in (0.0, 1.0) for t in temperatures):  # skip a pass over the logits when possible
        scale = torch.tensor([t or 1.0 for t in temperatures], device=logits.device, dtype=logits.dtype)
        scaled = logits / scale.unsqueeze(1)
    tokens = scaled.argmax(-1)  # the greedy rows' choice; sampled rows are overwritten below
    for i, generator in enumerate(generators):
        if generator is not None:
            top_k, top_p = filters[i]
            tokens[i] = gumbel_max(filter_logits(scaled[i], top_k, top_p), generator)
    # log_softmax at the chosen tokens, without materialising the [rows, vocab] result
    logprobs = scaled.gather(1, tokens.unsqueeze(1)).squeeze(1) - scaled.logsumexp(-1)
    return tokens, logprobs
