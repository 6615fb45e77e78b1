"""Safe arithmetic: ``evaluate_expression`` and the ``calculator`` tool built on it.

The expression is parsed with ``ast`` (``mode="eval"``) and walked node by node; nothing is
ever passed to ``eval``/``exec``. Allowed:

* numbers (int, float; ``1_000``, ``1e-3``), and the constants ``pi``, ``e``, ``tau``;
* ``+ - * / // % **``, unary ``+``/``-``, parentheses;
* the functions ``abs round min max sqrt floor ceil exp log log2 log10 sin cos tan asin acos
  atan hypot factorial gcd`` (``log(x, base)`` too), with positional arguments only.

Anything else (names, attributes, strings, comparisons, ``**`` with a large exponent,
keyword arguments, ...) is a ``CalculatorError`` with a message saying what is wrong.

Work is bounded before it is done: at most ``MAX_EXPRESSION_CHARS`` characters (which also
bounds the nesting, so the recursion), integer results of at most ``MAX_INT_BITS`` bits
(checked *before* a power, product or factorial is computed, so ``9**9**9`` is refused in
microseconds), ``factorial`` up to ``MAX_FACTORIAL``. Float overflow and domain errors
(``sqrt(-1)``, ``1/0``) are errors. ``^`` is read as ``**`` (a model's power sign), and
``×``/``÷`` as ``*``/``/``.

    >>> evaluate_expression("2 * (3 + 4) ** 2 / 7")
    14.0
    >>> format_number(evaluate_expression("0.1 + 0.2"))
    '0.3'
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable, Optional, Union

from verl_agentic.tools.base import BaseTool, ToolResult
from verl_agentic.tools.registry import register_tool_class

__all__ = ["CalculatorError", "CalculatorTool", "evaluate_expression", "format_number"]

Number = Union[int, float]

MAX_EXPRESSION_CHARS = 500
MAX_DEPTH = MAX_EXPRESSION_CHARS  # node nesting; a 500-character sum of 1s nests 249 deep
MAX_INT_BITS = 4096  # about 1233 decimal digits
MAX_FACTORIAL = 450  # 450! has ~3600 bits

CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}


class CalculatorError(ValueError):
    """A bad or too expensive expression; the message is meant for the model."""


def _check_int(value: Number) -> Number:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalculatorError(f"result too large (more than {MAX_INT_BITS} bits)")
    return value


def _pow(a: Number, b: Number) -> Number:
    if isinstance(a, int) and isinstance(b, int):
        if b < 0:
            if a == 0:
                raise CalculatorError("0 cannot be raised to a negative power")
            if abs(b) > MAX_INT_BITS and abs(a) > 1:
                raise CalculatorError(f"exponent {b} is too large in magnitude")
            return a ** b  # a float (an OverflowError is reported by the caller)
        if abs(a) > 1 and (abs(a).bit_length() - 1) * b > MAX_INT_BITS:
            raise CalculatorError(f"result too large: {a} ** {b} would exceed {MAX_INT_BITS} bits")
        return a ** b
    try:
        result = float(a) ** float(b)
    except OverflowError:
        raise CalculatorError(f"overflow: {a} ** {b} is too large") from None
    except ZeroDivisionError:
        raise CalculatorError("0 cannot be raised to a negative power") from None
    if isinstance(result, complex):
        raise CalculatorError(f"({a}) ** ({b}) is not a real number")
    return result


def _mul(a: Number, b: Number) -> Number:
    if isinstance(a, int) and isinstance(b, int) and a.bit_length() + b.bit_length() > MAX_INT_BITS + 1:
        raise CalculatorError(f"result too large (more than {MAX_INT_BITS} bits)")
    return a * b


def _div(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalculatorError("division by zero")
    return a / b


def _floordiv(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalculatorError("division by zero")
    return a // b


def _mod(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalculatorError("modulo by zero")
    return a % b


_BINOPS: dict[type, tuple[str, Callable[[Number, Number], Number]]] = {
    ast.Add: ("+", operator.add), ast.Sub: ("-", operator.sub), ast.Mult: ("*", _mul),
    ast.Div: ("/", _div), ast.FloorDiv: ("//", _floordiv), ast.Mod: ("%", _mod), ast.Pow: ("**", _pow),
}
_UNARYOPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _factorial(n: Number) -> int:
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if not isinstance(n, int) or n < 0:
        raise CalculatorError("factorial() needs a non-negative integer")
    if n > MAX_FACTORIAL:
        raise CalculatorError(f"factorial() argument too large (at most {MAX_FACTORIAL})")
    return math.factorial(n)


def _log(x: Number, base: Optional[Number] = None) -> float:
    return math.log(x) if base is None else math.log(x, base)


def _round(x: Number, ndigits: Optional[Number] = None) -> Number:
    if ndigits is None:
        return round(x)
    if not isinstance(ndigits, int):
        raise CalculatorError("round(): the number of digits must be an integer")
    return round(x, ndigits)


def _int_args(fn: Callable) -> Callable:
    def wrapped(*args: Number) -> int:
        if not all(isinstance(a, int) for a in args):
            raise CalculatorError(f"{fn.__name__}() needs integer arguments")
        return fn(*args)
    return wrapped


# name -> (function, min args, max args or None for any)
FUNCTIONS: dict[str, tuple[Callable, int, Optional[int]]] = {
    "abs": (abs, 1, 1), "round": (_round, 1, 2), "min": (lambda *a: min(a), 1, None),
    "max": (lambda *a: max(a), 1, None),
    "sqrt": (math.sqrt, 1, 1), "floor": (math.floor, 1, 1), "ceil": (math.ceil, 1, 1),
    "exp": (math.exp, 1, 1), "log": (_log, 1, 2), "log2": (math.log2, 1, 1), "log10": (math.log10, 1, 1),
    "sin": (math.sin, 1, 1), "cos": (math.cos, 1, 1), "tan": (math.tan, 1, 1), "asin": (math.asin, 1, 1),
    "acos": (math.acos, 1, 1), "atan": (math.atan, 1, 1), "hypot": (math.hypot, 1, None),
    "factorial": (_factorial, 1, 1), "gcd": (_int_args(math.gcd), 1, None),
}


def _describe(node: ast.AST) -> str:
    try:
        return repr(ast.unparse(node))
    except (AttributeError, TypeError, ValueError, RecursionError):  # a node unparse cannot write: its type
        return type(node).__name__


def _eval(node: ast.AST, depth: int) -> Number:
    if depth > MAX_DEPTH:
        raise CalculatorError(f"expression nested too deeply (more than {MAX_DEPTH} levels)")
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalculatorError(f"only numbers are allowed, got {_describe(node)}")
        return _check_int(node.value)
    if isinstance(node, ast.BinOp):
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise CalculatorError(f"operator not allowed in {_describe(node)} (allowed: + - * / // % **)")
        left, right = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        try:
            return _check_float(_check_int(op[1](left, right)), node)
        except OverflowError:
            raise CalculatorError(f"overflow in {_describe(node)}") from None
    if isinstance(node, ast.UnaryOp):
        fn = _UNARYOPS.get(type(node.op))
        if fn is None:
            raise CalculatorError(f"operator not allowed in {_describe(node)} (allowed: unary + and -)")
        return fn(_eval(node.operand, depth + 1))
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if node.id in FUNCTIONS:
            raise CalculatorError(f"{node.id} is a function: call it, e.g. {node.id}(2)")
        raise CalculatorError(f"unknown name {node.id!r} (constants: {', '.join(CONSTANTS)})")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise CalculatorError(f"unknown function in {_describe(node)}; allowed: {', '.join(FUNCTIONS)}")
        name = node.func.id
        if node.keywords:
            raise CalculatorError(f"{name}(): keyword arguments are not allowed")
        fn, lo, hi = FUNCTIONS[name]
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise CalculatorError(f"{name}(): * arguments are not allowed")
        if len(node.args) < lo or (hi is not None and len(node.args) > hi):
            want = f"{lo}" if lo == hi else (f"at least {lo}" if hi is None else f"{lo} to {hi}")
            raise CalculatorError(f"{name}() takes {want} argument(s), got {len(node.args)}")
        args = [_eval(a, depth + 1) for a in node.args]
        try:
            return _check_float(_check_int(fn(*args)), node)
        except CalculatorError:
            raise
        except OverflowError:
            raise CalculatorError(f"overflow in {_describe(node)}") from None
        except (ValueError, TypeError, ZeroDivisionError) as e:
            raise CalculatorError(f"{name}(): {e} (in {_describe(node)})") from None
    raise CalculatorError(f"not allowed in a calculator expression: {_describe(node)} "
                          f"({type(node).__name__}); use numbers, + - * / // % **, parentheses and "
                          f"{', '.join(FUNCTIONS)}")


def _check_float(value: Number, node: ast.AST) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError(f"result of {_describe(node)} is not a finite number")
    return value


def evaluate_expression(expression: str) -> Number:
    """The value of an arithmetic expression; ``CalculatorError`` (a ValueError) if bad or too big."""
    if not isinstance(expression, str):
        raise CalculatorError(f"the expression must be a string, got {type(expression).__name__}")
    text = expression.strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression too long ({len(text)} characters, at most {MAX_EXPRESSION_CHARS})")
    text = text.replace("^", "**").replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"invalid expression: {e.msg}" + (f" at column {e.offset}" if e.offset else "")) from None
    except (ValueError, RecursionError, MemoryError) as e:
        raise CalculatorError(f"invalid expression: {e}") from None
    try:
        return _eval(tree.body, 0)
    except RecursionError:
        raise CalculatorError("expression nested too deeply") from None


def format_number(value: Number) -> str:
    """``14``, ``0.3`` (15 significant digits, so 0.1 + 0.2 reads 0.3), ``1.5e+20``."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, ".15g")


@register_tool_class("calculator")
class CalculatorTool(BaseTool):
    """Evaluates an arithmetic expression (see the module docstring for what is allowed)."""

    DEFAULT_SCHEMA = {"type": "function", "function": {
        "name": "calculator",
        "description": ("Evaluate an arithmetic expression and return the number. Supports + - * / // % ** "
                        "(or ^), parentheses, pi, e, and abs, round, min, max, sqrt, floor, ceil, exp, log, "
                        "log2, log10, sin, cos, tan, asin, acos, atan, hypot, factorial, gcd."),
        "parameters": {"type": "object", "properties": {
            "expression": {"type": "string", "description": "e.g. \"(12 * 7 + 5) / 2\" or \"sqrt(2) * 3\""}},
            "required": ["expression"]}}}

    async def execute(self, instance_id: str, parameters: dict, **kwargs: Any) -> ToolResult:
        expression = parameters.get("expression") if isinstance(parameters, dict) else None
        if expression is None:
            return ToolResult("Error: calculator() needs an 'expression' argument, e.g. \"2 * (3 + 4)\".",
                              status="error")
        if isinstance(expression, (int, float)) and not isinstance(expression, bool):
            expression = str(expression)
        try:
            value = evaluate_expression(expression)
        except CalculatorError as e:
            return ToolResult(f"Error: {e}", status="error", metrics={"ok": False})
        metrics: dict = {"ok": True}
        if isinstance(value, float) or value.bit_length() < 1000:
            metrics["value"] = float(value)
        return ToolResult(format_number(value), metrics=metrics)
