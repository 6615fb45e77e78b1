"""The backend door: a generation backend whose answers are recorded on, or played back from, a tape.

``taped(backend, tape)`` is what an episode generates through when it is recorded or replayed
(``AsyncRollout`` and the verl plugin's agent loop wrap their backend per episode; a backend that speaks
chat itself keeps doing so, through the ``chat`` door). Each ``generate``
advances the tape's turn and is one ``generate`` event: the request is the prompt (its length and
SHA-256 over the token ids) and the sampling (``max_new_tokens``, temperature, top-p, top-k, seed), the
answer the generated token ids, logprobs, text and finish reason exactly as the backend returned them.
On replay, the recorded answer serves the recorded request and any other prompt or sampling is the
divergence: no model is asked. ``NoModel`` is the backend a replay wraps (a tokenizer, the stop ids,
and a ``generate`` that is never reached).
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Any, Optional

from verl_agentic.interfaces import ChatOutput, GenOutput, SamplingParams
from verl_agentic.record.tape import Tape, digest, door, using


def prompt_request(prompt_ids: list[int], sampling: SamplingParams) -> dict:
    """What a ``generate`` event is matched by: the prompt's length and hash, and the sampling."""
    sha = hashlib.sha256(array("q", prompt_ids).tobytes()).hexdigest()
    return {"prompt_len": len(prompt_ids), "prompt_sha256": sha, "max_new_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
            "seed": sampling.seed}


def _gen_as_dict(out: GenOutput) -> dict:
    return {"token_ids": list(out.token_ids), "logprobs": None if out.logprobs is None else list(out.logprobs),
            "text": out.text, "finish_reason": out.finish_reason}


def _chat_as_dict(out: ChatOutput) -> dict:
    return {"message": out.message, "finish_reason": out.finish_reason, "token_ids": out.token_ids,
            "logprobs": out.logprobs, "prompt_token_count": out.prompt_token_count}


def has_native_chat(backend: Any) -> bool:
    """Does ``backend`` implement ``chat()`` itself (a chat server), rather than the base class's stub?
    (``backends.chat_adapter.has_native_chat``, a layer above, asks the same: a taped backend must answer
    it as the backend it wraps does, or a chat loop would talk to it another way.)"""
    method = getattr(type(backend), "chat", None)
    return method is not None and getattr(method, "__qualname__", "") != "GenerationBackend.chat"


class TapedBackend:
    """``backend`` with its ``generate`` through the tape's door; everything else is the backend's own
    (tokenizer, stop ids, stats). ``taped`` picks this or ``TapedChatBackend``."""

    def __init__(self, backend: Any, tape: Tape):
        self._backend = backend
        self.tape = tape

    def __getattr__(self, name: str) -> Any:
        if name == "chat":  # only TapedChatBackend has one (see has_native_chat)
            raise AttributeError(name)
        return getattr(self._backend, name)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenOutput:
        self.tape.turn += 1
        with using(self.tape):  # a backend called outside the episode's context (verl's) still records
            return await door("generate", prompt_request(prompt_ids, sampling),
                              lambda: self._backend.generate(prompt_ids, sampling),
                              encode=_gen_as_dict, decode=lambda d: GenOutput(**d))


class TapedChatBackend(TapedBackend):
    """A taped backend that speaks chat itself (an HTTP chat server): its ``chat`` through the door too."""

    async def chat(self, messages: list[dict], sampling: SamplingParams,
                   tools: Optional[list[dict]] = None) -> ChatOutput:
        self.tape.turn += 1
        request = {"messages": digest(messages), "tools": digest(tools), "max_new_tokens": sampling.max_new_tokens,
                   "temperature": sampling.temperature, "seed": sampling.seed}
        with using(self.tape):
            return await door("chat", request, lambda: self._backend.chat(messages, sampling, tools),
                              encode=_chat_as_dict, decode=lambda d: ChatOutput(**d))


def taped(backend: Any, tape: Tape) -> TapedBackend:
    """``backend`` behind ``tape``'s doors, speaking chat exactly when ``backend`` does."""
    return (TapedChatBackend if has_native_chat(backend) else TapedBackend)(backend, tape)


class NoModel:
    """The backend of a replay: the recorded run's tokenizer and stop ids, and no model. Every answer
    comes from the tape; reaching ``generate`` means a door was asked for a live model."""

    def __init__(self, tokenizer: Any, stop_token_ids: list[int]):
        self.tokenizer = tokenizer
        self.stop_token_ids = list(stop_token_ids)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenOutput:
        raise RuntimeError("replay: no model; every generation must come from the recording")

    async def close(self) -> None:
        pass

    def stats(self) -> dict[str, float]:
        return {}


class NoChatModel(NoModel):
    """``NoModel`` for a run whose backend spoke chat itself (the recording's ``native_chat``)."""

    async def chat(self, messages: list[dict], sampling: SamplingParams,
                   tools: Optional[list[dict]] = None) -> ChatOutput:
        raise RuntimeError("replay: no model; every chat answer must come from the recording")
