"""Chat-template rendering for token-in/token-out multi-turn rollouts.

The rule (one rule, for every template):

- The prompt is the template applied to the initial messages with the generation prompt,
  tokenized once.
- What the model generates is kept as token ids, never re-encoded.
- After an assistant turn, the new observation messages are tokenized as the *delta* the
  template adds for them **in the real conversation context**: the conversation is rendered
  with the assistant's content replaced by a sentinel, and the delta is everything after the
  sentinel (the template's end-of-turn marker, the new messages, the next generation prompt).
  If the model already generated the end-of-turn token (it stopped on it), that token's text
  is removed from the front of the delta, so it is not inserted twice; if the model was cut
  off (no stop token), the template's end-of-turn marker is inserted as an injected token.

Rendering in the real context, rather than a dummy one, keeps templates that look at the
whole conversation (tool-response grouping, Qwen3's last-query logic) correct, and history
rewriting (e.g. Qwen3 dropping earlier ``<think>`` blocks) never touches tokens the model saw.
"""

from __future__ import annotations

from typing import Any, Optional

from verl_agentic.interfaces import EpisodeFailure
from verl_agentic.tools.runner import tools_system_block

# A string no model produces and no template transforms: marks where an assistant content sits.
SENTINEL = "\u2060\u2063verl-agentic-assistant-{}\u2063\u2060"


class ChatTemplate:
    """Renders and tokenizes conversations with a tokenizer's chat template."""

    def __init__(self, tokenizer: Any, chat_template_kwargs: Optional[dict] = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template; "
                "multi-turn rollouts need one (set tokenizer.chat_template)"
            )
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})

    @property
    def supports_tools(self) -> bool:
        """Whether the template renders ``tools=`` itself (Qwen2.5/Qwen3 do, SmolLM2 does not)."""
        return "tools" in str(self.tokenizer.chat_template)

    def with_tools(self, messages: list[dict], tools: Optional[list[dict]]) -> list[dict]:
        """For templates without tool support: the tools as a hermes-style block in the system message."""
        if not tools or self.supports_tools:
            return messages

        block = tools_system_block(tools)
        if messages and messages[0].get("role") == "system":
            return [{**messages[0], "content": f"{messages[0]['content']}\n\n{block}"}] + list(messages[1:])
        return [{"role": "system", "content": block}] + list(messages)

    def render(self, messages: list[dict], *, add_generation_prompt: bool,
               tools: Optional[list[dict]] = None) -> str:
        if tools and not self.supports_tools:
            messages, tools = self.with_tools(messages, tools), None
        try:
            return self.tokenizer.apply_chat_template(
                messages, tools=tools or None, tokenize=False,
                add_generation_prompt=add_generation_prompt, **self.kwargs,
            )
        except Exception as e:  # jinja errors: bad roles, missing fields, ...
            raise EpisodeFailure("template_error", f"chat template failed: {type(e).__name__}: {e}") from e

    def encode(self, text: str) -> list[int]:
        """Tokenize template text; the template already holds every special token it needs."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: list[dict], tools: Optional[list[dict]] = None) -> list[int]:
        return self.encode(self.render(messages, add_generation_prompt=True, tools=tools))

    def delta_text(self, history: list[dict], new_messages: list[dict], *,
                   generated_stop_text: Optional[str] = None,
                   tools: Optional[list[dict]] = None) -> str:
        """Text the template adds after the last assistant message of ``history``.

        ``history`` ends with the assistant message just generated. The result covers the
        rest of that assistant turn (end-of-turn marker, minus ``generated_stop_text`` when the
        model produced it), ``new_messages`` and the next generation prompt.
        """
        if not history or history[-1].get("role") != "assistant":
            raise ValueError("delta_text: history must end with the assistant message")
        marker = SENTINEL.format(0)
        context = history[:-1] + [{"role": "assistant", "content": marker}]
        rendered = self.render(context + list(new_messages), add_generation_prompt=True, tools=tools)
        pos = rendered.rfind(marker)
        if pos < 0:
            raise EpisodeFailure(
                "template_error", "the chat template dropped the assistant message; cannot place the delta"
            )
        tail = rendered[pos + len(marker):]
        if generated_stop_text and tail.startswith(generated_stop_text):
            tail = tail[len(generated_stop_text):]
        return tail

    def split_rendered(self, messages: list[dict], *, add_generation_prompt: bool,
                       tools: Optional[list[dict]] = None) -> list[str]:
        """Render ``messages`` once with every assistant content replaced by a sentinel.

        Returns the text segments between assistant contents: segment 0 precedes the first
        assistant content, segment i follows assistant i-1. Used by the drift check to compare
        a whole trajectory with a fresh rendering of its messages.
        """
        marked, k = [], 0
        for m in messages:
            if m.get("role") == "assistant":
                marked.append({"role": "assistant", "content": SENTINEL.format(k)})
                k += 1
            else:
                marked.append(m)
        rendered = self.render(marked, add_generation_prompt=add_generation_prompt, tools=tools)
        segments, cursor = [], 0
        for i in range(k):
            marker = SENTINEL.format(i)
            pos = rendered.find(marker, cursor)
            if pos < 0:
                raise EpisodeFailure("template_error", f"assistant message {i} is missing from the rendering")
            segments.append(rendered[cursor:pos])
            cursor = pos + len(marker)
        segments.append(rendered[cursor:])
        return segments

    def stop_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)
