"""``python -m verl_agentic.main_rollout``: dataset -> multi-turn rollouts -> trajectories + summary.

Writes ``trajectories.jsonl`` (one episode per line, the schema in docs/rollouts.md) and ``summary.json``
(per-task metrics, backend counters, token-exactness check) into ``output.dir``, and prints
the per-task summary table. All keys: ``verl_agentic/config/rollout.yaml``.

Nothing finished is lost: each episode is written as it finishes and each chunk of scores as it is
scored (``rollout/journal.py``), so the same command run again on the same ``output.dir`` continues
where a crash, a kill or a stop left off. SIGINT and SIGTERM stop the run, keep what finished, and print
the command that continues it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any, Optional

import hydra
from omegaconf import DictConfig

from verl_agentic.config import (  # noqa: F401 - load_config, make_backend, ... are imported from here too
    CONFIG_DIR,
    REPO_ROOT,
    HFConfig,
    RunConfig,
    check_task_scorers,
    load_config,
    make_backend,
    resolve_data_path,
    reward_manager,
    reward_settings,
    rollout_config,
)
from verl_agentic.interfaces import ConfigError, canonical_weight_dtype
from verl_agentic.record import RecordingWriter, has_recording, recording_header
from verl_agentic.reward import score_trajectories
from verl_agentic.reward.scorers import EPISODE_REWARD
from verl_agentic.rollout import AsyncRollout, format_table, summarize
from verl_agentic.rollout.async_rollout import resolve_tasks
from verl_agentic.rollout.journal import JournalError, RolloutJournal
from verl_agentic.rollout.trajectory import drift_summary
from verl_agentic.tasks import get_task
from verl_agentic.tasks.data import BadRow, load_rows, write_skipped_rows

# settings that change how fast a rollout goes, not what it produces: a resumed run may change them
# (rollout.hf: only its HFConfig.ROUNDING_KEYS; its PRECISION_KEYS change the tokens)
SPEED_KEYS = {"rollout": ("concurrency", "max_batch_size"),
              "reward": ("progress", "num_workers", "overcommit", "concurrency", "batch_size", "timeout_s",
                         "request_timeout_s", "max_retries", "retry_backoff_s", "straggler_s", "memory_limit_mb")}


def run_identity(c: RunConfig, rows: list[dict]) -> dict:
    """What a run's episodes are of: its config without ``output`` and ``SPEED_KEYS``, and the rows
    (``data.rows`` and their hash ``data.rows_sha256``). Of ``rollout.hf`` it keeps the keys that change
    the tokens (``HFConfig.PRECISION_KEYS``, by their canonical value, and only where not fp32, so a run
    from before this rule resumes). ``output.dir``'s journal refuses a re-run whose identity differs,
    naming the keys."""
    raw = {k: v for k, v in c.raw.items() if k != "output"}
    for section, keys in SPEED_KEYS.items():
        raw[section] = {k: v for k, v in (raw.get(section) or {}).items() if k not in keys}
    hf = raw["rollout"].pop("hf", None) or {}
    precision = {k: hf[k] for k in HFConfig.PRECISION_KEYS if k in hf}
    if "weight_dtype" in precision:
        precision["weight_dtype"] = canonical_weight_dtype(precision["weight_dtype"])
        if precision["weight_dtype"] == "float32":
            del precision["weight_dtype"]
    if precision:
        raw["rollout"]["hf"] = precision
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()
    raw["data"] = {**(raw.get("data") or {}), "rows": len(rows), "rows_sha256": digest}
    return raw


def run(cfg: DictConfig | RunConfig, backend: Any = None) -> tuple[list[dict], dict]:
    """Roll out ``cfg.data`` and write the outputs; returns (trajectories, summary). Continues the run
    already in ``output.dir`` when there is one (finished episodes and scores are not redone)."""
    c = RunConfig.parse(cfg)  # every section checked once, before anything loads; the steps below take c
    log = _logger(c.output.quiet)
    get_task(c.task_type)  # an unknown task_type fails before anything loads
    data = _RunRows(c)  # rows (bad rows skipped or an error), their tasks resolved: before the model loads
    scorer = reward_manager(c)  # config errors (unknown manager, missing url) before the model loads
    if scorer is not None and scorer.local_scorers:
        check_task_scorers(data.tasks)
    out_dir, n = Path(c.output.dir), c.rollout.n
    journal = RolloutJournal(out_dir, run_identity(c, data.rows))  # another run's outputs: refused before the model loads
    data.report(out_dir, journal, n, log)
    pending = journal.pending(len(data.rows), n)
    record = _recording(c, out_dir, journal, log)
    own_backend, recorder, wall_s = backend is None, None, 0.0
    try:
        if own_backend:
            backend = _load_backend(c, log)
        recorder = _recorder(c, out_dir, backend, journal) if record else None
        if pending:
            rollout = AsyncRollout(backend, c.rollout, task_configs=c.task, default_task_type=c.task_type,
                                   seed=c.seed, progress=not c.output.quiet, recorder=recorder)
            rollout.run_sync(data.rows, pending, on_episode=journal.append)
            wall_s = rollout.last_wall_s
        trajectories = journal.trajectories(len(data.rows), n)
        reward_summary = None
        if scorer is not None:
            trajectories, reward_summary = _score(scorer, journal, trajectories, len(data.rows), n, log)
    except KeyboardInterrupt:
        log(f"stopped: {len(journal.episodes)} of {len(data.rows) * n} episodes and {len(journal.scores)} scores "
            f"are in {out_dir}")
        raise
    finally:
        _close(journal, recorder, scorer, backend if own_backend else None)
    summary = _summary(c, data, trajectories, journal, pending, wall_s, backend, reward_summary)
    journal.finish(trajectories)
    tmp = out_dir / ".summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2))
    os.replace(tmp, out_dir / "summary.json")
    if not c.output.quiet:
        _print_summary(summary, len(trajectories), out_dir)
    return trajectories, summary


# ----------------------------------------------------------------------------------------------
# the steps of a run


def _logger(quiet: bool) -> Any:
    return (lambda msg: None) if quiet else (lambda msg: print(f"[verl-agentic] {msg}", file=sys.stderr))


class _RunRows:
    """``data.path``'s rows (``data.on_bad_row``: a bad row is an error, or skipped and listed) and the
    (task_type, TaskSpec) of each."""

    def __init__(self, c: RunConfig) -> None:
        self.path = resolve_data_path(c.data.path)
        self.skipped: list[BadRow] = []
        self.rows = load_rows(self.path, c.task_type, c.data.max_samples, on_bad_row=c.data.on_bad_row,
                              skipped=self.skipped)
        self.tasks = resolve_tasks(self.rows, c.task_type, c.task)  # before the model loads

    def report(self, out_dir: Path, journal: RolloutJournal, n: int, log: Any) -> None:
        """The rows skipped (``skipped_rows.jsonl``), a torn line dropped, and how far a resumed run got."""
        if self.skipped:
            write_skipped_rows(out_dir / "skipped_rows.jsonl", self.skipped)
            log(f"skipped {len(self.skipped)} bad rows of {self.path} (data.on_bad_row=skip): "
                f"{out_dir / 'skipped_rows.jsonl'} lists them with their reasons")
        if journal.torn_bytes:
            log(f"dropped a torn last line ({journal.torn_bytes} bytes) left by an interrupted write")
        if journal.resumed:
            log(f"continuing {out_dir}: {journal.resumed} of {len(self.rows) * n} episodes already finished")


def _recording(c: RunConfig, out_dir: Path, journal: RolloutJournal, log: Any) -> bool:
    """Whether this run records (``output.record``, or a recorded run resumed); a recording cannot start
    in the middle of a run."""
    record = c.output.record or has_recording(out_dir)  # a recorded run that is resumed keeps recording
    if record and not has_recording(out_dir) and journal.resumed:
        journal.close()
        raise JournalError(f"output.record=true, but {out_dir} holds {journal.resumed} episodes run without a "
                           f"recording: record into a new output.dir")
    if record and not c.output.record:
        log(f"{out_dir} holds a recording: the episodes run now are recorded too")
    return record


def _load_backend(c: RunConfig, log: Any) -> Any:
    t0 = time.perf_counter()
    backend = make_backend(c)
    log(f"model loaded in {time.perf_counter() - t0:.1f} s")
    return backend


def _recorder(c: RunConfig, out_dir: Path, backend: Any, journal: RolloutJournal) -> RecordingWriter:
    recorder = RecordingWriter(out_dir, recording_header(c.raw, backend, c.rollout, c.task, c.task_type, c.seed))
    unrecorded = set(journal.episodes) - recorder.recorded
    if unrecorded:
        print(f"[verl-agentic] warning: {len(unrecorded)} finished episodes of {out_dir} have no recording "
              f"(e.g. {min(unrecorded)}); a replay skips them", file=sys.stderr)
    return recorder


def _score(scorer: Any, journal: RolloutJournal, trajectories: list[dict], rows: int, n: int,
           log: Any) -> tuple[list[dict], dict]:
    """Score what of ``trajectories`` is not scored yet, a round at a time, each round's scores written down
    before the next; returns the trajectories with their scores and the reward summary."""
    t0 = time.perf_counter()
    todo = journal.unscored(trajectories)
    chunk = max(1, scorer.config.batch_size * scorer.config.concurrency)
    for i in range(0, len(todo), chunk):
        score_trajectories(todo[i:i + chunk], scorer)
        journal.record_scores(todo[i:i + chunk])
    trajectories = journal.trajectories(rows, n)
    summary = {"manager": scorer.config.manager, "wall_s": time.perf_counter() - t0, "scored_now": len(todo),
               **scorer.stats()}
    by_reward = sorted({t["task_type"] for t in trajectories
                        if (t.get("score_extra") or {}).get("scored_by") == EPISODE_REWARD})
    if by_reward:  # every run says it, a resumed one too (the counters above are this run's)
        summary["scored_by_episode_reward_tasks"] = by_reward
        log(f"no scorer is registered for task(s) {', '.join(by_reward)}: their episodes are scored by "
            f"their own episode reward (register_scorer(NAME) or a task's scorer attribute changes that)")
    unreached = len(journal.unscored(trajectories))
    if unreached:
        print(f"[verl-agentic] warning: {unreached} episodes could not be scored (the reward service was "
              f"unavailable); run the same command again to score them", file=sys.stderr)
    return trajectories, summary


def _close(journal: RolloutJournal, recorder: Any, scorer: Any, backend: Any) -> None:
    """What the run opened: the journal, the recording, the reward manager, a backend it loaded itself."""
    journal.close()
    if recorder is not None:
        recorder.close()
    if scorer is not None:
        scorer.close()
    if backend is not None:
        asyncio.run(backend.close())


def _summary(c: RunConfig, data: _RunRows, trajectories: list[dict], journal: RolloutJournal, pending: list,
             wall_s: float, backend: Any, reward_summary: Optional[dict]) -> dict:
    """``summary.json``: per-task metrics, this run's speed, the data, the backend's counters, the reward
    summary, the config (and with ``output.check_drift`` the token-exactness check)."""
    ran = set(pending)
    new = [t for t in trajectories if (t["index"], t["sample_id"]) in ran]
    summary: dict = {"tasks": summarize(trajectories, None if journal.resumed else wall_s),
                     "run": {"episodes": len(trajectories), "resumed_episodes": journal.resumed,
                             "rollout_wall_s": wall_s,
                             "generated_tokens_per_s": sum(t["metrics"].get("generated_tokens", 0) for t in new)
                             / wall_s if wall_s else None},
                     "data": {"path": str(data.path), "rows": len(data.rows), "skipped_rows": len(data.skipped)},
                     "backend": backend.stats(), "stop_token_ids": list(backend.stop_token_ids or []),
                     "reward": reward_summary, "config": c.raw}
    if c.output.check_drift:
        summary["drift"] = drift_summary(trajectories, backend.tokenizer, c.rollout.chat_template_kwargs,
                                         backend.stop_token_ids)
    return summary


def _print_summary(summary: dict, episodes: int, out_dir: Path) -> None:
    print(format_table(summary["tasks"]))
    if "drift" in summary:
        d = summary["drift"]
        print(f"token exactness: {d['episodes_ok']}/{d['episodes']} episodes ok, "
              f"{d['injected_differing_tokens']} differing injected tokens of {d['injected_tokens']}; "
              f"re-encoding would have changed {d['reencode_changed_tokens']} of {d['generated_tokens']} "
              f"generated tokens")
    print(f"wrote {episodes} trajectories to {out_dir / 'trajectories.jsonl'}")


def continue_command(module: str, argv: list[str], out_dir: str, *extra: str) -> str:
    """The command line that continues a stopped run: the same overrides, ``output.dir`` made explicit
    (its default has the time in it) and ``extra`` ones (e.g. ``trainer.resume=true``)."""
    names = {a.split("=", 1)[0].lstrip("+~") for a in (f"output.dir={out_dir}", *extra)}
    keep = [a for a in argv if a.split("=", 1)[0].lstrip("+~") not in names]
    return shlex.join(["python", "-m", module, *keep, f"output.dir={os.path.abspath(out_dir)}", *extra])


class StopSignals:
    """SIGTERM and SIGINT as ``KeyboardInterrupt`` in the main thread (as Ctrl-C is), for the CLIs.

    ``on_stop`` (optional) is called instead of raising: it raises ``KeyboardInterrupt`` itself when the
    program may stop at once, or returns to defer the stop (the trainer's raises at once). ``received`` is
    the signal that came. A second signal always raises."""

    def __init__(self, on_stop: Optional[Any] = None):
        self.on_stop = on_stop
        self.received: Optional[int] = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        first = self.received is None
        self.received = signum
        if first and self.on_stop is not None:
            self.on_stop()
            return
        raise KeyboardInterrupt(signal.Signals(signum).name)

    def __enter__(self) -> "StopSignals":
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    @property
    def exit_code(self) -> int:
        return 128 + (self.received or signal.SIGINT)


def run_or_exit(fn: Any, cfg: DictConfig, stopped_message: Any = None, signals: Optional[StopSignals] = None) -> None:
    """A CLI entry's body: bad input is one clear stderr line and exit code 2, not a traceback; a full
    disk (or any failed write) is one line and exit code 1; SIGINT/SIGTERM (``signals``) stop the run
    with exit code 128 + the signal and ``stopped_message(cfg)`` (how to continue) on stderr."""
    signals = signals or StopSignals()
    try:
        with signals:
            fn(cfg)
    except (ConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        if stopped_message is not None:
            print(stopped_message(cfg), file=sys.stderr)
        sys.exit(signals.exit_code)
    except OSError as e:  # no space left, file too large, permission denied: nothing to show but the cause
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


def _continue_rollout(cfg: DictConfig) -> str:
    return "to continue, run: " + continue_command("verl_agentic.main_rollout", sys.argv[1:], str(cfg.output.dir))


def call_hydra_main(hydra_main: Any, argv: Optional[list[str]]) -> None:
    """Run a CLI's ``@hydra.main`` function on ``argv`` (overrides such as ``task_type=my_task``;
    None: the command line's). What lets a user's script call ``main([...])``."""
    if argv is None:
        hydra_main()
        return
    saved = sys.argv
    sys.argv = [saved[0] if saved else "verl_agentic", *argv]
    try:
        hydra_main()
    finally:
        sys.argv = saved


# config_path: the folder's absolute path, not "config": called from a user's script, hydra would look
# for a package verl_agentic.config, which is config.py, a module ("Primary config module not found")
@hydra.main(config_path=CONFIG_DIR, config_name="rollout", version_base=None)
def _hydra_main(cfg: DictConfig) -> None:
    run_or_exit(run, cfg, _continue_rollout)


def main(argv: Optional[list[str]] = None) -> None:
    """``python -m verl_agentic.main_rollout [key=value ...]``, or from a script: ``main(["imports=[my_tasks]",
    "task_type=my_task", ...])`` (``argv`` None: the command line's arguments)."""
    call_hydra_main(_hydra_main, argv)


if __name__ == "__main__":
    main()
