"""verl's platform interface for a machine without an accelerator.

verl reaches the device through ``verl.plugin.platform.get_platform()``: the device name
(``"cpu"`` here, so verl builds CPU device meshes and looks up engines registered for "cpu"),
the ``torch.<device>`` module it calls ``empty_cache``/``synchronize``/``mem_get_info`` etc. on,
the collective backend (gloo), and the Ray resource its placement groups ask for. The Ray
resource stays ``"GPU"``: verl's resource pools are written in GPUs, so a CPU run declares one
logical GPU to Ray (``+ray_kwargs.ray_init.num_gpus=1``) and every "GPU" bundle lands on it;
nothing ever touches CUDA.
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any, Optional

import torch

from verl.plugin.platform import PlatformBase


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


def _mem_get_info(*args: Any, **kwargs: Any) -> tuple[int, int]:
    """(free, total) bytes of host memory, as ``torch.cuda.mem_get_info`` reports device memory."""
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


class _CPUDeviceModule(types.ModuleType):
    """``torch.cpu`` plus the ``torch.cuda`` calls verl makes on its device module.

    Memory statistics read 0 and cache calls do nothing: host memory has no caching allocator
    to report on. RNG calls go to torch's default (CPU) generator.
    """

    def __init__(self) -> None:
        super().__init__("verl_agentic_cpu_device")
        for name in ("empty_cache", "reset_peak_memory_stats", "reset_max_memory_allocated", "ipc_collect",
                     "set_per_process_memory_fraction", "set_device", "init"):
            setattr(self, name, _noop)
        for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
                     "memory_cached"):
            setattr(self, name, _zero)
        self.mem_get_info = _mem_get_info
        self.manual_seed = torch.manual_seed
        self.manual_seed_all = torch.manual_seed
        self.get_rng_state = torch.get_rng_state
        self.set_rng_state = torch.set_rng_state
        self.current_device = lambda: "cpu"
        self.device_count = lambda: 1
        self.is_available = lambda: True
        self.is_initialized = lambda: True
        self.synchronize = _noop
        self.memory_stats = lambda *a, **k: {}
        self.get_device_name = lambda *a, **k: "CPU"  # verl's flops counter: "CPU" is its name for torch.cpu

    def __getattr__(self, name: str) -> Any:  # everything else: torch.cpu's own (Stream, device, ...)
        return getattr(torch.cpu, name)


CPU_DEVICE_MODULE = _CPUDeviceModule()


class PlatformCPU(PlatformBase):
    """The ``cpu`` platform: selected with ``VERL_PLATFORM=cpu`` (see ``verl_plugin.cpu``)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # never auto-detected: a CPU run is asked for explicitly (VERL_PLATFORM=cpu)
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"

    def current_device(self) -> Any:
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def rollout_env_vars(self) -> dict[str, str]:
        """For verl's vLLM server (``vllm_async_server.py``, ``launch_servers``): vLLM's CPU platform,
        and a KV cache of ``VLLM_CPU_KVCACHE_SPACE`` GiB (default 1; vLLM would otherwise size it
        from ``gpu_memory_utilization`` times the host's RAM)."""
        return {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register() -> None:
    """The ``cpu`` platform in verl's ``PlatformRegistry`` (CPU mode; ``upstream.py``: ``cpu_platform``)."""
    from verl.plugin.platform import PlatformRegistry

    PlatformRegistry.register(platform="cpu")(PlatformCPU)
