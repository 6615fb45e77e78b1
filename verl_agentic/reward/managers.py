"""Imports the built-in reward managers so they register: naive, prime, swedev."""

from verl_agentic.reward import naive, prime, remote  # noqa: F401
