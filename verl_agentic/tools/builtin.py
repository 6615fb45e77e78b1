"""Imports the built-in tools and extra parsers so they register (python, calculator, python_code)."""

import importlib

for _module in ("verl_agentic.tools.python_sandbox", "verl_agentic.tools.calculator",
                "verl_agentic.tools.code_parser"):
    try:
        importlib.import_module(_module)
    except ModuleNotFoundError as _e:  # pragma: no cover - only while a built-in is missing
        if _e.name != _module:
            raise
