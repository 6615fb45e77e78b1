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

One module per format: ``hermes``, ``json_block`` (``json``), ``react``, ``openai``, ``python_code``
(fenced ```` ```python ```` blocks as calls of the ``python`` tool); ``base`` holds what they share.
"""

from verl_agentic.tools.parsers.base import (
    DEFAULT_FEEDBACK_TEMPLATE,
    PARSERS,
    ParseError,
    ParseResult,
    ToolCall,
    ToolCallParser,
    feedback_message,
    get_parser,
    register_parser,
)
from verl_agentic.tools.parsers.hermes import HermesParser
from verl_agentic.tools.parsers.json_block import JsonParser
from verl_agentic.tools.parsers.openai import OpenAIParser
from verl_agentic.tools.parsers.python_code import PythonCodeBlockParser
from verl_agentic.tools.parsers.react import ReactParser

__all__ = [
    "ToolCall", "ParseError", "ParseResult", "ToolCallParser", "HermesParser", "JsonParser", "ReactParser",
    "OpenAIParser", "PythonCodeBlockParser", "PARSERS", "register_parser", "get_parser", "feedback_message",
    "DEFAULT_FEEDBACK_TEMPLATE",
]
