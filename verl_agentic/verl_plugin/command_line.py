"""verl's trainer command line, as the plugin reads it inside ``import verl``: whether this process is verl's
trainer (``python -m verl.trainer.main_ppo ...``) and the hydra overrides on its command line."""

from __future__ import annotations

import sys
from typing import Sequence


def is_verl_trainer(argv0: str) -> bool:
    # `python -m verl.trainer.main_ppo` imports verl while locating the module: sys.argv[0] is still "-m"
    # then, and the module's name is only in the interpreter's own command line
    orig = list(getattr(sys, "orig_argv", ()))
    if "-m" in orig[:-1] and orig[orig.index("-m") + 1].startswith("verl.trainer."):
        return True
    return "/verl/trainer/" in argv0.replace("\\", "/")


def overrides(argv: Sequence[str]) -> dict[str, str]:
    """{key: value} of the ``key=value`` overrides in ``argv``, the key without hydra's ``+`` / ``~`` prefix;
    arguments without ``=`` (``--help``, ``~key``) are not overrides of a value."""
    return {key.lstrip("+~"): value for key, _, value in (arg.partition("=") for arg in argv if "=" in arg)}
