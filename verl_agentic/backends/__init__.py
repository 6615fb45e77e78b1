"""Generation backends: ``hf`` (in-process transformers, the default)."""

from verl_agentic.backends.base import GenerationBackend

__all__ = ["GenerationBackend"]
