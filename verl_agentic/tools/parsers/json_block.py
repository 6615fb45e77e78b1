"""``json``: a fenced JSON call (or a list of them), or a bare JSON object that is the whole message."""

from __future__ import annotations

import json
import re

from verl_agentic.tools.parsers.base import (
    ParseError,
    ParseResult,
    ToolCall,
    ToolCallParser,
    _collect,
    _decode_json_values,
    _json_error_message,
    _looks_like_call,
    _quote,
    register_parser,
)


_FENCE_OPEN = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)")
_JSON_FENCE_LANGS = {"json", "tool_call", "tool_calls"}


@register_parser("json")
class JsonParser(ToolCallParser):
    """A fenced JSON call (or list of calls), or a bare JSON object that is the whole message."""

    def parse(self, text: str) -> ParseResult:
        text = text or ""
        pieces: list[str] = []
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        attempted = False
        pos = 0
        while True:
            m = _FENCE_OPEN.search(text, pos)
            if m is None:
                pieces.append(text[pos:])
                break
            lang = m.group(1).lower()
            close = text.find("```", m.end())
            body = text[m.end():close if close >= 0 else len(text)]
            stop = close + 3 if close >= 0 else len(text)
            starts_json = body.lstrip().startswith(("{", "["))
            is_call_fence = lang in _JSON_FENCE_LANGS or (lang == "" and starts_json)
            if not is_call_fence:
                pieces.append(text[pos:stop])
                pos = stop
                continue
            pieces.append(text[pos:m.start()])
            raw = text[m.start():stop]
            pos = stop
            if close < 0:
                attempted = True
                errors.append(ParseError("unclosed_tag", "the ``` code fence of the tool call was never closed", raw))
                continue
            try:
                values = _decode_json_values(body)
            except json.JSONDecodeError as e:
                attempted = True
                errors.append(ParseError("invalid_json", f"the fenced tool call is not valid JSON "
                                                         f"({_json_error_message(e)}): {_quote(body)}", raw))
                continue
            if lang == "" and not all(_looks_like_call(v) for v in values):
                pieces.append(raw)  # a plain fence with JSON data, not a call
                continue
            attempted = True
            _collect(values, raw, calls, errors)

        if not attempted:  # no call fences: the whole message may be a bare JSON call
            whole = text.strip()
            if whole.startswith(("{", "[")):
                try:
                    values = _decode_json_values(whole)
                except json.JSONDecodeError as e:
                    if whole.startswith("{"):
                        errors.append(ParseError("invalid_json", f"the tool call is not valid JSON "
                                                                 f"({_json_error_message(e)}): {_quote(whole)}", whole))
                        return ParseResult("", calls, errors)
                    values = None
                if values is not None and all(_looks_like_call(v) for v in values):
                    _collect(values, whole, calls, errors)
                    return ParseResult("", calls, errors)
        return ParseResult("".join(pieces).strip(), calls, errors)

    def format_calls(self, calls: list[ToolCall], content: str = "") -> str:
        blocks = ["```json\n" + json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
                  + "\n```" for call in calls]
        return "\n\n".join(([content] if content else []) + blocks)
