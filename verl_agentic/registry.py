"""A named registry with clear errors, shared by tasks, prompt generators and preprocessors.

Duplicate names are an error that names both definitions (re-registering the very same
definition, as happens when a module is imported twice, is allowed). Unknown names are an
error that lists what is registered. A registry may also discover registrations from a
Python entry-point group, so third-party packages can register without edits here; the
built-in tasks, scorers and interactions are found the same way (``pyproject.toml``), so no
registry imports what registers into it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import sys
import threading
from typing import Any, Callable, Generic, Iterator, Optional, TypeVar

from verl_agentic.interfaces import ConfigError

T = TypeVar("T")

IMPORTS_HINT = ("every process that runs tasks or scorers imports it (Ray's workers and prime's processes too): "
                "run from the folder that holds it (the working directory is on sys.path, Ray's workers' too) "
                "or add that folder to PYTHONPATH; on a Ray cluster the run joins (RAY_ADDRESS), ship the folder "
                "to every node with +ray_kwargs.ray_init.runtime_env.working_dir=<the folder>")


def _where() -> str:
    """`` (on Ray node <id>)`` in a process connected to Ray, else nothing: which node lacks a module."""
    ray = sys.modules.get("ray")  # only where Ray is already loaded: this module does not need it
    if ray is None or not ray.is_initialized():
        return ""
    return f" (on Ray node {ray.get_runtime_context().get_node_id()})"


def import_modules(modules: Any, key: str = "imports") -> list:
    """Import each module named in ``modules`` (a name or a list of names): their import registers
    tasks, scorers, tools, interactions. The ``imports`` option of ``main_rollout`` and ``main_ppo``,
    ``+agentic.imports`` of the verl plugin and ``reward.scorer_modules`` all come here. A name that
    does not import is a ``ConfigError`` naming ``key``, the module and the cause."""
    if modules is None:
        return []
    names = [modules] if isinstance(modules, str) else list(modules)
    out = []
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{key} must be a list of module names, got {modules!r}")
        name = name.strip()
        try:
            out.append(importlib.import_module(name))
        except ImportError as e:
            missing = getattr(e, "name", None)
            not_found = missing is not None and (name == missing or name.startswith(missing + "."))
            cause = f"{e}; {IMPORTS_HINT}" if not_found else f"importing it raised {type(e).__name__}: {e}"
            raise ConfigError(f"{key}: cannot import {name!r}{_where()}: {cause}") from e
    return out


def describe_definition(obj: Any) -> str:
    """``module.qualname (file:line)`` of a function/class, for error messages."""
    target = getattr(obj, "__wrapped__", obj)
    module = getattr(target, "__module__", None) or type(target).__module__
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    try:
        file = inspect.getsourcefile(target)
        line = inspect.getsourcelines(target)[1]
        return f"{module}.{qualname} ({file}:{line})"
    except (TypeError, OSError):
        return f"{module}.{qualname}"


class Registry(Generic[T]):
    """``name -> object`` with decorator registration, entry points and helpful errors."""

    def __init__(self, kind: str, entry_point_group: Optional[str] = None, *, modules_only: bool = False):
        """``modules_only``: the group's entry points are modules whose import registers here (a
        registry sharing its group with another, e.g. the tasks' prompt generators with ``TASKS``,
        must not register the other's objects under their entry-point names)."""
        self.kind = kind
        self.entry_point_group = entry_point_group
        self.modules_only = modules_only
        self._items: dict[str, T] = {}
        self._sources: dict[str, str] = {}
        self._entry_points_loaded = entry_point_group is None
        self._lock = threading.RLock()

    # -- registration -------------------------------------------------------------------
    def register(self, name: str, obj: Optional[T] = None, *, source: Optional[str] = None,
                 replace: bool = False) -> Any:
        """Register ``obj`` under ``name``; without ``obj``, return a decorator."""
        if obj is None:
            def decorator(o: T) -> T:
                self.register(name, o, source=source, replace=replace)
                return o
            return decorator
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{self.kind} name must be a non-empty string, got {name!r}")
        src = source or describe_definition(obj)
        with self._lock:
            if name in self._items and not replace and self._sources[name] != src:
                raise ConfigError(
                    f"{self.kind} {name!r} is registered twice: first by {self._sources[name]}, "
                    f"again by {src}. Pick another name, or pass replace=True to override."
                )
            self._items[name] = obj
            self._sources[name] = src
        return obj

    def unregister(self, name: str) -> None:
        with self._lock:
            self._items.pop(name, None)
            self._sources.pop(name, None)

    # -- lookup ---------------------------------------------------------------------------
    def load_entry_points(self) -> None:
        """Import every entry point of the group once (their import registers them).

        An entry point whose object is not registered by importing it is registered under
        the entry point's name. A broken plugin is reported, not silently skipped.
        """
        with self._lock:
            if self._entry_points_loaded:
                return
            self._entry_points_loaded = True
        for ep in importlib.metadata.entry_points(group=self.entry_point_group):
            try:
                obj = ep.load()
            except Exception as e:  # a broken third-party plugin must not hide the others
                raise ConfigError(
                    f"failed to load {self.kind} plugin {ep.name!r} ({ep.value}) from entry-point "
                    f"group {self.entry_point_group!r}: {type(e).__name__}: {e}"
                ) from e
            if ep.name not in self._items and not inspect.ismodule(obj) and not self.modules_only:
                self.register(ep.name, obj, source=f"entry point {ep.value}")

    def get(self, name: str) -> T:
        self.load_entry_points()
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            hint = ""
            if (self.entry_point_group and self.entry_point_group.startswith("verl_agentic.")
                    and not importlib.metadata.entry_points(group=self.entry_point_group)):
                hint = (f" (no entry points in {self.entry_point_group!r}, where the built-in ones come from: "
                        "install verl-agentic, or reinstall it after pyproject.toml changed: pip install -e .)")
            raise ConfigError(f"unknown {self.kind} {name!r}; registered: {known}{hint}") from None

    def get_or_import(self, name: str) -> T:
        """A registered name, or else a dotted import path (``pkg.module.Attr``).

        A bare unknown name is the usual error listing the registered ones; a dotted path that
        does not import names it and lists them too.
        """
        if name in self or "." not in name:
            return self.get(name)
        module, _, attr = name.rpartition(".")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"{self.kind} {name!r} cannot be imported: {e}; registered names: "
                              f"{', '.join(self.names()) or '(none)'}") from e

    def source(self, name: str) -> str:
        self.get(name)
        return self._sources[name]

    def names(self) -> list[str]:
        self.load_entry_points()
        return sorted(self._items)

    __getitem__ = get

    def __contains__(self, name: object) -> bool:
        self.load_entry_points()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def items(self) -> list[tuple[str, T]]:
        return [(n, self._items[n]) for n in self.names()]

