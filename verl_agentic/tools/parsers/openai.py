"""``openai``: an OpenAI chat-completions message with ``tool_calls`` (or its JSON text)."""

from __future__ import annotations

import json

from verl_agentic.tools.parsers.base import (
    ParseError,
    ParseResult,
    ToolCall,
    ToolCallParser,
    _call_from_object,
    _json_error_message,
    _kind,
    register_parser,
)


@register_parser("openai")
class OpenAIParser(ToolCallParser):
    """An OpenAI chat-completions message (dict or JSON text) with ``tool_calls``."""

    def parse(self, text: str | dict) -> ParseResult:
        if isinstance(text, dict):
            return self.parse_message(text)
        text = text or ""
        stripped = text.strip()
        if not stripped.startswith("{"):
            return ParseResult(stripped, [], [ParseError(
                "unknown_format", "expected the JSON text of a chat-completions message "
                                  '({"role": "assistant", "content": ..., "tool_calls": [...]})', stripped)])
        try:
            message = json.loads(stripped)
        except json.JSONDecodeError as e:
            return ParseResult("", [], [ParseError("invalid_json", f"the message is not valid JSON "
                                                                   f"({_json_error_message(e)})", stripped)])
        return self.parse_message(message)

    def parse_message(self, message: dict) -> ParseResult:
        if not isinstance(message, dict):
            return ParseResult("", [], [ParseError("unknown_format", f"a message must be a JSON object, "
                                                                     f"got {_kind(message)}", repr(message))])
        choices = message.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict) and "message" in choices[0]:
            message = choices[0]["message"]  # a whole completion response
            if not isinstance(message, dict):
                return self.parse_message(message)
        content = message.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        content = content.strip() if isinstance(content, str) else ""
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        tool_calls = message.get("tool_calls")
        if tool_calls is None and isinstance(message.get("function_call"), dict):  # legacy single call
            tool_calls = [{"type": "function", "function": message["function_call"]}]
        if tool_calls is None:
            return ParseResult(content, calls, errors)
        if not isinstance(tool_calls, list):
            errors.append(ParseError("unknown_format", f'"tool_calls" must be a list, got {_kind(tool_calls)}',
                                     json.dumps(tool_calls, ensure_ascii=False, default=str)))
            return ParseResult(content, calls, errors)
        for item in tool_calls:
            raw = json.dumps(item, ensure_ascii=False, default=str)
            if not isinstance(item, dict):
                errors.append(ParseError("not_an_object", f"each tool call must be an object, got {_kind(item)}", raw))
                continue
            if item.get("type", "function") != "function":
                errors.append(ParseError("unknown_format", f"unsupported tool call type {item.get('type')!r} "
                                                           "(only 'function')", raw))
                continue
            fn = item.get("function")
            if not isinstance(fn, dict):
                errors.append(ParseError("missing_name", f'the tool call needs a "function" object with "name" '
                                                         f'and "arguments", got {_kind(fn)}', raw))
                continue
            out = _call_from_object(fn, raw)
            if isinstance(out, ToolCall):
                out.id = item.get("id") if isinstance(item.get("id"), str) else None
                calls.append(out)
            else:
                errors.append(out)
        return ParseResult(content, calls, errors)

    def format_calls(self, calls: list[ToolCall], content: str = "") -> str:
        message = {"role": "assistant", "content": content or None,
                   "tool_calls": [c.to_openai(default_id=f"call_{i}") for i, c in enumerate(calls)]}
        return json.dumps(message, ensure_ascii=False)
