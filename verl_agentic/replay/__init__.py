"""Replay: a recorded run's episodes re-executed against their recordings, with no model.

``python -m verl_agentic.replay RUN_DIR`` (``__main__.py``) runs each recorded episode's task code again
(start, obs, end, parsers, the chat template, tools' parsing and, with ``--live``, the tools, interactions
and services themselves) with every door answering from the recording (``verl_agentic.record``), and
reports per episode the first turn where anything differs (``compare.py``): tokens, messages, a door's
request, the reward. ``replay_run`` is the same from Python. ``rescore`` scores the replayed episodes
with another scorer and sets the score beside the recorded one.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from verl_agentic.interfaces import ConfigError
from verl_agentic.jsonl import read_json_lines
from verl_agentic.models.embedded import EMBEDDED_NAMES, embedded_model_dir
from verl_agentic.record import NoModel, RecordingError, Tape, find_episode, read_episodes, read_header
from verl_agentic.replay.compare import first_difference
from verl_agentic.reward.base import RewardConfig, make_reward_manager, score_trajectories
from verl_agentic.rollout.async_rollout import AsyncRollout, RolloutConfig


@dataclass
class EpisodeReplay:
    """One replayed episode: the recording's line, the replayed trajectory, the first difference."""

    record: dict
    trajectory: dict
    difference: Optional[dict]
    recorded_score: Optional[float] = None
    score: Optional[float] = None  # from ``rescore``

    @property
    def key(self) -> str:
        return f"{self.record['index']}/{self.record['sample_id']}"

    def as_dict(self) -> dict:
        out = {"index": self.record["index"], "sample_id": self.record["sample_id"], "uid": self.record["uid"],
               "task_type": self.record["task_type"], "same": self.difference is None, "difference": self.difference,
               "reward": {"recorded": self.record["outcome"]["reward"], "replayed": self.trajectory["reward"]}}
        if self.score is not None or self.recorded_score is not None:
            out["score"] = {"recorded": self.recorded_score, "rescored": self.score}
        return out


@dataclass
class ReplayReport:
    episodes: list[EpisodeReplay]
    timings: dict = field(default_factory=dict)

    @property
    def differing(self) -> list[EpisodeReplay]:
        return [e for e in self.episodes if e.difference is not None]


class _Playback:
    """The ``Recorder`` of a replay: each episode's tape plays its recording back."""

    def __init__(self, records: dict[tuple[int, int], dict], live: Iterable[str]):
        self.records = records
        self.live = tuple(live)
        self.done: dict[tuple[int, int], tuple[Tape, dict, Any, dict]] = {}

    def begin(self, index: int, sample_id: int) -> Tape:
        return Tape("replay", self.records[(index, sample_id)]["events"], live=self.live)

    def finish(self, tape: Tape, traj: dict, *, row: dict, seed: Optional[int], sampling: dict) -> None:
        self.done[(traj["index"], traj["sample_id"])] = (tape, traj, seed, sampling)


def tokenizer_path(header: dict, given: Optional[str] = None) -> str:
    """The tokenizer to replay with: ``given``, else the recorded one when it is on this machine, else the
    embedded model's when the run used it (``model.path`` null or ``embedded``)."""
    if given:
        return str(given)
    path = header.get("tokenizer") or ""
    if path and Path(path).exists():
        return path
    model = ((header.get("config") or {}).get("model") or {}).get("path")
    if model is None or str(model).strip().lower() in EMBEDDED_NAMES:
        return str(embedded_model_dir(quiet=True))
    raise RecordingError(f"the recorded run's tokenizer {path!r} is not on this machine: pass --tokenizer PATH "
                         f"(a folder with the same tokenizer)")


def load_tokenizer(path: str) -> Any:
    # on first use: transformers is slow to import, and a test may hand its own tokenizer in
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise RecordingError(f"cannot load the recorded run's tokenizer {path!r}: {e}") from None


def import_modules(modules: Iterable[str]) -> None:
    """Import modules whose import registers tasks or scorers (a run's own, not entry points)."""
    for m in modules:
        try:
            importlib.import_module(m)
        except ImportError as e:
            raise ConfigError(f"--import {m}: {e}") from None


def replay_run(run_dir: str | Path, *, episode: Optional[str] = None, live: Iterable[str] = (),
               tokenizer: Any = None, task_configs: Optional[dict] = None) -> ReplayReport:
    """Replay the recording in ``run_dir`` (every episode, or the one ``episode`` names: ``INDEX``,
    ``INDEX/SAMPLE`` or a uid). ``live``: doors that run for real (``record.LIVE_DOORS``). ``task_configs``:
    task sections to use instead of the recorded ones (e.g. a service's new address for ``--live http``).
    ``tokenizer``: a tokenizer object, or the path of one (default: ``tokenizer_path``)."""
    t0 = time.perf_counter()
    header = read_header(run_dir)
    records = [find_episode(run_dir, episode)] if episode is not None else read_episodes(run_dir)
    t_read = time.perf_counter()
    if tokenizer is None or isinstance(tokenizer, (str, Path)):
        tokenizer = load_tokenizer(tokenizer_path(header, tokenizer))
    t_tok = time.perf_counter()
    by_key = {(r["index"], r["sample_id"]): r for r in records}
    playback = _Playback(by_key, live)
    configs = {**header["task_configs"], **(task_configs or {})}
    rollout = AsyncRollout(NoModel(tokenizer, header["stop_token_ids"]), RolloutConfig(**header["rollout"]),
                           task_configs=configs, default_task_type=header.get("default_task_type"),
                           seed=header["seed"], recorder=playback)
    rows = {r["index"]: r["row"] for r in records}
    asyncio.run(rollout.run(rows, sorted(by_key)))
    episodes = []
    for key, rec in sorted(by_key.items()):
        tape, traj, seed, sampling = playback.done[key]
        diff = first_difference(rec["outcome"], traj, tape, tokenizer,
                                seeds=((rec["seed"], rec["sampling"]), (seed, sampling)))
        episodes.append(EpisodeReplay(rec, traj, diff))
    t_end = time.perf_counter()
    return ReplayReport(episodes, {"read_s": t_read - t0, "tokenizer_s": t_tok - t_read,
                                   "replay_s": t_end - t_tok, "total_s": t_end - t0})


def recorded_scores(run_dir: str | Path) -> dict[tuple[int, int], Optional[float]]:
    """The scores in the run's ``trajectories.jsonl`` (a run scored by a reward manager), by episode."""
    path = Path(run_dir) / "trajectories.jsonl"
    if not path.exists():
        return {}
    return {(t["index"], t["sample_id"]): t.get("score") for t in read_json_lines(path, what="a trajectory")}


def rescore(report: ReplayReport, run_dir: str | Path, scorer: str, *, scorer_kwargs: Optional[dict] = None,
            scorer_modules: Iterable[str] = ()) -> dict:
    """Score the replayed episodes with ``scorer`` (a registered scorer's name) through the naive
    manager; each episode's ``score`` is the new one, ``recorded_score`` the run's (its reward manager's
    score, else the episode's reward). Returns a summary: means and how many scores changed."""
    manager = make_reward_manager(RewardConfig(manager="naive", scorer=scorer,
                                               scorer_kwargs={scorer: dict(scorer_kwargs or {})},
                                               scorer_modules=list(scorer_modules)))
    try:
        trajs = [e.trajectory for e in report.episodes]
        score_trajectories(trajs, manager)
    finally:
        manager.close()
    before = recorded_scores(run_dir)
    for e in report.episodes:
        key = (e.record["index"], e.record["sample_id"])
        e.recorded_score = before.get(key)
        if e.recorded_score is None:
            e.recorded_score = e.record["outcome"]["reward"]
        e.score = e.trajectory.get("score")
    pairs = [(e.recorded_score, e.score) for e in report.episodes]
    scored = [(a, b) for a, b in pairs if b is not None]
    return {"scorer": scorer, "episodes": len(pairs), "scored": len(scored),
            "recorded_mean": sum(a for a, _ in scored) / len(scored) if scored else None,
            "rescored_mean": sum(b for _, b in scored) / len(scored) if scored else None,
            "changed": sum(1 for a, b in scored if a != b),
            "errors": sum(1 for e in report.episodes if e.trajectory.get("score_error"))}


__all__ = ["EpisodeReplay", "ReplayReport", "import_modules", "recorded_scores", "replay_run", "rescore"]
