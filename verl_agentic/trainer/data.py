"""The trainer's rows: the training and held-out datasets, their bad rows, and where a run is in them.

``data.on_bad_row=skip`` leaves a bad row of either file out and lists it with its reason in
``output.dir/skipped_rows.jsonl`` (``fail``, the default: the first bad row is an error naming its file,
row and field). Each epoch visits every training row once, in an order seeded by ``seed`` and the epoch
(``data.shuffle=false``: the file's order); ``position`` and ``restore`` are what a checkpoint keeps of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from verl_agentic.config import RunConfig, resolve_data_path
from verl_agentic.rollout.async_rollout import resolve_tasks
from verl_agentic.tasks.data import BadRow, load_rows, write_skipped_rows


class TrainData:
    """The rows of a run (``rows``, ``val_rows``), the bad rows left out (``skipped``) and the tasks they
    resolve to (``tasks``: (task_type, TaskSpec) per training row, checked before the model loads)."""

    def __init__(self, c: RunConfig) -> None:
        self.skipped: list[BadRow] = []
        self.rows = self._load(c.data.path, c.data.max_samples, c)
        self.tasks = resolve_tasks(self.rows, c.task_type, c.task)
        self.val_rows: list[dict] = []
        if c.data.val_path:
            self.val_rows = self._load(c.data.val_path, c.data.val_max_samples, c)
            resolve_tasks(self.val_rows, c.task_type, c.task)
        self.batch_size = c.trainer.batch_size
        self.seed, self.shuffle = c.seed, c.data.shuffle
        self.restore(epoch=0, cursor=0)

    def _load(self, path: str, max_samples: Any, c: RunConfig) -> list[dict]:
        return load_rows(resolve_data_path(path), c.task_type, max_samples, on_bad_row=c.data.on_bad_row,
                         skipped=self.skipped)

    def write_skipped(self, out_dir: Path, log: Callable[[str], None]) -> None:
        """``skipped_rows.jsonl`` in ``out_dir`` and one line in the log, when rows were left out."""
        if self.skipped:
            write_skipped_rows(out_dir / "skipped_rows.jsonl", self.skipped)
            log(f"skipped {len(self.skipped)} bad rows (data.on_bad_row=skip): "
                f"{out_dir / 'skipped_rows.jsonl'} lists them with their reasons")

    def next_rows(self) -> list[dict]:
        """The next ``trainer.batch_size`` training rows, into the next epoch when this one runs out."""
        out = []
        for _ in range(self.batch_size):
            if self.cursor >= len(self._order):
                self.restore(epoch=self.epoch + 1, cursor=0)
            out.append(self.rows[int(self._order[self.cursor])])
            self.cursor += 1
        return out

    def position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def restore(self, epoch: int, cursor: int) -> None:
        self.epoch, self.cursor = int(epoch), int(cursor)
        n = len(self.rows)
        self._order = np.random.default_rng([self.seed, self.epoch]).permutation(n) if self.shuffle else np.arange(n)
