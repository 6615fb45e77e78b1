"""A progress bar for long scoring runs (stderr), or a no-op one when progress is off."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass


@contextlib.contextmanager
def progress_bar(total: int, desc: str, enabled: bool) -> Iterator:
    if not enabled:
        yield _NoBar()
        return
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="sample", file=sys.stderr, dynamic_ncols=True, mininterval=0.5)
    try:
        yield bar
    finally:
        bar.close()
