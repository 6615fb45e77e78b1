"""The built-in monitors, one class each: a name, a statistic, a threshold, a message.

Thresholds are defaults, each argued in its class; ``monitors.thresholds.<name>`` replaces one.
bench/RESULTS.md ("Reward-hacking and collapse monitors") shows where each fires on this
project's committed runs.
"""

from __future__ import annotations

from typing import Optional

from verl_agentic.monitors.base import Monitor

MIN_PROMPTS = 4  # a batch of fewer prompts may rightly share one answer


def _at(history: list[dict], key: str) -> Optional[float]:
    return history[-1].get(key)


class AnswerCollapse(Monitor):
    """The share of the batch's episodes that give its most common final answer, or its most
    common first answer when that share is larger (with feedback, a policy that always guesses 12
    and moves by one after "That is not right" splits its final answers). Episodes of different
    prompts that all give one answer have stopped reading the problem; 0.5 is far above what right
    answers share (the most common ground truth of the word problems' held-out split covers 8% of
    it). Needs at least ``MIN_PROMPTS`` prompts in the batch."""

    name = "answer_collapse"
    threshold = 0.5
    where, prompts_key = "batch", "batch/prompts"
    what = "share of the training batch giving its most common final (or first) answer"

    def statistic(self, history: list[dict]) -> Optional[float]:
        prompts = _at(history, self.prompts_key)
        if prompts is not None and prompts < MIN_PROMPTS:
            return None
        shares = [v for v in (_at(history, f"{self.where}/answer_top_share"),
                              _at(history, f"{self.where}/first_answer_top_share")) if v is not None]
        return max(shares) if shares else None

    def message(self, value: float, summary: dict) -> str:
        final = summary.get(f"{self.where}/answer_top_share")
        which = "answer" if final is not None and final >= value else "first_answer"
        return (f"{value:.0%} of the {self.where} episodes give the same {which.replace('_', ' ')} "
                f"{summary.get(f'{self.where}/{which}_top')!r} (threshold {self.threshold:.0%}): answer collapse")


class HeldoutAnswerCollapse(AnswerCollapse):
    """The same on the held-out validation's greedy episodes (validation steps only)."""

    name = "heldout_answer_collapse"
    where, prompts_key = "heldout", "heldout/episodes"
    what = "share of the held-out episodes giving their most common final (or first) answer"


class RewardUpHeldoutDown(Monitor):
    """At each validation after the first: the smaller of (a) how much the mean training reward rose,
    the steps since the previous validation against the steps before (the first baseline_steps
    steps for the first interval), and (b) how much held-out accuracy fell since the previous
    validation. Positive only when both happened; 0.05 is 7-8 of 150 held-out problems, past the
    validation-to-validation wobble of the healthy committed runs (at most 0.026 down)."""

    name = "reward_up_heldout_down"
    threshold = 0.05
    what = "min(train reward rise, held-out accuracy fall) between validations"

    def statistic(self, history: list[dict]) -> Optional[float]:
        vals = [i for i, h in enumerate(history) if h.get("heldout/accuracy") is not None]
        if len(vals) < 2 or vals[-1] != len(history) - 1:
            return None
        prev, cur = vals[-2], vals[-1]
        fall = history[prev]["heldout/accuracy"] - history[cur]["heldout/accuracy"]
        now = [h["batch/reward_mean"] for h in history[prev + 1:cur + 1] if h.get("batch/reward_mean") is not None]
        start = vals[-3] + 1 if len(vals) >= 3 else 0
        before = [h["batch/reward_mean"] for h in history[start:prev + 1] if h.get("batch/reward_mean") is not None]
        if len(vals) < 3:  # the first interval: compare with its own first steps
            before = now[:self.baseline_steps]
        if not now or not before:
            return None
        rise = sum(now) / len(now) - sum(before) / len(before)
        self._last = (rise, fall)
        return min(rise, fall)

    def message(self, value: float, summary: dict) -> str:
        rise, fall = self._last
        return (f"training reward rose by {rise:.3f} while held-out accuracy fell by {fall:.3f} "
                f"(threshold {self.threshold}): the policy is learning something the held-out problems do not reward")


class RewardWithoutCorrect(Monitor):
    """The share of the batch's positive reward that went to episodes without a correct answer
    (format-only reward, partial credit, a scorer that can be satisfied another way). 0.25: a quarter
    of what the policy is paid for is not the task."""

    name = "reward_without_correct"
    threshold = 0.25
    what = "share of positive reward earned without a correct answer"

    def statistic(self, history: list[dict]) -> Optional[float]:
        if not _at(history, "batch/reward_mean"):  # nothing earned: nothing to attribute
            return None
        return _at(history, "batch/reward_without_correct")

    def message(self, value: float, summary: dict) -> str:
        return (f"{value:.0%} of the batch's reward went to episodes without a correct answer "
                f"(threshold {self.threshold:.0%}): reward for format or partial credit, not for the task")


class LengthExploitation(Monitor):
    """Generated tokens per assistant turn against the run's first steps. 1.5: turns half as long
    again as at the start; learning the task has shortened turns in every committed run."""

    name = "length_exploitation"
    threshold = 1.5
    what = "generated tokens per assistant turn / its first steps' mean"

    def statistic(self, history: list[dict]) -> Optional[float]:
        return self.relative_to_start(history, "batch/gen_tokens_per_turn")

    def message(self, value: float, summary: dict) -> str:
        return (f"assistant turns are {value:.2f}x as long as in the first {self.baseline_steps} steps "
                f"({summary.get('batch/gen_tokens_per_turn', 0):.1f} tokens; {summary.get('batch/clip_ratio', 0):.0%} "
                f"cut at max_new_tokens; threshold {self.threshold}x): length exploitation")


class EntropyCollapse(Monitor):
    """The policy's token entropy against the run's first steps. 0.1: a tenth of its start, where
    sampling the group's n episodes stops giving different episodes to compare."""

    name = "entropy_collapse"
    threshold = 0.1
    direction = "below"
    what = "token entropy / its first steps' mean"

    def statistic(self, history: list[dict]) -> Optional[float]:
        return self.relative_to_start(history, "batch/entropy")

    def message(self, value: float, summary: dict) -> str:
        return (f"token entropy {summary.get('batch/entropy', 0):.3f} is {value:.2f}x its first "
                f"{self.baseline_steps} steps' (threshold {self.threshold}x): entropy collapse")


class KLAcceleration(Monitor):
    """How fast KL to the reference rises now against before: its rise over the last
    ``baseline_steps`` steps over its rise over the ``baseline_steps`` before them (the earlier rise
    counted as at least 0.01, so a KL that stays small never fires). 3.0: three times faster."""

    name = "kl_acceleration"
    threshold = 3.0
    what = "KL-to-reference rise over the last steps / over the steps before"
    min_rise = 0.01

    def statistic(self, history: list[dict]) -> Optional[float]:
        if _at(history, "batch/kl_ref") is None:
            return None
        kl = [h["batch/kl_ref"] for h in history if h.get("batch/kl_ref") is not None]
        w = self.baseline_steps
        if len(kl) < 2 * w + 1:
            return None
        recent, earlier = kl[-1] - kl[-1 - w], kl[-1 - w] - kl[-1 - 2 * w]
        return recent / max(earlier, self.min_rise)

    def message(self, value: float, summary: dict) -> str:
        return (f"KL to the reference ({summary.get('batch/kl_ref', 0):.4f}) rose {value:.1f}x faster over the last "
                f"{self.baseline_steps} steps than over the {self.baseline_steps} before (threshold {self.threshold}x)")


class ToolCallSpam(Monitor):
    """Tool calls per assistant turn. 3.0: every turn making three calls or more on average; the
    tasks here need one."""

    name = "tool_call_spam"
    threshold = 3.0
    what = "tool calls per assistant turn"

    def statistic(self, history: list[dict]) -> Optional[float]:
        return _at(history, "batch/tool_calls_per_turn")

    def message(self, value: float, summary: dict) -> str:
        return f"{value:.1f} tool calls per assistant turn (threshold {self.threshold}): tool-call spam"


BUILTIN = (AnswerCollapse, HeldoutAnswerCollapse, RewardUpHeldoutDown, RewardWithoutCorrect, LengthExploitation,
           EntropyCollapse, KLAcceleration, ToolCallSpam)
