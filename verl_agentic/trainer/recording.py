"""``output.record`` in the trainer: each step's rollout and each validation's, recorded for
``python -m verl_agentic.replay`` into ``output.dir/recordings/<name>/`` (docs/replay.md). A step redone
after a resume records again, into a fresh folder."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

from verl_agentic.config import RunConfig
from verl_agentic.record import RecordingWriter, recording_header


class RolloutRecording:
    def __init__(self, c: RunConfig, out_dir: Path) -> None:
        self.conf = c
        self.root = out_dir / "recordings"

    def target(self, name: str, backend: Any, rollout_cfg: Any, seed: int) -> Optional[tuple[Path, dict]]:
        """Where the rollout ``name`` is recorded (the folder made afresh) and its header; None when
        ``output.record`` is off or the rollout has no name."""
        c = self.conf
        if not c.output.record or not name:
            return None
        folder = self.root / name
        shutil.rmtree(folder, ignore_errors=True)
        return folder, recording_header(c.raw, backend, rollout_cfg, c.task, c.task_type, seed)


@contextmanager
def recording_writer(target: Optional[tuple[Path, dict]]) -> Iterator[Optional[RecordingWriter]]:
    """The writer of a ``RolloutRecording.target`` (None: no recording), closed when the rollout ends."""
    writer = RecordingWriter(*target) if target is not None else None
    try:
        yield writer
    finally:
        if writer is not None:
            writer.close()
