"""Packed oneDNN linear layers (the hf backend's CPU fp32 path): same results, only inside ``active()``."""

from __future__ import annotations

import pytest
import torch

from verl_agentic.backends.packed_linear import PRIVATE_OPS, PackedLinears, packed_linear_supported


def test_the_private_torch_ops_still_exist() -> None:
    for op in PRIVATE_OPS:
        namespace, name = op.split(".")
        assert hasattr(getattr(torch.ops, namespace), name), f"torch.ops.{op} is gone: see backends/packed_linear.py"


U32 = 2.0 ** -24  # unit roundoff of IEEE fp32


def _layer_inputs(model, ids) -> dict:
    """The input each linear layer sees in a forward pass of ``ids`` (real activations, not noise)."""
    seen, hooks = {}, []
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            hooks.append(m.register_forward_pre_hook(lambda mod, args: seen.setdefault(mod, args[0].detach())))
    with torch.inference_mode():
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    return seen


def _assert_within_fp32_bound(forward, layer: torch.nn.Linear, x: torch.Tensor, name: str) -> None:
    """``forward(x)`` is an fp32 computation of ``x @ W.T + b``: each output lies within the classic
    forward-error bound of a K-term fp32 dot product, |y - y_exact| <= gamma_(K+1) * (|x| @ |W|.T + |b|)
    with gamma_n = n*u / (1 - n*u) (Higham, Accuracy and Stability of Numerical Algorithms, 3.1), which
    holds for any summation order, blocking or FMA: what a GEMM library may choose per CPU. A kernel that
    computed in bf16 (u = 2^-8) or dropped terms would break it. Compared like with like: the layer's own
    input, against the same layer in float64."""
    w = layer.weight.detach().double()
    b = None if layer.bias is None else layer.bias.detach().double()
    xd = x.double()
    with torch.inference_mode():
        got = forward(x).double()
        exact = torch.nn.functional.linear(xd, w, b)
    k = w.shape[1] + 1
    gamma = k * U32 / (1 - k * U32)
    scale = xd.abs() @ w.abs().T + (0 if b is None else b.abs())
    excess = ((got - exact).abs() - gamma * scale).max().item()
    assert excess <= 0, f"{name}: beyond the fp32 bound by {excess:.3g}"


def _assert_layers_accurate(model, packed: PackedLinears, ids) -> int:
    """Every packed layer (and, as a check of the bound itself, the stock ``F.linear``) within the bound;
    returns how many layers were checked."""
    inputs = _layer_inputs(model, ids)
    names = {m: n for n, m in model.named_modules()}
    assert len(packed._forwards) == len(packed.linears)
    for layer, forward in zip(packed.linears, packed._forwards):
        x = inputs[layer]
        _assert_within_fp32_bound(forward, layer, x, f"packed {names[layer]}")
        _assert_within_fp32_bound(layer.forward, layer, x, f"F.linear {names[layer]}")
    return len(packed.linears)


def test_packed_forward_matches_and_the_model_is_untouched_outside(smol_dir) -> None:
    """The packed forward is a different fp32 summation order, so it cannot equal the stock one to the
    bit, and how far the logits land from a float64 forward after 30 layers depends on the CPU's kernels
    (0.0004 packed vs 0.0022 stock on an AMD EPYC; 0.00047 vs 0.00016 on an Intel Xeon without
    AVX512-BF16, where an earlier ratio-of-the-two bound failed). So each layer is checked on its own
    input against fp32's rounding bound, which holds on every CPU for any correct fp32 kernel."""
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
    assert not any("forward" in m.__dict__ for m in packed.linears)
    assert _assert_layers_accurate(model, packed, ids) == 30 * 7 + 1  # q k v o gate up down per layer, lm_head
    assert (fast - plain).abs().max().item() < 1e-2  # a gross error shows end to end as well
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
    _assert_layers_accurate(model, packed, ids)
    assert (repacked - new).abs().max().item() < 1e-2


def test_the_bound_catches_a_bf16_kernel(smol_dir) -> None:
    """Negative control: the fp32 bound is tight enough to refuse a linear that computes in bfloat16."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32).eval()
    layer = model.model.layers[0].mlp.down_proj
    x = _layer_inputs(model, torch.tensor([[1, 2, 3, 4, 5, 6]]))[layer]
    w16 = layer.weight.detach().to(torch.bfloat16)
    with pytest.raises(AssertionError, match="beyond the fp32 bound"):
        _assert_within_fp32_bound(lambda v: torch.nn.functional.linear(v.to(torch.bfloat16), w16).float(),
                                  layer, x, "bf16 down_proj")


def test_not_supported_off_cpu_fp32(tiny_qwen_dir) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen_dir, dtype=torch.bfloat16)
    assert not packed_linear_supported(model)
