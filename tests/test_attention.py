"""The copy-free grouped attention gives the same results as transformers' sdpa, on real GQA models."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from verl_agentic.backends.attention import NAME, use_grouped_attention


def _padded_batch(vocab: int, lengths: list[int], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(10, vocab - 10, (len(lengths), width), generator=g)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, width - n:] = 1
    return ids, mask


def _prefill_and_decode(model, ids, mask, steps=4):
    """Logits of a left-padded prefill and a few greedy decode steps, as the hf backend runs them."""
    cache = DynamicCache(config=model.config)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = []
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
        logits.append(out.logits[:, -1])
        nxt, next_pos = out.logits[:, -1].argmax(-1, keepdim=True), pos[:, -1:] + 1
        for _ in range(steps):
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
            out = model(input_ids=nxt, attention_mask=mask, position_ids=next_pos, past_key_values=cache, use_cache=True)
            logits.append(out.logits[:, -1])
            nxt, next_pos = out.logits[:, -1].argmax(-1, keepdim=True), next_pos + 1
    return torch.stack(logits), out


@pytest.mark.parametrize("which", ["smol_dir", "tiny_qwen_dir"])
def test_grouped_attention_matches_sdpa(which, request):
    path = request.getfixturevalue(which)
    stock = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    grouped = copy.deepcopy(stock)
    assert use_grouped_attention(grouped) and grouped.config._attn_implementation == NAME
    assert stock.config.num_attention_heads > stock.config.num_key_value_heads  # really GQA
    ids, mask = _padded_batch(stock.config.vocab_size, [37, 12, 25, 37])
    a, _ = _prefill_and_decode(stock, ids, mask)
    b, _ = _prefill_and_decode(grouped, ids, mask)
    assert torch.allclose(a, b, atol=2e-4, rtol=1e-4), (a - b).abs().max()
    # no padding at all: the fused causal path
    ids, mask = _padded_batch(stock.config.vocab_size, [20, 20], seed=1)
    with torch.no_grad():
        assert torch.allclose(stock(ids).logits, grouped(ids).logits, atol=2e-4, rtol=1e-4)


def test_grouped_attention_gradients_match(tiny_qwen_dir):
    stock = AutoModelForCausalLM.from_pretrained(tiny_qwen_dir, dtype=torch.float32, attn_implementation="sdpa")
    grouped = copy.deepcopy(stock)
    use_grouped_attention(grouped)
    ids, mask = _padded_batch(stock.config.vocab_size, [16, 9])
    for m in (stock, grouped):
        m.zero_grad()
        m(input_ids=ids, attention_mask=mask).logits.float().logsumexp(-1).mean().backward()
    for (name, p1), (_, p2) in zip(stock.named_parameters(), grouped.named_parameters()):
        assert torch.allclose(p1.grad, p2.grad, atol=1e-4, rtol=1e-3), name


def test_models_without_grouped_heads_are_left_alone(tiny_qwen_dir):
    eager = AutoModelForCausalLM.from_pretrained(tiny_qwen_dir, dtype=torch.float32, attn_implementation="eager")
    assert not use_grouped_attention(eager) and eager.config._attn_implementation == "eager"
