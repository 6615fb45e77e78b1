"""Tool-call parsers (verl_agentic.tools.parsers) on the real Qwen2.5 / Qwen3 chat templates.

The hermes parser must read back exactly what the official templates render for an assistant
message with ``tool_calls``; every parser's ``format_calls`` must round-trip through ``parse``;
malformed calls must give typed errors (never exceptions) while the good calls of the same turn
are kept.
"""

from __future__ import annotations

import json
import random
import re

import pytest

from verl_agentic.interfaces import ConfigError
from verl_agentic.tools.parsers import (
    PARSERS,
    HermesParser,
    JsonParser,
    OpenAIParser,
    ParseError,
    ParseResult,
    ReactParser,
    ToolCall,
    ToolCallParser,
    feedback_message,
    get_parser,
    register_parser,
)

BUILTIN = ["hermes", "json", "openai", "react"]
KNOWN_ERROR_TYPES = {"invalid_json", "missing_name", "invalid_name", "bad_arguments", "missing_arguments",
                     "not_an_object", "unclosed_tag", "stray_tag", "unknown_format"}

WEATHER_SCHEMA = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "units": {"type": "string"}},
                   "required": ["city"]}}}
SEARCH_SCHEMA = {"type": "function", "function": {
    "name": "search", "description": "Web search.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "filters": {"type": "object"}},
                   "required": ["query"]}}}

# Unicode, nesting, JSON escapes, every JSON scalar type.
CALLS = [
    ("get_weather", {"city": "Zürich", "units": "metric"}),
    ("search", {"query": "東京の天気 ☀️ — «ça va?»",
                "filters": {"lang": ["ja", "en"], "max": 3, "exact": True, "after": None, "score": 0.5,
                            "nested": {"deep": [{"a": []}, {}]}},
                "note": 'quote " backslash \\ newline\n tab\t'}),
]

GOOD = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
GOOD2 = '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>'


def hf_tool_calls(calls):
    return [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]


def assistant_turns(rendered: str) -> list[str]:
    """The text of each assistant turn: what the model generates after ``<|im_start|>assistant\\n``."""
    return re.findall(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", rendered, re.S)


def pairs(calls: list[ToolCall]):
    return [(c.name, c.arguments) for c in calls]


@pytest.fixture(params=["qwen25", "qwen3"])
def tokenizer(request):
    return request.getfixturevalue(f"{request.param}_tokenizer"), request.param


# ----------------------------------------------------------------------------------------------
# hermes on the real templates
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", ["Let me check both.", None])
def test_hermes_reads_what_the_real_template_renders(tokenizer, content):
    tok, which = tokenizer
    messages = [{"role": "user", "content": "Weather in Zürich, and search Tokyo?"},
                {"role": "assistant", "content": content, "tool_calls": hf_tool_calls(CALLS)}]
    rendered = tok.apply_chat_template(messages, tools=[WEATHER_SCHEMA, SEARCH_SCHEMA], tokenize=False)
    (turn,) = assistant_turns(rendered)

    result = get_parser("hermes").parse(turn)

    assert result.errors == [], result.errors
    assert pairs(result.calls) == CALLS
    assert all(c.id is None and c.raw in turn and c.raw.startswith("<tool_call>") for c in result.calls)
    # Qwen3 prefixes the last assistant turn with an empty think block; it is not tool-call markup.
    think = "<think>\n\n</think>\n\n" if which == "qwen3" else ""
    assert result.content == (think + (content or "")).strip()
    # format_calls is byte-identical to the template's rendering of the same calls.
    assert turn == think + get_parser("hermes").format_calls(
        [ToolCall(n, a) for n, a in CALLS], content=content or "")


def test_hermes_parsed_turn_re_renders_identically(tokenizer):
    """parse -> assistant_message() -> the real template gives back the very same text."""
    tok, _ = tokenizer
    user = {"role": "user", "content": "Weather in Zürich, and search Tokyo?"}
    original = [user, {"role": "assistant", "content": "On it.", "tool_calls": hf_tool_calls(CALLS)}]
    rendered = tok.apply_chat_template(original, tools=[WEATHER_SCHEMA], tokenize=False)
    result = get_parser("hermes").parse(assistant_turns(rendered)[0].replace("<think>\n\n</think>\n\n", ""))
    again = tok.apply_chat_template([user, result.assistant_message()], tools=[WEATHER_SCHEMA], tokenize=False)
    assert again == rendered


def test_string_arguments_render_differently_but_parse_the_same(qwen25_tokenizer, qwen3_tokenizer):
    """An HF message may carry ``arguments`` as a JSON string: Qwen2.5 tojson's it (a JSON string
    inside the call), Qwen3 pastes it raw (an object). Both must parse to the same dict."""
    args = {"query": "naïve café", "filters": {"max": 2}}
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"type": "function",
                                 "function": {"name": "search", "arguments": json.dumps(args, ensure_ascii=False)}}]}]
    t25 = assistant_turns(qwen25_tokenizer.apply_chat_template(messages, tools=[SEARCH_SCHEMA], tokenize=False))[0]
    t3 = assistant_turns(qwen3_tokenizer.apply_chat_template(messages, tools=[SEARCH_SCHEMA], tokenize=False))[0]
    assert '"arguments": "{\\"query\\"' in t25  # double-encoded
    assert '"arguments": {"query"' in t3  # raw
    for turn in (t25, t3):
        result = get_parser("hermes").parse(turn)
        assert result.errors == [] and pairs(result.calls) == [("search", args)], turn


def test_hermes_multi_turn_qwen3_conversation(qwen3_tokenizer):
    """Every assistant turn of a rendered Qwen3 tool conversation, reasoning included."""
    first = [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Berlin", "units": "imperial"})]
    second = [("search", {"query": "warmest city in Europe today"})]
    messages = [
        {"role": "user", "content": "Paris or Berlin: which is warmer? Then find the warmest city."},
        {"role": "assistant", "content": "", "tool_calls": hf_tool_calls(first)},
        {"role": "tool", "content": '{"temp_c": 21}'},
        {"role": "tool", "content": '{"temp_c": 18}'},
        {"role": "assistant", "content": "Paris is warmer.", "reasoning_content": "Now search.",
         "tool_calls": hf_tool_calls(second)},
        {"role": "tool", "content": "Seville, 31 °C"},
        {"role": "assistant", "content": "Paris (21 °C) beats Berlin; Seville is warmest."},
    ]
    rendered = qwen3_tokenizer.apply_chat_template(messages, tools=[WEATHER_SCHEMA, SEARCH_SCHEMA], tokenize=False)
    turns = assistant_turns(rendered)
    assert len(turns) == 3
    parser = get_parser("hermes")
    r1, r2, r3 = (parser.parse(t) for t in turns)
    assert pairs(r1.calls) == first and r1.content == "" and not r1.errors
    assert pairs(r2.calls) == second and not r2.errors
    assert r2.content == "<think>\nNow search.\n</think>\n\nParis is warmer."
    assert r3.calls == [] and r3.errors == [] and r3.content.endswith("Seville is warmest.")


def test_hermes_truncated_generation_at_every_length(qwen3_tokenizer):
    """A generation cut at any character: no exception, the closed calls are kept, an open tag is an error."""
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "Checking.", "tool_calls": hf_tool_calls(CALLS)}]
    turn = assistant_turns(qwen3_tokenizer.apply_chat_template(messages, tools=[WEATHER_SCHEMA], tokenize=False))[0]
    parser = get_parser("hermes")
    for n in range(len(turn) + 1):
        prefix = turn[:n]
        result = parser.parse(prefix)
        closed = prefix.count("</tool_call>")
        open_left = prefix.count("<tool_call>") > closed
        assert pairs(result.calls) == CALLS[:closed], prefix
        assert [e.type for e in result.errors] == (["unclosed_tag"] if open_left else []), prefix
        assert "<tool_call>" not in result.content


def test_hermes_allow_unclosed_accepts_complete_json_only():
    text = 'ok\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
    assert [e.type for e in get_parser("hermes").parse(text).errors] == ["unclosed_tag"]
    lenient = get_parser("hermes", allow_unclosed=True)
    result = lenient.parse(text)
    assert pairs(result.calls) == [("get_weather", {"city": "Oslo"})] and result.errors == []
    assert result.content == "ok"
    cut = lenient.parse('<tool_call>\n{"name": "get_weather", "argum')
    assert cut.calls == [] and [e.type for e in cut.errors] == ["unclosed_tag"]


def test_hermes_lenient_shapes():
    parser = get_parser("hermes")
    text = ('<tool_call>\n{"name": "a", "parameters": {"x": 1}}\n</tool_call>'  # parameters synonym
            '<tool_call>\n```json\n{"name": "b", "arguments": "{\\"y\\": [1]}"}\n```\n</tool_call>'  # fenced, str args
            '<tool_call>\n[{"name": "c", "arguments": {}}, {"name": "d"}]\n</tool_call>'  # list; no arguments
            '<tool_call>{"name": "e", "arguments": null}\n{"name": "f", "arguments": {"z": "w"}}</tool_call>'
            '<tool_call>{"type": "function", "function": {"name": "g", "arguments": {"k": 2}}}</tool_call>')
    result = parser.parse(text)
    assert result.errors == []
    assert pairs(result.calls) == [("a", {"x": 1}), ("b", {"y": [1]}), ("c", {}), ("d", {}), ("e", {}),
                                   ("f", {"z": "w"}), ("g", {"k": 2})]


# ----------------------------------------------------------------------------------------------
# format_calls -> parse, every parser
# ----------------------------------------------------------------------------------------------
CALL_SETS = {
    "one": [ToolCall("get_weather", {"city": "Paris"})],
    "several_unicode_nested": [ToolCall(n, a) for n, a in CALLS] + [ToolCall("noop", {})],
    "ids": [ToolCall("get_weather", {"city": "Lima"}, id="call_abc"), ToolCall("search", {"q": "é"}, id="call_2")],
}


@pytest.mark.parametrize("call_set", sorted(CALL_SETS))
@pytest.mark.parametrize("content", ["", "I will check the weather first."])
@pytest.mark.parametrize("name", BUILTIN)
def test_format_then_parse_round_trip(name, call_set, content):
    parser = get_parser(name)
    calls = CALL_SETS[call_set]
    text = parser.format_calls(calls, content=content)
    result = parser.parse(text)
    assert result.errors == [], f"{name}: {result.errors}\n{text}"
    assert pairs(result.calls) == pairs(calls), text
    assert result.content == content, text
    if name == "openai":  # the only format that carries ids; missing ones are generated
        assert [c.id for c in result.calls] == [c.id or f"call_{i}" for i, c in enumerate(calls)]
    else:
        assert all(c.id is None and c.raw and c.raw in text for c in result.calls)
    assert parser.format_calls(calls) == parser.format_calls(calls, content="")


def test_every_registered_builtin_is_present():
    assert set(BUILTIN) <= set(PARSERS.names())


# ----------------------------------------------------------------------------------------------
# malformed input: typed errors, no exceptions, good calls kept
# ----------------------------------------------------------------------------------------------
def openai_msg(*tool_calls, content=None) -> str:
    return json.dumps({"role": "assistant", "content": content, "tool_calls": list(tool_calls)})


def oa_call(name="get_weather", arguments='{"city": "Paris"}', id="c1", type="function"):
    return {"id": id, "type": type, "function": {"name": name, "arguments": arguments}}


MALFORMED = {
    # name: (parser, text, expected error types in order, expected good call names)
    "hermes-invalid-json": ("hermes",
                            GOOD + '\n<tool_call>\n{"name": "x", "arguments": {"a": 1}\n</tool_call>\n' + GOOD2,
                            ["invalid_json"], ["get_weather", "search"]),
    "hermes-missing-name": ("hermes", GOOD + '\n<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>',
                            ["missing_name"], ["get_weather"]),
    "hermes-empty-name": ("hermes", '<tool_call>{"name": "  ", "arguments": {}}</tool_call>' + GOOD,
                          ["missing_name"], ["get_weather"]),
    "hermes-args-list": ("hermes", '<tool_call>\n{"name": "x", "arguments": [1, 2]}\n</tool_call>\n' + GOOD,
                         ["bad_arguments"], ["get_weather"]),
    "hermes-args-bad-string": ("hermes", GOOD + '<tool_call>{"name": "x", "arguments": "{city: Paris}"}</tool_call>',
                               ["bad_arguments"], ["get_weather"]),
    "hermes-not-object": ("hermes", '<tool_call>\n"get_weather"\n</tool_call>' + GOOD, ["not_an_object"],
                          ["get_weather"]),
    "hermes-unclosed-end": ("hermes", GOOD + '\n<tool_call>\n{"name": "search", "argu', ["unclosed_tag"],
                            ["get_weather"]),
    "hermes-unclosed-before-next": ("hermes", '<tool_call>\n{"name": "x", "arguments": {}}\n' + GOOD,
                                    ["unclosed_tag"], ["get_weather"]),
    "hermes-garbage": ("hermes", "<tool_call>I want the weather tool please</tool_call>\n" + GOOD2,
                       ["invalid_json"], ["search"]),
    "hermes-stray-close": ("hermes", '{"name": "x", "arguments": {}}\n</tool_call>\n' + GOOD, ["stray_tag"],
                           ["get_weather"]),
    "json-invalid-json": ("json", '```json\n{"name": "x", "arguments": {"a": }}\n```\n```json\n'
                                  '{"name": "search", "arguments": {}}\n```', ["invalid_json"], ["search"]),
    "json-missing-name": ("json", '```json\n[{"arguments": {}}, {"name": "search", "arguments": {}}]\n```',
                          ["missing_name"], ["search"]),
    "json-args-not-object": ("json", '```json\n{"name": "x", "arguments": 5}\n```\n```\n'
                                     '{"name": "search", "arguments": {"q": 1}}\n```', ["bad_arguments"], ["search"]),
    "json-unclosed-fence": ("json", '```json\n{"name": "search", "arguments": {}}\n```\n```json\n{"name": "x", ',
                            ["unclosed_tag"], ["search"]),
    "json-garbage-fence": ("json", "```json\ncall the search tool\n```", ["invalid_json"], []),
    "json-bare-truncated": ("json", '{"name": "search", "arguments": {"q": ', ["invalid_json"], []),
    "react-invalid-json": ("react", 'Action: get_weather\nAction Input: {"city": Paris}\nAction: search\n'
                                    'Action Input: {"query": "x"}', ["invalid_json"], ["search"]),
    "react-missing-name": ("react", 'Thought: hmm\nAction:\nAction Input: {"a": 1}\nAction: search\n'
                                    'Action Input: {"query": "x"}', ["missing_name"], ["search"]),
    "react-input-without-action": ("react", 'Action Input: {"a": 1}\nAction: search\nAction Input: x',
                                   ["missing_name"], ["search"]),
    "react-missing-input": ("react", "Action: get_weather\nObservation: none\nAction: search\nAction Input: x",
                            ["missing_arguments"], ["search"]),
    "react-sentence-as-name": ("react", "Action: I will look up the weather\nAction Input: {}\n"
                                        "Action: search\nAction Input: x", ["invalid_name"], ["search"]),
    "openai-invalid-json": ("openai", '{"role": "assistant", "tool_calls": [', ["invalid_json"], []),
    "openai-garbage": ("openai", "I would call get_weather now.", ["unknown_format"], []),
    "openai-missing-name": ("openai", openai_msg(oa_call(name=None), oa_call(id="c2")), ["missing_name"],
                            ["get_weather"]),
    "openai-args-not-json": ("openai", openai_msg(oa_call(arguments="{city: Paris"), oa_call(id="c2")),
                             ["bad_arguments"], ["get_weather"]),
    "openai-args-not-object": ("openai", openai_msg(oa_call(arguments="[1, 2]"), oa_call(id="c2")),
                               ["bad_arguments"], ["get_weather"]),
    "openai-no-function": ("openai", openai_msg({"id": "c0", "type": "function"}, oa_call()), ["missing_name"],
                           ["get_weather"]),
    "openai-wrong-type": ("openai", openai_msg(oa_call(type="code_interpreter"), oa_call(id="c2")),
                          ["unknown_format"], ["get_weather"]),
    "openai-item-not-object": ("openai", openai_msg("get_weather", oa_call()), ["not_an_object"], ["get_weather"]),
    "openai-tool-calls-not-list": ("openai", json.dumps({"role": "assistant", "content": "hi", "tool_calls": "x"}),
                                   ["unknown_format"], []),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_calls_give_typed_errors(case):
    name, text, error_types, good = MALFORMED[case]
    parser = get_parser(name)
    result = parser.parse(text)
    assert [e.type for e in result.errors] == error_types, result.errors
    assert [c.name for c in result.calls] == good, result.calls
    for e in result.errors:
        assert e.message and e.raw, e
        assert len(e.message) < 300, e.message
    feedback = parser.feedback_message(result.errors)
    assert result.errors[0].message in feedback and parser.example() in feedback
    if name == "hermes":
        assert "<tool_call>" not in result.content


def test_non_call_text_is_content_without_errors():
    for name in ("hermes", "json", "react"):
        result = get_parser(name).parse("  The answer is 42.\n")
        assert result == ParseResult("The answer is 42.", [], []), name
    assert get_parser("openai").parse_message({"role": "assistant", "content": " 42 "}) == ParseResult("42", [], [])


@pytest.mark.parametrize("name", BUILTIN)
def test_random_markup_never_raises(name):
    pieces = ["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"name"', '"arguments"', '"parameters"', ":", ",",
              '"x"', "null", "1", '"', "\\", "```json", "```", "\n", "Action:", "Action Input:", "Final Answer:",
              "Thought:", '"tool_calls"', '"function"', "é", " "]
    rng = random.Random(1234)
    parser = get_parser(name)
    for _ in range(400):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        result = parser.parse(text)
        assert isinstance(result, ParseResult) and isinstance(result.content, str)
        assert all(isinstance(c.name, str) and c.name and isinstance(c.arguments, dict) for c in result.calls), text
        assert all(e.type in KNOWN_ERROR_TYPES and e.message for e in result.errors), (text, result.errors)


# ----------------------------------------------------------------------------------------------
# format specifics
# ----------------------------------------------------------------------------------------------
def test_json_parser_shapes():
    p = get_parser("json")
    bare = p.parse(' {"name": "search", "arguments": {"q": "x"}} ')
    assert pairs(bare.calls) == [("search", {"q": "x"})] and bare.content == "" and not bare.errors
    listed = p.parse('[{"name": "a", "arguments": {}}, {"name": "b", "parameters": {"k": 1}}]')
    assert pairs(listed.calls) == [("a", {}), ("b", {"k": 1})]
    mixed = p.parse('Here is code:\n```python\nprint({"name": 1})\n```\nand data:\n```\n{"temp": 3}\n```\n'
                    'Calling:\n```\n{"name": "search", "arguments": {"q": "y"}}\n```')
    assert pairs(mixed.calls) == [("search", {"q": "y"})] and not mixed.errors
    assert "```python" in mixed.content and '{"temp": 3}' in mixed.content and '"search"' not in mixed.content
    data = p.parse('{"answer": 42}')  # JSON that is not a call is an answer, not an error
    assert data.calls == [] and data.errors == [] and data.content == '{"answer": 42}'


def test_react_parser_shapes():
    p = get_parser("react")
    text = ('Thought: I need two lookups.\nAction: get_weather\nAction Input: Paris\n'
            'Action: search\nAction Input: "best café"\nAction: calc\nAction Input: ```json\n{"expr": "2+2"}\n```\n'
            'Action: noop\nAction Input:\n')
    result = p.parse(text)
    assert result.errors == []
    assert pairs(result.calls) == [("get_weather", {"input": "Paris"}), ("search", {"input": "best café"}),
                                   ("calc", {"expr": "2+2"}), ("noop", {})]
    assert result.content == "Thought: I need two lookups."
    trailing = p.parse('Action: search\nAction Input: {"q": "x"} and then I wait.')
    assert pairs(trailing.calls) == [("search", {"q": "x"})] and trailing.content == "and then I wait."


def test_react_final_answer_means_no_call():
    p = get_parser("react")
    text = "Thought: I know it.\nFinal Answer: 42\nAction: search\nAction Input: {}"
    result = p.parse(text)
    assert result.calls == [] and result.errors == [] and result.content == text
    assert ReactParser.final_answer(text) == "42\nAction: search\nAction Input: {}"
    assert ReactParser.final_answer("Thought: no") is None


def test_openai_message_shapes():
    p = get_parser("openai")
    assert isinstance(p, OpenAIParser)
    message = {"role": "assistant", "content": [{"type": "text", "text": "Checking "}, {"type": "text", "text": "now"}],
               "tool_calls": [oa_call(id="call_9"),
                              {"id": "call_10", "type": "function",
                               "function": {"name": "search", "arguments": {"q": "dict args"}}}]}
    result = p.parse_message(message)
    assert result.content == "Checking now" and not result.errors
    assert [(c.id, c.name, c.arguments) for c in result.calls] == [("call_9", "get_weather", {"city": "Paris"}),
                                                                   ("call_10", "search", {"q": "dict args"})]
    assert p.parse(message) == result  # a dict goes to parse_message
    response = {"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0, "message": message}]}
    assert p.parse(json.dumps(response)) == result
    legacy = p.parse_message({"role": "assistant", "content": None,
                              "function_call": {"name": "search", "arguments": '{"q": 1}'}})
    assert pairs(legacy.calls) == [("search", {"q": 1})] and legacy.calls[0].id is None
    assert p.parse_message({"role": "assistant", "content": "plain"}) == ParseResult("plain", [], [])
    assert p.parse_message(["not", "a", "dict"]).errors[0].type == "unknown_format"


def test_to_hf_and_to_openai():
    c = ToolCall("search", {"q": "é"}, id="call_1")
    assert c.to_hf() == {"type": "function", "function": {"name": "search", "arguments": {"q": "é"}}, "id": "call_1"}
    assert c.to_openai() == {"id": "call_1", "type": "function",
                             "function": {"name": "search", "arguments": '{"q": "é"}'}}
    assert ParseResult("hi").assistant_message() == {"role": "assistant", "content": "hi"}


# ----------------------------------------------------------------------------------------------
# feedback
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", BUILTIN)
def test_feedback_example_is_a_valid_call_in_that_format(name):
    parser = get_parser(name)
    example = parser.parse(parser.example())
    assert example.errors == [] and pairs(example.calls) == [("tool_name", {"argument": "value"})]


def test_feedback_message_default_custom_and_empty():
    hermes = get_parser("hermes")
    errors = hermes.parse(GOOD + '<tool_call>{"name": "x", "arguments": [1]}</tool_call>'
                                 '<tool_call>{"name": "x", "arguments": [1]}</tool_call>').errors
    assert len(errors) == 2
    msg = hermes.feedback_message(errors)
    assert msg.startswith("Your tool call could not be parsed: ")
    assert msg.count("must be a JSON object") == 1  # identical reasons are said once
    assert msg.endswith('<tool_call>\n{"name": "tool_name", "arguments": {"argument": "value"}}\n</tool_call>')
    assert hermes.feedback_message([]) == ""

    custom = get_parser("hermes", feedback_template="Bad call ({reasons}). Example: {example}",
                        example_call=ToolCall("get_weather", {"city": "Rome"}))
    msg = custom.feedback_message(errors)
    assert msg.startswith("Bad call (") and '{"name": "get_weather", "arguments": {"city": "Rome"}}' in msg

    react_msg = feedback_message([ParseError("invalid_json", "broken input")], "react")
    assert "broken input" in react_msg and "Action Input:" in react_msg
    templated = feedback_message([ParseError("missing_name", "no name")], "json", template="{reasons}|{example}")
    assert templated.startswith("no name|```json")


# ----------------------------------------------------------------------------------------------
# registry
# ----------------------------------------------------------------------------------------------
def test_unknown_parser_lists_registered_ones():
    with pytest.raises(ConfigError) as e:
        get_parser("hermes2")
    message = str(e.value)
    assert "hermes2" in message
    for name in BUILTIN:
        assert name in message


def test_get_parser_instances_and_options():
    classes = {"hermes": HermesParser, "json": JsonParser, "react": ReactParser, "openai": OpenAIParser}
    for name, cls in classes.items():
        p = get_parser(name)
        assert type(p) is cls and p.name == name
        assert get_parser(name) is not p  # a fresh instance each time
        assert get_parser(p) is p
    with pytest.raises(ConfigError, match="bad options"):
        get_parser("json", no_such_option=True)


def test_register_custom_parser():
    @register_parser("_test_upper")
    class Upper(ToolCallParser):
        def parse(self, text):
            name, _, arg = (text or "").partition(" ")
            return ParseResult("", [ToolCall(name.lower(), {"arg": arg})], [])

        def format_calls(self, calls, content=""):
            return "\n".join(f"{c.name.upper()} {c.arguments['arg']}" for c in calls)

    try:
        p = get_parser("_test_upper")
        assert p.name == "_test_upper" and "_test_upper" in PARSERS.names()
        assert pairs(p.parse("SEARCH x").calls) == [("search", {"arg": "x"})]
        with pytest.raises(ConfigError, match="registered twice"):
            register_parser("_test_upper")(type("Other", (ToolCallParser,), {}))
    finally:
        PARSERS.unregister("_test_upper")
    assert "_test_upper" not in PARSERS.names()
