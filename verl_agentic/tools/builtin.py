"""Imports the built-in tools so they register (python, calculator), when they are present."""

import importlib

for _module in ("verl_agentic.tools.python_sandbox", "verl_agentic.tools.calculator"):
    try:
        importlib.import_module(_module)
    except ModuleNotFoundError as _e:  # pragma: no cover - only while a built-in is missing
        if _e.name != _module:
            raise
