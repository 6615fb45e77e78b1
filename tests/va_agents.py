"""Test doubles and data shared by the agent tests (test_agent_gateway, test_agent_examples,
test_verl_agent_loop): a module of its own, so that registering the tests' agents happens once."""

from __future__ import annotations

from verl_agentic.backends.base import GenerationBackend
from verl_agentic.interfaces import GenOutput
from verl_agentic.tools.calculator import CalculatorTool

PROBLEMS = {"Q1: 12 loaves a day for 7 days?": ("12*7", "84"), "Q2: 45 stickers, 17 given away?": ("45-17", "28")}
CALCULATOR = CalculatorTool().get_openai_tool_schema()
if hasattr(CALCULATOR, "model_dump"):
    CALCULATOR = CALCULATOR.model_dump(exclude_none=True)


class ScriptedCalculatorPolicy(GenerationBackend):
    """TEST DOUBLE for the model: on a problem's first turn it calls the calculator with the problem's
    expression, after that it answers ``#### <value>`` (the episode found by its question, the turn by
    the assistant turns in the context). Each reply is the real tokenizer's ids plus ``<|im_end|>``."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.stop_token_ids = [self.end_id]
        self.replies: list[list[int]] = []

    async def generate(self, prompt_ids, sampling):
        context = self.tokenizer.decode(prompt_ids)
        question = next(q for q in PROBLEMS if q in context)
        expression, value = PROBLEMS[question]
        turn = context.count("<|im_start|>assistant") - 1
        reply = (f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'
                 if turn == 0 else f"The answer is {value}.\n#### {value}")
        ids = (self.tokenizer.encode(reply, add_special_tokens=False) + [self.end_id])[:sampling.max_new_tokens]
        self.replies.append(ids)
        return GenOutput(ids, [-0.25] * len(ids), self.tokenizer.decode(ids), "stop" if ids[-1] == self.end_id else "length")
