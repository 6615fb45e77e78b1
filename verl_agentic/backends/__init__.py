"""Generation backends: ``hf`` (in-process transformers, the default) and ``openai`` (an OpenAI-compatible
server such as vLLM, ``openai_http.OpenAIBackend``); ``chat_adapter`` gives token backends a ``chat()``."""

from verl_agentic.backends.base import GenerationBackend

__all__ = ["GenerationBackend"]
