"""A rollout's journal: episodes written as they finish, and read back to resume.

``main_rollout`` keeps these in ``output.dir``::

    journal.json        what the episodes are of (the run's identity: its config, the rows' hash); a
                        re-run with another identity is refused, naming the keys that differ
    trajectories.jsonl  one finished episode a line, appended as each one finishes (unbuffered: a kill
                        leaves at most a torn last line); at the end rewritten in input order, with
                        the scores, through a temporary file
    scores.jsonl        {"index", "sample_id", "score", "score_extra", "score_error"}, appended as
                        scoring goes; folded into trajectories.jsonl at the end, then removed

Opening a journal in a folder that has them resumes: the episodes and scores there are kept, a torn
last line is dropped, and ``pending`` / ``unscored`` say what is left. An episode is keyed by
``(index, sample_id)``; one is never written twice. A cancelled episode (the run was stopped) is
never written: it did not finish.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Optional

from verl_agentic.interfaces import ConfigError
from verl_agentic.jsonl import JsonLinesAppender, read_complete_json_lines, write_json_lines

SCORE_KEYS = ("score", "score_extra", "score_error")
# score errors that say nothing about the sample (the service was down): scored again on resume
RESCORE_ERRORS = ("service_unavailable",)


class JournalError(ConfigError):
    """``output.dir`` holds outputs this run cannot continue (another run's, or damaged ones); the
    message names the file (and line, or the differing keys) and what to do."""


def _key(record: dict) -> tuple[int, int]:
    return int(record["index"]), int(record["sample_id"])


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


class RolloutJournal:
    """The journal of the rollout whose identity is ``identity`` (JSON-able) in ``out_dir``.

    Raises:
        JournalError: the folder holds another run's outputs, outputs without a journal, or a
            damaged line that is not the last.
    """

    def __init__(self, out_dir: str | Path, identity: dict):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "trajectories.jsonl"
        self.scores_path = self.dir / "scores.jsonl"
        meta = self.dir / "journal.json"
        identity = json.loads(json.dumps(identity))  # as it reads back (tuples are lists)
        if meta.exists():
            try:
                before = json.loads(meta.read_text())["identity"]
            except (ValueError, KeyError, TypeError) as e:
                raise JournalError(f"{meta}: not a rollout journal ({e}); use a new output.dir") from None
            if before != identity:
                a, b = _flat(before), _flat(identity)
                diff = sorted(k for k in a.keys() | b.keys() if a.get(k, "<unset>") != b.get(k, "<unset>"))
                shown = ", ".join(f"{k}: {a.get(k, '<unset>')!r} -> {b.get(k, '<unset>')!r}" for k in diff[:5])
                raise JournalError(f"{self.dir} holds a rollout with other settings ({shown}"
                                   f"{f', and {len(diff) - 5} more' if len(diff) > 5 else ''}); run it with "
                                   f"its settings to continue it, or choose a new output.dir")
        elif self.path.exists():
            raise JournalError(f"{self.path} exists but {meta.name} does not: it is not a resumable rollout "
                               f"(written by an older version, or by hand); choose a new output.dir")
        else:
            tmp = meta.with_name(f".{meta.name}.tmp")
            tmp.write_text(json.dumps({"identity": identity}, indent=1))
            os.replace(tmp, meta)
        episodes, self.torn_bytes = read_complete_json_lines(self.path, what="a trajectory", error=JournalError)
        scores, torn = read_complete_json_lines(self.scores_path, what="a score", error=JournalError)
        self.torn_bytes += torn
        self.episodes: dict[tuple[int, int], dict] = {}
        for t in episodes:
            self.episodes.setdefault(_key(t), t)
        self.scores: dict[tuple[int, int], dict] = {_key(s): {k: s.get(k) for k in SCORE_KEYS} for s in scores}
        for key, t in self.episodes.items():  # a finished run's lines carry their scores
            if "score" in t:
                self.scores.setdefault(key, {k: t.get(k) for k in SCORE_KEYS})
        self.resumed = len(self.episodes)
        self._episodes_out: Optional[JsonLinesAppender] = None
        self._scores_out: Optional[JsonLinesAppender] = None

    # ------------------------------------------------------------------ episodes

    def pending(self, num_rows: int, n: int) -> list[tuple[int, int]]:
        """The ``(index, sample_id)`` pairs not finished yet, row-major."""
        return [(i, k) for i in range(num_rows) for k in range(n) if (i, k) not in self.episodes]

    def append(self, traj: dict) -> None:
        """Write a finished episode now (``AsyncRollout.run``'s ``on_episode``)."""
        key = _key(traj)
        if key in self.episodes:
            return
        if self._episodes_out is None:
            self._episodes_out = JsonLinesAppender(self.path)
        self._episodes_out.append(traj)
        self.episodes[key] = traj

    def trajectories(self, num_rows: int, n: int) -> list[dict]:
        """Every episode in input order (all must be finished), with its score when it has one."""
        out = []
        for i in range(num_rows):
            for k in range(n):
                t = self.episodes[(i, k)]
                if (i, k) in self.scores:
                    t.update(self.scores[(i, k)])
                out.append(t)
        return out

    # ------------------------------------------------------------------ scores

    def unscored(self, trajectories: Iterable[dict]) -> list[dict]:
        """Those of ``trajectories`` without a score, or whose scoring failed for want of the service."""
        out = []
        for t in trajectories:
            s = self.scores.get(_key(t))
            if s is None or (s.get("score_error") or {}).get("type") in RESCORE_ERRORS:
                out.append(t)
        return out

    def record_scores(self, trajectories: Iterable[dict]) -> None:
        """Write the scores ``score_trajectories`` put on these trajectories."""
        if self._scores_out is None:
            self._scores_out = JsonLinesAppender(self.scores_path)
        for t in trajectories:
            s = {k: t.get(k) for k in SCORE_KEYS}
            self._scores_out.append({"index": t["index"], "sample_id": t["sample_id"], **s})
            self.scores[_key(t)] = s

    # ------------------------------------------------------------------ the end

    def finish(self, trajectories: list[dict]) -> None:
        """Rewrite ``trajectories.jsonl`` as ``trajectories`` (input order, scored) in one step; the
        scores file is then folded in and removed."""
        self.close()
        write_json_lines(self.path, trajectories, atomic=True)
        self.scores_path.unlink(missing_ok=True)

    def close(self) -> None:
        for out in (self._episodes_out, self._scores_out):
            if out is not None:
                out.close()
        self._episodes_out = self._scores_out = None
