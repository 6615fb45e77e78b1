"""Test-only (vLLM's environment): a vLLM worker extension whose weight load fails, the one fault of the
vLLM weight sync that cannot be caused on purpose otherwise (a mock of that fault, named so).

tests/test_verl_vllm.py selects it with verl's own engine setting
``++actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls=va_vllm_faults.FailingLoadExtension``
(verl passes ``engine_kwargs.vllm`` to vLLM after its own arguments, so it replaces the plugin's
``CPUWorkerExtension``), with this folder on ``PYTHONPATH`` so that vLLM's worker process imports it.
The shipped code has no fault switch: the extension names its reload class (``reload_class``), and this
one fails.
"""

from __future__ import annotations

from verl_agentic.verl_plugin.cpu.vllm_worker import CPUWorkerExtension, InPlaceReload, WeightLoadError

FAULT_BUCKET = 1  # 0-based: the second bucket of a sync
MESSAGE = f"fault injected by tests/va_vllm_faults.py at bucket {FAULT_BUCKET}"


class FailingLoad(InPlaceReload):
    """The plugin's in-place reload, except that every sync fails while loading bucket ``FAULT_BUCKET``:
    the first, at start (a resumed run's push of its checkpoint's weights), is verl's same
    ``update_weights`` path as the push after an update, and failing there costs the test no step."""

    def load(self, bucket: list) -> None:
        if self.buckets == FAULT_BUCKET:
            raise WeightLoadError(MESSAGE)
        super().load(bucket)


class FailingLoadExtension(CPUWorkerExtension):
    reload_class = FailingLoad
