"""verl's side of the head-to-head bench: our calculator as a verl function tool
(``actor_rollout_ref.rollout.multi_turn.function_tool_path``), with our tool's schema and replies, so
verl's ``tool_agent`` and our ``task_agent`` offer the model the same tool and answer it the same way."""

from verl.tools.function_tool import function_tool

from verl_agentic.tools.calculator import CalculatorError, CalculatorTool, evaluate_expression, format_number


@function_tool(schema=CalculatorTool.DEFAULT_SCHEMA)
def calculator(expression: str = None) -> str:
    if expression is None:
        return "Error: calculator() needs an 'expression' argument, e.g. \"2 * (3 + 4)\"."
    if isinstance(expression, (int, float)) and not isinstance(expression, bool):
        expression = str(expression)
    try:
        return format_number(evaluate_expression(expression))
    except CalculatorError as e:
        return f"Error: {e}"
