"""The episode loop for chat-speaking policies: ``openai_chat_agent_loop``.

Each assistant turn is one ``chat(messages, sampling, tools) -> ChatOutput`` call, as against an
OpenAI-compatible ``/v1/chat/completions`` server: the backend's own ``chat()`` when it has one
(an HTTP chat server), else ``ChatAdapter`` over its token ``generate`` (render the chat
template with the tools, generate, parse tool calls with the task config's ``parser``, default
``hermes``). The assistant message goes into the conversation as the server answered it
(``content`` plus OpenAI-form ``tool_calls``), and ``obs(state, chat_out)`` gets the
``ChatOutput``. ``TaskSpec.gen`` (the token-level gen) is not used.

Everything else is ``ids_agent_loop``: the same start / obs / end contract, context budget
rule, typed errors, per-turn seeds, timeouts and cancellation, and the same trajectory dump.

Token exactness in chat mode, precisely
---------------------------------------
When the backend reports the generated token ids (``ChatAdapter`` always does; an HTTP server
when asked for them), the dump has ``prompt_ids`` / ``response_ids`` / ``response_mask`` /
``response_logprobs`` like the token loop:

- **Exact**: each assistant span holds the generated ids as generated, with their logprobs
  (mask 1). The prompt and every observation delta (mask 0) are rendered from the messages
  exactly as ``ids_agent_loop`` renders them, so ``check_drift`` verifies them as for any
  trajectory. Prompt + response is therefore the token sequence the model *would* have seen had
  it continued its own tokens, the sequence a trainer computes logprobs on.
- **Not exact**: the context of turn k >= 2. A chat request carries messages, and the server
  re-renders the whole conversation: the earlier assistant turns become the template's
  rendering of the parsed message (the decoded content re-encoded, tool calls re-serialized by
  the template), not the generated ids. Where the two differ, turn k was sampled (and its
  logprobs computed) on a different context than the dumped one. Before every turn the loop
  renders the conversation as the server does and compares it with the trajectory's context:
  ``chat_rerender_turns`` counts turns whose context differed, ``chat_rerender_tokens`` the
  tokens that differ (0 and 0 mean the dump is exactly what the model saw). This assumes the
  server renders with the same chat template and tokenizer as ``backend.tokenizer``; a server
  that reports its prompt token count is checked against that (``chat_prompt_count_mismatch``).
- **Text only**: a backend that reports no token ids gives a trajectory of messages and turn
  texts only (empty token fields, zero-length turn spans, ``chat_text_only`` = 1): good for
  evaluation, not for training.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any, Optional

from verl_agentic.backends.chat_adapter import ChatAdapter, has_native_chat
from verl_agentic.interfaces import (
    ChatOutput,
    EpisodeResult,
    EpisodeState,
    GenOutput,
    RolloutContext,
    SamplingParams,
)
from verl_agentic.rollout.loops import LoopLimits, ids_agent_loop, maybe_await
from verl_agentic.rollout.template import ChatTemplate
from verl_agentic.rollout.task_spec import TaskSpec


def differing_tokens(a: list[int], b: list[int]) -> int:
    """Tokens of the longer sequence outside the blocks ``a`` and ``b`` share (0 when equal)."""
    if a == b:
        return 0
    prefix = 0
    for x, y in zip(a, b):
        if x != y:
            break
        prefix += 1
    same = prefix + sum(m.size for m in difflib.SequenceMatcher(
        None, a[prefix:], b[prefix:], autojunk=False).get_matching_blocks())
    return max(len(a), len(b)) - same


@dataclass
class _ChatEpisode:
    """One episode's chat side: wraps the task so ``ids_agent_loop`` drives it (see the module docstring)."""

    task: Any
    backend: Any
    renderer: ChatAdapter  # renders conversations as a chat server does (and chats for token backends)
    text_only: bool = False
    last: Optional[ChatOutput] = None

    async def gen(self, state: EpisodeState, backend: Any, sampling: SamplingParams) -> GenOutput:
        native = has_native_chat(self.backend)
        served = None if self.text_only else self.renderer.render_prompt_ids(state.messages, state.tools)
        if served is not None:
            self._measure_rerender(state, served)
        if native:
            out = await self.backend.chat(state.messages, sampling, state.tools)
        else:
            out = await self.renderer.chat_from_prompt(served, sampling, state.tools)
        if not isinstance(out, ChatOutput):
            raise TypeError(f"chat() must return a ChatOutput, got {type(out).__name__}")
        if native and served is not None and out.prompt_token_count not in (None, len(served)):
            _bump(state, "chat_prompt_count_mismatch")  # the server's template or tokenizer is not ours
        self.last = out
        if out.token_ids is None:
            self.text_only = True
        ids = [] if self.text_only else list(out.token_ids)
        return GenOutput(
            token_ids=ids,
            logprobs=None if self.text_only or out.logprobs is None else list(out.logprobs),
            text=self.renderer.tokenizer.decode(ids, skip_special_tokens=False) if ids else _message_text(out.message),
            finish_reason="length" if out.finish_reason == "length" else "stop",  # tool_calls stopped too
        )

    @staticmethod
    def _measure_rerender(state: EpisodeState, served: list[int]) -> None:
        """Compare the prompt a chat server generates from with the trajectory's context."""
        diff = differing_tokens(served, state.context_ids)
        state.metrics.setdefault("chat_rerender_turns", 0.0)
        state.metrics.setdefault("chat_rerender_tokens", 0.0)
        if diff:
            _bump(state, "chat_rerender_turns")
            _bump(state, "chat_rerender_tokens", diff)

    async def obs(self, state: EpisodeState, out: GenOutput) -> Any:
        # The loop appended the assistant message as decoded text; the conversation keeps the chat answer.
        message = dict(self.last.message)
        message["role"] = "assistant"
        if message.get("content") is None:
            message["content"] = ""
        state.messages[-1] = message
        return await maybe_await(self.task.obs(state, self.last))

    async def end(self, state: EpisodeState) -> EpisodeResult:
        if self.text_only:
            _drop_tokens(state)
        return await maybe_await(self.task.end(state))


def _bump(state: EpisodeState, key: str, by: float = 1.0) -> None:
    state.metrics[key] = state.metrics.get(key, 0.0) + by


def _message_text(message: dict) -> str:
    """A readable text of an assistant message without tokens: content, then its tool calls as JSON."""
    calls = [json.dumps(c, ensure_ascii=False) for c in message.get("tool_calls") or []]
    return "\n".join([message.get("content") or ""] + calls)


def _drop_tokens(state: EpisodeState) -> None:
    """Text-only episodes: no token fields, turns keep their texts with empty spans."""
    state.prompt_ids, state.response_ids, state.response_mask, state.response_logprobs = [], [], [], []
    for turn in state.turns:
        turn.start = turn.end = 0
    state.metrics["chat_text_only"] = 1.0


async def openai_chat_agent_loop(task: Any, row: dict, ctx: RolloutContext, backend: Any,
                                 sampling: SamplingParams, limits: LoopLimits,
                                 template: ChatTemplate) -> tuple[EpisodeState, EpisodeResult]:
    """Run one episode of ``task`` against a chat-speaking policy (see the module docstring)."""
    parser = (ctx.task_config or {}).get("parser") or "hermes"
    episode = _ChatEpisode(task, backend, ChatAdapter(backend, parser, template))
    spec = TaskSpec(start=task.start, obs=episode.obs, end=episode.end, gen=episode.gen,
                    name=getattr(task, "name", ""))
    return await ids_agent_loop(spec, row, ctx, backend, sampling, limits, template)
