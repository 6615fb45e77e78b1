"""``openai``: generation through an OpenAI-compatible HTTP server (vLLM, SGLang).

Start a server, then roll out against it::

    python -m vllm.entrypoints.openai.api_server --model DIR --logprobs-mode processed_logprobs
    python -m verl_agentic.main_rollout rollout.backend=openai model.path=DIR \\
        rollout.openai.base_url=http://127.0.0.1:8000

``model.path`` (or ``rollout.openai.tokenizer``) is only read for the tokenizer, the chat
template and the stop ids: the rollout renders prompts and observation deltas itself.

- :meth:`OpenAIBackend.generate` is token-in/token-out over ``POST /v1/completions``: the prompt
  goes as token ids (``"prompt": [ids]``) and the answer's token ids come back as the server
  produced them (``"token_ids"``, or the ``"token_id:N"`` strings of
  ``"return_tokens_as_token_ids"``), with their logprobs; nothing is decoded and re-encoded.
  vLLM keeps the stop token in the ids (and its logprob), as ``GenOutput`` wants.
- :meth:`OpenAIBackend.chat` speaks ``POST /v1/chat/completions`` (messages, ``tools``) and
  returns the assistant message with parsed ``tool_calls``, plus token ids and logprobs when the
  server reports them. With ``api="chat"`` the server is taken to speak only chat and
  ``generate`` refuses (use a task with the chat loop).

Logprob convention: ours is ``log_softmax(logits / temperature)`` before top-k/top-p filtering
(see ``GenOutput``). vLLM reports, per ``--logprobs-mode``:

- ``raw_logprobs`` (its default): ``log_softmax(logits)``, the temperature ignored. Equal to ours
  only at temperature 1 or greedy.
- ``processed_logprobs``: after temperature *and* top-k/top-p, renormalised over the kept tokens.
  Equal to ours when top_p=1 and top_k is off (our defaults), and greedy.

So start vLLM with ``--logprobs-mode processed_logprobs`` for trainer-consistent logprobs
(tests/test_vllm.py checks them against ``log_softmax(logits / T)`` recomputed by transformers).

Transport: one ``aiohttp`` session with a connection pool of ``concurrency`` connections and at
most ``concurrency`` requests in flight. Connection errors, timeouts, 429 and 5xx answers are
retried ``max_retries`` times after ``retry_backoff_s`` doubling per retry (capped at 8 s, with
jitter). When they run out the call raises :class:`ServerUnavailableError`; a 4xx answer or a
malformed one raises :class:`ServerResponseError` at once. Both are ``EpisodeFailure``\\ s of type
``generation_error``, so the rollout records them on the episode and goes on with the others.
Once a request has given up, the server counts as down: later requests make a single attempt
(no retries, so the rest of a rollout fails fast) until one succeeds again.

The session lives on a private event loop in a helper thread (``serving.BackgroundLoop``), so the backend can be used from any
event loop, one after another (``main_rollout`` rolls out in one ``asyncio.run`` and closes the
backend in another), and JSON work stays off the rollout's loop. Cancelling a ``generate`` call
closes its HTTP request, which makes vLLM abort the generation.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional, TypeVar
from urllib.parse import urlparse

import aiohttp

from verl_agentic.backends.base import GenerationBackend, stop_ids_from_configs
from verl_agentic.interfaces import ChatOutput, ConfigError, EpisodeFailure, GenOutput, SamplingParams, check_keys
from verl_agentic.serving import BackgroundLoop

BACKOFF_CAP_S = 8.0
APIS = ("completions", "chat")
TOOL_CHOICES = ("auto", "required", "none")
_T = TypeVar("_T")


@dataclass(frozen=True)
class OpenAIConfig:
    """The ``rollout.openai`` section, checked when made (a bad value is a ``ConfigError`` naming the
    key). ``from_dict`` takes the section as a mapping and rejects unknown keys; ``api_key`` is
    the key itself (the section names the environment variable that holds it: ``api_key_env``)."""

    base_url: str = "http://127.0.0.1:8000"
    model: Optional[str] = None
    api: str = "completions"
    tokenizer: Optional[str] = None
    api_key_env: Optional[str] = None
    concurrency: int = 64
    request_timeout_s: Optional[float] = 600.0
    connect_timeout_s: float = 10.0
    max_retries: int = 5
    retry_backoff_s: float = 0.5
    tool_choice: str = "auto"

    def __post_init__(self) -> None:
        parsed = urlparse(str(self.base_url or ""))
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"rollout.openai.base_url must look like http://host:port, got {self.base_url!r}")
        if self.api not in APIS:
            raise ConfigError(f"rollout.openai.api must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.tool_choice not in TOOL_CHOICES:
            raise ConfigError(f"rollout.openai.tool_choice must be one of {', '.join(TOOL_CHOICES)}, "
                              f"got {self.tool_choice!r}")
        for key, low in (("concurrency", 1), ("max_retries", 0)):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"rollout.openai.{key} must be an integer >= {low}, got {value!r}")
        for key in ("request_timeout_s", "connect_timeout_s"):
            value = getattr(self, key)
            if value is not None and value <= 0:
                raise ConfigError(f"rollout.openai.{key} must be > 0, got {value}")
        if self.retry_backoff_s < 0:
            raise ConfigError(f"rollout.openai.retry_backoff_s must be >= 0, got {self.retry_backoff_s}")

    @classmethod
    def from_dict(cls, section: dict) -> "OpenAIConfig":
        check_keys(section, [f.name for f in fields(cls)], "rollout.openai")
        return cls(**section)

    def api_key(self) -> Optional[str]:
        """The key in ``api_key_env`` (None when no variable is named); a named one that is unset is a ConfigError."""
        if not self.api_key_env:
            return None
        if self.api_key_env not in os.environ:
            raise ConfigError(f"rollout.openai.api_key_env={self.api_key_env}, but that environment variable is not set")
        return os.environ[self.api_key_env]

    @property
    def root_url(self) -> str:
        """``base_url`` without a trailing ``/`` or ``/v1``."""
        url = str(self.base_url).rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url


class OpenAIServerError(EpisodeFailure):
    """The server gave no usable answer. A ``generation_error`` for the episode that asked."""

    def __init__(self, message: str):
        super().__init__("generation_error", message)


class ServerUnavailableError(OpenAIServerError):
    """The server could not be reached, timed out or answered 429/5xx on every attempt."""


class ServerResponseError(OpenAIServerError):
    """The server refused the request (4xx) or answered something this client cannot use."""


class _Retryable(Exception):
    """One attempt failed in a way another attempt may fix."""


def _token_ids_from_strings(tokens: list, where: str) -> list[int]:
    """Ids from vLLM's ``"token_id:N"`` strings (``return_tokens_as_token_ids``)."""
    ids = []
    for token in tokens:
        if not (isinstance(token, str) and token.startswith("token_id:") and token[9:].isdigit()):
            raise ServerResponseError(
                f"{where}: token {token!r} is not of the form 'token_id:N'; the server ignored "
                "return_tokens_as_token_ids (token-in/token-out needs vLLM or another server that has it)")
        ids.append(int(token[9:]))
    return ids


def _ids_and_logprobs(token_ids: Any, tokens: Optional[list], logprobs: Optional[list], where: str,
                      strict: bool = True) -> tuple[Optional[list[int]], Optional[list[float]]]:
    """The generated ids (``token_ids`` or the logprob entries' ``token_id:N``) and aligned logprobs.

    When the server sends both forms they must agree; logprobs must be one number per token.
    Not ``strict`` (chat, where ids are optional): logprob tokens that are text, not ids, are
    dropped, and with them the logprobs unless ``token_ids`` says which tokens they belong to.
    """
    if tokens is not None and not strict and not all(
            isinstance(t, str) and t.startswith("token_id:") and t[9:].isdigit() for t in tokens):
        tokens = None
        if token_ids is None:
            logprobs = None
    from_strings = _token_ids_from_strings(tokens, where) if tokens is not None else None
    if token_ids is not None:
        if not (isinstance(token_ids, list) and all(isinstance(t, int) for t in token_ids)):
            raise ServerResponseError(f"{where}: 'token_ids' is not a list of integers")
        if from_strings is not None and from_strings != token_ids:
            raise ServerResponseError(f"{where}: 'token_ids' and the logprob tokens disagree")
    ids = token_ids if token_ids is not None else from_strings
    if logprobs is not None:
        if ids is None or len(logprobs) != len(ids):
            raise ServerResponseError(f"{where}: {len(logprobs)} logprobs for "
                                      f"{'no' if ids is None else len(ids)} token ids")
        if not all(isinstance(x, (int, float)) for x in logprobs):
            raise ServerResponseError(f"{where}: a generated token has no logprob")
        logprobs = [float(x) for x in logprobs]
    return ids, logprobs


def _finish_reason(value: Any, allowed: tuple[str, ...], where: str) -> str:
    if value == "function_call":  # the pre-tools OpenAI name
        value = "tool_calls"
    if value == "abort":  # vLLM aborted the request (it is shutting down, or it dropped the request)
        raise ServerUnavailableError(f"{where}: the server aborted the request")
    if value not in allowed:
        raise ServerResponseError(f"{where}: unknown finish_reason {value!r} (expected one of {allowed})")
    return value


def _tool_calls(raw: Any, where: str) -> list[dict]:
    """OpenAI-form tool calls, with ``arguments`` as a JSON string."""
    if not isinstance(raw, list):
        raise ServerResponseError(f"{where}: 'tool_calls' is not a list")
    calls = []
    for i, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ServerResponseError(f"{where}: tool call {i} has no function name: {str(call)[:200]}")
        arguments = fn.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        calls.append({"id": str(call.get("id") or f"call_{i}"), "type": "function",
                      "function": {"name": fn["name"], "arguments": arguments}})
    return calls


def _error_message(raw: bytes) -> str:
    """The server's ``{"error": {"message"}}`` (OpenAI form) or ``{"error": str}``, else the body's start."""
    try:
        payload = json.loads(raw)
        error = payload.get("error") if isinstance(payload, dict) else None
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:500]
        if isinstance(error, str):
            return error[:500]
    except (ValueError, UnicodeDecodeError):
        pass
    return raw[:300].decode("utf-8", "replace") or "(empty body)"


def _stop_ids_from_folder(path: Path) -> list[int]:
    """EOS ids of the folder's generation config and config, read as the hf backend reads them
    from the model (a tokenizer-only folder has none)."""
    from transformers import AutoConfig, GenerationConfig

    generation_config = GenerationConfig.from_pretrained(path) if (path / "generation_config.json").is_file() else None
    config = AutoConfig.from_pretrained(path) if (path / "config.json").is_file() else None
    return stop_ids_from_configs(generation_config, config)


class OpenAIBackend(GenerationBackend):
    """Generates through an OpenAI-compatible server; see the module docstring.

    Args:
        base_url: ``http://host:port`` of the server, with or without ``/v1``.
        tokenizer: the tokenizer of the served model (the rollout renders templates with it).
        model: the served model's name; None: the first one ``GET /v1/models`` lists.
        api: ``completions`` (token ids in and out; ``chat`` works too) or ``chat`` (the server
            only speaks ``/v1/chat/completions``; ``generate`` refuses).
        stop_token_ids: ids that end a generation (sent as ``stop_token_ids`` with every
            completion); None: the tokenizer's EOS.
        concurrency: requests in flight, and connections kept in the pool.
        request_timeout_s: the limit of one attempt (None: no limit).
        connect_timeout_s: the limit for opening a connection.
        max_retries: further attempts after a connection error, timeout, 429 or 5xx.
        retry_backoff_s: the first retry's delay; doubles per retry, capped at 8 s, with jitter.
        tool_choice: sent with chat requests that have tools (``auto``, ``required``, ``none``).
        chat_template_kwargs: sent with chat requests (e.g. ``{"enable_thinking": False}``).
        api_key: sent as ``Authorization: Bearer``.
    """

    def __init__(
        self,
        base_url: str,
        tokenizer: Any,
        *,
        model: Optional[str] = None,
        api: str = "completions",
        stop_token_ids: Optional[list[int]] = None,
        concurrency: int = 64,
        request_timeout_s: Optional[float] = 600.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 5,
        retry_backoff_s: float = 0.5,
        tool_choice: str = "auto",
        chat_template_kwargs: Optional[dict] = None,
        api_key: Optional[str] = None,
    ) -> None:
        settings = OpenAIConfig(base_url=base_url, model=model, api=api, concurrency=concurrency,
                                request_timeout_s=request_timeout_s, connect_timeout_s=connect_timeout_s,
                                max_retries=max_retries, retry_backoff_s=retry_backoff_s, tool_choice=tool_choice)
        self.base_url = settings.root_url
        self.tokenizer = tokenizer
        self.model = model
        self.api = api
        if stop_token_ids is None:
            stop_token_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        self.stop_token_ids = list(stop_token_ids)
        self.concurrency = concurrency
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.tool_choice = tool_choice
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

        self._lock = threading.Lock()
        self._helper = BackgroundLoop("openai-backend")
        self._session: Optional[aiohttp.ClientSession] = None
        self._semaphore: Optional[asyncio.Semaphore] = None
        self._model_lock: Optional[asyncio.Lock] = None
        self._closed = False
        self._down = False  # the last request gave up: make single attempts until one succeeds
        self._counts: Counter = Counter()
        self._in_flight = 0
        self._busy_since = 0.0
        self._busy_s = 0.0

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], base_url: str, **kwargs: Any) -> OpenAIBackend:
        """The tokenizer and stop ids of a local model (or tokenizer) folder; ``kwargs`` as for the class.

        Raises:
            FileNotFoundError: ``path`` is not a folder.
        """
        from transformers import AutoTokenizer

        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"no tokenizer folder at {os.fspath(path)!r} (the served model's "
                                    "Hugging Face folder, for its tokenizer and chat template)")
        tokenizer = AutoTokenizer.from_pretrained(folder)
        kwargs.setdefault("stop_token_ids", _stop_ids_from_folder(folder) or None)  # None: the tokenizer's EOS
        return cls(base_url, tokenizer, **kwargs)

    @classmethod
    def from_config(cls, config: OpenAIConfig, tokenizer_path: str | os.PathLike[str], **kwargs: Any) -> OpenAIBackend:
        """The backend of a checked ``rollout.openai`` section; ``tokenizer_path`` is used when the
        section names no ``tokenizer``; ``kwargs`` (e.g. ``chat_template_kwargs``) as for the class."""
        return cls.from_pretrained(
            config.tokenizer or tokenizer_path, config.base_url, model=config.model, api=config.api,
            concurrency=config.concurrency, request_timeout_s=config.request_timeout_s,
            connect_timeout_s=config.connect_timeout_s, max_retries=config.max_retries,
            retry_backoff_s=config.retry_backoff_s, tool_choice=config.tool_choice, api_key=config.api_key(), **kwargs)

    # ------------------------------------------------------------------ public API

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenOutput:
        """Continue ``prompt_ids`` with ``POST /v1/completions`` (token ids in and out).

        Raises:
            ValueError: an empty prompt, or invalid sampling parameters.
            ServerUnavailableError, ServerResponseError: see the module docstring.
            RuntimeError: the backend is closed, or ``api="chat"``.
        """
        if self.api == "chat":
            raise RuntimeError("rollout.openai.api=chat: this server only speaks /v1/chat/completions, so the "
                               "token-in/token-out loop cannot use it; run a task with the chat loop, or "
                               "use api=completions")
        if not prompt_ids:
            raise ValueError("OpenAIBackend.generate: empty prompt")
        self._validate(sampling)
        if sampling.max_new_tokens <= 0:
            return GenOutput(token_ids=[], logprobs=[], text="", finish_reason="length")
        return await self._submit(self._generate(list(prompt_ids), sampling))

    async def chat(self, messages: list[dict], sampling: SamplingParams,
                   tools: Optional[list[dict]] = None) -> ChatOutput:
        """One assistant message from ``POST /v1/chat/completions``, with parsed ``tool_calls``."""
        self._validate(sampling)
        return await self._submit(self._chat(list(messages), sampling, tools))

    async def close(self) -> None:
        """Close the HTTP session and stop the helper thread; calls in flight fail. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._helper.started:
            await asyncio.to_thread(self._helper.close, self._close_session)

    def stats(self) -> dict[str, float]:
        """Counters: ``requests`` answered, ``generated_tokens``, ``prompt_tokens``, ``busy_s`` (seconds
        with at least one request in flight), HTTP ``attempts``, ``retries`` and ``failed_requests``
        (given up on)."""
        busy = self._busy_s + (time.perf_counter() - self._busy_since if self._in_flight else 0.0)
        return {"requests": self._counts["requests"], "generated_tokens": self._counts["generated_tokens"],
                "prompt_tokens": self._counts["prompt_tokens"], "busy_s": busy,
                "attempts": self._counts["attempts"], "retries": self._counts["retries"],
                "failed_requests": self._counts["failed_requests"]}

    # ------------------------------------------------------------------ request bodies and answers

    @staticmethod
    def _validate(sampling: SamplingParams) -> None:
        if sampling.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {sampling.temperature}")
        if not 0 < sampling.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {sampling.top_p}")

    def _sampling_body(self, sampling: SamplingParams) -> dict:
        """Every sampling field explicit: vLLM otherwise fills gaps from the model's generation_config."""
        body = {"max_tokens": sampling.max_new_tokens, "temperature": sampling.temperature,
                "top_p": sampling.top_p, "top_k": sampling.top_k if sampling.top_k > 0 else -1,
                "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                "n": 1, "stream": False, "return_tokens_as_token_ids": True, "return_token_ids": True}
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenOutput:
        stops = list(dict.fromkeys([*self.stop_token_ids, *(sampling.stop_token_ids or [])]))
        body = {"model": await self._model_name(), "prompt": prompt_ids, **self._sampling_body(sampling),
                "logprobs": 0, "stop_token_ids": stops, "add_special_tokens": False}
        data, where = await self._request("POST", "/v1/completions", body)
        choice = self._first_choice(data, where)
        lp = choice.get("logprobs") or {}
        if not isinstance(lp, dict):
            raise ServerResponseError(f"{where}: 'logprobs' is not an object")
        ids, logprobs = _ids_and_logprobs(choice.get("token_ids"), lp.get("tokens"), lp.get("token_logprobs"), where)
        if ids is None:
            raise ServerResponseError(f"{where}: the answer carries no token ids (neither 'token_ids' nor "
                                      "logprob tokens); token-in/token-out needs vLLM or a server like it")
        finish = _finish_reason(choice.get("finish_reason"), ("stop", "length"), where)
        self._count_answer(data, len(ids))
        return GenOutput(token_ids=ids, logprobs=logprobs,
                         text=self.tokenizer.decode(ids, skip_special_tokens=False), finish_reason=finish)

    async def _chat(self, messages: list[dict], sampling: SamplingParams,
                    tools: Optional[list[dict]]) -> ChatOutput:
        body = {"model": await self._model_name(), "messages": messages, **self._sampling_body(sampling),
                "logprobs": True}
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        if tools:
            body["tools"] = tools
            body["tool_choice"] = self.tool_choice
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        data, where = await self._request("POST", "/v1/chat/completions", body)
        choice = self._first_choice(data, where)
        raw = choice.get("message")
        if not isinstance(raw, dict):
            raise ServerResponseError(f"{where}: the choice has no 'message' object")
        message: dict = {"role": "assistant", "content": raw.get("content") or ""}
        if raw.get("tool_calls"):
            message["tool_calls"] = _tool_calls(raw["tool_calls"], where)
        finish = _finish_reason(choice.get("finish_reason"), ("stop", "length", "tool_calls"), where)
        content = (choice.get("logprobs") or {}).get("content")
        tokens = logprobs = None
        if isinstance(content, list):
            tokens = [entry.get("token") if isinstance(entry, dict) else None for entry in content]
            logprobs = [entry.get("logprob") if isinstance(entry, dict) else None for entry in content]
        ids, logprobs = _ids_and_logprobs(choice.get("token_ids"), tokens, logprobs, where, strict=False)
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        self._count_answer(data, len(ids or []))
        return ChatOutput(message=message, finish_reason=finish, token_ids=ids, logprobs=logprobs,
                          prompt_token_count=usage.get("prompt_tokens"))

    @staticmethod
    def _first_choice(data: dict, where: str) -> dict:
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ServerResponseError(f"{where}: the answer has no 'choices'")
        return choices[0]

    def _count_answer(self, data: dict, generated: int) -> None:
        self._counts["requests"] += 1
        self._counts["generated_tokens"] += generated
        usage = data.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            self._counts["prompt_tokens"] += usage["prompt_tokens"]

    async def _model_name(self) -> str:
        """``model``, or the first model the server lists (asked once)."""
        if self.model is None:
            self._setup()
            async with self._model_lock:
                if self.model is None:
                    data, where = await self._request("GET", "/v1/models", None)
                    models = data.get("data")
                    if not isinstance(models, list) or not models or not isinstance(models[0], dict) \
                            or not models[0].get("id"):
                        raise ServerResponseError(f"{where}: no model listed; set rollout.openai.model")
                    self.model = str(models[0]["id"])
        return self.model

    # ------------------------------------------------------------------ transport (helper-thread loop)

    async def _submit(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the helper thread's loop; cancelling the caller cancels it there."""
        try:
            loop = self._ensure_loop()
        except RuntimeError:
            coro.close()
            raise
        future: concurrent.futures.Future[_T] = asyncio.run_coroutine_threadsafe(self._guarded(coro), loop)
        return await asyncio.wrap_future(future)

    async def _guarded(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """``coro``, failing with ``RuntimeError`` (not a cancellation) when ``close`` stops it."""
        try:
            return await coro
        except asyncio.CancelledError:
            if self._closed:
                raise RuntimeError("OpenAIBackend was closed while the request ran") from None
            raise

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise RuntimeError("OpenAIBackend is closed")
            return self._helper.loop

    def _setup(self) -> aiohttp.ClientSession:
        """The pooled session, semaphore and lock, made on first use inside the helper loop."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.concurrency),
                timeout=aiohttp.ClientTimeout(total=self.request_timeout_s, sock_connect=self.connect_timeout_s),
                headers=self._headers)
            self._semaphore = asyncio.Semaphore(self.concurrency)
            self._model_lock = asyncio.Lock()
        return self._session

    async def _close_session(self) -> None:
        """Stop the requests still running (their callers get ``RuntimeError``), then close the session."""
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def _request(self, method: str, path: str, body: Optional[dict]) -> tuple[dict, str]:
        """The JSON object the server answered, with retries; and ``"METHOD URL"`` for messages."""
        session = self._setup()
        url = f"{self.base_url}{path}"
        where = f"{method} {url}"
        attempts = 1 if self._down else self.max_retries + 1
        t0 = time.perf_counter()
        for attempt in range(attempts):
            if attempt:
                delay = min(BACKOFF_CAP_S, self.retry_backoff_s * 2 ** (attempt - 1))
                await asyncio.sleep(delay / 2 + random.uniform(0, delay / 2))
                self._counts["retries"] += 1
            try:
                async with self._semaphore:
                    data = await self._attempt(session, method, url, body, where)
                self._down = False
                return data, where
            except _Retryable as e:
                last = str(e)
        self._down = True
        self._counts["failed_requests"] += 1
        raise ServerUnavailableError(f"{last} (gave up after {attempts} attempt{'s' * (attempts > 1)} "
                                     f"in {time.perf_counter() - t0:.1f} s)")

    async def _attempt(self, session: aiohttp.ClientSession, method: str, url: str, body: Optional[dict],
                       where: str) -> dict:
        """One HTTP attempt: the answer's JSON object, or ``_Retryable`` / ``ServerResponseError``."""
        self._counts["attempts"] += 1
        self._enter_busy()
        try:
            async with session.request(method, url, json=body) as resp:
                status, raw = resp.status, await resp.read()
        except TimeoutError:
            raise _Retryable(f"{where}: no answer within {self.request_timeout_s} s "
                             "(rollout.openai.request_timeout_s)") from None
        except aiohttp.ClientError as e:
            raise _Retryable(f"{where}: cannot reach the server: {type(e).__name__}: {e}") from None
        finally:
            self._leave_busy()
        if status == 429 or status >= 500:
            raise _Retryable(f"{where}: HTTP {status}: {_error_message(raw)}")
        if status != 200:
            raise ServerResponseError(f"{where}: the server refused the request (HTTP {status}): "
                                      f"{_error_message(raw)}")
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise ServerResponseError(f"{where}: the answer is not JSON: {raw[:200]!r}") from None
        if not isinstance(data, dict):
            raise ServerResponseError(f"{where}: the answer is not a JSON object: {raw[:200]!r}")
        return data

    def _enter_busy(self) -> None:
        if self._in_flight == 0:
            self._busy_since = time.perf_counter()
        self._in_flight += 1

    def _leave_busy(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._busy_s += time.perf_counter() - self._busy_since
