"""``chat()`` for any token backend: render the chat template with tools, generate, parse tool calls.

A chat server (``/v1/chat/completions``) is stateless: each request carries the whole
conversation, the server renders it with the model's chat template, generates, and parses the
tool calls out of the text. ``ChatAdapter`` does the same with a token backend (``hf``, or the
token endpoint of an HTTP server), so the chat loop runs on every backend, and its answers keep
the generated token ids and logprobs::

    chat = ChatAdapter(backend, parser="hermes")
    out = await chat.chat(messages, sampling, tools=[schema, ...])
    out.message      # {"role": "assistant", "content": str, "tool_calls"?: [OpenAI-form calls]}
    out.token_ids    # exactly as generated (the stop token included when the model stopped on it)

Messages are OpenAI chat messages; ``to_template_messages`` turns them into what Hugging Face
templates take (tool-call ``arguments`` as objects, ``None`` content as ``""``; for templates
without tool support the calls are written into the content in the parser's format, next to the
hermes-style tools block ``ChatTemplate`` adds to the system message).

Tool calls are parsed only when tools are offered. A turn whose markup the parser cannot read
(any parse error) comes back as plain content with no ``tool_calls``, the way OpenAI-compatible
servers answer it; the environment then sees the raw text.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from verl_agentic.backends.base import GenerationBackend
from verl_agentic.interfaces import ChatOutput, GenOutput, SamplingParams
from verl_agentic.rollout.loops import ended_on_stop
from verl_agentic.rollout.template import ChatTemplate
from verl_agentic.tools.parsers import ToolCall, ToolCallParser, get_parser


def calls_from_message(message: dict) -> list[ToolCall]:
    """The ``tool_calls`` of an OpenAI-form assistant message as ``ToolCall``s.

    ``arguments`` may be a JSON string (OpenAI) or an object (HF); a string that is not a JSON
    object is kept as ``{"arguments": <string>}`` so nothing the model wrote is dropped.
    """
    calls = []
    for i, tc in enumerate(message.get("tool_calls") or []):
        fn = tc.get("function", tc) if isinstance(tc, dict) else {}
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                decoded = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                decoded = {"arguments": args}
            args = decoded if isinstance(decoded, dict) else {"arguments": args}
        calls.append(ToolCall(str(fn.get("name", "")), args if isinstance(args, dict) else {},
                              id=tc.get("id") if isinstance(tc, dict) else None))
    return calls


def to_template_messages(messages: list[dict], template: ChatTemplate, parser: ToolCallParser) -> list[dict]:
    """OpenAI chat messages -> the messages a Hugging Face chat template renders (see the module docstring)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("content") is None:
            m["content"] = ""
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = calls_from_message(m)
            if template.supports_tools:
                m["tool_calls"] = [{**({"id": c.id} if c.id else {}), "type": "function",
                                    "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
            else:  # the template would drop them: write them where the model wrote them
                m["content"] = parser.format_calls(calls, m["content"])
                del m["tool_calls"]
        out.append(m)
    return out


def chat_output(out: GenOutput, tokenizer: Any, stop_token_ids: set[int], parser: Optional[ToolCallParser],
                prompt_token_count: Optional[int] = None) -> ChatOutput:
    """A generated turn as one assistant message; ``parser`` None: no tool-call parsing.

    The content is the decoded generation without its stop token (as the token loop stores
    it); with tool calls it is the parser's content (markup removed, stripped).
    """
    stopped = ended_on_stop(out.token_ids, out.finish_reason, stop_token_ids)
    text = tokenizer.decode(out.token_ids[:-1] if stopped else out.token_ids, skip_special_tokens=False)
    message: dict = {"role": "assistant", "content": text}
    finish_reason = out.finish_reason
    if parser is not None:
        parsed = parser.parse(text)
        if parsed.calls and not parsed.errors:
            message = {"role": "assistant", "content": parsed.content,
                       "tool_calls": [c.to_openai(f"call_{i}") for i, c in enumerate(parsed.calls)]}
            finish_reason = "tool_calls"
    return ChatOutput(message=message, finish_reason=finish_reason, token_ids=list(out.token_ids),
                      logprobs=None if out.logprobs is None else list(out.logprobs),
                      prompt_token_count=prompt_token_count)


class ChatAdapter(GenerationBackend):
    """A token backend that also answers ``chat()``; ``generate`` goes straight to the wrapped backend.

    Args:
        backend: the token backend (its ``tokenizer`` and ``stop_token_ids`` are used).
        parser: the tool-call format the model writes (a registered parser name or instance).
        template: the chat template to render with; default: the backend tokenizer's, with
            ``chat_template_kwargs``.

    ``close`` does not close the wrapped backend: it belongs to whoever created it.
    """

    def __init__(self, backend: GenerationBackend, parser: str | ToolCallParser = "hermes",
                 template: Optional[ChatTemplate] = None, chat_template_kwargs: Optional[dict] = None):
        self.backend = backend
        self.tokenizer = backend.tokenizer
        self.stop_token_ids = list(backend.stop_token_ids or [])
        self.template = template or ChatTemplate(backend.tokenizer, chat_template_kwargs)
        self.parser = get_parser(parser)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenOutput:
        return await self.backend.generate(prompt_ids, sampling)

    def render_prompt_ids(self, messages: list[dict], tools: Optional[list[dict]] = None) -> list[int]:
        """The prompt a chat request for ``messages`` generates from (the whole conversation, re-rendered)."""
        return self.template.prompt_ids(to_template_messages(messages, self.template, self.parser), tools)

    async def chat(self, messages: list[dict], sampling: SamplingParams,
                   tools: Optional[list[dict]] = None) -> ChatOutput:
        return await self.chat_from_prompt(self.render_prompt_ids(messages, tools), sampling, tools)

    async def chat_from_prompt(self, prompt_ids: list[int], sampling: SamplingParams,
                               tools: Optional[list[dict]] = None) -> ChatOutput:
        """``chat`` for a conversation already rendered by ``render_prompt_ids``."""
        out = await self.backend.generate(prompt_ids, sampling)
        stops = set(self.stop_token_ids) | set(sampling.stop_token_ids or [])
        return chat_output(out, self.tokenizer, stops, self.parser if tools else None, len(prompt_ids))

    def stats(self) -> dict[str, float]:
        return self.backend.stats()


def has_native_chat(backend: Any) -> bool:
    """Does ``backend`` implement ``chat()`` itself (a chat server), rather than the base class stub?"""
    method = getattr(type(backend), "chat", None)
    return method is not None and method is not GenerationBackend.chat
