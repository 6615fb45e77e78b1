"""HFBackend's engine: the KV cache kept across turns, continuous batching and the KV budget.

References are computed without our engine: ``model.generate`` for greedy tokens, one plain forward
over prompt + answer for logprobs, and a fresh backend per request (nothing cached) for seeded samples.
Models: the tiny random Qwen2 with the real Qwen2.5 chat template, and a tiny random Llama (SmolLM2's
architecture) with SmolLM2's tokenizer and template. These tests check the engine's bookkeeping against
references computed from the same weights, which a tiny model does as well (issue 37: with SmolLM2 the
Llama half took 287 s of make test's first pass, with the tiny Llama at most 2.3 s a test). SmolLM2 runs
through the engine in test_fused_forward.py, test_rollout.py, test_code_verify_e2e.py and test_learning.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from verl_agentic.backends.hf import HFBackend
from verl_agentic.interfaces import GenOutput, SamplingParams

QUESTIONS = ["What is 2 + 3?", "Name a colour.", "Count to five.", "Say hello in French."]
FEEDBACK = ["Are you sure? Check it again.", "That is not right. Try again."]


@pytest.fixture(scope="module", params=["tiny_qwen", "tiny_llama"])
def loaded(request: pytest.FixtureRequest) -> HFBackend:
    """A backend loaded once per model; tests build fresh backends around its model and tokenizer."""
    fixture = {"tiny_qwen": "tiny_qwen_dir", "tiny_llama": "tiny_llama_dir"}[request.param]
    return HFBackend.from_pretrained(request.getfixturevalue(fixture))


def fresh(loaded: HFBackend, **kwargs: Any) -> HFBackend:
    return HFBackend(loaded.model, loaded.tokenizer, **kwargs)


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         tokenize=True)["input_ids"]


def feedback_ids(tokenizer: Any, text: str) -> list[int]:
    """The tokens a feedback turn appends after an answer (both models use ChatML)."""
    return tokenizer(f"<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n",
                     add_special_tokens=False)["input_ids"]


async def conversation(backend: HFBackend, first: list[int], feedback: list[list[int]],
                       sampling: SamplingParams) -> list[tuple[list[int], GenOutput]]:
    """Turns of one episode: the next prompt is the previous prompt + the answer's ids + feedback."""
    prompt, turns = first, []
    for i in range(len(feedback) + 1):
        out = await backend.generate(prompt, sampling.replace(seed=None if sampling.seed is None else sampling.seed + i))
        turns.append((prompt, out))
        if i < len(feedback):
            prompt = prompt + out.token_ids + feedback[i]
    return turns


def run_conversations(backend: HFBackend, sampling: SamplingParams, n: int = 4) -> list[list[tuple[list[int], GenOutput]]]:
    tok = backend.tokenizer
    fb = [feedback_ids(tok, t) for t in FEEDBACK]

    async def main() -> list[Any]:
        try:
            return await asyncio.gather(*(conversation(backend, chat_ids(tok, q), fb, sampling)
                                          for q in QUESTIONS[:n]))
        finally:
            await backend.close()

    return asyncio.run(main())


def greedy_reference(model: Any, prompt: list[int], max_new_tokens: int, stop: list[int]) -> list[int]:
    out = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=0)[0, len(prompt):].tolist()
    cut = next((i for i, t in enumerate(out) if t in stop), None)
    return out if cut is None else out[: cut + 1]


def forward_logprobs(model: Any, prompt: list[int], output: GenOutput, temperature: float) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + output.token_ids])).logits[0, len(prompt) - 1 : -1].float()
    return (logits / (temperature or 1.0)).log_softmax(-1).gather(1, torch.tensor(output.token_ids).unsqueeze(1)).squeeze(1)


def test_later_turns_prefill_only_their_delta_and_match_a_full_prefill(loaded: HFBackend) -> None:
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0)
    backend = fresh(loaded)
    episodes = run_conversations(backend, greedy)
    stats = backend.stats()
    prompts = [p for turns in episodes for p, _ in turns]
    later = [(turns[i - 1][0], turns[i - 1][1]) for turns in episodes for i in range(1, len(turns))]
    # every later turn reused its conversation's cache: all but the feedback (and the last answer token)
    assert stats["cached_tokens"] >= sum(len(p) + len(o.token_ids) - 1 for p, o in later)
    assert stats["prefill_tokens"] == sum(len(p) for p in prompts) - stats["cached_tokens"]
    assert stats["evictions"] == 0
    for turns in episodes:
        for prompt, out in turns:
            assert out.token_ids == greedy_reference(loaded.model, prompt, 10, loaded.stop_token_ids)
            torch.testing.assert_close(torch.tensor(out.logprobs), forward_logprobs(loaded.model, prompt, out, 0.0),
                                       atol=1e-4, rtol=0)


def test_seeded_samples_equal_those_of_a_backend_with_nothing_cached(loaded: HFBackend) -> None:
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0, top_k=50, top_p=0.95, seed=11)
    episodes = run_conversations(fresh(loaded), sampling, n=3)
    for turns in episodes:
        for i, (prompt, out) in enumerate(turns):
            alone = fresh(loaded)  # nothing cached: the whole prompt is prefilled

            async def once() -> GenOutput:
                try:
                    return await alone.generate(prompt, sampling.replace(seed=sampling.seed + i))
                finally:
                    await alone.close()

            ref = asyncio.run(once())
            assert alone.stats()["cached_tokens"] == 0
            assert out.token_ids == ref.token_ids
            assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-4)


def test_a_full_cache_evicts_idle_conversations_and_queues_the_rest(loaded: HFBackend) -> None:
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0)
    expected = run_conversations(fresh(loaded), greedy)
    per_token = fresh(loaded)._cache.bytes_per_token
    # room for two slots of 256 columns (+ scratch): 4 conversations must share them
    small = fresh(loaded, kv_cache_gb=(2 * 257 + 8) * per_token / 2**30)
    episodes = run_conversations(small, greedy)
    assert [[o.token_ids for _, o in t] for t in episodes] == [[o.token_ids for _, o in t] for t in expected]
    stats = small.stats()
    assert stats["evictions"] > 0 and stats["kv_cache_mb"] <= (2 * 257 + 8) * per_token / 2**20


def test_a_prompt_longer_than_the_budget_is_refused_before_queueing(loaded: HFBackend) -> None:
    per_token = fresh(loaded)._cache.bytes_per_token
    backend = fresh(loaded, kv_cache_gb=300 * per_token / 2**30)  # one slot of 256 columns
    prompt = chat_ids(loaded.tokenizer, "Hi")

    async def main() -> GenOutput:
        with pytest.raises(ValueError, match=r"kv_cache_gb") as info:
            await backend.generate(prompt * 20, SamplingParams(max_new_tokens=8, temperature=0.0))
        assert f"{len(prompt) * 20} tokens" in str(info.value)
        try:
            return await backend.generate(prompt, SamplingParams(max_new_tokens=8, temperature=0.0))
        finally:
            await backend.close()

    out = asyncio.run(main())
    assert out.token_ids == greedy_reference(loaded.model, prompt, 8, loaded.stop_token_ids)
    assert backend.stats()["requests"] == 1


def test_a_request_cancelled_mid_turn_frees_its_cache(loaded: HFBackend) -> None:
    backend = fresh(loaded)
    prompt = chat_ids(loaded.tokenizer, QUESTIONS[0])
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)

    async def main() -> tuple[int, int]:
        long = asyncio.ensure_future(backend.generate(prompt, greedy.replace(max_new_tokens=50_000)))
        while backend.stats()["decoded_tokens"] < 3:  # it is decoding
            await asyncio.sleep(0.01)
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        before = backend.stats()["cached_tokens"]
        await backend.generate(prompt, greedy)  # nothing of the cancelled row is left to reuse
        after = backend.stats()["cached_tokens"]
        await backend.close()
        return before, after

    before, after = asyncio.run(main())
    assert after == before


def test_a_new_request_joins_the_running_batch_and_leaves_before_the_long_one(loaded: HFBackend) -> None:
    backend = fresh(loaded)
    tok = loaded.tokenizer
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)

    async def main() -> tuple[GenOutput, bool]:
        long = asyncio.ensure_future(backend.generate(chat_ids(tok, QUESTIONS[1]), greedy.replace(max_new_tokens=400,
                                                                                                   stop_token_ids=[])))
        while backend.stats()["decoded_tokens"] < 5:
            await asyncio.sleep(0.01)
        short = await backend.generate(chat_ids(tok, QUESTIONS[2]), greedy)
        still_running = not long.done()
        long.cancel()
        await backend.close()
        return short, still_running

    short, still_running = asyncio.run(main())
    assert still_running
    assert short.token_ids == greedy_reference(loaded.model, chat_ids(tok, QUESTIONS[2]), 4, loaded.stop_token_ids)
    assert backend.stats()["mean_batch_size"] > 1  # the short request decoded beside the long one


def test_a_new_prompt_copies_the_longest_prefix_another_slot_computed(loaded: HFBackend) -> None:
    backend = fresh(loaded)
    tok = loaded.tokenizer
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    first = chat_ids(tok, "Please answer carefully and show your work. " + QUESTIONS[0])
    sibling = chat_ids(tok, "Please answer carefully and show your work. " + QUESTIONS[3])
    shared = next(i for i, (a, b) in enumerate(zip(first, sibling)) if a != b)
    assert shared >= 16

    async def main() -> GenOutput:
        try:
            await backend.generate(first, greedy)
            return await backend.generate(sibling, greedy)
        finally:
            await backend.close()

    out = asyncio.run(main())
    assert backend.stats()["cached_tokens"] == shared
    assert out.token_ids == greedy_reference(loaded.model, sibling, 6, loaded.stop_token_ids)


def test_changed_weights_drop_the_cached_conversations(loaded: HFBackend) -> None:
    backend = fresh(loaded)
    tok = loaded.tokenizer
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    prompt = chat_ids(tok, QUESTIONS[0])
    model = loaded.model
    original = {k: v.clone() for k, v in model.state_dict().items()}

    async def main() -> tuple[GenOutput, list[int]]:
        first = await backend.generate(prompt, greedy)
        cached = backend.stats()["cached_tokens"]
        # the next turn after a weight update (an in-place change, as an optimizer step makes)
        changed = {k: v * 1.05 if v.dim() == 2 else v for k, v in original.items()}
        await backend.call_between_steps(lambda: model.load_state_dict(changed))
        turn = prompt + first.token_ids + feedback_ids(tok, FEEDBACK[0])
        second = await backend.generate(turn, greedy)
        assert backend.stats()["cached_tokens"] == cached  # nothing computed with the old weights reused
        await backend.close()
        return second, turn

    try:
        second, turn = asyncio.run(main())
        assert second.token_ids == greedy_reference(model, turn, 6, loaded.stop_token_ids)
        torch.testing.assert_close(torch.tensor(second.logprobs), forward_logprobs(model, turn, second, 0.0),
                                   atol=1e-4, rtol=0)
    finally:
        model.load_state_dict(original)


def test_grpo_siblings_arriving_together_prefill_their_prompt_once(loaded: HFBackend) -> None:
    backend = fresh(loaded)
    prompt = chat_ids(loaded.tokenizer, "Please answer carefully and show your work. " + QUESTIONS[0])
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0, seed=0)
    n = 4

    async def main() -> list[GenOutput]:
        try:
            return await asyncio.gather(*(backend.generate(prompt, sampling.replace(seed=i)) for i in range(n)))
        finally:
            await backend.close()

    outs = asyncio.run(main())
    stats = backend.stats()
    assert stats["cached_tokens"] == (n - 1) * (len(prompt) - 1)  # copied, not recomputed
    assert stats["prefill_tokens"] == len(prompt) + (n - 1)
    for i, out in enumerate(outs):
        alone = fresh(loaded)

        async def once() -> GenOutput:
            try:
                return await alone.generate(prompt, sampling.replace(seed=i))
            finally:
                await alone.close()

        ref = asyncio.run(once())
        assert out.token_ids == ref.token_ids
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-4)


def test_an_idle_engine_thread_ends_so_an_unclosed_backend_is_freed(loaded: HFBackend) -> None:
    """A running engine thread references its backend: it must end when idle, or every backend a user
    forgets to close keeps its KV cache and packed weights for the life of the process. The next request
    starts a new thread and still finds the conversation cached."""
    import gc
    import threading
    import time
    import weakref

    from verl_agentic.backends import hf

    backend = fresh(loaded)
    tok = loaded.tokenizer
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
    prompt = chat_ids(tok, QUESTIONS[0])

    def engine_threads() -> int:
        return sum(t.name == "hf-backend" and t.is_alive() for t in threading.enumerate())

    async def turn(b: HFBackend, p: list[int]) -> GenOutput:
        return await b.generate(p, greedy)

    before = engine_threads()
    first = asyncio.run(turn(backend, prompt))
    deadline = time.monotonic() + hf.IDLE_EXIT_S + 10
    while engine_threads() > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert engine_threads() == before, "the idle engine thread did not end"
    cached = backend.stats()["cached_tokens"]
    second_prompt = prompt + first.token_ids + feedback_ids(tok, FEEDBACK[0])
    second = asyncio.run(turn(backend, second_prompt))
    assert backend.stats()["cached_tokens"] - cached == len(prompt) + len(first.token_ids) - 1
    assert second.token_ids == greedy_reference(loaded.model, second_prompt, 4, loaded.stop_token_ids)

    ref = weakref.ref(backend)
    del backend
    deadline = time.monotonic() + hf.IDLE_EXIT_S + 10
    while ref() is not None and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.1)
    assert ref() is None, "an unclosed idle backend is still referenced"


# -------------------------------------------------------------------------------------------
# abort (verl's partial rollouts): answered with what was generated, resumable token for token


@pytest.fixture(scope="module")
def tiny(tiny_qwen_dir) -> HFBackend:
    return HFBackend.from_pretrained(tiny_qwen_dir)


async def _when_decoded(backend: HFBackend, tokens: int) -> None:
    while backend.stats()["decoded_tokens"] < tokens:
        await asyncio.sleep(0.001)


def test_abort_all_answers_with_the_tokens_so_far_and_a_resume_continues_them_exactly(tiny: HFBackend) -> None:
    """verl aborts the requests in flight before a weight update and resumes each with its prompt plus
    the tokens it got. Aborted: running requests return a prefix of what they would have generated
    (with its logprobs), a queued one returns nothing; the resumed requests then produce exactly the
    rest of the uninterrupted greedy output."""
    n = 256
    greedy = SamplingParams(max_new_tokens=n, temperature=0.0)
    prompts = [chat_ids(tiny.tokenizer, q) for q in QUESTIONS[:3]]
    reference = [greedy_reference(tiny.model, p, n, tiny.stop_token_ids) for p in prompts[:2]]
    assert all(len(r) == n for r in reference), "the tiny model stopped early: the test needs long outputs"

    async def main() -> tuple[list[GenOutput], list[GenOutput], int]:
        backend = fresh(tiny, max_batch_size=2)  # the third request waits in the queue
        try:
            calls = [asyncio.ensure_future(backend.generate(p, greedy)) for p in prompts]
            await _when_decoded(backend, 12)
            aborted_count = await backend.abort_all()
            aborted = await asyncio.gather(*calls)
            resumed = await asyncio.gather(*(backend.generate(p + out.token_ids, greedy.replace(
                max_new_tokens=n - len(out.token_ids))) for p, out in zip(prompts[:2], aborted)))
            return aborted, resumed, aborted_count
        finally:
            await backend.close()

    aborted, resumed, count = asyncio.run(main())
    assert count == 3 and [out.finish_reason for out in aborted] == ["abort"] * 3
    assert aborted[2].token_ids == [] and aborted[2].logprobs == []
    for prompt, ref, cut, rest in zip(prompts, reference, aborted, resumed):
        k = len(cut.token_ids)
        assert 0 < k < n and cut.token_ids == ref[:k]
        assert rest.token_ids == ref[k:] and rest.finish_reason == "length"
        whole = GenOutput(token_ids=ref, logprobs=None, text="", finish_reason="length")
        torch.testing.assert_close(torch.tensor(cut.logprobs + rest.logprobs),
                                   forward_logprobs(tiny.model, prompt, whole, 0.0), atol=1e-4, rtol=0)


def test_a_weight_change_ends_the_requests_in_flight_instead_of_mixing_weights(tiny: HFBackend) -> None:
    """A request must not continue with keys and values of the old weights under the new ones: a weight
    change answers it with the tokens of the old weights (``abort``); resumed, it continues with the new."""
    n = 256
    greedy = SamplingParams(max_new_tokens=n, temperature=0.0)
    prompt = chat_ids(tiny.tokenizer, QUESTIONS[0])
    model = tiny.model
    original = {k: v.clone() for k, v in model.state_dict().items()}
    old_reference = greedy_reference(model, prompt, n, tiny.stop_token_ids)
    changed = {k: v * 1.05 if v.dim() == 2 else v for k, v in original.items()}

    async def main() -> tuple[GenOutput, GenOutput]:
        backend = fresh(tiny)
        try:
            call = asyncio.ensure_future(backend.generate(prompt, greedy))
            await _when_decoded(backend, 12)
            await backend.call_between_steps(lambda: model.load_state_dict(changed))
            cut = await call
            rest = await backend.generate(prompt + cut.token_ids, greedy.replace(max_new_tokens=8))
            return cut, rest
        finally:
            await backend.close()

    try:
        cut, rest = asyncio.run(main())
        k = len(cut.token_ids)
        assert cut.finish_reason == "abort" and 0 < k < n and cut.token_ids == old_reference[:k]
        assert rest.token_ids == greedy_reference(model, prompt + cut.token_ids, 8, tiny.stop_token_ids)
    finally:
        model.load_state_dict(original)
