"""In-process Hugging Face transformers generation: continuous batching over a KV cache kept across turns.

Many episodes call :meth:`HFBackend.generate` concurrently. One engine thread serves them all:

    loop:
        take new requests; admit them while slots and the KV budget allow (else they wait)
            a request that continues a slot's tokens (the next turn of a conversation) takes that
            slot and prefills only the new tokens; any other gets a free slot, copying the longest
            prefix another slot already computed (GRPO siblings share their prompt)
        prefill one chunk of the admitted requests   (at most prefill_chunk_tokens while others decode)
        decode one token for every running request   (one forward pass, the running rows are slots 0..R-1)
        a finished or cancelled request leaves at once; its slot stays cached (idle) for its next turn
        until the KV budget needs the room: then the least recently used idle slot is dropped
    abort_all() answers every queued or admitted request with what it has generated so far
        (finish_reason "abort"), and so does a change of the weights: no request continues with
        weights other than those it started with, and no cached conversation outlives them

So an episode waiting for a tool or feedback holds no place in the decode batch, a new turn does not
wait for the slowest row, and a turn re-reads the conversation's keys/values instead of recomputing
them. The cache layout is :mod:`verl_agentic.backends.kv_slots`; sampling is
:mod:`verl_agentic.backends.sampling`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from verl_agentic.backends.attention import use_grouped_attention
from verl_agentic.backends.base import GenerationBackend, stop_ids_from_configs
from verl_agentic.backends.fused_forward import FusedForward, fused_forward_supported
from verl_agentic.backends.kv_slots import SlotKVCache
from verl_agentic.backends.packed_linear import (PackedLinears, check_weight_dtype, packed_linear_supported,
                                                   weight_dtype_of)
from verl_agentic.backends.sampling import filter_logits, sample_rows
from verl_agentic.interfaces import GenOutput, SamplingParams, check_keys

__all__ = ["HFBackend", "filter_logits", "hf_options"]

# The engine settings a config may set (``rollout.hf``), as HFBackend keyword arguments.
OPTION_KEYS = ("kv_cache_gb", "prefill_chunk_tokens", "num_threads", "packed_linear", "weight_dtype", "fused_forward",
               "device")


def hf_options(section: Any) -> dict[str, Any]:
    """The ``rollout.hf`` config section as keyword arguments of :class:`HFBackend` (None: none).

    Raises:
        ConfigError: a key that is not one of ``OPTION_KEYS``.
    """
    if section is None:
        return {}
    options = dict(OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else section)
    check_keys(options, OPTION_KEYS, "rollout.hf")
    return options

# A prefix shorter than this is recomputed rather than copied from another slot.
MIN_SHARED_PREFIX = 16
# seconds without work after which the engine thread ends (a new request starts another)
IDLE_EXIT_S = 1.0


@dataclass
class _Request:
    """A queued ``generate`` call."""

    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future[GenOutput]
    loop: asyncio.AbstractEventLoop
    # Set on the event loop when the caller stops waiting; the engine then drops the row.
    cancelled: bool = False


@dataclass
class _Row:
    """The decode state of one admitted request."""

    request: _Request
    stop_ids: frozenset[int]
    generator: torch.Generator | None  # None for greedy rows
    slot: int = -1
    pending: list[int] = field(default_factory=list)  # prompt tokens not yet in the slot
    started: bool = False  # a chunk of its prompt has been prefilled
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = ""  # "stop" or "length" once finished

    @property
    def done(self) -> bool:
        return bool(self.finish_reason) or self.request.cancelled

    def append(self, token_id: int, logprob: float) -> None:
        """Record a generated token and mark the row finished on a stop id or at its budget."""
        self.token_ids.append(token_id)
        self.logprobs.append(logprob)
        if token_id in self.stop_ids:
            self.finish_reason = "stop"
        elif len(self.token_ids) >= self.request.sampling.max_new_tokens:
            self.finish_reason = "length"


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id lists (binary search over C-level slice compares)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo] and a[:hi + 1] != b[:hi + 1]
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class HFBackend(GenerationBackend):
    """Generates with an in-process ``transformers`` causal LM: continuous batching, KV kept across turns.

    Each request keeps its own :class:`SamplingParams` inside a batch: temperature 0 is greedy,
    otherwise the logits are divided by the temperature, filtered by top-k and top-p and sampled
    (Gumbel-max) with the row's own ``torch.Generator``. That generator is seeded with the request's
    ``seed`` when it has one (so its tokens do not depend on what it is batched with), else with a
    number drawn from the backend's generator seeded by ``seed`` (so a run is reproducible given the
    same order of requests).

    The logprob returned for each token is ``log_softmax(logits / temperature)`` at that token (raw
    logits when greedy), computed *before* top-k / top-p filtering: it is the quantity a trainer
    recomputes from the same model at the same temperature.

    A row finishes on one of its stop ids (the backend's :attr:`stop_token_ids` plus the request's
    ``stop_token_ids``), which is kept in its output, or at its own ``max_new_tokens``. It is answered
    at once and leaves the decode batch; a cancelled caller's row leaves it too and its cache is freed.

    KV reuse is automatic: a request whose prompt starts with the tokens a cached slot holds (the
    previous turn's prompt and answer) prefills only the rest. Results equal a full re-prefill within
    float tolerance (the same attention over the same keys, computed in another order).

    Args:
        model: a causal LM (``PreTrainedModel``); moved to ``device`` and set to eval mode.
        tokenizer: its tokenizer (used for the pad id and to decode ``GenOutput.text``).
        max_batch_size: the most requests being prefilled or decoded at once; more wait their turn.
        batch_wait_ms: how long an idle engine waits after a first request for others to join its
            first prefill (requests issued in the same event-loop tick always join).
        seed: seeds the generator of requests that carry no seed of their own.
        device: where the model runs.
        grouped_attention: switch an ``sdpa`` model with grouped KV heads to the copy-free grouped
            attention of :mod:`verl_agentic.backends.attention` (same results, faster decode steps).
            This changes the model object, which the backend shares with its caller.
        kv_cache_gb: the KV cache budget (all slots, cached idle conversations included). A request
            that does not fit waits for running ones to finish; one that could never fit is refused.
        prefill_chunk_tokens: the most (padded) prompt tokens prefilled between two decode steps
            while other requests are decoding, so they keep moving.
        num_threads: torch's intra-op threads (process-wide); None leaves torch's setting. Lower it
            when the rollout shares the cores with a trainer or a reward pool.
        packed_linear: on CPU in fp32, run the linear layers through oneDNN with weights packed once
            (:mod:`verl_agentic.backends.packed_linear`; repacked when the weights change). It costs
            a second copy of the linear weights; turned off where the ops are missing or disagree.
        weight_dtype: ``float32`` (default, exact), or ``bfloat16`` / ``int8``: generate with a copy of
            the linear weights in fewer bytes (the model keeps its fp32 weights; its logprobs are then
            the low-precision model's, see :mod:`verl_agentic.backends.packed_linear`). CPU and fp32
            models only; refused (``ConfigError``) on a CPU without the instructions its fast kernel
            needs.
        weight_dtype_setting: the config key that set ``weight_dtype``, for error messages.
        fused_forward: for Llama-family models whose linears run from copies (packed or low precision),
            run the forward without transformers' layers (:mod:`verl_agentic.backends.fused_forward`:
            q/k/v and gate/up fused; at start its logits are compared bitwise with transformers' on one prefill
            and one decode step, and it is off where they differ; other shapes: tokens exact, logprobs to 1e-4 in tests).
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
        kv_cache_gb: float = 4.0,
        prefill_chunk_tokens: int = 256,
        num_threads: int | None = None,
        packed_linear: bool = True,
        weight_dtype: str | torch.dtype = "float32",
        weight_dtype_setting: str = "rollout.hf.weight_dtype",
        fused_forward: bool = True,
    ) -> None:
        if weight_dtype_of(weight_dtype, weight_dtype_setting) != torch.float32:
            param = next(model.parameters())
            if torch.device(device).type != "cpu" or param.dtype != torch.float32:
                raise ValueError(f"weight_dtype={weight_dtype} is for a float32 model on CPU (this one is "
                                 f"{param.dtype}, to run on {device}); elsewhere load the model in the dtype "
                                 "to generate in")
        self.weight_dtype = check_weight_dtype(weight_dtype, setting=weight_dtype_setting)  # the CPU, before any work
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if prefill_chunk_tokens < 1:
            raise ValueError(f"prefill_chunk_tokens must be >= 1, got {prefill_chunk_tokens}")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1 or None, got {num_threads}")
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        # sdpa + grouped KV heads: attend without copying the KV cache (see backends/attention.py)
        self.grouped_attention = grouped_attention and use_grouped_attention(self.model)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.num_threads = num_threads
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
        dtype = next(self.model.parameters()).dtype
        self._cache = SlotKVCache.for_model(self.model, dtype, self.device)
        onednn = packed_linear and packed_linear_supported(self.model)
        # copies of the linear weights: packed for oneDNN, and/or in a lower precision
        self._packed = (PackedLinears(self.model, min(max_batch_size, 32), self.weight_dtype, onednn=onednn)
                        if onednn or self.weight_dtype != torch.float32 else None)
        # where the linears run from copies anyway, the fused forward replaces them when it is exact here
        self._fused: FusedForward | None = None
        if fused_forward and self._packed is not None and fused_forward_supported(self.model):
            fused = FusedForward(self.model, self.weight_dtype, min(max_batch_size, 32), onednn)
            if fused.matches(self._transformers_forward, self._cache):
                self._fused, self._packed = fused, None
        self.kv_budget_tokens = int(kv_cache_gb * 2**30) // self._cache.bytes_per_token

        # event loops -> engine thread
        self._inbox: collections.deque[_Request] = collections.deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self._closed = False
        self._calls: collections.deque[tuple[Callable[[], Any], _Request]] = collections.deque()
        self._clear_requested = False
        # engine thread only
        self._weights_version = -1
        self._waiting: collections.deque[_Request] = collections.deque()
        self._owner: list[_Row | None] = []  # per slot: the row using it (None: idle or free)
        self._stamp: list[int] = []  # per slot: when it was last used (for LRU eviction)
        self._tick = 0
        self._running = 0  # the running rows are slots 0 .. _running - 1
        self._prefilling: list[_Row] = []  # admitted, prompt not fully in the cache, admission order
        self._prefill_rows_cap = max_batch_size  # halved after a failed prefill, regrown after a success

        self._counters: collections.Counter[str] = collections.Counter()
        self._busy_s = 0.0
        self._decode_s = 0.0

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
        """Continue ``prompt_ids``; see the class docstring for sampling, stopping and caching.

        Raises:
            ValueError: an empty prompt, a token id outside the model's vocabulary, invalid sampling
                parameters, or a prompt + ``max_new_tokens`` larger than the KV budget (raised before
                the request is queued).
            RuntimeError: the backend is closed.
            Exception: whatever the model raised while decoding this request.
        """
        if self._closed:
            raise RuntimeError("HFBackend is closed")
        self._validate(prompt_ids, sampling)
        if sampling.max_new_tokens <= 0:
            return GenOutput(token_ids=[], logprobs=[], text="", finish_reason="length")
        loop = asyncio.get_running_loop()
        request = _Request(list(prompt_ids), sampling, loop.create_future(), loop)
        self._inbox.append(request)
        self._ensure_thread()  # after queueing: see _engine's idle exit
        self._wake.set()
        try:
            return await request.future
        except asyncio.CancelledError:
            request.cancelled = True
            self._wake.set()
            raise

    async def call_between_steps(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` on the engine thread between two forward passes and return its result, e.g. to
        load new weights while requests are in flight. The cached conversations are dropped after it."""
        loop = asyncio.get_running_loop()
        call = _Request([], SamplingParams(), loop.create_future(), loop)
        self._calls.append((fn, call))
        self._ensure_thread()
        self._wake.set()
        return await call.future

    async def abort_all(self) -> int:
        """Answer every queued or running request at once with the tokens and logprobs it has so far and
        ``finish_reason="abort"`` (a caller resumes it by sending ``prompt_ids + token_ids``), between
        two forward passes; returns how many were answered. The cached conversations are dropped."""
        return await self.call_between_steps(self._abort_requests)

    def clear_cache(self) -> None:
        """Drop every cached conversation before the next step (thread-safe). Not needed after in-place
        weight updates through torch (an optimizer step, ``load_state_dict``): the engine sees those in
        the parameters' version counters."""
        self._clear_requested = True
        self._wake.set()

    async def close(self) -> None:
        """Stop the engine; requests still queued or decoding fail with ``RuntimeError``."""
        if self._closed:
            return
        self._closed = True
        self._ensure_thread()  # a closed engine's thread fails what is queued and frees the cache
        self._wake.set()
        thread = self._thread
        if thread is not None:
            await asyncio.to_thread(thread.join)  # at most one forward pass

    def stats(self) -> dict[str, float]:
        """Counters: requests decoded (``max_new_tokens > 0``), ``batches`` (prefill forward passes),
        ``decode_steps`` and the ``mean_batch_size`` (rows per decode step), tokens returned to callers,
        tokens decoded so far (live, for progress output), ``prefill_tokens`` computed and
        ``cached_tokens`` reused instead, ``evictions`` of idle cached conversations, prefill passes that
        raised (``failed_prefills``: retried with fewer rows), requests answered early by an abort or a
        weight change (``aborted``), the KV cache size
        and seconds spent in engine work (``busy_s``) and in decode steps (``decode_s``)."""
        c = self._counters
        return {
            "requests": c["requests"],
            "batches": c["prefills"],
            "decode_steps": c["decode_steps"],
            "mean_batch_size": c["decode_rows"] / c["decode_steps"] if c["decode_steps"] else 0.0,
            "generated_tokens": c["generated_tokens"],
            "decoded_tokens": c["decoded_tokens"],
            "prefill_tokens": c["prefill_tokens"],
            "cached_tokens": c["cached_tokens"],
            "evictions": c["evictions"],
            "failed_prefills": c["failed_prefills"],
            "aborted": c["aborted"],
            "kv_cache_mb": round(self._cache.nbytes / 2**20, 1),
            "busy_s": self._busy_s,
            "decode_s": self._decode_s,
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
        need = SlotKVCache.round_columns(len(prompt_ids) + max(sampling.max_new_tokens, 0)) + 1
        if need > self.kv_budget_tokens:
            raise ValueError(
                f"HFBackend.generate: a prompt of {len(prompt_ids)} tokens + max_new_tokens "
                f"{sampling.max_new_tokens} needs {need} tokens of KV cache, more than the budget of "
                f"{self.kv_budget_tokens} tokens ({self._cache.bytes_per_token} bytes each); raise kv_cache_gb"
            )

    def _ensure_thread(self) -> None:
        with self._thread_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._engine, name="hf-backend", daemon=True)
                self._thread.start()

    def _deliver(self, request: _Request, output: GenOutput) -> None:
        """Resolve a finished request (called on its event loop)."""
        self._counters["generated_tokens"] += len(output.token_ids)
        if not request.future.done():
            request.future.set_result(output)

    @staticmethod
    def _set_result(request: _Request, value: Any) -> None:
        if not request.future.done():
            request.future.set_result(value)

    @staticmethod
    def _set_exception(request: _Request, exc: BaseException) -> None:
        if not request.future.done():
            request.future.set_exception(exc)

    # ------------------------------------------------------------------ engine thread

    def _post(self, request: _Request, callback: Any, *args: Any) -> None:
        try:
            request.loop.call_soon_threadsafe(callback, request, *args)
        except RuntimeError:  # the caller's event loop is closed: nobody is waiting any more
            pass

    def _fail(self, request: _Request, exc: BaseException) -> None:
        self._post(request, self._set_exception, exc)

    def _engine(self) -> None:
        """The engine thread: admit, prefill a chunk, decode a step, until closed."""
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
        while not self._closed:
            self._wake.clear()
            idle = not self._running and not self._prefilling and not self._waiting
            self._take_inbox()
            self._run_calls()
            if not self._waiting and not self._running and not self._prefilling:
                if not self._wake.wait(timeout=IDLE_EXIT_S) and self._exit_if_idle():
                    return
                continue
            if idle and self.batch_wait_s > 0:  # a first request: let its siblings arrive
                time.sleep(self.batch_wait_s)
                self._take_inbox()
            start = time.perf_counter()
            try:
                # only with work to do: an idle engine must not read weights a trainer is writing
                self._check_weights()
                with torch.inference_mode():
                    self._drop_cancelled()
                    self._admit()
                    if self._prefilling:
                        self._prefill_step()
                    if self._running:
                        t0 = time.perf_counter()
                        self._decode_step()
                        self._decode_s += time.perf_counter() - t0
            except Exception as exc:  # a bug, not a model failure: fail what is in flight, go on
                self._reset(exc)
            self._busy_s += time.perf_counter() - start
        self._run_calls()
        self._reset(RuntimeError("HFBackend was closed"))
        # a closed backend holds no cache or packed weights, even while something still references it
        self._cache = SlotKVCache.for_model(self.model, self._cache.dtype, self.device)
        self._owner, self._stamp, self._packed, self._fused = [], [], None, None

    def _exit_if_idle(self) -> bool:
        """Let the idle engine thread end (the next request starts a new one): a running thread keeps
        its backend alive, so a backend nobody closed would otherwise hold its model and cache forever.
        Under the lock: a request queued before this check keeps the thread; one queued after it
        finds no thread and starts one."""
        with self._thread_lock:
            if self._inbox or self._calls or self._closed:
                return False
            self._thread = None
            return True

    def _run_calls(self) -> None:
        while self._calls:
            fn, request = self._calls.popleft()
            try:
                result = fn()
            except Exception as exc:  # raised to the caller of call_between_steps; the engine goes on
                self._fail(request, exc)
            else:
                self._post(request, self._set_result, result)
            self._clear_requested = True

    def _abort_requests(self) -> int:
        """Answer the queued and the admitted requests with ``finish_reason="abort"`` (engine thread)."""
        self._take_inbox()
        aborted = 0
        for request in self._waiting:
            if not request.cancelled:
                self._post(request, self._deliver, GenOutput(token_ids=[], logprobs=[], text="", finish_reason="abort"))
                aborted += 1
        self._waiting.clear()
        self._counters["aborted"] += aborted
        return aborted + self._abort_admitted()

    def _abort_admitted(self) -> int:
        """Answer the admitted requests (prefilling or decoding) with what they have, ``finish_reason="abort"``."""
        aborted = 0
        for row in [*self._prefilling, *(self._owner[s] for s in range(self._running))]:
            if not row.request.cancelled:
                row.finish_reason = "abort"
                self._finish(row)
                aborted += 1
        for row in self._prefilling:
            self._free(row.slot)
        self._prefilling.clear()
        self._leave(list(range(self._running)), keep_cache=False)
        self._counters["aborted"] += aborted
        return aborted

    def _check_weights(self) -> None:
        """Drop the cached conversations (their keys/values are stale) and repack the linear weights when
        the weights changed; a request in flight across the change is answered with what it has
        (``finish_reason="abort"``) instead of continuing with keys and values of the old weights."""
        version = sum(p._version for p in self.model.parameters())
        if self._clear_requested or version != self._weights_version:
            if version != self._weights_version and self._weights_version != -1:
                self._abort_admitted()
            for slot in self._idle_slots():
                self._free(slot)
            if self._packed is not None:
                self._packed.pack()
            if self._fused is not None:
                self._fused.pack()
            self._weights_version = version
            self._clear_requested = False

    def _reset(self, exc: BaseException) -> None:
        """Fail every queued and admitted request with ``exc`` and empty the cache."""
        self._take_inbox()
        admitted = [row.request for row in self._owner if row is not None]
        for request in [*self._waiting, *admitted]:
            self._fail(request, exc)
        self._waiting.clear()
        self._prefilling.clear()
        self._running = 0
        for slot in range(self._cache.num_slots):
            self._free(slot)

    def _take_inbox(self) -> None:
        while self._inbox:
            self._waiting.append(self._inbox.popleft())

    def _new_row(self, request: _Request) -> _Row:
        sampling = request.sampling
        generator = None
        if sampling.temperature > 0:
            seed = sampling.seed if sampling.seed is not None else self._seed_rng.getrandbits(63)
            generator = torch.Generator(device=self.device).manual_seed(seed)
        stop_ids = frozenset(self.stop_token_ids).union(sampling.stop_token_ids or ())
        return _Row(request=request, stop_ids=stop_ids, generator=generator)

    # -------------------------------------------------- slots

    def _touch(self, slot: int) -> None:
        self._tick += 1
        self._stamp[slot] = self._tick

    def _swap(self, a: int, b: int) -> None:
        if a == b:
            return
        self._cache.swap(a, b)
        self._owner[a], self._owner[b] = self._owner[b], self._owner[a]
        self._stamp[a], self._stamp[b] = self._stamp[b], self._stamp[a]
        for s in (a, b):
            if self._owner[s] is not None:
                self._owner[s].slot = s

    def _idle_slots(self) -> list[int]:
        """Slots holding a cached conversation that no request is using."""
        return [s for s in range(self._cache.num_slots) if self._owner[s] is None and self._cache.tokens[s]]

    def _used_slots(self) -> list[int]:
        """Slots a request uses or a cached conversation occupies (the rest are free)."""
        return [s for s in range(self._cache.num_slots) if self._owner[s] is not None or self._cache.tokens[s]]

    def _free_slots(self) -> list[int]:
        used = set(self._used_slots())
        return [s for s in range(self._cache.num_slots) if s not in used]

    def _free(self, slot: int) -> None:
        self._owner[slot] = None
        self._cache.tokens[slot] = []

    def _columns_needed(self, extra: int = 0) -> int:
        rows = [self._owner[s] for s in range(self._cache.num_slots) if self._owner[s] is not None]
        worst = [len(r.request.prompt_ids) + r.request.sampling.max_new_tokens for r in rows]
        return max([extra, *worst, *(len(t) for t in self._cache.tokens)])

    def _reallocate(self, slots: int, columns: int) -> None:
        """Resize the cache, keeping the used slots (the running ones stay at 0 .. R-1)."""
        keep = self._used_slots()
        owners = [self._owner[s] for s in keep]
        stamps = [self._stamp[s] for s in keep]
        self._cache.reserve(slots, columns, keep)
        self._owner = owners + [None] * (slots - len(keep))
        self._stamp = stamps + [0] * (slots - len(keep))
        for s, row in enumerate(self._owner):
            if row is not None:
                row.slot = s

    def _claim_slot(self, columns: int, row: _Row) -> int | None:
        """A free slot of at least ``columns`` columns for ``row`` (growing the cache or evicting idle
        slots within the budget), or None when it cannot be had now."""
        budget = self.kv_budget_tokens
        capacity = max(self._cache.capacity, SlotKVCache.round_columns(self._columns_needed(columns)))
        used = len(self._used_slots())
        idle = sorted(self._idle_slots(), key=lambda s: self._stamp[s])  # least recently used first
        # evict idle slots until one more slot of `capacity` columns fits
        while (used + 1) * (capacity + 1) > budget and idle:
            self._free(idle.pop(0))
            self._counters["evictions"] += 1
            used -= 1
        if (used + 1) * (capacity + 1) > budget:
            return None
        free = self._free_slots()
        if capacity > self._cache.capacity or not free:
            # memory is committed as it is allocated: grow on demand (doubling the slots, so reallocation
            # costs O(final size)), never past the budget
            if capacity == self._cache.capacity:
                grown = min(max(2 * self._cache.num_slots, 4), budget // (capacity + 1))
            else:  # the columns grow: keep the slots there are (compacted), plus one
                grown = min(max(used + 1, self._cache.num_slots), budget // (capacity + 1))
            self._reallocate(grown, capacity)
            free = self._free_slots()
        slot = free[0]
        self._owner[slot] = row
        row.slot = slot
        return slot

    # -------------------------------------------------- admission

    def _drop_cancelled(self) -> None:
        self._waiting = collections.deque(r for r in self._waiting if not r.cancelled)
        for row in [r for r in self._prefilling if r.request.cancelled]:
            self._prefilling.remove(row)
            self._free(row.slot)
        cancelled = [s for s in range(self._running) if self._owner[s].request.cancelled]
        self._leave(cancelled, keep_cache=False)

    def _admit(self) -> None:
        while self._waiting and self._running + len(self._prefilling) < self.max_batch_size:
            request = self._waiting[0]
            row = self._new_row(request)
            if not self._place(row):
                return  # no room in the KV budget: it waits for running requests to finish
            self._waiting.popleft()
            self._counters["requests"] += 1
            self._prefilling.append(row)

    def _place(self, row: _Row) -> bool:
        """Give ``row`` a slot: its own conversation's if one is cached, else a fresh one seeded with the
        longest prefix any slot holds."""
        prompt = row.request.prompt_ids
        worst = len(prompt) + row.request.sampling.max_new_tokens
        tokens = self._cache.tokens
        continuing = [s for s in self._idle_slots() if len(tokens[s]) <= len(prompt)
                      and prompt[: len(tokens[s])] == tokens[s]]
        if continuing and SlotKVCache.round_columns(worst) <= self._cache.capacity:
            slot = max(continuing, key=lambda s: len(tokens[s]))
            self._owner[slot] = row
            row.slot = slot
        else:
            slot = self._claim_slot(worst, row)
            if slot is None:
                return False
        tokens = self._cache.tokens  # claiming may have reallocated the cache
        cached = min(len(tokens[slot]), len(prompt) - 1)  # the last prompt token is always computed
        del tokens[slot][cached:]
        row.pending = prompt[cached:]
        self._counters["cached_tokens"] += cached
        self._reuse_longest_prefix(row)
        self._touch(slot)
        return True

    def _reuse_longest_prefix(self, row: _Row) -> None:
        """Copy into ``row``'s slot the longest prefix of its prompt that another slot has computed, when
        that is at least ``MIN_SHARED_PREFIX`` tokens more than the slot holds."""
        tokens, prompt = self._cache.tokens, row.request.prompt_ids
        have = len(tokens[row.slot])
        best, best_len = -1, 0
        for s in range(self._cache.num_slots):
            if s != row.slot and len(tokens[s]) > have:
                n = _common_prefix(tokens[s], prompt)
                if n > best_len:
                    best, best_len = s, n
        best_len = min(best_len, len(prompt) - 1)
        if best_len >= have + MIN_SHARED_PREFIX:
            self._cache.copy_prefix(best, row.slot, best_len)
            row.pending = prompt[best_len:]
            self._counters["cached_tokens"] += best_len - have

    # -------------------------------------------------- forward passes

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor, rows: slice | list[int],
                 write: torch.Tensor, key_len: int) -> torch.Tensor:
        """One forward pass over slots ``rows``; float32 logits of each row's last query position."""
        mask = torch.arange(key_len, device=self.device).view(1, 1, 1, key_len) <= positions.unsqueeze(1).unsqueeze(-1)
        self._cache.plan(rows, write, key_len)
        forward = self._fused if self._fused is not None else self._transformers_forward
        return forward(input_ids, positions, mask, self._cache)

    def _transformers_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                              cache: SlotKVCache) -> torch.Tensor:
        """The model's own forward (linears from the packed copies, if any) over a planned cache."""
        with self._packed.active() if self._packed is not None else contextlib.nullcontext():
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                             past_key_values=cache, use_cache=True, **self._forward_kwargs)
        return out.logits[:, -1, :].float()

    def _prefill_step(self) -> None:
        """Prefill one chunk of the admitted rows (left-padded so each row's last token is last)."""
        budget = self.prefill_chunk_tokens if self._running else max(self.prefill_chunk_tokens, 4096)
        chosen: list[tuple[_Row, int]] = []
        width = 0
        for row in self._prefilling:
            if not row.started:
                self._reuse_longest_prefix(row)  # a sibling may have computed more of it since admission
                have = len(self._cache.tokens[row.slot])
                prompt = row.request.prompt_ids
                if any(_common_prefix(prompt, other.request.prompt_ids) >= have + MIN_SHARED_PREFIX
                       for other, _ in chosen):
                    continue  # a row of this chunk computes the shared prefix: copy it next step
            chunk = min(len(row.pending), budget)
            if chosen and ((len(chosen) + 1) * max(width, chunk) > budget or len(chosen) >= self._prefill_rows_cap):
                break
            chosen.append((row, chunk))
            width = max(width, chunk)
        capacity = self._cache.capacity
        input_ids = torch.full((len(chosen), width), self._pad_id, dtype=torch.long)
        positions = torch.zeros((len(chosen), width), dtype=torch.long)
        write = torch.full((len(chosen), width), capacity, dtype=torch.long)
        key_len = 0
        for i, (row, chunk) in enumerate(chosen):
            start = len(self._cache.tokens[row.slot])
            input_ids[i, width - chunk:] = torch.tensor(row.pending[:chunk])
            positions[i, width - chunk:] = torch.arange(start, start + chunk)
            write[i, width - chunk:] = positions[i, width - chunk:]
            key_len = max(key_len, start + chunk)
        try:
            logits = self._forward(input_ids.to(self.device), positions.to(self.device),
                                   [row.slot for row, _ in chosen], write.to(self.device), key_len)
        except Exception as exc:  # e.g. out of memory: retry fewer rows; a single row fails alone
            if len(chosen) > 1:
                self._prefill_rows_cap = max(1, len(chosen) // 2)
            else:
                row = chosen[0][0]
                self._prefilling.remove(row)
                self._free(row.slot)
                self._fail(row.request, exc)
            self._counters["failed_prefills"] += 1
            return
        self._prefill_rows_cap = min(self.max_batch_size, self._prefill_rows_cap * 2)
        self._counters["prefills"] += 1
        done = []
        for i, (row, chunk) in enumerate(chosen):
            row.started = True
            self._cache.tokens[row.slot].extend(row.pending[:chunk])
            del row.pending[:chunk]
            self._counters["prefill_tokens"] += chunk
            if not row.pending:
                done.append(i)
        if not done:
            return
        rows = [chosen[i][0] for i in done]
        self._sample_into(logits[done], rows)
        for row in rows:
            self._prefilling.remove(row)
            if row.done:
                self._finish(row)
                self._owner[row.slot] = None
                self._touch(row.slot)
                if row.request.cancelled:
                    self._free(row.slot)
            else:
                self._swap(row.slot, self._running)  # join the decode batch
                self._running += 1

    def _decode_step(self) -> None:
        """One token for every running row (slots 0 .. R-1: the cache hands attention a view)."""
        running = self._running
        rows = [self._owner[s] for s in range(running)]
        positions = torch.tensor([len(self._cache.tokens[s]) for s in range(running)], dtype=torch.long)
        last = torch.tensor([row.token_ids[-1] for row in rows], dtype=torch.long)
        try:
            logits = self._forward(last.view(-1, 1).to(self.device), positions.view(-1, 1).to(self.device),
                                   slice(0, running), positions.view(-1, 1).to(self.device),
                                   int(positions.max()) + 1)
        except Exception as exc:  # the rows of a failed step fail; the engine goes on
            for row in rows:
                self._fail(row.request, exc)
            self._leave(list(range(running)), keep_cache=False)
            return
        for s, row in enumerate(rows):
            self._cache.tokens[s].append(row.token_ids[-1])
        self._counters["decode_steps"] += 1
        self._counters["decode_rows"] += running
        self._sample_into(logits, rows)
        for row in rows:
            self._finish(row)
        self._leave([s for s, row in enumerate(rows) if row.request.cancelled], keep_cache=False)
        self._leave([s for s in range(self._running) if self._owner[s].finish_reason], keep_cache=True)

    def _sample_into(self, logits: torch.Tensor, rows: list[_Row]) -> None:
        tokens, logprobs = sample_rows(
            logits,
            [row.request.sampling.temperature for row in rows],
            [(row.request.sampling.top_k, row.request.sampling.top_p) for row in rows],
            [row.generator for row in rows],
        )
        self._counters["decoded_tokens"] += len(rows)
        for row, token_id, logprob in zip(rows, tokens.tolist(), logprobs.tolist()):
            if not row.request.cancelled:
                row.append(token_id, logprob)

    def _finish(self, row: _Row) -> None:
        """Answer a finished row's caller (a no-op for rows still decoding or cancelled)."""
        if row.finish_reason and not row.request.cancelled:
            output = GenOutput(
                token_ids=row.token_ids,
                logprobs=row.logprobs,
                text=self.tokenizer.decode(row.token_ids, skip_special_tokens=False),
                finish_reason=row.finish_reason,
            )
            self._post(row.request, self._deliver, output)

    def _leave(self, slots: list[int], keep_cache: bool) -> None:
        """Take running ``slots`` out of the decode batch (highest first, so the swaps stay valid)."""
        for s in sorted(slots, reverse=True):
            self._swap(s, self._running - 1)
            self._running -= 1
            slot = self._running
            if keep_cache:
                self._owner[slot] = None
                self._touch(slot)
            else:
                self._free(slot)
