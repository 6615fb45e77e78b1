"""verl-agentic: multi-turn, tool-calling RL rollouts for LLMs, as a plugin for verl."""

__version__ = "0.1.0"
