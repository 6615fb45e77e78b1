"""Low-precision rollout (``rollout.hf.weight_dtype``): bf16 / int8 copies of the linear weights for
generation while the model (and a trainer sharing it) keeps fp32; refused on a CPU without the fast
kernel's instructions."""

from __future__ import annotations

import asyncio

import pytest
import torch

from verl_agentic.backends.hf import HFBackend
from verl_agentic.backends.packed_linear import (
    FAST_PATH_FLAGS, PRIVATE_FUNCTIONS, PackedLinears, check_weight_dtype, cpu_flags, quantize_int8,
)
from verl_agentic.interfaces import ConfigError, SamplingParams


def _fast_here(dtype: torch.dtype) -> bool:
    return any(cpu_flags().get(flag) for flag in FAST_PATH_FLAGS[dtype])


def test_the_private_cpu_capability_function_still_exists_and_reports_instruction_sets() -> None:
    for name in PRIVATE_FUNCTIONS:
        obj = torch
        for part in name.split(".")[1:]:
            assert hasattr(obj, part), f"{name} is gone: see backends/packed_linear.py"
            obj = getattr(obj, part)
    flags = cpu_flags()
    assert flags["architecture"] and isinstance(flags.get("num_logical_cores"), int)
    if flags["architecture"] == "x86_64":  # the names FAST_PATH_FLAGS uses on x86
        assert {"avx512_bf16", "amx_bf16", "avx512_f"} <= set(flags)


def test_names_and_aliases() -> None:
    assert check_weight_dtype("fp32", flags={}) is torch.float32  # fp32 needs nothing
    assert check_weight_dtype("BF16", flags={"avx512_bf16": True}) is torch.bfloat16
    assert check_weight_dtype("int8", flags={"avx512_f": True}) is torch.int8
    with pytest.raises(ConfigError, match=r"one of float32 \(fp32\), bfloat16 \(bf16\), int8; got 'fp8'"):
        check_weight_dtype("fp8", flags={})


def test_refused_on_a_cpu_without_the_instructions() -> None:
    # this machine's own features with the fast kernels' instruction sets switched off: a CPU we do not have
    without = {**cpu_flags(), **{flag: False for flags in FAST_PATH_FLAGS.values() for flag in flags}}
    with pytest.raises(ConfigError) as info:
        check_weight_dtype("bf16", flags=without)
    message = str(info.value)
    assert "rollout.hf.weight_dtype=bfloat16 needs one of the CPU instruction sets avx512_bf16, amx_bf16" in message
    assert without["cpu_name"] in message and "weight_dtype=float32" in message and "\n" not in message
    with pytest.raises(ConfigError, match=r"weight_dtype=int8 needs one of the CPU instruction sets avx512_f"):
        check_weight_dtype("int8", flags=without)


def test_the_config_checks_the_cpu_before_anything_loads() -> None:
    from verl_agentic.config import HFConfig

    for name, dtype in (("bfloat16", torch.bfloat16), ("int8", torch.int8)):
        if _fast_here(dtype):
            assert HFConfig(weight_dtype=name).weight_dtype == name
        else:
            with pytest.raises(ConfigError, match="instruction sets"):
                HFConfig(weight_dtype=name)


def test_int8_quantization_round_trips_within_half_a_step() -> None:
    w = torch.randn(64, 96) * torch.linspace(0.01, 2.0, 64)[:, None]  # rows of very different scales
    q, scales = quantize_int8(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127 and scales.shape == (64,)
    assert ((q.float() * scales[:, None] - w).abs() <= scales[:, None] / 2 + 1e-7).all()


@pytest.mark.parametrize("name,tolerance,size", [("bfloat16", 0.03, 2), ("int8", 0.12, 1)])
def test_low_precision_copies_compute_close_to_fp32_and_leave_the_model_alone(smol_dir, smol_tokenizer, name,
                                                                            tolerance, size) -> None:
    from transformers import AutoModelForCausalLM

    if name == "bfloat16" and not _fast_here(torch.bfloat16):  # oneDNN's bf16 packing refuses such a CPU outright
        with pytest.raises(ConfigError, match="instruction sets"):
            check_weight_dtype(name)  # what the engine asks before it packs: it refuses, with the reason
        pytest.skip(f"this CPU lacks {' / '.join(FAST_PATH_FLAGS[torch.bfloat16])}: bfloat16 copies were refused "
                    f"as they must be, not made")
    model = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    copies = PackedLinears(model, batch_hint=2, weight_dtype=name)
    assert copies.nbytes == sum(m.weight.numel() for m in copies.linears) * size
    ids = smol_tokenizer(["Natalia sold clips to 48 of her friends in April, and then",
                          "The capital of France is Paris. The capital of Italy is"], return_tensors="pt",
                         padding=True)["input_ids"]
    with torch.inference_mode():
        exact = model(input_ids=ids).logits
        with copies.active():
            low = model(input_ids=ids).logits
        again = model(input_ids=ids).logits
    assert torch.equal(exact, again)  # outside active() the fp32 model computes as before
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # a real difference, and a small one: log-probabilities of the same tokens
    lp_exact, lp_low = exact.log_softmax(-1), low.log_softmax(-1)
    gap = (lp_exact - lp_low).abs()
    top = lp_exact.argmax(-1, keepdim=True)
    top_gap = gap.gather(-1, top)
    assert 0 < top_gap.mean().item() < tolerance, top_gap.mean().item()
    # a weight change is seen after pack() (as the engine repacks when the version counters move)
    with torch.no_grad():
        copies.linears[0].weight.mul_(1.5)  # not the lm_head: tied to the input embeddings
    with torch.inference_mode():
        with copies.active():
            stale = model(input_ids=ids).logits
        copies.pack()
        with copies.active():
            repacked = model(input_ids=ids).logits
    assert torch.equal(stale, low) and not torch.allclose(repacked, low, atol=1e-2)


def _fp32_logprobs(model, prompt: list[int], out: list[int]) -> list[float]:
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + out])).logits[0, len(prompt) - 1: -1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(out)[:, None])[:, 0].tolist()


@pytest.mark.parametrize("name", ["bfloat16", "int8"])
def test_the_engine_generates_in_low_precision_and_logs_a_real_gap(smol_dir, smol_tokenizer, name) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32)
    dtype = torch.bfloat16 if name == "bfloat16" else torch.int8
    if not _fast_here(dtype):  # a CPU without the instructions: the engine refuses before touching the model
        with pytest.raises(ConfigError, match="instruction sets"):
            HFBackend(model, smol_tokenizer, weight_dtype=name)
        pytest.skip(f"this CPU lacks {' / '.join(FAST_PATH_FLAGS[dtype])}: the {name} engine was refused as it must "
                    f"be, not run")
    prompts = [smol_tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=True)["input_ids"]
               for q in ("What is 12 times 7?", "Name three prime numbers.")]
    sampling = SamplingParams(temperature=0, max_new_tokens=24)

    async def run(weight_dtype: str):
        backend = HFBackend(model, smol_tokenizer, weight_dtype=weight_dtype, max_batch_size=4)
        try:
            return backend, await asyncio.gather(*(backend.generate(p, sampling) for p in prompts))
        finally:
            await backend.close()

    low_backend, low = asyncio.run(run(name))
    _, exact = asyncio.run(run("float32"))
    assert low_backend.weight_dtype is dtype
    gaps_low, gaps_exact = [], []
    for p, lo, ex in zip(prompts, low, exact):
        assert lo.token_ids and all(0 <= t < model.config.vocab_size for t in lo.token_ids)
        gaps_low += [abs(a - b) for a, b in zip(lo.logprobs, _fp32_logprobs(model, p, lo.token_ids))]
        gaps_exact += [abs(a - b) for a, b in zip(ex.logprobs, _fp32_logprobs(model, p, ex.token_ids))]
    # the fp32 engine agrees with the trainer's forward; the low-precision one measurably does not
    assert max(gaps_exact) < 1e-3
    assert sum(gaps_low) / len(gaps_low) > 10 * max(sum(gaps_exact) / len(gaps_exact), 1e-6)
    assert sum(gaps_low) / len(gaps_low) < 0.2


def test_a_non_fp32_model_is_refused_whatever_the_cpu(tiny_qwen_dir, smol_tokenizer) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen_dir, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="is for a float32 model on CPU"):
        HFBackend(model, smol_tokenizer, weight_dtype="bf16")


def test_the_hf_rollout_server_is_fp32_unless_asked_and_a_pushed_state_reaches_the_bf16_copies(tiny_qwen_dir,
                                                                                                 caplog) -> None:
    """Inside verl's trainer, without the launch script: verl's ``rollout.dtype`` defaults to bfloat16
    (vLLM's precision), and the hf rollout used to follow it, so a plain verl run generated in bf16 (or
    was refused on a CPU without AVX512-BF16). It stays float32 unless
    ``engine_kwargs.hf.weight_dtype`` asks; a pushed fp32 state then reaches the bf16 copies."""
    from pathlib import Path

    import verl
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from verl_agentic.verl_plugin.cpu.hf_rollout import HFRolloutServer

    def server(weight_dtype=None) -> HFRolloutServer:
        """verl's own rollout defaults (its rollout.yaml: dtype bfloat16), sized down."""
        config = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "rollout" / "rollout.yaml")
        config.max_num_seqs, config.response_length = 4, 8
        if weight_dtype:
            config.engine_kwargs.hf = {"weight_dtype": weight_dtype}
        return HFRolloutServer(config, OmegaConf.create({"path": str(tiny_qwen_dir)}), replica_rank=0)

    with caplog.at_level("INFO", logger="verl_agentic.verl_plugin.cpu.hf_rollout"):
        default = server()  # verl's defaults, as a config without the launch script has them
    assert default.backend.weight_dtype is torch.float32
    assert "actor_rollout_ref.rollout.dtype=bfloat16 is for vLLM/SGLang" in caplog.text
    asyncio.run(default.backend.close())
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref.rollout.engine_kwargs.hf.weight_dtype must be one "
                                          r"of .*got 'float16'"):
        server("float16")
    if not _fast_here(torch.bfloat16):
        with pytest.raises(ConfigError, match=r"^actor_rollout_ref.rollout.engine_kwargs.hf.weight_dtype=bfloat16 "
                                              r"needs one of"):
            server("bfloat16")
        pytest.skip("this CPU has no AVX512-BF16/AMX: the bf16 hf rollout was refused as it must be, not run")
    bf16 = server("bfloat16")
    assert bf16.backend.weight_dtype is torch.bfloat16
    new = AutoModelForCausalLM.from_pretrained(tiny_qwen_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    prompt = [9707, 11, 1879, 0, 374]
    params = {"temperature": 0, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": 8}

    async def scenario():
        await bf16.update_weights(dict(new.state_dict()), 1)
        out = await bf16.generate("r0", prompt_ids=prompt, sampling_params=params)
        await bf16.backend.close()
        return out

    out = asyncio.run(scenario())
    lp_new = _fp32_logprobs(new, prompt, out.token_ids)
    lp_old = _fp32_logprobs(AutoModelForCausalLM.from_pretrained(tiny_qwen_dir, dtype=torch.float32), prompt,
                            out.token_ids)
    gap_new, gap_old = (sum(abs(a - b) for a, b in zip(out.log_probs, lp)) / len(lp) for lp in (lp_new, lp_old))
    assert gap_new < 0.1 and gap_new < gap_old / 2, (gap_new, gap_old)  # the bf16 copy of the pushed weights
