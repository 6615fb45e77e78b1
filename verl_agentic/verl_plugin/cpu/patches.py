"""What verl 0.9.1 lacks to train on a CPU: FSDP engines for device "cpu" and two patches.

Each function does one thing and names the verl line it works around. The private verl names they
touch are listed in ``verl_plugin/upstream.py``, which the tests check.
"""

from __future__ import annotations

import functools
import sys

CPU_BACKEND = "cpu:gloo"


def register_fsdp_engines() -> None:
    """verl registers its FSDP engines for cuda and npu only
    (``verl/workers/engine/fsdp/transformer_impl.py:1143`` and ``:1594``, looked up by device name
    in ``verl/workers/engine/base.py:402``): register the same classes for "cpu"."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl as fsdp

    for model_type, cls in (("language_model", fsdp.FSDPEngineWithLMHead),
                            ("value_model", fsdp.FSDPEngineWithValueHead)):
        if "cpu" not in EngineRegistry._engines.get(model_type, {}).get("fsdp2", {}):
            EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(cls)


def patch_process_group_backend() -> None:
    """``verl/utils/distributed.py:89`` builds the backend ``f"cpu:gloo,{device}:{nccl}"``, which on
    device "cpu" is ``"cpu:gloo,cpu:gloo"``: torch refuses it (``Duplicate device type cpu``).
    Without an explicit backend, use ``"cpu:gloo"``. Patched in ``verl.utils.distributed`` and in
    ``verl.workers.engine_workers`` (which imports the function by name at import time)."""
    from verl.utils import distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_verl_agentic_cpu", False):
        return

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or CPU_BACKEND)

    initialize_global_process_group_ray._verl_agentic_cpu = True
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray
    workers = sys.modules.get("verl.workers.engine_workers")
    if workers is not None:
        workers.initialize_global_process_group_ray = initialize_global_process_group_ray


def patch_cpu_offload_pin_memory() -> None:
    """``verl/workers/engine/fsdp/transformer_impl.py:462`` builds ``CPUOffloadPolicy(pin_memory=True)``
    for forward-only engines (the reference model); pinning host memory needs an accelerator
    ("Cannot access accelerator device"). On CPU there is nothing to pin: ``pin_memory=False``."""
    from verl.workers.engine.fsdp import transformer_impl as fsdp

    policy = fsdp.CPUOffloadPolicy
    if policy is None or getattr(policy, "_verl_agentic_cpu", False):
        return

    class CPUOffloadPolicyNoPin(policy):
        _verl_agentic_cpu = True

        def __init__(self, pin_memory: bool = False, **kwargs):
            super().__init__(pin_memory=False, **kwargs)

    fsdp.CPUOffloadPolicy = CPUOffloadPolicyNoPin


def apply_all() -> None:
    register_fsdp_engines()
    patch_process_group_backend()
    patch_cpu_offload_pin_memory()
