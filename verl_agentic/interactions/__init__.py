"""Interactions (the environment / simulated-user side of multi-turn episodes). See ``base.py``."""

from verl_agentic.interactions.base import BaseInteraction, call_with_instance
from verl_agentic.interactions.registry import (
    INTERACTION_CLASSES,
    Interactions,
    load_interactions,
    register_interaction,
)

__all__ = ["BaseInteraction", "call_with_instance", "INTERACTION_CLASSES", "Interactions", "load_interactions", "register_interaction"]
