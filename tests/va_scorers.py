"""A real scorer for trainer tests, importable by worker processes (``reward.scorer_modules=[va_scorers]``).

``va_vowel_share``: the share of vowels in the answer. Text from a tiny random model varies in
it, so GRPO advantages are non-zero and updates change the weights.
"""

from verl_agentic.reward.scorers import SCORERS, register_scorer

if "va_vowel_share" not in SCORERS:
    @register_scorer("va_vowel_share")
    def vowel_share(solution_str, ground_truth, extra_info=None):
        text = solution_str or ""
        return sum(c in "aeiouAEIOU" for c in text) / max(1, len(text))

if "va_marked_vowels" not in SCORERS:
    @register_scorer("va_marked_vowels")
    def marked_vowels(solution_str, ground_truth, extra_info=None, *, marks=None, sleep_s=0.0):
        """``va_vowel_share`` that takes ``sleep_s`` and appends a line to the file ``marks`` per call: the
        fault tests watch that file to stop a run at a known point (while it scores)."""
        import time

        if marks:
            with open(marks, "a") as f:
                f.write("scored\n")
        time.sleep(sleep_s)
        return vowel_share(solution_str, ground_truth, extra_info)

CALLS = {"va_fails_after": 0}  # calls in this process (tests reset it)

if "va_fails_after" not in SCORERS:
    @register_scorer("va_fails_after")
    def fails_after(solution_str, ground_truth, extra_info=None, *, after=0):
        """``va_vowel_share`` for this process's first ``after`` calls, then it raises on every call: a
        scorer that breaks in the middle of a run (the naive manager runs it in-process)."""
        CALLS["va_fails_after"] += 1
        if CALLS["va_fails_after"] > after:
            raise RuntimeError("the scorer broke")
        return vowel_share(solution_str, ground_truth, extra_info)

if "va_starts_with_vowel" not in SCORERS:
    @register_scorer("va_starts_with_vowel")
    def starts_with_vowel(solution_str, ground_truth, extra_info=None):
        """1.0 when the answer's first letter (after spaces) is a vowel: decided by the first generated
        token alone, about a fifth of a random model's vocabulary. The learning regression test
        (tests/test_learning.py) trains a tiny random model to say it."""
        text = (solution_str or "").lstrip()
        return float(text[:1].lower() in ("a", "e", "i", "o", "u"))
