"""The calculator: safe ``ast`` evaluation, bounded work, clear errors, and the tool API."""

from __future__ import annotations

import math
import time

import pytest

from verl_agentic.tools import load_tools
from verl_agentic.tools.calculator import (
    MAX_EXPRESSION_CHARS,
    MAX_INT_BITS,
    CalculatorError,
    CalculatorTool,
    evaluate_expression,
    format_number,
)


@pytest.mark.parametrize("expr, expected", [
    ("1 + 2 * 3", 7),
    ("(1 + 2) * 3", 9),
    ("2 * (3 + 4) ** 2 / 7", 14.0),
    ("7 / 2", 3.5),
    ("7 // 2", 3),
    ("-7 // 2", -4),
    ("7 % 3", 1),
    ("2 ** 10", 1024),
    ("2 ^ 10", 1024),  # a model's ^ means power
    ("-3 ** 2", -9),
    ("+-+4", -4),
    ("-" * 499 + "1", -1),
    ("1_000 * 1e-3", 1.0),
    ("2 ** -2", 0.25),
    ("sqrt(16) + abs(-2.5)", 6.5),
    ("round(2.675, 2)", 2.67),  # binary floating point, as Python
    ("round(7.5)", 8),
    ("min(3, 1, 2) + max(4, 9)", 10),
    ("floor(2.7) + ceil(2.1)", 5),
    ("log(8, 2)", 3.0),
    ("log10(1000) + log2(8)", 6.0),
    ("factorial(5) / gcd(12, 18)", 20.0),
    ("hypot(3, 4)", 5.0),
    ("12 × 3 ÷ 4", 9.0),
    ("2 ** 4095 // 2 ** 4094", 2),
    ("(-1) ** (10 ** 100)", 1),
])
def test_values(expr, expected):
    value = evaluate_expression(expr)
    assert value == expected and type(value) is type(expected), (expr, value)


def test_constants_and_float_functions():
    assert evaluate_expression("pi") == math.pi and evaluate_expression("e") == math.e
    assert math.isclose(evaluate_expression("sin(pi / 6)"), 0.5)
    assert math.isclose(evaluate_expression("exp(log(10))"), 10.0)


@pytest.mark.parametrize("expr, message", [
    ("", "empty expression"),
    ("2 +", "invalid expression"),
    ("1 / 0", "division by zero"),
    ("5 // 0", "division by zero"),
    ("5 % 0", "modulo by zero"),
    ("0 ** -1", "negative power"),
    ("x + 1", "unknown name 'x'"),
    ("sqrt", "is a function"),
    ("sqrt(-1)", "math domain error"),
    ("log(0)", "math domain error"),
    ("(-8) ** (1 / 3)", "not a real number"),
    ("9 ** 9 ** 9", "result too large"),
    ("2 ** 4096", "result too large"),
    ("(2 ** 2048) * (2 ** 2048)", "result too large"),
    ("2.0 ** 100000", "overflow"),
    ("exp(1000)", "overflow"),
    ("1e308 * 10", "not a finite number"),
    ("factorial(100000)", "factorial() argument too large"),
    ("factorial(-1)", "non-negative integer"),
    ("factorial(2.5)", "non-negative integer"),
    ("gcd(1.5, 2)", "integer arguments"),
    ("round(2.5, 1.5)", "must be an integer"),
    ("sqrt(1, 2)", "takes 1 argument(s), got 2"),
    ("round(x=1)", "keyword arguments"),
    ("max(*[1, 2])", "* arguments"),
    ("'abc'", "only numbers"),
    ("True + 1", "only numbers"),
    ("1 < 2", "Compare"),
    ("[1, 2]", "List"),
    ("1 if 1 else 2", "IfExp"),
    ("lambda: 1", "Lambda"),
    ("(1).__class__", "Attribute"),
    ("__import__('os').system('echo hacked')", "unknown function"),
    ("open('/etc/passwd')", "unknown function"),
    ("1 << 100", "operator not allowed"),
    ("~1", "operator not allowed"),
    ("(" * 240 + "1" + ")" * 240, "too many nested parentheses"),
])
def test_errors(expr, message):
    with pytest.raises(CalculatorError) as e:
        evaluate_expression(expr)
    assert message in str(e.value), str(e.value)


def test_expression_length_limit():
    ok = "+".join(["1"] * (MAX_EXPRESSION_CHARS // 2))  # just under the limit
    assert evaluate_expression(ok) == MAX_EXPRESSION_CHARS // 2
    with pytest.raises(CalculatorError, match="too long"):
        evaluate_expression(ok + "+1+1")


def test_expensive_expressions_are_refused_fast():
    hostile = ["9**9**9", "10**10**10", "(2**4000)**(2**4000)", "factorial(10**9)", "2**4000 * 2**4000 * 2**4000",
               "((((((((((7**7)**7)**7)**7)**7)**7)**7)**7)**7)**7)"]
    t0 = time.perf_counter()
    for expr in hostile:
        with pytest.raises(CalculatorError):
            evaluate_expression(expr)
    assert time.perf_counter() - t0 < 0.1  # refused before computing, not after


def test_results_stay_bounded():
    value = evaluate_expression("2 ** 4095")
    assert value.bit_length() <= MAX_INT_BITS


def test_no_eval_side_effects(tmp_path):
    target = tmp_path / "pwned"
    with pytest.raises(CalculatorError):
        evaluate_expression(f"__import__('pathlib').Path({str(target)!r}).touch()")
    assert not target.exists()


def test_format_number():
    assert format_number(14.0) == "14"
    assert format_number(evaluate_expression("0.1 + 0.2")) == "0.3"
    assert format_number(7) == "7"
    assert format_number(1.5e20) == "1.5e+20"
    assert format_number(2 / 3) == "0.666666666666667"


async def test_tool_api():
    (tool,) = load_tools(["calculator"])
    assert isinstance(tool, CalculatorTool) and tool.name == "calculator"
    schema = tool.get_openai_tool_schema()["function"]
    assert schema["parameters"]["required"] == ["expression"]

    iid = await tool.create()
    r = await tool.execute(iid, {"expression": "(12 * 7 + 5) / 2"})
    assert (r.text, r.status, r.metrics["value"]) == ("44.5", "ok", 44.5)
    r = await tool.execute(iid, {"expression": "9**9**9"})
    assert r.status == "error" and r.text.startswith("Error: result too large")
    r = await tool.execute(iid, {"expression": "import os"})
    assert r.status == "error" and "invalid expression" in r.text
    r = await tool.execute(iid, {"expression": 42})  # a number passed as a JSON number
    assert (r.text, r.status) == ("42", "ok")
    r = await tool.execute(iid, {"expr": "1 + 1"})
    assert r.status == "error" and "'expression'" in r.text
    r = await tool.execute(iid, {"expression": "2 ** 4095"})
    assert r.status == "ok" and "value" not in r.metrics and r.text == str(2 ** 4095)
    assert await tool.calc_reward(iid) == 0.0
    await tool.release(iid)
