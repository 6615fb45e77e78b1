"""The dispatch table: ``task_type`` -> ``TaskSpec(loop, start, gen, obs, end)``.

It lives in the rollout layer because it is the rollout's contract with a task: the rollout looks
a row's task up here and never imports a task. The tasks (``verl_agentic.tasks.*``, a layer above)
register into it; the built-in ones are found through the entry-point group ``verl_agentic.tasks``
(declared in ``pyproject.toml``), the same way a third-party package's are.

Register a task with a decorator on a class (methods ``start``, ``obs``, ``end`` and
optionally ``gen`` / ``loop``; sync or async), or with an explicit ``TaskSpec``::

    from verl_agentic.tasks import register_task   # re-exported there

    @register_task("echo")
    class EchoTask:
        def start(self, row, ctx): ...
        def obs(self, state, gen_out): ...
        def end(self, state): ...

    register_task("echo2", TaskSpec(start=..., obs=..., end=...))

A package registers its tasks through the entry-point group ``verl_agentic.tasks``: the entry point
names a module whose import registers them (or a ``TaskSpec``/class, registered under the
entry point's name).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

from verl_agentic.interfaces import ConfigError
from verl_agentic.registry import Registry, describe_definition
from verl_agentic.rollout.loops import default_gen, ids_agent_loop

ENTRY_POINT_GROUP = "verl_agentic.tasks"


@dataclass(frozen=True)
class TaskSpec:
    """The functions that make a task.

    ``start(row, ctx)``, ``obs(state, gen_out)``, ``end(state)``: see ``verl_agentic.interfaces``.
    ``gen(state, backend, sampling)`` defaults to continuing the token context with the backend;
    ``loop(task, row, ctx, backend, sampling, limits, template)`` to ``ids_agent_loop``.
    ``check_config(task_config)``, optional, validates the task's config section once before
    any episode runs (raise ``ConfigError``), so a typo fails fast instead of in every episode.
    ``scorer``, optional: the registered scorer (``register_scorer``) that scores this task's episodes
    whatever their ``data_source``; without one (and none registered under the data source or the task's
    name) a reward manager scores an episode by its own reward, ``end``'s ``EpisodeResult.reward``.
    """

    start: Callable
    obs: Callable
    end: Callable
    gen: Optional[Callable] = None
    loop: Optional[Callable] = None
    check_config: Optional[Callable[[dict], Any]] = None
    name: str = ""
    scorer: Optional[str] = None

    def __post_init__(self) -> None:
        for field_name in ("start", "obs", "end"):
            if not callable(getattr(self, field_name)):
                raise ConfigError(f"TaskSpec.{field_name} must be callable, got {getattr(self, field_name)!r}")
        if self.scorer is not None and (not isinstance(self.scorer, str) or not self.scorer):
            raise ConfigError(f"TaskSpec.scorer must be a scorer's name, got {self.scorer!r}")
        if self.gen is None:
            object.__setattr__(self, "gen", default_gen)
        if self.loop is None:
            object.__setattr__(self, "loop", ids_agent_loop)


TASKS: Registry[TaskSpec] = Registry("task_type", entry_point_group=ENTRY_POINT_GROUP)


def _spec_from_class(cls: type, name: str) -> TaskSpec:
    instance = cls()
    missing = [m for m in ("start", "obs", "end") if not callable(getattr(instance, m, None))]
    if missing:
        raise ConfigError(f"task class {cls.__qualname__} registered as {name!r} lacks {', '.join(missing)}")
    return TaskSpec(
        start=instance.start, obs=instance.obs, end=instance.end,
        gen=getattr(instance, "gen", None), loop=getattr(instance, "loop", None),
        check_config=getattr(instance, "check_config", None), name=name, scorer=getattr(instance, "scorer", None),
    )


def register_task(name: str, spec: Any = None, *, replace: bool = False) -> Any:
    """Register a task under ``name``: a ``TaskSpec``, or (as a decorator) a class.

    Registering a different definition under a name already taken raises an error that
    names both definitions.
    """

    def do_register(obj: Any) -> Any:
        if isinstance(obj, TaskSpec):
            task_spec = obj if obj.name == name else TaskSpec(**{**obj.__dict__, "name": name})
            source = describe_definition(obj.start)
        elif inspect.isclass(obj):
            task_spec = _spec_from_class(obj, name)
            source = describe_definition(obj)
        else:
            raise ConfigError(f"register_task({name!r}) takes a TaskSpec or a class, got {obj!r}")
        TASKS.register(name, task_spec, source=source, replace=replace)
        return obj

    if spec is None:
        return do_register
    return do_register(spec)


def get_task(name: str) -> TaskSpec:
    """The TaskSpec of ``name``; an unknown name raises ConfigError listing the registered ones."""
    return TASKS.get(name)
