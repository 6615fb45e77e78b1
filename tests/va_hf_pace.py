"""Test-only (verl's CPU runs): an hf rollout server that makes one episode span a weight update on purpose.

verl's ``colocate_async`` trainer keeps two batches of prompts in flight; each step takes the first groups to
finish, aborts every request still running (``abort_all_requests``), trains, pushes the new weights and
resumes: an episode still running at that abort spans two policy versions. Whether one is running is a race:
the hf engine decodes all episodes of the window together, and on some machines every one had finished (a CI
runner, then this machine: no episode spanned two versions). tests/test_verl_cpu.py selects this server with
the plugin's own setting
``+actor_rollout_ref.rollout.engine_kwargs.hf.server_class=va_hf_pace.HoldOneTurnForTheUpdate``
(this folder on ``PYTHONPATH``, so that Ray's workers import it) to take the race out:

the first sampled (not validation) request that continues an episode begun with the launch's first weights
(its prompt extends an earlier request's) is held, before it generates, until verl's abort closes the gate
(the other groups of the window complete the step's batch meanwhile). It is then answered ``aborted`` with
the version it was admitted at, as the shipped server answers a request caught by an abort; verl's
``FullyAsyncLLMServerClient`` resubmits it after the update, so the episode's turns come from two versions.
One such request per launch is held, and never longer than ``HOLD_TIMEOUT_S`` (then it generates: the
test's assertions on the spans fail rather than the run hanging). Which later step trains that episode is
verl's sampler's choice (the first groups to finish).

The same way, one call of the openai-SDK agent (tests/va_verl_cpu_agent.py: its second call, whose prompt
holds ``AGENT_MARK``) is held until the next abort and answered ``aborted``; verl's client resubmits it (the
same prompt) after the update, and the agent, waiting on our gateway meanwhile, gets the resumed answer
(verl sends each try under a fresh request id: the resubmission is known by its prompt). Both holds print
a line when they end and when the request comes back.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Optional

from verl.workers.rollout.replica import TokenOutput

from verl_agentic.verl_plugin.cpu.hf_rollout import HFRolloutServer

HOLD_TIMEOUT_S = 300.0
AGENT_MARK = "Once more: "  # in the prompt of tests/va_verl_cpu_agent.py's second call


class HoldOneTurnForTheUpdate(HFRolloutServer):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._launch_version: Optional[int] = None  # the weights this launch started from (its first push)
        # each request's prompt and the version its episode began with
        self._prompts: list[tuple[tuple[int, ...], Optional[int]]] = []
        self._held = False
        self._held_prompt: Optional[tuple[int, ...]] = None  # the held turn's prompt, to see it come back
        self._agent_held = False
        self._agent_back: Optional[tuple[tuple[int, ...], Optional[int]]] = None  # its prompt, held at step

    async def update_weights(self, state: Any, global_steps: Optional[int] = None, **kwargs: Any) -> dict:
        record = await super().update_weights(state, global_steps, **kwargs)
        if self._launch_version is None:
            self._launch_version = global_steps
        return record

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> TokenOutput:
        version = self.global_steps
        prompt = tuple(prompt_ids)
        if self._agent_back is not None and self._agent_back[0] == prompt:  # the held agent call, resubmitted
            held_at = self._agent_back[1]  # (with nothing generated: the same prompt, under a fresh request id)
            self._agent_back = None
            out = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)
            print(f"va_hf_pace: resumed the held agent call (held with the weights of step {held_at}), "
                  f"answered with those of step {self.global_steps}: {len(out.token_ids)} tokens, {out.stop_reason}",
                  flush=True)
            return out
        sampled = float(sampling_params.get("temperature", 1.0)) > 0
        if (not self._agent_held and sampled and self._gate.is_set()
                and AGENT_MARK in self.backend.tokenizer.decode(prompt_ids)):
            self._agent_held = True
            if await self._hold(f"agent call {request_id}", version):
                self._agent_back = (prompt, version)
                return _aborted(version)
        # verl gives each turn a fresh request id: a later turn of an episode is known by its prompt, which
        # extends its previous turn's (the latest such request: the same prompt may recur in a later step)
        held = self._held_prompt
        if held is not None and prompt[:len(held)] == held:  # the aborted turn, resubmitted (with what it had)
            self._held_prompt = None  # (it may arrive while generation is paused: it runs after the resume)
            out = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)
            print(f"va_hf_pace: resumed the held turn's prompt (+{len(prompt) - len(held)} tokens), submitted with "
                  f"the weights of step {version}, answered with those of step {self.global_steps}", flush=True)
            return out
        previous = [begun for p, begun in self._prompts if len(p) < len(prompt) and prompt[:len(p)] == p]
        begun_at = previous[-1] if previous else version
        self._prompts.append((prompt, begun_at))
        if (not self._held and previous and self._launch_version is not None and self._gate.is_set()
                and begun_at == version == self._launch_version and sampled):
            self._held = True
            if await self._hold(f"request {request_id}", version):
                self._held_prompt = prompt
                return _aborted(version)
        return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)

    async def _hold(self, what: str, version: Optional[int]) -> bool:
        """Wait until verl's abort closes the gate (True) or ``HOLD_TIMEOUT_S`` passes (False); say which."""
        start = time.monotonic()
        while self._gate.is_set() and time.monotonic() - start < HOLD_TIMEOUT_S:
            await asyncio.sleep(0.05)
        print(f"va_hf_pace: held {what} (weights of step {version}) {time.monotonic() - start:.1f} s, "
              f"until {'the abort' if not self._gate.is_set() else 'timeout'}", flush=True)
        return not self._gate.is_set()


def _aborted(version: Optional[int]) -> TokenOutput:
    """What the shipped server answers a request caught by an abort before it generated."""
    return TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted", extra_fields={"global_steps": version})
