"""``hermes``: ``<tool_call>{...}</tool_call>`` tags (Qwen2.5, Qwen3, Hermes, most open chat templates)."""

from __future__ import annotations

import json
from typing import Any

from verl_agentic.tools.parsers.base import (
    ParseError,
    ParseResult,
    ToolCall,
    ToolCallParser,
    _collect,
    _decode_json_values,
    _json_error_message,
    _quote,
    _strip_fence,
    register_parser,
)


@register_parser("hermes")
class HermesParser(ToolCallParser):
    """``<tool_call>{json}</tool_call>`` blocks (see the module docstring)."""

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def __init__(self, *, allow_unclosed: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.allow_unclosed = allow_unclosed

    def _body_values(self, body: str) -> list[Any]:
        return _decode_json_values(_strip_fence(body))

    def parse(self, text: str) -> ParseResult:
        text = text or ""
        o, c = self.open_tag, self.close_tag
        pieces: list[str] = []
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        pos = 0
        while True:
            start = text.find(o, pos)
            if start < 0:
                pieces.append(text[pos:])
                break
            pieces.append(text[pos:start])
            body_start = start + len(o)
            end = text.find(c, body_start)
            nxt = text.find(o, body_start)
            if end < 0 or 0 <= nxt < end:  # never closed, or closed only after another opening
                stop = nxt if nxt >= 0 else len(text)
                raw = text[start:stop]
                pos = stop
                if self.allow_unclosed and nxt < 0:
                    try:
                        values = self._body_values(text[body_start:])
                    except json.JSONDecodeError:
                        values = None
                    if values:
                        _collect(values, raw, calls, errors)
                        continue
                where = "before the next " + o if nxt >= 0 else "(the output ended inside it)"
                errors.append(ParseError("unclosed_tag", f"{o} was not closed with {c} {where}", raw))
                continue
            raw = text[start:end + len(c)]
            pos = end + len(c)
            body = text[body_start:end]
            try:
                values = self._body_values(body)
            except json.JSONDecodeError as e:
                errors.append(ParseError("invalid_json", f"the text inside {o}{c} is not valid JSON "
                                                         f"({_json_error_message(e)}): {_quote(body)}", raw))
                continue
            _collect(values, raw, calls, errors)
        for piece in pieces:
            if c in piece:
                errors.append(ParseError("stray_tag", f"found {c} without a matching {o} before it",
                                         piece.strip()))
        return ParseResult("".join(pieces).strip(), calls, errors)

    def format_calls(self, calls: list[ToolCall], content: str = "") -> str:
        # Byte-identical to what the Qwen2.5 / Qwen3 chat templates render for tool_calls.
        blocks = [f'{self.open_tag}\n{{"name": {json.dumps(call.name, ensure_ascii=False)}, "arguments": '
                  f"{json.dumps(call.arguments, ensure_ascii=False)}}}\n{self.close_tag}" for call in calls]
        return "\n".join(([content] if content else []) + blocks)
