"""Imports the built-in tools and extra parsers so they register (python, calculator, search, python_code)."""

from verl_agentic.tools import calculator, code_parser, python_sandbox, search  # noqa: F401
