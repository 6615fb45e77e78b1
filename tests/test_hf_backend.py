"""HFBackend: batched in-process generation, checked against transformers on a tiny random model."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from verl_agentic.backends.hf import HFBackend
from verl_agentic.interfaces import GenOutput, SamplingParams
from verl_agentic.models.tiny import make_tiny_model

TOKENIZER_DIR = Path(__file__).parent / "assets" / "tokenizers" / "qwen2.5-instruct"
IM_END = 151645  # <|im_end|>, the tiny model's EOS
ENDOFTEXT = 151643  # <|endoftext|>

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(str(TOKENIZER_DIR), str(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="module")
def loaded(tiny_dir: str) -> HFBackend:
    """A backend loaded once; tests build fresh backends around its model and tokenizer."""
    return HFBackend.from_pretrained(tiny_dir)


@pytest.fixture
def make_backend(loaded: HFBackend) -> Callable[..., HFBackend]:
    def make(**kwargs: Any) -> HFBackend:
        return HFBackend(loaded.model, loaded.tokenizer, **kwargs)

    return make


@pytest.fixture(scope="module")
def prompts(loaded: HFBackend) -> list[list[int]]:
    """Chat-templated prompts of different lengths."""
    questions = ["Hi", "What is 2 + 2?", "Tell me a long story about a dragon who learned to code."]
    out = [
        loaded.tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True
        )["input_ids"]
        for q in questions
    ]
    out.append(loaded.tokenizer("Hello world")["input_ids"])  # a bare 2-token prompt
    assert len({len(p) for p in out}) == len(out)
    return out


def generate_all(backend: HFBackend, requests: list[tuple[list[int], SamplingParams]]) -> list[Any]:
    """Issue all requests concurrently on a fresh event loop; exceptions are returned."""

    async def main() -> list[Any]:
        try:
            return await asyncio.gather(
                *(backend.generate(p, s) for p, s in requests), return_exceptions=True
            )
        finally:
            await backend.close()

    return asyncio.run(main())


def generate_then(
    backend: HFBackend,
    requests: list[tuple[list[int], SamplingParams]],
    after: tuple[list[int], SamplingParams],
) -> tuple[list[Any], GenOutput]:
    """Issue ``requests`` concurrently (exceptions are returned), then ``after`` on its own."""

    async def main() -> tuple[list[Any], GenOutput]:
        results = await asyncio.gather(
            *(backend.generate(p, s) for p, s in requests), return_exceptions=True
        )
        try:
            return results, await backend.generate(*after)
        finally:
            await backend.close()

    return asyncio.run(main())


def reference_greedy(model: Any, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """``model.generate`` greedy on a left-padded batch, each row cut after its first EOS."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), 0, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p) :] = torch.tensor(p)
        attention_mask[i, width - len(p) :] = 1
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=0,
    )
    rows = []
    for row in out[:, width:].tolist():
        rows.append(row[: row.index(IM_END) + 1] if IM_END in row else row)
    return rows


def full_forward_logprobs(model: Any, prompt: list[int], output: GenOutput, temperature: float):
    """Logprobs of ``output``'s tokens from one forward pass over prompt + output."""
    ids = torch.tensor([prompt + output.token_ids])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logprobs = (logits / (temperature or 1.0)).log_softmax(-1)
    return logprobs.gather(1, torch.tensor(output.token_ids).unsqueeze(1)).squeeze(1)


def test_stop_ids_come_from_the_model_configs(
    loaded: HFBackend, make_backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert loaded.stop_token_ids == [IM_END]
    monkeypatch.setattr(loaded.model.generation_config, "eos_token_id", [ENDOFTEXT, IM_END])
    assert make_backend().stop_token_ids == [ENDOFTEXT, IM_END]


def test_from_pretrained_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        HFBackend.from_pretrained(missing)


def test_make_tiny_model_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_AGENTIC_CACHE", str(tmp_path))
    path = make_tiny_model(str(TOKENIZER_DIR), hidden_size=32, num_layers=1)
    config = json.loads((Path(path) / "config.json").read_text())
    assert config["vocab_size"] == 151665 and config["hidden_size"] == 32
    assert config["eos_token_id"] == IM_END and config["pad_token_id"] == ENDOFTEXT
    assert Path(path).parent == tmp_path and Path(path).name.startswith("tiny-qwen2-0-32-1-")
    assert sorted(p.name for p in tmp_path.iterdir()) == [Path(path).name]  # no temp folder left
    mtime = os.stat(Path(path) / "config.json").st_mtime_ns
    assert make_tiny_model(str(TOKENIZER_DIR), hidden_size=32, num_layers=1) == path
    assert os.stat(Path(path) / "config.json").st_mtime_ns == mtime
    llama = make_tiny_model(str(TOKENIZER_DIR), hidden_size=32, num_layers=1, architecture="llama")
    config = json.loads((Path(llama) / "config.json").read_text())  # a folder of its own, Llama's layers
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert Path(llama).name.startswith("tiny-llama-0-32-1-") and config["tie_word_embeddings"] is True
    with pytest.raises(ValueError, match=r"unknown architecture 'gpt2'; known: \['llama', 'qwen2'\]"):
        make_tiny_model(str(TOKENIZER_DIR), architecture="gpt2")


def test_greedy_matches_model_generate(make_backend, loaded: HFBackend, prompts) -> None:
    backend = make_backend()
    outputs = generate_all(backend, [(p, GREEDY) for p in prompts])
    expected = reference_greedy(loaded.model, prompts, GREEDY.max_new_tokens)
    assert [o.token_ids for o in outputs] == expected
    assert len({tuple(e) for e in expected}) == len(expected)  # the model is not degenerate
    for output, tokens in zip(outputs, expected):
        assert output.finish_reason == ("stop" if tokens[-1] == IM_END else "length")
        assert output.text == loaded.tokenizer.decode(tokens)
    # one prefill for the first prompt, one for the three that copy its system-prompt prefix
    assert backend.stats()["batches"] == 2 and backend.stats()["cached_tokens"] > 0


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_match_full_forward(make_backend, loaded, prompts, temperature: float) -> None:
    sampling = SamplingParams(max_new_tokens=10, temperature=temperature, top_k=50, top_p=0.9)
    requests = [(p, sampling.replace(seed=i)) for i, p in enumerate(prompts)]
    outputs = generate_all(make_backend(), requests)
    for prompt, output in zip(prompts, outputs):
        expected = full_forward_logprobs(loaded.model, prompt, output, temperature)
        torch.testing.assert_close(torch.tensor(output.logprobs), expected, atol=1e-4, rtol=0)


def test_seeded_sampling_does_not_depend_on_batching(make_backend, prompts) -> None:
    sampling = SamplingParams(max_new_tokens=16, temperature=1.0, top_k=100, top_p=0.95, seed=7)
    (alone,) = generate_all(make_backend(), [(prompts[2], sampling)])
    others = [
        (prompts[0], SamplingParams(max_new_tokens=4, temperature=0.0)),
        (prompts[1], SamplingParams(max_new_tokens=20, temperature=0.9)),
        (prompts[3], SamplingParams(max_new_tokens=2, temperature=1.0, seed=1)),
    ]
    batched = generate_all(make_backend(), [others[0], (prompts[2], sampling), *others[1:]])
    assert batched[1].token_ids == alone.token_ids
    assert batched[1].logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    (other_seed,) = generate_all(make_backend(), [(prompts[2], sampling.replace(seed=8))])
    assert other_seed.token_ids != alone.token_ids


def test_unseeded_sampling_follows_backend_seed(make_backend, prompts) -> None:
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0)
    runs = [generate_all(make_backend(seed=s), [(p, sampling) for p in prompts]) for s in (0, 0, 1)]
    tokens = [[o.token_ids for o in run] for run in runs]
    assert tokens[0] == tokens[1]
    assert tokens[0] != tokens[2]


def test_top_k_1_and_tiny_top_p_are_greedy(make_backend, prompts) -> None:
    requests = [
        (prompts[2], GREEDY),
        (prompts[2], GREEDY.replace(temperature=1.5, top_k=1, seed=3)),
        (prompts[2], GREEDY.replace(temperature=1.5, top_p=1e-6, seed=4)),
    ]
    greedy, top_k_1, tiny_top_p = generate_all(make_backend(), requests)
    assert top_k_1.token_ids == greedy.token_ids
    assert tiny_top_p.token_ids == greedy.token_ids


def test_concurrent_requests_are_batched(make_backend, loaded, prompts) -> None:
    backend = make_backend()
    outputs = generate_all(backend, [(p, GREEDY) for p in prompts * 2])
    stats = backend.stats()
    assert stats["requests"] == 8 and stats["batches"] < 8
    assert stats["generated_tokens"] == sum(len(o.token_ids) for o in outputs)
    assert stats["decoded_tokens"] == stats["generated_tokens"]  # nothing was cancelled

    small = make_backend(max_batch_size=3)
    outputs = generate_all(small, [(p, GREEDY) for p in prompts * 2])
    # at most 3 requests in the engine at once: the others waited for a place, none failed
    assert small.stats()["requests"] == 8 and 1 < small.stats()["mean_batch_size"] <= 3
    expected = reference_greedy(loaded.model, prompts, GREEDY.max_new_tokens)
    assert [o.token_ids for o in outputs] == expected * 2


def test_stop_token_is_kept(make_backend, loaded, prompts) -> None:
    expected = reference_greedy(loaded.model, prompts, GREEDY.max_new_tokens)
    # a prompt whose greedy step-3 token did not already appear at steps 1-2
    index = next(i for i, e in enumerate(expected) if e[2] not in e[:2])
    stop = expected[index][2]
    requests = [(p, GREEDY) for p in prompts]
    requests[index] = (prompts[index], GREEDY.replace(stop_token_ids=[stop]))
    outputs = generate_all(make_backend(), requests)
    assert outputs[index].token_ids == expected[index][:3]
    assert outputs[index].finish_reason == "stop"
    # the other rows go on correctly after the stopped row left the batch
    others = [i for i in range(len(prompts)) if i != index]
    assert [outputs[i].token_ids for i in others] == [expected[i] for i in others]


def test_max_new_tokens_per_row(make_backend, loaded, prompts) -> None:
    budgets = [1, 5, 0, 9]
    requests = [(p, GREEDY.replace(max_new_tokens=n)) for p, n in zip(prompts, budgets)]
    backend = make_backend()
    outputs = generate_all(backend, requests)
    expected = reference_greedy(loaded.model, prompts, max(budgets))
    for output, tokens, budget in zip(outputs, expected, budgets):
        assert output.token_ids == tokens[:budget]
        assert output.finish_reason == "length"
        assert len(output.logprobs) == budget
    assert backend.stats()["requests"] == 3  # the max_new_tokens=0 request never reached the engine


def test_bad_token_id_fails_only_its_caller(make_backend, loaded, prompts) -> None:
    backend = make_backend()
    vocab = loaded.model.get_input_embeddings().num_embeddings

    (bad, good), after = generate_then(
        backend, [(prompts[0] + [vocab + 5], GREEDY), (prompts[1], GREEDY)], (prompts[2], GREEDY)
    )
    assert isinstance(bad, ValueError) and str(vocab + 5) in str(bad)
    assert isinstance(good, GenOutput) and len(good.token_ids) == GREEDY.max_new_tokens
    assert len(after.token_ids) == GREEDY.max_new_tokens


def test_mocked_oom_retries_smaller_and_fails_only_the_row_that_cannot_fit(
    make_backend, loaded, prompts, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a token only the long prompt has: any forward pass that prefills it fails
    marker = next(t for t in prompts[2] if all(t not in p for p in (prompts[0], prompts[1], prompts[3])))
    expected = reference_greedy(loaded.model, prompts, GREEDY.max_new_tokens)
    backend = make_backend()
    real_forward = backend._forward  # the engine's one forward pass (transformers' or the fused one)

    def mock_oom_forward(input_ids: torch.Tensor, *args: Any) -> Any:
        if bool((input_ids == marker).any()):  # any prefill that includes the long prompt
            raise RuntimeError("mocked OOM (long prompt)")
        return real_forward(input_ids, *args)

    monkeypatch.setattr(backend, "_forward", mock_oom_forward)  # an OOM cannot be caused safely for real

    results, after = generate_then(
        backend, [(prompts[0], GREEDY), (prompts[1], GREEDY), (prompts[2], GREEDY)], (prompts[3], GREEDY)
    )
    # the 3-row prefill failed, then fewer rows at a time: the two short prompts were served correctly
    assert [r.token_ids for r in results[:2]] == expected[:2]
    assert isinstance(results[2], RuntimeError) and "long prompt" in str(results[2])
    assert after.token_ids == expected[3]  # the engine goes on
    stats = backend.stats()
    assert stats["requests"] == 4 and stats["generated_tokens"] == 3 * GREEDY.max_new_tokens
    assert stats["failed_prefills"] >= 2  # the batch of three, then the long prompt alone


def test_cancelled_request_is_dropped(make_backend, prompts) -> None:
    backend = make_backend()
    endless = GREEDY.replace(max_new_tokens=50_000)  # minutes of decoding if it were kept

    async def main() -> tuple[GenOutput, GenOutput]:
        long = asyncio.ensure_future(backend.generate(prompts[0], endless))

        async def long_is_decoding() -> None:
            # else a slow engine thread may still hold it in the queue when it is cancelled below,
            # and the test would not see a running row leave the batch (a race the CI once hit)
            while backend.stats()["decoded_tokens"] == 0:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(long_is_decoding(), timeout=60)
        short = await backend.generate(prompts[1], GREEDY.replace(max_new_tokens=2))
        assert not long.done()  # the short request was answered while the long one goes on
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        # served promptly only if the cancelled row left the running batch
        after = await asyncio.wait_for(backend.generate(prompts[2], GREEDY), timeout=30)
        await backend.close()
        return short, after

    short, after = asyncio.run(main())
    assert len(short.token_ids) == 2 and len(after.token_ids) == GREEDY.max_new_tokens
    assert backend.stats()["requests"] == 3


def test_close_fails_pending_requests(make_backend, prompts) -> None:
    backend = make_backend()

    async def main() -> None:
        pending = asyncio.ensure_future(
            backend.generate(prompts[0], GREEDY.replace(max_new_tokens=50_000))
        )
        await asyncio.sleep(0.05)
        await backend.close()
        with pytest.raises(RuntimeError, match="closed"):
            await pending
        with pytest.raises(RuntimeError, match="closed"):
            await backend.generate(prompts[0], GREEDY)
        await backend.close()  # idempotent

    asyncio.run(main())
