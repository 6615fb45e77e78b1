"""``react``: ``Thought`` / ``Action`` / ``Action Input`` blocks; nothing after ``Final Answer:`` is a call."""

from __future__ import annotations

import json
import re
from typing import Optional

from verl_agentic.tools.parsers.base import (
    ParseError,
    ParseResult,
    ToolCall,
    ToolCallParser,
    _json_error_message,
    _quote,
    _strip_fence,
    register_parser,
)


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
