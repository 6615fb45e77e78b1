"""Named interactions from config; the sample's ``interaction_kwargs.name`` picks one.

YAML (as in verl's former ``interaction_config_path`` files)::

    interaction:
      - name: gsm8k                       # optional: generated from the class name when missing
        class_name: gsm8k                 # a registered name or a dotted path
        config: {}
      - name: verify
        class_name: code_verify
        config: {feedback_message: "Are you sure? Can you write Python code to verify?", max_rounds: 3}

Duplicate names are rejected; an unknown name at lookup lists the configured ones. A sample
without ``interaction_kwargs.name`` gets ``gsm8k`` (verl's default) when that is configured,
else the only configured interaction.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional, Union

from verl_agentic.interfaces import ConfigError
from verl_agentic.registry import Registry

INTERACTION_CLASSES: Registry[type] = Registry("interaction class", "verl_agentic.interactions")
DEFAULT_NAME = "gsm8k"


def register_interaction(name: str):
    def decorator(cls: type) -> type:
        INTERACTION_CLASSES.register(name, cls)
        return cls
    return decorator


def _default_name(class_name: str) -> str:
    base = class_name.rpartition(".")[2]
    base = re.sub(r"Interaction$", "", base) or base
    return re.sub(r"(?<!^)(?=[A-Z])", "_", base).lower()


class Interactions:
    """The configured interactions by name."""

    def __init__(self, interactions: dict[str, Any]):
        self.by_name = interactions

    def __bool__(self) -> bool:
        return bool(self.by_name)

    def names(self) -> list[str]:
        return sorted(self.by_name)

    async def close(self) -> None:
        """Close every interaction (``BaseInteraction.close``; a class without ``close`` holds nothing)."""
        for interaction in self.by_name.values():
            close = getattr(interaction, "close", None)
            if close is not None:
                await close()

    def select(self, interaction_kwargs: Optional[dict]) -> tuple[str, Any]:
        name = (interaction_kwargs or {}).get("name")
        if name is None:
            if DEFAULT_NAME in self.by_name:
                name = DEFAULT_NAME
            elif len(self.by_name) == 1:
                name = next(iter(self.by_name))
            else:
                raise ConfigError(f"the sample names no interaction (interaction_kwargs.name) and none is named "
                                  f"{DEFAULT_NAME!r}; configured: {', '.join(self.names())}")
        if name not in self.by_name:
            raise ConfigError(f"unknown interaction {name!r}; configured: {', '.join(self.names()) or '(none)'}")
        return name, self.by_name[name]


def load_interactions(config: Union[str, Path, dict, list, None]) -> Interactions:
    """From a YAML path, a ``{"interaction": [...]}`` dict, the list, or a bare class name.

    The classes are registered names (the built-in ``gsm8k`` and ``code_verify`` come from the
    gsm8k task, through the ``verl_agentic.interactions`` entry points) or dotted paths."""
    if config is None:
        return Interactions({})
    if isinstance(config, str) and not config.endswith((".yaml", ".yml")):
        config = [{"class_name": config}]
    if isinstance(config, (str, Path)):
        import yaml

        path = Path(config)
        if not path.exists():
            raise ConfigError(f"interaction config '{path}' does not exist")
        config = yaml.safe_load(path.read_text()) or {}
    entries = config.get("interaction", []) if isinstance(config, dict) else config
    if not isinstance(entries, list):
        raise ConfigError("interaction config: 'interaction' must be a list of {name, class_name, config}")
    out: dict[str, Any] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ConfigError(f"interaction[{i}]: needs 'class_name' (and optional 'name', 'config')")
        unknown = set(entry) - {"name", "class_name", "config"}
        if unknown:
            raise ConfigError(f"interaction[{i}]: unknown keys {sorted(unknown)}")
        name = entry.get("name") or _default_name(entry["class_name"])
        if name in out:
            raise ConfigError(f"interaction name {name!r} is configured twice (interaction[{i}])")
        try:
            cls = INTERACTION_CLASSES.get_or_import(entry["class_name"])
        except ConfigError as e:
            missing = getattr(e.__cause__, "name", None) or ""  # ModuleNotFoundError.name: the module not found
            if not (missing == "verl.interactions" or missing.startswith("verl.interactions.")):
                raise
            raise ConfigError(f"{e}. verl removed verl.interactions in 0.8: in {entry['class_name']!r}'s module change "
                              "`from verl.interactions.base import BaseInteraction` to `from verl_agentic.interactions "
                              "import BaseInteraction` (docs/migrating.md)") from None
        out[name] = cls({**(entry.get("config") or {}), "name": name})
    return Interactions(out)
