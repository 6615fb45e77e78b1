"""A run's recording on disk, beside its trajectories (``output.record=true``)::

    recording.json    what the episodes need to run again: the run's config, the tokenizer (its path and
                      its fingerprint, ``probe.py``), the stop ids, the rollout settings, each task's
                      config, the seed
    recording.jsonl   one episode a line, appended as each one finishes (before its trajectory is):
                      {"index", "sample_id", "uid", "task_type", "seed",
                       "ctx": {"sample_index", "max_turns", "seed", "task_config", ...}, "sampling": {...},
                       "limits": {"max_turns", "max_total_tokens", "episode_timeout_s"}, "row",
                       "events": [{"door", "turn", "request", "answer" | "error"}],
                       "outcome": {"prompt_ids", "response_ids", "messages", "turns", "reward",
                                   "finish_reason", "error"}}

``outcome`` is what the episode came to (the trajectory's fields a replay compares). A resumed run
appends to the same file; an episode run twice (a kill between its recording and its trajectory)
has two lines, and the last one counts. ``find_episode`` finds one episode of a large recording
without parsing the others: each line starts with its ``index``, ``sample_id`` and ``uid``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Optional

from verl_agentic.interfaces import ConfigError
from verl_agentic.jsonl import JsonLinesAppender, read_complete_json_lines, read_json_lines
from verl_agentic.record.backend import has_native_chat
from verl_agentic.record.probe import tokenizer_probe
from verl_agentic.record.tape import Tape

FORMAT = "verl_agentic.recording/1"
HEADER = "recording.json"
EPISODES = "recording.jsonl"
OUTCOME_KEYS = ("prompt_ids", "response_ids", "messages", "turns", "reward", "finish_reason", "error")
_LINE_KEY = re.compile(rb'^\{"index": (\d+), "sample_id": (\d+), "uid": ("(?:[^"\\]|\\.)*"), '
                       rb'"episode_id": (null|"(?:[^"\\]|\\.)*")')


class RecordingError(ConfigError):
    """A recording that cannot be read (no recording there, another format, a damaged line, no such
    episode); the message names the file and what to do."""


def has_recording(run_dir: str | Path) -> bool:
    return (Path(run_dir) / HEADER).exists()


def recording_header(config: dict, backend: Any, rollout: Any, task_configs: dict,
                     default_task_type: Optional[str], seed: int) -> dict:
    """What a replay needs besides the episodes: the run's ``config`` (as given), the tokenizer's path and
    the stop ids of ``backend``, the rollout settings (a dataclass or a dict; a replay reads its
    ``chat_template_kwargs``), the task sections, the rollout's seed."""
    stop_ids = list(backend.stop_token_ids or [])
    return {"config": config, "tokenizer": str(getattr(backend.tokenizer, "name_or_path", "") or ""),
            "tokenizer_probe": tokenizer_probe(backend.tokenizer, stop_ids), "stop_token_ids": stop_ids,
            "native_chat": has_native_chat(backend),
            "rollout": rollout if isinstance(rollout, dict) else dataclasses.asdict(rollout),
            "task_configs": task_configs, "default_task_type": default_task_type, "seed": seed}


class RecordingWriter:
    """Appends finished episodes to ``run_dir/recording.jsonl``; writes ``recording.json`` (``header``)
    when the run has none, and keeps a resumed run's (the header of a run does not change on resume)."""

    def __init__(self, run_dir: str | Path, header: dict):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = self.dir / HEADER
        if not meta.exists():
            tmp = meta.with_name(f".{HEADER}.{os.getpid()}.tmp")  # writers in several processes (verl's)
            tmp.write_text(json.dumps({"format": FORMAT, **header}, indent=1, default=str))
            os.replace(tmp, meta)
        done, self.torn_bytes = read_complete_json_lines(self.dir / EPISODES, what="a recorded episode",
                                                         error=RecordingError)
        self.recorded = {(int(r["index"]), int(r["sample_id"])) for r in done}  # the episodes it holds
        self._out: Optional[JsonLinesAppender] = None
        self._lock = threading.Lock()

    def begin(self, index: int, sample_id: int) -> Tape:
        """A fresh recording tape for an episode (``AsyncRollout``'s ``Recorder``)."""
        return Tape("record")

    def finish(self, tape: Tape, traj: dict, *, row: dict, ctx: Any, sampling: Any, limits: Any,
               episode_id: Optional[str] = None) -> None:
        """Write the finished episode's line: its tape, its trajectory's outcome and what it ran with
        (``row``, the ``RolloutContext``, the ``SamplingParams``, the ``LoopLimits``; a replay runs it
        with the same). ``AsyncRollout`` calls this before the trajectory is written."""
        record = {"index": int(traj["index"]), "sample_id": int(traj["sample_id"]), "uid": str(traj["uid"]),
                  "episode_id": episode_id, "task_type": traj["task_type"], "seed": ctx.seed,
                  "ctx": {"sample_index": ctx.sample_index, "max_turns": ctx.max_turns, "seed": ctx.seed,
                          "task_config": ctx.task_config,
                          "max_consecutive_invalid_tool_calls": ctx.max_consecutive_invalid_tool_calls},
                  "sampling": dataclasses.asdict(sampling), "limits": dataclasses.asdict(limits), "row": row,
                  "events": tape.events, "outcome": {k: traj.get(k) for k in OUTCOME_KEYS}}
        if traj.get("rows_before"):  # an episode of several rows: the earlier ones are compared too
            record["outcome"]["rows_before"] = traj["rows_before"]
        with self._lock:
            if self._out is None:
                self._out = JsonLinesAppender(self.dir / EPISODES)
            self._out.append(record)
            self.recorded.add((record["index"], record["sample_id"]))  # main_rollout's journal keys

    def close(self) -> None:
        with self._lock:  # not while another thread's finish() writes
            if self._out is not None:
                self._out.close()
                self._out = None


class RecordingWriters:
    """One ``RecordingWriter`` per recordings folder, for a process that records into many folders over
    a run (verl's agent-loop workers write ``recordings/step_NNNNNN/``, a folder a step): at most
    ``max_open`` of them hold an open file at a time; the least recently used ones are closed and
    reopen on their next episode (an async trainer's late episodes of an older policy version)."""

    def __init__(self, max_open: int = 8):
        self.max_open = max_open
        self._writers: "OrderedDict[str, RecordingWriter]" = OrderedDict()
        self._lock = threading.Lock()

    def get(self, folder: str, header: Callable[[], dict]) -> RecordingWriter:
        """The folder's writer (made with ``header()`` the first time); older writers past ``max_open``
        are closed."""
        with self._lock:
            writer = self._writers.pop(folder, None)
            if writer is None:
                writer = RecordingWriter(folder, header())
            self._writers[folder] = writer  # most recently used last
            for old in list(self._writers.values())[:-self.max_open]:
                old.close()
            return writer

    @property
    def open_files(self) -> int:
        return sum(w._out is not None for w in self._writers.values())

    def close(self) -> None:
        with self._lock:
            for w in self._writers.values():
                w.close()


def read_header(run_dir: str | Path) -> dict:
    meta = Path(run_dir) / HEADER
    if not meta.exists():
        raise RecordingError(f"{run_dir} holds no recording ({HEADER} is missing): record a run with "
                             f"output.record=true")
    try:
        header = json.loads(meta.read_text())
    except ValueError as e:
        raise RecordingError(f"{meta}: not JSON ({e})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        got = header.get("format") if isinstance(header, dict) else type(header).__name__
        raise RecordingError(f"{meta}: format {got!r}, this version reads {FORMAT!r}")
    return header


def read_episodes(run_dir: str | Path) -> list[dict]:
    """Every recorded episode (the last line of each), in ``(index, sample_id)`` order."""
    path = Path(run_dir) / EPISODES
    if not path.exists():
        raise RecordingError(f"{path} is missing: the run recorded no episode")
    out: dict[tuple[int, int, str], dict] = {}
    for rec in read_json_lines(path, what="a recorded episode", error=RecordingError, skip_torn=True):
        out[episode_key(rec)] = rec  # a torn line (logged with its line number) is skipped
    return [out[k] for k in sorted(out)]


def episode_key(record: dict) -> tuple[int, int, str]:
    """What tells a recording's episodes apart: ``(index, sample_id, episode_id or "")``."""
    return int(record["index"]), int(record["sample_id"]), record.get("episode_id") or ""


def parse_episode_id(spec: str) -> tuple[Optional[int], Optional[int], Optional[str]]:
    """``INDEX`` (sample 0), ``INDEX/SAMPLE``, or a uid (or an episode id): ``(index, sample_id, uid)``."""
    m = re.fullmatch(r"(\d+)(?:/(\d+))?", spec.strip())
    if m:
        return int(m.group(1)), int(m.group(2) or 0), None
    return None, None, spec


def find_episode(run_dir: str | Path, spec: str) -> dict:
    """The episode ``spec`` names (``parse_episode_id``) of a recording, reading only its line in full."""
    path = Path(run_dir) / EPISODES
    if not path.exists():
        raise RecordingError(f"{path} is missing: the run recorded no episode")
    index, sample_id, uid = parse_episode_id(spec)
    found: Optional[bytes] = None
    with open(path, "rb") as f:
        for line in f:
            m = _LINE_KEY.match(line)
            if m is None:
                continue
            if uid is None:
                hit = int(m.group(1)) == index and int(m.group(2)) == sample_id
            else:
                hit = uid in (json.loads(m.group(3)), json.loads(m.group(4)))
            if hit and found is not None and uid is not None and _LINE_KEY.match(found).group(1, 2, 4) != \
                    m.group(1, 2, 4):
                raise RecordingError(f"{path}: {spec!r} names several episodes (a prompt's uid is shared by its "
                                     f"samples): give INDEX/SAMPLE or the episode id")
            if hit:
                found = line  # the last line of an episode counts
    if found is None:
        raise RecordingError(f"{path}: no episode {spec!r} (give INDEX, INDEX/SAMPLE or a uid)")
    try:
        return json.loads(found)
    except ValueError as e:
        raise RecordingError(f"{path}: episode {spec!r}: damaged line ({e})") from None

