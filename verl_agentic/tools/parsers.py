"""Tool-call parsers: turn an assistant turn's text into ``ToolCall``s, and back.

Every parser returns a ``ParseResult(content, calls, errors)``: ``content`` is the assistant text
with the tool-call markup removed (stripped), ``calls`` the well-formed calls in order, and
``errors`` one typed ``ParseError`` per malformed call. Parsing never raises on model output: a
broken call becomes an error and the good calls of the same turn are still returned.
``format_calls`` is the inverse of ``parse`` (the text a model should produce), used in prompts,
format hints and tests.

Formats (registered names, ``get_parser(name)``):

``hermes`` (Qwen2.5, Qwen3, Hermes, and most open chat templates)::

    Let me look that up.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_time", "arguments": {"tz": "CET"}}
    </tool_call>

  Several tags per turn; a tag may also hold several objects or a JSON list of them.
  ``arguments`` may be a JSON *string* holding the object (Qwen2.5's template renders string
  arguments that way) and ``parameters`` is accepted as a synonym. A ``<tool_call>`` left open
  at the end (a truncated generation) is an ``unclosed_tag`` error (``allow_unclosed=True``
  accepts it when the JSON inside is complete). Text outside the tags, including a Qwen3
  ``<think>...</think>`` block, is ``content``.

``json``: a fenced object (```` ```json ```` or a bare ```` ``` ```` fence holding JSON) with
  ``name`` and ``arguments``, or a list of them; or a bare JSON object that is the whole message.
  Other fences (```` ```python ````) and JSON that does not look like a call (no ``name`` /
  ``arguments`` / ``parameters`` / ``function`` key) stay in ``content``::

    ```json
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    ```

``react``::

    Thought: I need the weather first.
    Action: get_weather
    Action Input: {"city": "Paris"}

  ``Action Input`` may be a plain string (``Action Input: Paris`` -> ``{"input": "Paris"}``);
  several Action blocks are allowed; nothing after ``Final Answer:`` is parsed as a call.
  ``content`` keeps the Thought / Observation / Final Answer text.

``openai``: an OpenAI chat-completions ``message`` (a dict via ``parse_message``, or its JSON
  text via ``parse``; a whole completion response with ``choices`` is accepted too) with
  ``tool_calls: [{"id", "type": "function", "function": {"name", "arguments": "<json string>"}}]``.
  Calls keep their ``id``. The legacy single ``function_call`` is accepted as well.

Error types (``ParseError.type``): ``invalid_json``, ``missing_name``, ``invalid_name``,
``bad_arguments``, ``missing_arguments``, ``not_an_object``, ``unclosed_tag``, ``stray_tag``,
``unknown_format``.

Usage::

    from verl_agentic.tools.parsers import get_parser

    parser = get_parser("hermes")
    result = parser.parse(assistant_text)
    for call in result.calls:
        ...  # call.name, call.arguments (a dict), call.id
    if result.errors:
        feedback = parser.feedback_message(result.errors)  # send back to the model
    messages.append(result.assistant_message())  # HF-format assistant message with tool_calls

New formats register with ``@register_parser("name")`` on a ``ToolCallParser`` subclass, or from
another package through the ``verl_agentic.tool_parsers`` entry-point group.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from verl_agentic.interfaces import ConfigError
from verl_agentic.registry import Registry

__all__ = [
    "ToolCall", "ParseError", "ParseResult", "ToolCallParser", "HermesParser", "JsonParser", "ReactParser",
    "OpenAIParser", "PARSERS", "register_parser", "get_parser", "feedback_message", "DEFAULT_FEEDBACK_TEMPLATE",
]

DEFAULT_FEEDBACK_TEMPLATE = "Your tool call could not be parsed: {reasons}. Use the format:\n{example}"
_EXAMPLE_CALL_NAME = "tool_name"
_EXAMPLE_CALL_ARGUMENTS = {"argument": "value"}
_MAX_RAW_IN_MESSAGE = 80  # characters of the offending text quoted in an error message


# ----------------------------------------------------------------------------------------------
# data types
# ----------------------------------------------------------------------------------------------
@dataclass
class ToolCall:
    name: str
    arguments: dict  # parsed JSON object
    id: Optional[str] = None  # call id when the format carries one (openai), else None
    raw: str = ""  # the exact text span it came from

    def to_hf(self) -> dict:
        """The HF chat-template form: ``{"type": "function", "function": {"name", "arguments": {...}}}``."""
        out: dict[str, Any] = {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if self.id is not None:
            out["id"] = self.id
        return out

    def to_openai(self, default_id: Optional[str] = None) -> dict:
        """The OpenAI form, with ``arguments`` as a JSON string."""
        return {"id": self.id if self.id is not None else default_id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


@dataclass
class ParseError:
    type: str  # "invalid_json" | "missing_name" | "bad_arguments" | "unclosed_tag" | "unknown_format" ...
    message: str  # short, human readable, suitable to show the model
    raw: str = ""


@dataclass
class ParseResult:
    content: str  # the assistant text with the tool-call markup removed (stripped)
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def assistant_message(self) -> dict:
        """An HF-format assistant message (``tool_calls`` only when there are calls)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.calls:
            msg["tool_calls"] = [c.to_hf() for c in self.calls]
        return msg


# ----------------------------------------------------------------------------------------------
# shared helpers
# ----------------------------------------------------------------------------------------------
_CALL_KEYS = ("name", "arguments", "parameters", "function")


def _kind(value: Any) -> str:
    """``a list``, ``a string``, ... for error messages."""
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _quote(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > _MAX_RAW_IN_MESSAGE:
        text = text[: _MAX_RAW_IN_MESSAGE - 3] + "..."
    return repr(text)


def _json_error_message(e: json.JSONDecodeError) -> str:
    return f"{e.msg} at line {e.lineno}, column {e.colno}"


def _decode_json_values(text: str) -> list[Any]:
    """Every JSON value in ``text`` (whitespace-separated); raises ``json.JSONDecodeError``."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    ws = re.compile(r"\s*")
    i = ws.match(text, 0).end()
    if i == len(text):
        raise json.JSONDecodeError("Expecting value (empty)", text, i)
    while i < len(text):
        value, i = decoder.raw_decode(text, i)
        values.append(value)
        i = ws.match(text, i).end()
    return values


def _strip_fence(text: str) -> str:
    """``text`` without a surrounding Markdown code fence (```` ```json ... ``` ````), if it has one."""
    s = text.strip()
    m = re.fullmatch(r"```[A-Za-z0-9_+.-]*[ \t]*\n?(.*?)\n?[ \t]*```", s, re.S)
    return m.group(1) if m else s


def _decode_arguments(value: Any, name: str) -> tuple[Optional[dict], Optional[ParseError]]:
    """``arguments`` as a dict: an object, a JSON string holding one, or absent/null (``{}``)."""
    if value is None:
        return {}, None
    if isinstance(value, str):
        if not value.strip():
            return {}, None
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError as e:
            return None, ParseError("bad_arguments", f'the "arguments" string of {name!r} is not valid JSON '
                                                     f"({_json_error_message(e)})")
        value = decoded
    if not isinstance(value, dict):
        return None, ParseError("bad_arguments", f'"arguments" of {name!r} must be a JSON object, got {_kind(value)}')
    return value, None


def _call_from_object(obj: Any, raw: str) -> ToolCall | ParseError:
    """A ``{"name", "arguments"|"parameters", "id"?}`` object (or ``{"function": {...}}``) -> a call."""
    if not isinstance(obj, dict):
        return ParseError("not_an_object", f'a tool call must be a JSON object with "name" and "arguments", '
                                           f"got {_kind(obj)}", raw)
    call_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    if isinstance(obj.get("function"), dict) and "name" not in obj:  # {"type": "function", "function": {...}}
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        if name is None:
            got = 'no "name"'
        else:
            got = '"name" is empty' if isinstance(name, str) else f'"name" is {_kind(name)}'
        return ParseError("missing_name", f'the tool call needs a non-empty "name" string ({got})', raw)
    name = name.strip()
    args_value = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    arguments, err = _decode_arguments(args_value, name)
    if err is not None:
        err.raw = raw
        return err
    return ToolCall(name=name, arguments=arguments, id=call_id, raw=raw)


def _collect(values: list[Any], raw: str, calls: list[ToolCall], errors: list[ParseError]) -> None:
    """Calls from decoded JSON values: objects, or lists of objects."""
    for value in values:
        for item in value if isinstance(value, list) else [value]:
            out = _call_from_object(item, raw)
            (calls if isinstance(out, ToolCall) else errors).append(out)


def _looks_like_call(value: Any) -> bool:
    if isinstance(value, dict):
        return any(k in value for k in _CALL_KEYS)
    if isinstance(value, list):
        return bool(value) and all(isinstance(v, dict) for v in value) and any(_looks_like_call(v) for v in value)
    return False


# ----------------------------------------------------------------------------------------------
# base class, registry
# ----------------------------------------------------------------------------------------------
class ToolCallParser:
    """Base class. Subclasses implement ``parse`` and ``format_calls``.

    ``feedback_template`` (``{reasons}`` and ``{example}`` are filled in) and ``example_call``
    configure ``feedback_message``.
    """

    name: str = ""

    def __init__(self, *, feedback_template: Optional[str] = None, example_call: Optional[ToolCall] = None):
        self.feedback_template = feedback_template or DEFAULT_FEEDBACK_TEMPLATE
        self.example_call = example_call or ToolCall(_EXAMPLE_CALL_NAME, dict(_EXAMPLE_CALL_ARGUMENTS))

    def parse(self, text: str) -> ParseResult:
        raise NotImplementedError

    def format_calls(self, calls: list[ToolCall], content: str = "") -> str:
        """The text form of ``calls`` (after ``content`` when given): ``parse`` of it gives them back."""
        raise NotImplementedError

    def example(self) -> str:
        """A one-call example in this format, for format hints."""
        return self.format_calls([self.example_call])

    def feedback_message(self, errors: list[ParseError]) -> str:
        """The message to send back to the model for ``errors`` (``""`` when there are none)."""
        if not errors:
            return ""
        reasons: list[str] = []
        for e in errors:
            if e.message not in reasons:
                reasons.append(e.message)
        return self.feedback_template.format(reasons="; ".join(reasons), example=self.example())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


PARSERS: Registry = Registry("tool-call parser", "verl_agentic.tool_parsers")


def register_parser(name: str):
    """Class decorator: register a ``ToolCallParser`` subclass under ``name`` (sets ``cls.name``)."""

    def decorator(cls):
        cls.name = name
        PARSERS.register(name, cls)
        return cls

    return decorator


def get_parser(name: str | ToolCallParser, **options: Any) -> ToolCallParser:
    """A new parser instance by registered name (``options`` go to its constructor).

    An unknown name raises ``ConfigError`` listing the registered ones; a parser instance is
    returned as is.
    """
    if isinstance(name, ToolCallParser):
        return name
    cls = PARSERS.get(name)
    try:
        return cls(**options)
    except TypeError as e:
        raise ConfigError(f"tool-call parser {name!r}: bad options {sorted(options)}: {e}") from e


def feedback_message(errors: list[ParseError], parser: str | ToolCallParser = "hermes",
                     template: Optional[str] = None) -> str:
    """``parser``'s feedback for ``errors``, optionally with another ``template``."""
    p = get_parser(parser)
    if template is not None:
        p = type(p)(feedback_template=template, example_call=p.example_call)
    return p.feedback_message(errors)


# ----------------------------------------------------------------------------------------------
# hermes
# ----------------------------------------------------------------------------------------------
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


# ----------------------------------------------------------------------------------------------
# json
# ----------------------------------------------------------------------------------------------
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


# ----------------------------------------------------------------------------------------------
# react
# ----------------------------------------------------------------------------------------------
_REACT_MARKER = re.compile(r"^[ \t]*(thought|action input|action|observation|final answer)[ \t]*:[ \t]*",
                           re.M | re.I)


@register_parser("react")
class ReactParser(ToolCallParser):
    """``Action: name`` / ``Action Input: {json}`` blocks (see the module docstring)."""

    def parse(self, text: str) -> ParseResult:
        text = text or ""
        # (kind, marker start, value start, value end): a value runs up to the next marker.
        marks = list(_REACT_MARKER.finditer(text))
        segs = [(m.group(1).lower(), m.start(), m.end(), marks[i + 1].start() if i + 1 < len(marks) else len(text))
                for i, m in enumerate(marks)]
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        removed: list[tuple[int, int]] = []
        i = 0
        while i < len(segs):
            kind, mstart, vstart, vend = segs[i]
            if kind == "final answer":
                break
            if kind == "action input":  # an input with no Action before it
                raw = text[mstart:vend].strip()
                errors.append(ParseError("missing_name", "found 'Action Input:' without an 'Action: <tool name>' "
                                                         "line before it", raw))
                removed.append((mstart, vend))
                i += 1
                continue
            if kind != "action":
                i += 1
                continue
            name_line = text[vstart:vend].split("\n", 1)[0].strip().strip("`'\"").strip()
            has_input = i + 1 < len(segs) and segs[i + 1][0] == "action input"
            if not has_input:
                raw = text[mstart:vend].strip()
                errors.append(ParseError("missing_arguments", f"'Action: {name_line}' must be followed by an "
                                                              "'Action Input:' line", raw))
                removed.append((mstart, vend))
                i += 1
                continue
            _, _, istart, iend = segs[i + 1]
            call_end, arguments, err = self._arguments(text, istart, iend, name_line)
            raw = text[mstart:call_end].strip()
            removed.append((mstart, call_end))
            i += 2
            if not name_line:
                errors.append(ParseError("missing_name", "'Action:' needs the tool name", raw))
            elif re.search(r"\s", name_line):
                errors.append(ParseError("invalid_name", "'Action:' must be just the tool name, "
                                                         f"got {_quote(name_line)}", raw))
            elif err is not None:
                err.raw = raw
                errors.append(err)
            else:
                calls.append(ToolCall(name=name_line, arguments=arguments, raw=raw))
        content, pos = [], 0
        for s, e in removed:
            content.append(text[pos:s])
            pos = e
        content.append(text[pos:])
        return ParseResult("".join(content).strip(), calls, errors)

    @staticmethod
    def _arguments(text: str, start: int, end: int, name: str) -> tuple[int, Optional[dict], Optional[ParseError]]:
        """(end of the consumed input, arguments, error) for the Action Input in ``text[start:end]``."""
        value = text[start:end]
        stripped = value.strip()
        if stripped.startswith("```"):
            stripped = _strip_fence(stripped)
            consumed = end
        else:
            consumed = None
        if stripped.startswith("{"):
            try:
                obj, used = json.JSONDecoder().raw_decode(stripped)
            except json.JSONDecodeError as e:
                return end, None, ParseError("invalid_json", f"the Action Input of {name!r} is not valid JSON "
                                                             f"({_json_error_message(e)}): {_quote(stripped)}")
            if consumed is None:  # text after the JSON object stays in content
                consumed = start + (len(value) - len(value.lstrip())) + used
            return consumed, obj, None
        if stripped.startswith('"'):
            try:
                s = json.loads(stripped)
                if isinstance(s, str):
                    return end, {"input": s}, None
            except json.JSONDecodeError:
                pass
        return end, ({"input": stripped} if stripped else {}), None

    @staticmethod
    def final_answer(text: str) -> Optional[str]:
        """The text after ``Final Answer:`` (``None`` when there is none)."""
        for m in _REACT_MARKER.finditer(text or ""):
            if m.group(1).lower() == "final answer":
                return text[m.end():].strip()
        return None

    def format_calls(self, calls: list[ToolCall], content: str = "") -> str:
        blocks = [f"Action: {call.name}\nAction Input: {json.dumps(call.arguments, ensure_ascii=False)}"
                  for call in calls]
        return "\n".join(([content.rstrip()] if content else []) + blocks)


# ----------------------------------------------------------------------------------------------
# openai
# ----------------------------------------------------------------------------------------------
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
