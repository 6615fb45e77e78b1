"""A warning, before anything starts, when a run joins a Ray cluster with task modules only this machine has.

``+agentic.imports=[my_tasks]`` names modules every agent-loop and reward worker imports. When verl's trainer
starts its own Ray (one machine), its workers find them as the driver does. When it joins a running cluster
(``RAY_ADDRESS``), a worker on another node has neither the driver's working directory nor its
``PYTHONPATH``: each episode there fails (``agentic.imports: cannot import ... (on Ray node ...)``), and verl
ends the run with its own error for groups without trajectories. So in verl's trainer process, at ``import
verl``, this names each such module that is found here outside the installed packages while the command line
ships nothing through Ray's runtime_env (``working_dir`` or ``py_modules``), with the override that ships it.
A warning, not an error: a shared filesystem may give every node the same path.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path
from typing import Mapping, Optional, Sequence

from verl_agentic.verl_plugin.command_line import is_verl_trainer, overrides

SHIPPING_KEYS = ("ray_kwargs.ray_init.runtime_env.working_dir", "ray_kwargs.ray_init.runtime_env.py_modules")


def _module_names(value: str) -> list[str]:
    """``[a, b]`` / ``a`` (hydra's list or a single name) -> the names."""
    return [name.strip(" '\"") for name in value.strip().strip("[]").split(",") if name.strip(" '\"")]


def _installed(name: str, origin: str) -> bool:
    """In the standard library, site-packages, or a distribution's package (an editable install too)."""
    if name.split(".")[0] in importlib.metadata.packages_distributions():
        return True
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return any(Path(origin).resolve().is_relative_to(Path(root).resolve()) for root in roots)


def unshipped_imports(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """One warning per ``agentic.imports`` module that a joined cluster's other nodes may lack."""
    address = environ.get("RAY_ADDRESS")
    given = overrides(argv)
    if not address or any(key in given for key in SHIPPING_KEYS) or "agentic.imports" not in given:
        return []
    out = []
    for name in _module_names(given["agentic.imports"]):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # a missing parent package: the import's own error names it later
            spec = None
        origin = getattr(spec, "origin", None)
        if not origin or not os.path.isabs(origin) or _installed(name, origin):
            continue
        folder = Path(origin).parent if Path(origin).name != "__init__.py" else Path(origin).parent.parent
        out.append(f"agentic.imports: {name!r} is found here at {origin}, outside the installed packages, and "
                   f"this run joins the Ray cluster at RAY_ADDRESS={address} without shipping it: a node "
                   f"without that path cannot import it (each of its episodes fails). Ship it with "
                   f"+ray_kwargs.ray_init.runtime_env.working_dir={folder}")
    return out


def warn_unshipped_imports(argv: Optional[Sequence[str]] = None, environ: Optional[Mapping[str, str]] = None) -> None:
    """In verl's trainer process only (``python -m verl.trainer.main_ppo ...``): print the warnings."""
    argv = list(sys.argv if argv is None else argv)
    if not argv or not is_verl_trainer(argv[0]):
        return
    for line in unshipped_imports(argv[1:], os.environ if environ is None else environ):
        print(f"[verl-agentic] WARNING {line}", file=sys.stderr, flush=True)
