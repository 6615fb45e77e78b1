"""Packed oneDNN linear layers (the hf backend's CPU fp32 path): same results, only inside ``active()``."""

from __future__ import annotations

import copy

import torch

from verl_agentic.backends.packed_linear import PRIVATE_OPS, PackedLinears, packed_linear_supported


def test_the_private_torch_ops_still_exist() -> None:
    for op in PRIVATE_OPS:
        namespace, name = op.split(".")
        assert hasattr(getattr(torch.ops, namespace), name), f"torch.ops.{op} is gone: see backends/packed_linear.py"


def _assert_as_accurate(fast: torch.Tensor, plain: torch.Tensor, model, ids) -> None:
    """The packed forward is a different fp32 summation order over 30 layers, so it cannot equal the stock
    one to the bit, and how far apart the two land depends on the CPU's kernels (0.0025 of logits up to 33
    on an AMD EPYC, under 0.002 elsewhere). What must hold on every CPU: the packed logits are as close to
    the same model's float64 forward as the stock fp32 ones are (on that EPYC: 0.0004 packed, 0.0022 stock)."""
    with torch.inference_mode():
        exact = copy.deepcopy(model).double()(input_ids=ids).logits
    fast_err, plain_err = ((x.double() - exact).abs().max().item() for x in (fast, plain))
    assert fast_err <= 2 * plain_err + 1e-4, (fast_err, plain_err)


def test_packed_forward_matches_and_the_model_is_untouched_outside(smol_dir) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32).eval()
    assert packed_linear_supported(model)
    packed = PackedLinears(model, batch_hint=8)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])
    with torch.inference_mode():
        plain = model(input_ids=ids).logits
        with packed.active():
            assert all("forward" in m.__dict__ for m in packed.linears)
            fast = model(input_ids=ids).logits
    _assert_as_accurate(fast, plain, model, ids)
    assert not any("forward" in m.__dict__ for m in packed.linears)
    # outside active() the model trains as before: gradients reach the linear weights
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    assert packed.linears[0].weight.grad is not None and packed.linears[0].weight.grad.abs().sum() > 0
    # stale until repacked: after a weight change the packed copy still computes with the old weights
    with torch.no_grad():
        packed.linears[-1].weight.mul_(1.5)
    model.eval()
    with torch.inference_mode():
        new = model(input_ids=ids).logits
        with packed.active():
            stale = model(input_ids=ids).logits
        packed.pack()
        with packed.active():
            repacked = model(input_ids=ids).logits
    assert not torch.allclose(stale, new, atol=1e-2)
    _assert_as_accurate(repacked, new, model, ids)


def test_not_supported_off_cpu_fp32(tiny_qwen_dir) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen_dir, dtype=torch.bfloat16)
    assert not packed_linear_supported(model)
