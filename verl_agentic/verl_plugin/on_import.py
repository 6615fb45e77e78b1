"""Run a function right after a module is first executed, without importing it first.

The plugin loads inside ``import verl`` in every verl process (the driver, each Ray worker).
Importing verl's trainer modules there would load them in every worker, and before the CPU
platform is registered they fail (``constants_ppo`` asks the platform for the device at import).
So the plugin watches for the import instead, which happens only in the process that trains
(``verl/trainer/main_ppo.py``'s ``TaskRunnerV1``): :func:`after_import`.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any, Callable

_HOOKS: dict[str, list[Callable[[Any], None]]] = {}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Wraps the loader of a watched module so that its hooks run once the module has executed."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        execute = spec.loader.exec_module  # a loader made for this spec: wrapping it touches nothing else

        def exec_module(module: Any) -> None:
            execute(module)
            for hook in _HOOKS.get(fullname, ()):
                hook(module)

        spec.loader.exec_module = exec_module
        return spec


def after_import(module_name: str, hook: Callable[[Any], None]) -> None:
    """Call ``hook(module)`` now if ``module_name`` is loaded, else right after it first is."""
    if module_name in sys.modules:
        hook(sys.modules[module_name])
        return
    _HOOKS.setdefault(module_name, []).append(hook)
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


__all__ = ["after_import"]
