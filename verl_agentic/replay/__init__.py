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
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from verl_agentic.interfaces import RolloutContext, SamplingParams
from verl_agentic.jsonl import read_json_lines
from verl_agentic.models.embedded import EMBEDDED_NAMES, embedded_model_dir
from verl_agentic.record import (
    NoChatModel,
    NoModel,
    RecordingError,
    Tape,
    find_episode,
    read_episodes,
    read_header,
    taped,
    using,
)
from verl_agentic.record.probe import tokenizer_probe
from verl_agentic.replay.compare import first_difference
from verl_agentic.replay.tokenizer import LightTokenizer
from verl_agentic.registry import import_modules
from verl_agentic.reward.base import RewardConfig, make_reward_manager, score_trajectories
from verl_agentic.rollout.loops import LoopLimits
from verl_agentic.rollout.task_spec import get_task
from verl_agentic.rollout.template import ChatTemplate
from verl_agentic.rollout.trajectory import build_trajectory

logger = logging.getLogger(__name__)


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
        episode = self.record.get("episode_id")
        return f"{self.record['index']}/{self.record['sample_id']}" + (f" {episode}" if episode else "")

    def as_dict(self) -> dict:
        out = {"index": self.record["index"], "sample_id": self.record["sample_id"], "uid": self.record["uid"],
               "episode_id": self.record.get("episode_id"), "task_type": self.record["task_type"], "same": self.difference is None, "difference": self.difference,
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


def tokenizer_path(header: dict, given: Optional[str] = None) -> str:
    """The tokenizer to replay with: ``given``, else the recorded one when it is on this machine, else the
    embedded model's when the run used it (``model.path`` null or ``embedded``; logged, as the recorded
    path is not the one used)."""
    if given:
        return str(given)
    path = header.get("tokenizer") or ""
    if path and Path(path).exists():
        return path
    model = ((header.get("config") or {}).get("model") or {}).get("path")
    if model is None or str(model).strip().lower() in EMBEDDED_NAMES:
        embedded = str(embedded_model_dir(quiet=True))
        logger.warning("replay: the recorded tokenizer %r is not on this machine; the run used the embedded model, so "
                    "its tokenizer replays it: %s", path, embedded)
        return embedded
    raise RecordingError(f"the recorded run's tokenizer {path!r} is not on this machine: pass --tokenizer PATH "
                         f"(a folder with the same tokenizer)")


def load_tokenizer(path: str, probe: Optional[dict] = None, stop_token_ids: Iterable[int] = ()) -> tuple[Any, str]:
    """The tokenizer in ``path`` and how it was loaded: ``"light"`` (``replay/tokenizer.py``, without
    transformers) when its fingerprint equals ``probe`` (the recorded tokenizer's), else ``"transformers"``.
    Which one, and why not the light one, is logged."""
    why = "the recording has no tokenizer fingerprint"
    if probe:
        try:
            light = LightTokenizer(path)
        except Exception as e:  # noqa: BLE001 - a folder it cannot serve (no tokenizer.json, a template jinja2
            # cannot parse, ...): transformers loads it, only slower; the reason is logged below
            light, why = None, f"the light tokenizer cannot serve it ({type(e).__name__}: {e})"
        if light is not None:
            if tokenizer_probe(light, list(stop_token_ids)) == probe:
                logger.info("replay: tokenizer %s (light: its fingerprint is the recorded tokenizer's)", path)
                return light, "light"
            why = "the light tokenizer's fingerprint differs from the recorded tokenizer's"
    # on first use: transformers (and torch) take seconds to import
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise RecordingError(f"cannot load the recorded run's tokenizer {path!r}: {e}") from None
    logger.warning("replay: tokenizer %s loaded with transformers, not the light tokenizer: %s", path, why)
    return tokenizer, "transformers"


def recorded_imports(header: dict) -> list[str]:
    """The modules the recorded run imported for its own tasks and scorers (``imports``; the verl
    plugin's ``agentic.imports``): a replay imports them too."""
    config = header.get("config") or {}
    return [*(config.get("imports") or []), *((config.get("agentic") or {}).get("imports") or [])]


async def replay_episode(record: dict, tokenizer: Any, stop_token_ids: list[int], template: ChatTemplate, *,
                         live: Iterable[str] = (), task_config: Optional[dict] = None,
                         native_chat: bool = False) -> EpisodeReplay:
    """Run one recorded episode's task again, every door answering from its recording (``live``: the
    doors that run for real), with what it ran with (its row, context, sampling and limits; its task
    section replaced by ``task_config`` when given), and compare it with the recording. ``native_chat``:
    the recorded backend spoke chat itself (the header's ``native_chat``)."""
    task_type = record["task_type"]
    spec = get_task(task_type)
    c = record["ctx"]
    ctx = RolloutContext(tokenizer=tokenizer, task_config=dict(c["task_config"] if task_config is None else task_config),
                         sample_index=c["sample_index"], max_turns=c["max_turns"], seed=c["seed"],
                         max_consecutive_invalid_tool_calls=c.get("max_consecutive_invalid_tool_calls"),
                         max_total_tokens=record["limits"].get("max_total_tokens"))
    sampling = SamplingParams(**record["sampling"])
    limits = LoopLimits(**record["limits"])
    tape = Tape("replay", record["events"], live=live)
    backend = taped((NoChatModel if native_chat else NoModel)(tokenizer, stop_token_ids), tape)
    with using(tape):
        state, result = await spec.loop(spec, record["row"], ctx, backend, sampling, limits, template)
    traj = build_trajectory(state, result, uid=record["uid"], task_type=task_type, index=record["index"],
                            sample_id=record["sample_id"], scorer=spec.scorer)
    return EpisodeReplay(record, traj, first_difference(record["outcome"], traj, tape, tokenizer))


def replay_run(run_dir: str | Path, *, episode: Optional[str] = None, live: Iterable[str] = (),
               tokenizer: Any = None, task_configs: Optional[dict] = None, concurrency: int = 16) -> ReplayReport:
    """Replay the recording in ``run_dir`` (every episode, or the one ``episode`` names: ``INDEX``,
    ``INDEX/SAMPLE`` or a uid). ``live``: doors that run for real (``record.LIVE_DOORS``). ``task_configs``:
    task sections to use instead of the recorded ones (e.g. a service's new address for ``--live http``).
    ``tokenizer``: a tokenizer object, or the path of one (default: ``tokenizer_path``)."""
    t0 = time.perf_counter()
    header = read_header(run_dir)
    import_modules(recorded_imports(header), "the recorded run's imports")
    records = [find_episode(run_dir, episode)] if episode is not None else read_episodes(run_dir)
    t_read = time.perf_counter()
    kind = "given"
    if tokenizer is None or isinstance(tokenizer, (str, Path)):
        tokenizer, kind = load_tokenizer(tokenizer_path(header, tokenizer), header.get("tokenizer_probe"),
                                         header["stop_token_ids"])
    t_tok = time.perf_counter()
    template = ChatTemplate(tokenizer, (header.get("rollout") or {}).get("chat_template_kwargs") or {})
    live = tuple(live)
    overrides = dict(task_configs or {})
    for name, cfg in overrides.items():  # a replaced section is checked as a run checks it
        check = get_task(name).check_config
        if check is not None:
            check(dict(cfg))

    async def all_episodes() -> list[EpisodeReplay]:
        sem = asyncio.Semaphore(concurrency)

        async def one(rec: dict) -> EpisodeReplay:
            async with sem:
                return await replay_episode(rec, tokenizer, header["stop_token_ids"], template, live=live,
                                            task_config=overrides.get(rec["task_type"]),
                                            native_chat=bool(header.get("native_chat")))

        return list(await asyncio.gather(*(one(r) for r in records)))

    episodes = asyncio.run(all_episodes())
    t_end = time.perf_counter()
    return ReplayReport(episodes, {"read_s": t_read - t0, "tokenizer_s": t_tok - t_read, "tokenizer": kind,
                                   "replay_s": t_end - t_tok, "total_s": t_end - t0})


def recorded_scores(run_dir: str | Path) -> dict[tuple[int, int], Optional[float]]:
    """The scores in the run's ``trajectories.jsonl`` (a run scored by a reward manager), by episode."""
    path = Path(run_dir) / "trajectories.jsonl"
    if not path.exists():
        return {}
    return {(t["index"], t["sample_id"]): t.get("score") for t in read_json_lines(path, what="a trajectory", skip_torn=True)}


def rescore(report: ReplayReport, run_dir: str | Path, scorer: Optional[str] = None, *,
            scorer_kwargs: Optional[dict] = None, scorer_modules: Iterable[str] = ()) -> dict:
    """Score the replayed episodes and set each one's ``score`` beside ``recorded_score`` (the run's: its
    reward manager's score, else the episode's reward). Returns a summary: means, how many changed.

    ``scorer``: a registered scorer's name, through the ``naive`` manager (re-scoring with a new scorer:
    a report, the episodes' differences stay as they are). None: the run's own ``reward`` section, as
    recorded (a regression check of the scoring: a score that changed is the episode's difference, at its
    last turn, when nothing differed before)."""
    header = read_header(run_dir)
    modules = [*recorded_imports(header), *scorer_modules]
    if scorer is None:
        reward = dict((header.get("config") or {}).get("reward") or {})
        if reward.get("manager") in (None, "none"):
            raise RecordingError(f"{run_dir}: the run was not scored (no reward section, or reward.manager=none): "
                                 f"re-score with --scorer NAME")
        config = RewardConfig.from_dict({**reward, "progress": False,
                                         "scorer_modules": [*(reward.get("scorer_modules") or []), *modules]})
    else:
        config = RewardConfig(manager="naive", scorer=scorer, scorer_kwargs={scorer: dict(scorer_kwargs or {})},
                              scorer_modules=modules)
    manager = make_reward_manager(config)
    try:
        score_trajectories([e.trajectory for e in report.episodes], manager)
    finally:
        manager.close()
    before = recorded_scores(run_dir)
    for e in report.episodes:
        e.recorded_score = before.get((e.record["index"], e.record["sample_id"]))
        if e.recorded_score is None:
            e.recorded_score = e.record["outcome"]["reward"]
        e.score = e.trajectory.get("score")
        if scorer is None and e.difference is None and e.score != e.recorded_score:
            turns = sum(1 for t in e.trajectory["turns"] if t["role"] == "assistant")
            e.difference = {"turn": turns, "what": "score", "detail": f"recorded {e.recorded_score!r}, re-scored "
                            f"{e.score!r} (reward.manager={config.manager}; {e.trajectory.get('score_error')})"}
    pairs = [(e.recorded_score, e.score) for e in report.episodes]
    scored = [(a, b) for a, b in pairs if b is not None]
    return {"scorer": scorer or f"the run's reward.manager={config.manager}", "episodes": len(pairs),
            "scored": len(scored),
            "recorded_mean": sum(a for a, _ in scored) / len(scored) if scored else None,
            "rescored_mean": sum(b for _, b in scored) / len(scored) if scored else None,
            "changed": sum(1 for a, b in scored if a != b),
            "errors": sum(1 for e in report.episodes if e.trajectory.get("score_error"))}


__all__ = ["EpisodeReplay", "ReplayReport", "recorded_imports", "recorded_scores", "replay_episode", "replay_run",
           "rescore"]
