"""What every tool-call format shares: ``ToolCall``, ``ParseError``, ``ParseResult``, the ``ToolCallParser``
base class, the JSON helpers of the formats, and the ``PARSERS`` registry (``register_parser``,
``get_parser``). The built-in formats are entry points of ``verl_agentic.tool_parsers``, like a plugin's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from verl_agentic.interfaces import ConfigError
from verl_agentic.registry import Registry

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
