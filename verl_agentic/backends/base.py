"""The generation interface every backend implements (token-in / token-out)."""

from __future__ import annotations

import abc
from typing import Any, Optional

from verl_agentic.interfaces import ChatOutput, GenOutput, SamplingParams


def eos_ids(*values: Any) -> list[int]:
    """The ids of ``eos_token_id`` values as configs and tokenizers hold them (each an int, a list of
    ints or None), in order, without duplicates: the one reading of them behind every stop-id list."""
    ids: list[int] = []
    for value in values:
        for token_id in [value] if isinstance(value, int) else value or []:
            if token_id not in ids:
                ids.append(token_id)
    return ids


def stop_ids_from_configs(generation_config: Any, config: Any) -> list[int]:
    """EOS ids of a model's generation config and config (either may be None), in order, without
    duplicates: what both backends stop on.

    The tokenizer's ``eos_token_id`` is deliberately not used: some converted tokenizers
    (e.g. from GGUF) carry a wrong one, while the model's configs say how it ends a turn.
    """
    return eos_ids(getattr(generation_config, "eos_token_id", None), getattr(config, "eos_token_id", None))


class GenerationBackend(abc.ABC):
    """Generates continuations of token-id prompts.

    Implementations must return the generated token ids exactly as the model produced
    them (never decoded and re-encoded), with one logprob per generated token.
    ``generate`` may be called concurrently from many episodes; a backend is free to
    batch such calls together.
    """

    #: the tokenizer whose ids this backend speaks
    tokenizer: Any
    #: ids that end a generation (the model's end-of-turn / EOS tokens)
    stop_token_ids: list[int]

    @abc.abstractmethod
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenOutput:
        """Continue ``prompt_ids``; stops on a stop id (kept in the output) or max_new_tokens."""

    async def chat(self, messages: list[dict], sampling: SamplingParams,
                   tools: Optional[list[dict]] = None) -> ChatOutput:
        """Answer a chat conversation with one assistant message (servers that only speak chat).

        Backends that speak tokens get this through ``verl_agentic.backends.chat_adapter``.
        """
        raise NotImplementedError(f"{type(self).__name__} has no chat endpoint")

    async def close(self) -> None:
        """Release resources (worker threads, HTTP sessions). Idempotent."""

    def stats(self) -> dict[str, float]:
        """Counters for the run summary (requests, batches, tokens, busy seconds, ...)."""
        return {}
