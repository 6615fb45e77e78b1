"""``naive``: scores in this process, one sample after the other. The reference semantics.

With ``timeout_s`` set, each scorer call runs in a daemon thread and a sample that takes longer
gets a ``timeout`` error while the batch goes on. Python cannot kill a thread, so the hung call
keeps running in the background (counted as ``abandoned_threads`` in ``stats()``; a daemon
thread does not block interpreter exit). Use ``prime`` for scorers that may hang or eat memory:
it kills the worker process.
"""

from __future__ import annotations

import queue
import threading
from typing import Optional, Sequence

from verl_agentic.reward.base import RewardItem, RewardManager, RewardResult, ScoreError, register_reward_manager
from verl_agentic.reward.progress import progress_bar
from verl_agentic.reward.scorers import run_scorer


def score_one(item: RewardItem, override: Optional[str], scorer_kwargs: dict) -> RewardResult:
    """Score one item in this thread; typed failures become the result's error."""
    try:
        score, extra = run_scorer(item, override, scorer_kwargs)
        return RewardResult(score, extra)
    except ScoreError as e:
        return RewardResult(None, {}, e.as_error())


class _DaemonRunner:
    """One daemon thread running calls one at a time; abandoned (and replaced) when a call hangs."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="verl-agentic-naive-scorer", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, args, box, done = self._jobs.get()
            if fn is None:
                return
            box.append(fn(*args))
            done.set()

    def call(self, timeout: float, fn, *args):
        box: list = []
        done = threading.Event()
        self._jobs.put((fn, args, box, done))
        if not done.wait(timeout):
            raise TimeoutError
        return box[0]

    def stop(self) -> None:
        self._jobs.put((None, None, None, None))


@register_reward_manager("naive")
class NaiveRewardManager(RewardManager):
    def __init__(self, config=None):
        super().__init__(config)
        self._runner: Optional[_DaemonRunner] = None
        self._abandoned = 0

    def _score_items(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        cfg = self.config
        results = []
        with progress_bar(len(items), "naive scoring", cfg.progress) as bar:
            for item in items:
                results.append(self._score_with_timeout(item))
                bar.update(1)
        return results

    def _score_with_timeout(self, item: RewardItem) -> RewardResult:
        cfg = self.config
        if cfg.timeout_s is None:
            return score_one(item, cfg.scorer, cfg.scorer_kwargs)
        if self._runner is None:
            self._runner = _DaemonRunner()
        try:
            return self._runner.call(cfg.timeout_s, score_one, item, cfg.scorer, cfg.scorer_kwargs)
        except TimeoutError:
            self._abandoned += 1
            self._runner = None  # the hung thread keeps the old runner; the next sample gets a fresh one
            return RewardResult(None, {}, ScoreError(
                "timeout", f"scorer ran past reward.timeout_s={cfg.timeout_s} s (naive: the call is abandoned, "
                           "not killed)").as_error())

    def stats(self) -> dict:
        return {**super().stats(), "abandoned_threads": self._abandoned}

    def close(self) -> None:
        if self._runner is not None:
            self._runner.stop()
            self._runner = None
