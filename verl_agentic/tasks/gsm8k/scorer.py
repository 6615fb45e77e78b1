"""The gsm8k scorers (found by the reward managers through the ``verl_agentic.scorers`` entry points).

``gsm8k`` (aliases ``openai/gsm8k``, ``verl_agentic/word_problems``, ``verl_agentic/easy_arith``: the synthetic rows of examples/): the answer is extracted as the gsm8k task does
(``method``: ``strict`` = the number after ``####``; ``flexible`` = that, else the last number).

- right answer                                  -> ``score`` (default 1.0)
- a well-formed (``#### N``) but wrong answer   -> ``format_score`` (partial credit, default 0.0)
- a parseable but not well-formed wrong answer  -> 0.0
- no parseable answer                           -> ``no_answer_score`` (a format penalty, default 0.0)

``answer_in_cut_turn=False`` (the task's key of the same name): a last turn cut at ``max_new_tokens``
(``extra_info["last_turn_cut"]``, set from the trajectory's turns) has no answer.

Extra: ``acc`` (1/0), ``answered`` (1/0), ``pred`` (the extracted answer or null).

``gsm8k_symbolic``: the same decision, then checked symbolically with sympy
(``sympify(pred) - sympify(truth)`` simplifies to 0), so ``3/4`` matches ``0.75``. It costs
milliseconds per sample, which makes it the CPU-heavy scorer of the reward benchmarks.
"""

from __future__ import annotations

from typing import Any, Optional

from verl_agentic.reward.scorers import register_scorer
from verl_agentic.tasks.gsm8k.answer import extract_answer, normalize_number


def _score(solution_str: str, ground_truth: Any, method: str, score: float, format_score: float,
           no_answer_score: float, symbolic: bool, cut: bool = False) -> dict:
    pred = None if cut else extract_answer(solution_str, method)
    truth = normalize_number(str(ground_truth))
    if truth is None:
        raise ValueError(f"ground_truth {ground_truth!r} is not a number")
    if pred is None:
        correct = False
    elif symbolic:  # always pays the check: the point of this scorer in the benchmarks
        correct = _symbolic_equal(pred, truth) or pred == truth
    else:
        correct = pred == truth
    if pred is None:
        value = no_answer_score
    elif correct:
        value = score
    else:  # partial credit only for a well-formed (#### N) wrong answer
        value = format_score if extract_answer(solution_str, "strict") is not None else 0.0
    return {"score": float(value), "acc": float(correct), "answered": float(pred is not None), "pred": pred}


def _symbolic_equal(a: str, b: str) -> bool:
    import sympy

    try:
        return sympy.simplify(sympy.sympify(a) - sympy.sympify(b)) == 0
    except (sympy.SympifyError, TypeError, SyntaxError):
        return False


@register_scorer("gsm8k", aliases=("openai/gsm8k", "verl_agentic/word_problems", "verl_agentic/easy_arith"))
def gsm8k_score(solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None, *,
                method: str = "flexible", score: float = 1.0, format_score: float = 0.0,
                no_answer_score: float = 0.0, answer_in_cut_turn: bool = True) -> dict:
    cut = not answer_in_cut_turn and bool((extra_info or {}).get("last_turn_cut"))
    return _score(solution_str, ground_truth, method, score, format_score, no_answer_score, symbolic=False, cut=cut)


@register_scorer("gsm8k_symbolic", preload=("sympy",))
def gsm8k_symbolic_score(solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None, *,
                         method: str = "flexible", score: float = 1.0, format_score: float = 0.0,
                         no_answer_score: float = 0.0) -> dict:
    return _score(solution_str, ground_truth, method, score, format_score, no_answer_score, symbolic=True)
