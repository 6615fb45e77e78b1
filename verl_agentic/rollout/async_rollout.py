"""AsyncRollout: many multi-turn episodes at once, dispatched on each row's ``task_type``."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, Union

from verl_agentic.interfaces import ConfigError, RolloutContext, SamplingParams
from verl_agentic.record.backend import taped
from verl_agentic.record.tape import Tape, using
from verl_agentic.rollout.loops import LoopLimits
from verl_agentic.rollout.template import ChatTemplate
from verl_agentic.rollout.trajectory import build_trajectory
from verl_agentic.rollout.task_spec import TaskSpec, get_task


@dataclass
class RolloutConfig:
    """The ``rollout.*`` config keys (docs/rollouts.md). The defaults are config/rollout.yaml's, so the
    Python API and ``main_rollout`` agree (tests/test_config.py compares them)."""

    n: int = 1
    max_turns: int = 3
    max_new_tokens: int = 256
    max_total_tokens: int = 2048
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = -1
    concurrency: int = 16
    episode_timeout_s: Optional[float] = None
    chat_template_kwargs: Optional[dict] = None  # None: {} (so the YAML's null can be replaced by a mapping)
    max_consecutive_invalid_tool_calls: Optional[int] = None  # default of tasks with tools (null: no limit)

    def __post_init__(self) -> None:
        if self.chat_template_kwargs is None:
            self.chat_template_kwargs = {}
        for name in ("n", "max_turns", "max_new_tokens", "max_total_tokens", "concurrency"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ConfigError(f"rollout.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if self.max_consecutive_invalid_tool_calls is not None and self.max_consecutive_invalid_tool_calls < 0:
            raise ConfigError("rollout.max_consecutive_invalid_tool_calls must be >= 0 (0: no limit) or null, "
                              f"got {self.max_consecutive_invalid_tool_calls}")


def _sample_seed(base: int, index: int, sample_id: int) -> int:
    return (base * 1_000_003 + index * 10_007 + sample_id) % (2**31 - 1)


def resolve_tasks(rows: Sequence[dict], default_task_type: Optional[str] = None,
                  task_configs: Optional[dict[str, dict]] = None) -> list[tuple[str, TaskSpec]]:
    """Each row's (task_type, TaskSpec), checked before any generation.

    An unknown name fails fast, naming the row and listing the registered tasks; each task's
    ``check_config`` validates its config section once.
    """
    if not rows:
        raise ConfigError("the dataset is empty: no rows to roll out")
    resolved, cache = [], {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ConfigError(f"row {i}: expected a dict, got {type(row).__name__}")
        name = row.get("task_type") or default_task_type
        if not name:
            raise ConfigError(f"row {i}: no 'task_type' field and no default task_type configured")
        if name not in cache:
            try:
                cache[name] = get_task(name)
            except ConfigError as e:
                raise ConfigError(f"row {i}: {e}") from None
            if cache[name].check_config is not None:
                cache[name].check_config(dict((task_configs or {}).get(name, {})))
        resolved.append((name, cache[name]))
    return resolved


class Recorder(Protocol):
    """Gives each episode its tape and takes it back when the episode is done (``output.record``'s
    writer, ``verl_agentic.record.RecordingWriter``): ``begin`` returns the episode's tape (None: the
    episode runs untaped), ``finish`` receives it with the trajectory and what the episode ran with: the
    row, its context (seed, config), its sampling and its limits (not called for an episode cancelled by
    a stop)."""

    def begin(self, index: int, sample_id: int) -> Optional[Tape]: ...

    def finish(self, tape: Tape, traj: dict, *, row: dict, ctx: RolloutContext, sampling: SamplingParams,
               limits: LoopLimits) -> None: ...


class AsyncRollout:
    """Runs episodes concurrently (bounded by ``concurrency``) against one backend.

    Each row names its ``task_type`` (or ``default_task_type`` applies); rows of different
    tasks may share a batch. Every row is sampled ``n`` times. Results come back in input
    order (row-major: row 0 samples 0..n-1, row 1, ...) as trajectory dicts; an episode that
    fails carries a typed ``error`` and never stops the others.

    ``recorder`` (``Recorder``): each episode runs with its tape (``verl_agentic.record``): its backend
    wrapped (``record.taped``) and the tape set for the doors it goes through.
    """

    def __init__(self, backend: Any, config: Optional[RolloutConfig] = None, *,
                 task_configs: Optional[dict[str, dict]] = None,
                 default_task_type: Optional[str] = None, seed: int = 0, progress: bool = False,
                 recorder: Optional[Recorder] = None):
        self.backend = backend
        self.config = config or RolloutConfig()
        self.task_configs = dict(task_configs or {})
        self.default_task_type = default_task_type
        self.seed = seed
        self.progress = progress
        self.recorder = recorder
        self.template = ChatTemplate(backend.tokenizer, self.config.chat_template_kwargs)
        self.last_wall_s = 0.0

    def _sampling(self, index: int, sample_id: int) -> SamplingParams:
        c = self.config
        return SamplingParams(
            max_new_tokens=c.max_new_tokens, temperature=c.temperature, top_p=c.top_p, top_k=c.top_k,
            seed=_sample_seed(self.seed, index, sample_id) if c.temperature > 0 else None,
        )

    async def run(self, rows: Union[Sequence[dict], Mapping[int, dict]],
                  pending: Optional[Sequence[tuple[int, int]]] = None,
                  on_episode: Optional[Callable[[dict], None]] = None) -> list[dict]:
        """The episodes of ``pending`` (``(row index, sample id)`` pairs; default: all, row-major), in
        that order. ``on_episode(trajectory)`` is called as each one finishes (main_rollout writes it
        down then); an episode cancelled by a stop is not finished and is not passed on. ``rows`` may
        be a mapping of row index to row (some rows of a larger dataset: a replay's)."""
        if isinstance(rows, Mapping):
            keys = list(rows)
            resolved = resolve_tasks([rows[k] for k in keys], self.default_task_type, self.task_configs)
            tasks: Any = dict(zip(keys, resolved))
        else:
            tasks = resolve_tasks(rows, self.default_task_type, self.task_configs)
        limits = LoopLimits(self.config.max_turns, self.config.max_total_tokens, self.config.episode_timeout_s)
        sem = asyncio.Semaphore(self.config.concurrency)
        if pending is None:
            pending = [(i, k) for i in (list(rows) if isinstance(rows, Mapping) else range(len(rows)))
                       for k in range(self.config.n)]
        bar = _ProgressBar(len(pending), self.progress, self.backend)
        t0 = time.perf_counter()

        async def episode(index: int, sample_id: int) -> dict:
            task_type, spec = tasks[index]
            row = rows[index]
            ctx = RolloutContext(
                tokenizer=self.backend.tokenizer, task_config=self.task_configs.get(task_type, {}),
                sample_index=sample_id, max_turns=self.config.max_turns,
                seed=_sample_seed(self.seed, index, sample_id),
                max_consecutive_invalid_tool_calls=self.config.max_consecutive_invalid_tool_calls,
                max_total_tokens=self.config.max_total_tokens,
            )
            sampling = self._sampling(index, sample_id)
            tape = self.recorder.begin(index, sample_id) if self.recorder is not None else None
            backend = self.backend if tape is None else taped(self.backend, tape)
            async with sem:
                with using(tape):
                    state, result = await spec.loop(spec, row, ctx, backend, sampling, limits, self.template)
            traj = build_trajectory(state, result, uid=str(row.get("uid", f"{task_type}-{index}")),
                                    task_type=task_type, index=index, sample_id=sample_id, scorer=spec.scorer)
            bar.update(traj)
            finished = (traj["error"] or {}).get("type") != "cancelled"  # a loop that swallowed a
            if tape is not None and finished:  # cancellation did not finish its episode
                self.recorder.finish(tape, traj, row=row, ctx=ctx, sampling=sampling, limits=limits)
            if on_episode is not None and finished:
                on_episode(traj)
            return traj

        ticker = asyncio.create_task(bar.tick_forever()) if self.progress else None
        try:
            out = await asyncio.gather(*(episode(i, k) for i, k in pending))
        finally:
            if ticker is not None:
                ticker.cancel()
            bar.close()
        self.last_wall_s = time.perf_counter() - t0
        return list(out)

    def run_sync(self, rows: Sequence[dict], pending: Optional[Sequence[tuple[int, int]]] = None,
                 on_episode: Optional[Callable[[dict], None]] = None) -> list[dict]:
        with asyncio.Runner() as runner:
            runner.get_loop().set_exception_handler(_quiet_about_stops)
            return runner.run(self.run(rows, pending, on_episode))


def _quiet_about_stops(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """The loop's exception handler: everything as asyncio reports it, but a stop. The CLIs raise SIGTERM
    and SIGINT as ``KeyboardInterrupt`` (``main_rollout.StopSignals``); one that lands while a task runs
    leaves that task finished with it, unretrieved, and asyncio would print "Task exception was never
    retrieved" with a traceback after the run's "to continue" line (tests/test_faults.py saw it)."""
    if isinstance(context.get("exception"), (KeyboardInterrupt, SystemExit)):
        return
    loop.default_exception_handler(context)


class _ProgressBar:
    """A tqdm bar over episodes with mean reward, errors and generated tokens; silent when disabled.

    Episodes of a batch tend to finish together, so the bar also refreshes every couple of
    seconds with the backend's token counter, showing progress inside long turns.
    """

    def __init__(self, total: int, enabled: bool, backend: Any):
        self.bar = None
        self.backend = backend
        self.done = self.errors = 0
        self.reward_sum = 0.0
        self.t0 = time.perf_counter()
        self.tokens0 = 0.0
        if enabled:
            from tqdm.auto import tqdm

            self.tokens0 = self._tokens()
            self.bar = tqdm(total=total, desc="rollout", unit="ep", dynamic_ncols=True)

    def _tokens(self) -> float:
        stats = self.backend.stats()
        return float(stats.get("decoded_tokens", stats.get("generated_tokens", 0)))

    def _refresh(self) -> None:
        tokens = self._tokens() - self.tokens0
        postfix = {"tok": int(tokens), "tok/s": f"{tokens / max(time.perf_counter() - self.t0, 1e-9):.0f}",
                   "errors": self.errors}
        if self.done:
            postfix["reward"] = f"{self.reward_sum / self.done:.3f}"
        self.bar.set_postfix(postfix, refresh=False)

    async def tick_forever(self, every_s: float = 2.0) -> None:
        while True:
            await asyncio.sleep(every_s)
            if self.bar is not None:
                self._refresh()
                self.bar.refresh()

    def update(self, traj: dict) -> None:
        self.done += 1
        self.reward_sum += traj["reward"]
        self.errors += traj["error"] is not None
        if self.bar is not None:
            self._refresh()
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
