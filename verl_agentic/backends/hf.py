"""In-process Hugging Face transformers generation that batches concurrent requests.

Many episodes call :meth:`HFBackend.generate` concurrently. Their requests go on a queue; one
worker task takes whatever is pending (up to ``max_batch_size``) and decodes it as a single
left-padded batch in a worker thread, so the event loop stays free while the model runs.
Each request is answered as soon as its own row finishes; requests that arrive meanwhile
form the next batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from verl_agentic.backends.attention import use_grouped_attention
from verl_agentic.backends.base import GenerationBackend, stop_ids_from_configs
from verl_agentic.interfaces import GenOutput, SamplingParams


@dataclass
class _Request:
    """A queued ``generate`` call."""

    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future[GenOutput]
    # Set on the event loop when the caller stops waiting; the decode thread then drops the row.
    cancelled: bool = False


@dataclass
class _Row:
    """The decode state of one request inside a batch."""

    request: _Request
    stop_ids: frozenset[int]
    generator: torch.Generator | None  # None for greedy rows
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = ""  # "stop" or "length" once finished

    def append(self, token_id: int, logprob: float) -> None:
        """Record a generated token and mark the row finished on a stop id or at its budget."""
        self.token_ids.append(token_id)
        self.logprobs.append(logprob)
        if token_id in self.stop_ids:
            self.finish_reason = "stop"
        elif len(self.token_ids) >= self.request.sampling.max_new_tokens:
            self.finish_reason = "length"


def _filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to -inf the entries of a 1-D logits row outside its top-k and its top-p nucleus.

    ``top_k <= 0`` and ``top_p >= 1`` disable the respective filter. The nucleus is the
    smallest set of most likely tokens whose probability reaches ``top_p``.
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


class HFBackend(GenerationBackend):
    """Generates with an in-process ``transformers`` causal LM, batching concurrent requests.

    Each request keeps its own :class:`SamplingParams` inside a batch: temperature 0 is
    greedy, otherwise the logits are divided by the temperature, filtered by top-k and top-p
    and sampled with the row's own ``torch.Generator``. That generator is seeded with the
    request's ``seed`` when it has one (so its tokens do not depend on what it is batched
    with), else with a number drawn from the backend's generator seeded by ``seed`` (so a
    run is reproducible given the same order of requests).

    The logprob returned for each token is ``log_softmax(logits / temperature)`` at that token
    (raw logits when greedy), computed *before* top-k / top-p filtering: it is the quantity a
    trainer recomputes from the same model at the same temperature.

    A row finishes on one of its stop ids (the backend's :attr:`stop_token_ids` plus the
    request's ``stop_token_ids``), which is kept in its output, or at its own
    ``max_new_tokens``. A finished request is answered at once; finished rows, and rows
    whose caller was cancelled, are dropped from the batch and its KV cache, so the others
    go on at the size of what is left.

    The backend serves one event loop at a time: the worker task binds to the loop of the
    first ``generate`` call and rebinds when called from a new loop after that one ended.

    Args:
        model: a causal LM (``PreTrainedModel``); moved to ``device`` and set to eval mode.
        tokenizer: its tokenizer (used for the pad id and to decode ``GenOutput.text``).
        max_batch_size: the most requests decoded together.
        batch_wait_ms: how long the worker waits for more requests after the first one of
            a batch arrives (requests issued in the same event-loop tick always join).
        seed: seeds the generator of requests that carry no seed of their own.
        device: where the model runs.
        grouped_attention: switch an ``sdpa`` model with grouped KV heads to the copy-free
            grouped attention of :mod:`verl_agentic.backends.attention` (same results, ~3x
            faster decode steps on long padded batches). This changes the model object, which
            the backend shares with its caller.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_batch_size: int = 32,
        batch_wait_ms: float = 2.0,
        seed: int = 0,
        device: str | torch.device = "cpu",
        grouped_attention: bool = True,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        # sdpa + grouped KV heads: attend without copying the KV cache (see backends/attention.py)
        self.grouped_attention = grouped_attention and use_grouped_attention(self.model)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.stop_token_ids = stop_ids_from_configs(getattr(model, "generation_config", None), model.config)
        if tokenizer.pad_token_id is not None:
            self._pad_id: int = tokenizer.pad_token_id
        else:  # any valid id works: padded positions are masked out
            self._pad_id = self.stop_token_ids[0] if self.stop_token_ids else 0
        self._vocab_size: int = model.get_input_embeddings().num_embeddings
        # Only the last position's logits are needed (saves a [batch, prompt, vocab] tensor).
        self._forward_kwargs: dict[str, Any] = (
            {"logits_to_keep": 1}
            if "logits_to_keep" in inspect.signature(model.forward).parameters
            else {}
        )
        self._seed_rng = random.Random(seed)

        # One thread runs every decode, so the model never runs twice at once.
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="hf-backend"
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._closed = False

        self._num_requests = 0
        self._num_batches = 0
        self._generated_tokens = 0
        self._decoded_tokens = 0  # bumped every decode step (live progress), cancelled rows included
        self._busy_s = 0.0

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike[str], dtype: str | torch.dtype = "float32", **kwargs: Any
    ) -> HFBackend:
        """Load the model and tokenizer of a local Hugging Face folder.

        Args:
            path: a folder with ``config.json``, weights and tokenizer files.
            dtype: the model's dtype (``"float32"``, ``"bfloat16"``, ``"auto"``, a torch dtype).
            **kwargs: passed on to :class:`HFBackend` (``max_batch_size``, ``device``, ...).

        Raises:
            FileNotFoundError: ``path`` is not a folder with a ``config.json``.
        """
        if not (Path(path) / "config.json").is_file():
            raise FileNotFoundError(
                f"no Hugging Face model at {os.fspath(path)!r} (expected a folder with config.json)"
            )
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
        return cls(model, tokenizer, **kwargs)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenOutput:
        """Continue ``prompt_ids``; see the class docstring for sampling and stopping.

        Raises:
            ValueError: an empty prompt, a token id outside the model's vocabulary or
                invalid sampling parameters (raised before the request is queued).
            RuntimeError: the backend is closed.
            Exception: whatever the model raised while decoding this request's batch.
        """
        if self._closed:
            raise RuntimeError("HFBackend is closed")
        self._validate(prompt_ids, sampling)
        if sampling.max_new_tokens <= 0:
            return GenOutput(token_ids=[], logprobs=[], text="", finish_reason="length")
        loop = asyncio.get_running_loop()
        request = _Request(list(prompt_ids), sampling, loop.create_future())
        self._ensure_worker(loop).put_nowait(request)
        try:
            return await request.future
        except asyncio.CancelledError:
            request.cancelled = True
            raise

    async def close(self) -> None:
        """Stop the worker; requests still queued or decoding fail with ``RuntimeError``."""
        if self._closed:
            return
        self._closed = True
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        if self._queue is not None:
            while not self._queue.empty():
                self._fail([self._queue.get_nowait()], RuntimeError("HFBackend was closed"))
        # Waits at most one decode step: the cancelled worker marked its batch's rows cancelled.
        await asyncio.to_thread(self._executor.shutdown)

    def stats(self) -> dict[str, float]:
        """Counters: requests decoded (``max_new_tokens > 0``), batches, mean batch size,
        tokens returned to callers, tokens decoded so far (live, for progress output) and
        seconds spent decoding."""
        return {
            "requests": self._num_requests,
            "batches": self._num_batches,
            "mean_batch_size": self._num_requests / self._num_batches if self._num_batches else 0.0,
            "generated_tokens": self._generated_tokens,
            "decoded_tokens": self._decoded_tokens,
            "busy_s": self._busy_s,
        }

    # ------------------------------------------------------------------ event-loop side

    def _validate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        if not prompt_ids:
            raise ValueError("HFBackend.generate: empty prompt")
        bad = [t for t in prompt_ids if not 0 <= t < self._vocab_size]
        if bad:
            raise ValueError(
                f"HFBackend.generate: token ids {bad[:5]} outside the model's vocabulary "
                f"[0, {self._vocab_size})"
            )
        if sampling.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {sampling.temperature}")
        if not 0 < sampling.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {sampling.top_p}")

    def _ensure_worker(self, loop: asyncio.AbstractEventLoop) -> asyncio.Queue[_Request]:
        """The request queue of ``loop``'s worker, starting the worker if needed."""
        worker_alive = self._worker is not None and not self._worker.done()
        if self._queue is None or not worker_alive or loop is not self._loop:
            self._loop = loop
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._serve(self._queue), name="HFBackend.worker")
        return self._queue

    async def _serve(self, queue: asyncio.Queue[_Request]) -> None:
        """Worker: forever take a batch of pending requests and decode it."""
        loop = asyncio.get_running_loop()
        while True:
            batch = [await queue.get()]
            try:
                await self._collect(queue, batch)
                batch = [r for r in batch if not r.future.done()]  # drop cancelled callers
                if not batch:
                    continue
                start = time.perf_counter()
                try:
                    await loop.run_in_executor(self._executor, self._decode_batch, batch, loop)
                except Exception as exc:  # e.g. OOM: fail what is left of this batch, keep serving
                    self._fail(batch, exc)
                finally:
                    self._busy_s += time.perf_counter() - start
                    self._num_batches += 1
                    self._num_requests += len(batch)
            except asyncio.CancelledError:
                for request in batch:
                    request.cancelled = True
                self._fail(batch, RuntimeError("HFBackend was closed"))
                raise

    async def _collect(self, queue: asyncio.Queue[_Request], batch: list[_Request]) -> None:
        """Add to ``batch`` the requests pending now and those arriving within the wait window."""
        await asyncio.sleep(0)  # let requests issued in the same tick reach the queue
        self._drain(queue, batch)
        if len(batch) < self.max_batch_size and self.batch_wait_s > 0:
            await asyncio.sleep(self.batch_wait_s)
            self._drain(queue, batch)

    def _drain(self, queue: asyncio.Queue[_Request], batch: list[_Request]) -> None:
        while len(batch) < self.max_batch_size and not queue.empty():
            batch.append(queue.get_nowait())

    def _deliver(self, request: _Request, output: GenOutput) -> None:
        """Resolve a finished request (called on the event loop by the decode thread)."""
        self._generated_tokens += len(output.token_ids)
        if not request.future.done():
            request.future.set_result(output)

    @staticmethod
    def _fail(requests: list[_Request], exc: BaseException) -> None:
        for request in requests:
            if not request.future.done():
                request.future.set_exception(exc)

    # ------------------------------------------------------------------ decode thread

    def _new_row(self, request: _Request) -> _Row:
        sampling = request.sampling
        generator = None
        if sampling.temperature > 0:
            seed = sampling.seed if sampling.seed is not None else self._seed_rng.getrandbits(63)
            generator = torch.Generator(device=self.device).manual_seed(seed)
        stop_ids = frozenset(self.stop_token_ids).union(sampling.stop_token_ids or ())
        return _Row(request=request, stop_ids=stop_ids, generator=generator)

    def _decode_batch(self, requests: list[_Request], loop: asyncio.AbstractEventLoop) -> None:
        """Decode ``requests`` as one left-padded batch (runs in the worker thread).

        Each request is resolved on ``loop`` as soon as its row finishes, so a short answer
        does not wait for the longest one of its batch.
        """
        rows = [self._new_row(r) for r in requests]
        lengths = [len(r.prompt_ids) for r in requests]
        width = max(lengths)
        input_ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, request in enumerate(requests):
            input_ids[i, width - lengths[i] :] = torch.tensor(request.prompt_ids)
            attention_mask[i, width - lengths[i] :] = 1
        input_ids = input_ids.to(self.device)
        attention_mask = attention_mask.to(self.device)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        next_positions = torch.tensor(lengths, device=self.device).unsqueeze(1)
        cache = DynamicCache(config=self.model.config)

        active = rows  # the rows still generating, in batch order
        with torch.inference_mode():
            logits = self._next_token_logits(input_ids, attention_mask, position_ids, cache)
            while True:
                tokens, logprobs = self._sample(logits, active)
                self._decoded_tokens += len(active)
                keep = []
                for i, (row, token_id, logprob) in enumerate(
                    zip(active, tokens.tolist(), logprobs.tolist())
                ):
                    row.append(token_id, logprob)
                    if row.finish_reason:
                        loop.call_soon_threadsafe(self._deliver, row.request, self._output(row))
                    elif not row.request.cancelled:
                        keep.append(i)
                if not keep:
                    return
                if len(keep) < len(active):
                    index = torch.tensor(keep, device=self.device)
                    cache.reorder_cache(index)  # index_select on the batch dim of every layer
                    attention_mask = attention_mask[index]
                    next_positions = next_positions[index]
                    tokens = tokens[index]
                    active = [active[i] for i in keep]
                attention_mask = torch.cat(
                    [attention_mask, attention_mask.new_ones(len(active), 1)], dim=1
                )
                logits = self._next_token_logits(
                    tokens.unsqueeze(1), attention_mask, next_positions, cache
                )
                next_positions = next_positions + 1

    def _output(self, row: _Row) -> GenOutput:
        return GenOutput(
            token_ids=row.token_ids,
            logprobs=row.logprobs,
            text=self.tokenizer.decode(row.token_ids, skip_special_tokens=False),
            finish_reason=row.finish_reason,
        )

    def _next_token_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DynamicCache,
    ) -> torch.Tensor:
        """Run the model on ``input_ids``, extending ``cache``; float32 last-position logits."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            **self._forward_kwargs,
        )
        return out.logits[:, -1, :].float()

    def _sample(self, logits: torch.Tensor, rows: list[_Row]) -> tuple[torch.Tensor, torch.Tensor]:
        """Pick one token per row; return the tokens and their logprobs (before filtering)."""
        temperatures = [row.request.sampling.temperature or 1.0 for row in rows]
        scaled = logits
        if any(t != 1.0 for t in temperatures):  # skip a pass over the logits when possible
            scaled = logits / torch.tensor(temperatures, device=logits.device).unsqueeze(1)
        tokens = scaled.argmax(-1)  # the greedy rows' choice; sampled rows are overwritten below
        for i, row in enumerate(rows):
            if row.generator is not None:
                sampling = row.request.sampling
                probs = _filter_logits(scaled[i], sampling.top_k, sampling.top_p).softmax(-1)
                tokens[i] = torch.multinomial(probs, 1, generator=row.generator)[0]
        # log_softmax at the chosen tokens, without materialising the [rows, vocab] result
        logprobs = scaled.gather(1, tokens.unsqueeze(1)).squeeze(1) - scaled.logsumexp(-1)
        return tokens, logprobs
