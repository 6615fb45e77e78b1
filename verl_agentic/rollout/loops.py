"""The multi-turn episode loop (token-in/token-out) and the default ``gen``.

One readable async function runs an episode::

    state = start(row, ctx)                      # messages, tools, task data
    prompt_ids = template(messages)              # tokenized once
    repeat up to max_turns:
        out = gen(state, backend, sampling)      # token ids + logprobs, kept as generated
        ob  = obs(state, out)                    # feedback / tool results / done / turn reward
        stop if done, out of turns, or the next delta does not fit max_total_tokens
        if ob.new_row: close this row, prompt_ids = template(ob.messages)   # a new training row
        else: append the delta tokens of ob.messages   # mask 0, logprob None
    end(state)                                   # always, also after errors and cancellation

Context budget rule (the same on every path): ``prompt + response <= max_total_tokens``.
Each turn may generate at most ``min(max_new_tokens, budget left)``; a prompt that does not
fit, or an observation whose tokens would leave no room to generate, ends the episode with
``finish_reason="length"`` and a ``context_overflow`` error; a turn cut by the budget ends it
with ``finish_reason="length"`` too. A task's typed failure ends it with ``finish_reason="error"``,
or the reason ``interfaces.FINISH_REASON_OF_ERROR`` gives its type (``invalid_tool_calls``).
Nothing raises out of the loop.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from dataclasses import dataclass
from typing import Any, Optional

from verl_agentic.interfaces import (
    FINISH_ERROR,
    FINISH_LENGTH,
    FINISH_MAX_TURNS,
    FINISH_REASON_OF_ERROR,
    FINISH_STOP,
    EpisodeError,
    EpisodeFailure,
    EpisodeResult,
    EpisodeState,
    GenOutput,
    Observation,
    RolloutContext,
    SamplingParams,
    Turn,
)
from verl_agentic.rollout.template import ChatTemplate


async def maybe_await(value: Any) -> Any:
    """Task hooks may be sync or async."""
    if inspect.isawaitable(value):
        return await value
    return value


@dataclass
class LoopLimits:
    max_turns: int = 1
    max_total_tokens: int = 2048
    episode_timeout_s: Optional[float] = None


def ended_on_stop(token_ids: list[int], finish_reason: Optional[str], stop_ids: set[int]) -> bool:
    """Did this turn end on a stop token the model generated (kept in its ids, mask 1)?"""
    return finish_reason == "stop" and bool(token_ids) and (not stop_ids or token_ids[-1] in stop_ids)


async def default_gen(state: EpisodeState, backend: Any, sampling: SamplingParams) -> GenOutput:
    """Continue the episode's token context with the backend."""
    return await backend.generate(state.context_ids, sampling)


async def ids_agent_loop(task: Any, row: dict, ctx: RolloutContext, backend: Any,
                         sampling: SamplingParams, limits: LoopLimits,
                         template: ChatTemplate) -> tuple[EpisodeState, EpisodeResult]:
    """Run one episode of ``task`` (a TaskSpec) and return its state and result.

    Errors are captured on the state (typed, see ``interfaces.ERROR_TYPES``) and never
    propagate, except cancellation, which still runs ``end`` first. When ``start`` itself
    fails there is no task state: the returned state is a bare one carrying the error, and
    ``end`` is not called (nothing was started).
    """
    t0 = time.perf_counter()
    timeout = limits.episode_timeout_s if limits.episode_timeout_s and limits.episode_timeout_s > 0 else None
    # one deadline for the whole episode, start included (an agent task's start waits for its first request)
    deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
    start_timer = asyncio.timeout_at(deadline)
    try:
        async with start_timer:
            state = await maybe_await(task.start(row, ctx))
        if not isinstance(state, EpisodeState):
            raise TypeError(f"start() must return an EpisodeState, got {type(state).__name__}")
    except Exception as e:  # noqa: BLE001 - captured per episode
        state = EpisodeState(row=row, messages=[], ctx=ctx, finish_reason=FINISH_ERROR)
        if isinstance(e, TimeoutError) and start_timer.expired():
            state.error = EpisodeError("timeout", f"start did not return within rollout.episode_timeout_s={timeout}")
        else:
            state.error = (EpisodeError(e.type, e.message) if isinstance(e, EpisodeFailure)
                           else EpisodeError("task_error", f"start: {type(e).__name__}: {e}"))
        return state, EpisodeResult(0.0, {})
    try:
        state.prompt_ids = template.prompt_ids(state.messages, state.tools)
        if len(state.prompt_ids) >= limits.max_total_tokens:
            raise EpisodeFailure(
                "context_overflow",
                f"prompt has {len(state.prompt_ids)} tokens, rollout.max_total_tokens="
                f"{limits.max_total_tokens} leaves no room to generate",
            )
        async with asyncio.timeout_at(deadline):
            await _run_turns(task, state, backend, sampling, limits, template)
    except asyncio.CancelledError:
        state.error = EpisodeError("cancelled", "the rollout was cancelled")
        state.finish_reason = FINISH_ERROR
        await _safe_end(task, state)
        raise
    except TimeoutError:
        state.error = EpisodeError("timeout", f"episode exceeded rollout.episode_timeout_s={limits.episode_timeout_s}")
        state.finish_reason = FINISH_ERROR
    except EpisodeFailure as e:
        state.error = EpisodeError(e.type, e.message)
        state.finish_reason = FINISH_REASON_OF_ERROR.get(e.type, FINISH_ERROR)
    except Exception as e:  # noqa: BLE001 - a bug in our own loop still must not kill the batch
        state.error = EpisodeError("task_error", f"{type(e).__name__}: {e}")
        state.finish_reason = FINISH_ERROR
    state.metrics["latency_s"] = time.perf_counter() - t0
    return state, await _safe_end(task, state)


async def _run_turns(task: Any, state: EpisodeState, backend: Any, sampling: SamplingParams,
                     limits: LoopLimits, template: ChatTemplate) -> None:
    """The turn loop; sets ``state.finish_reason`` (and ``state.error`` on overflow)."""
    stop_ids = set(getattr(backend, "stop_token_ids", []) or []) | set(sampling.stop_token_ids or [])
    for turn_index in range(limits.max_turns):
        budget = limits.max_total_tokens - state.num_tokens
        turn_sampling = sampling.replace(
            max_new_tokens=min(sampling.max_new_tokens, budget),
            # a fresh random stream per turn: one seed reused every turn would correlate the turns
            seed=None if sampling.seed is None else sampling.seed + 7919 * turn_index,
        )
        try:
            out = await maybe_await(task.gen(state, backend, turn_sampling))
        except Exception as e:
            raise EpisodeFailure("generation_error", f"gen: {type(e).__name__}: {e}") from e
        stopped = _append_assistant(state, out, stop_ids, template)

        try:
            ob = await maybe_await(task.obs(state, out))
        except EpisodeFailure as e:
            if e.info:  # the turn it judged keeps its facts (e.g. the invalid calls that ended the episode)
                state.turns[-1].info = _json_safe(e.info)
            raise
        except Exception as e:
            raise EpisodeFailure("task_error", f"obs: {type(e).__name__}: {e}") from e
        if not isinstance(ob, Observation):
            raise EpisodeFailure("task_error", f"obs() must return an Observation, got {type(ob).__name__}")
        state.turns[-1].reward = ob.turn_reward
        if ob.info:
            state.turns[-1].info = _json_safe(ob.info)
        for k, v in ob.metrics.items():
            state.metrics[k] = v

        if ob.done:
            state.finish_reason = FINISH_STOP
            return
        if out.finish_reason == "length" and len(out.token_ids) >= budget:
            state.finish_reason = FINISH_LENGTH
            state.error = EpisodeError("context_overflow", "the token budget ran out during generation")
            return
        if turn_index == limits.max_turns - 1:
            state.finish_reason = FINISH_MAX_TURNS
            return
        if ob.new_row:
            if not _start_row(state, ob.messages, ob.new_row, template, limits):
                return
            continue

        stop_text = template.stop_text(out.token_ids[-1]) if stopped else None
        delta = template.delta_text(state.messages, ob.messages, generated_stop_text=stop_text, tools=state.tools)
        delta_ids = template.encode(delta)
        if state.num_tokens + len(delta_ids) >= limits.max_total_tokens:
            state.finish_reason = FINISH_LENGTH
            state.error = EpisodeError(
                "context_overflow",
                f"observation of {len(delta_ids)} tokens does not fit: {state.num_tokens} used of "
                f"max_total_tokens={limits.max_total_tokens}",
            )
            return
        _append_injected(state, ob.messages, delta, delta_ids)


def _json_safe(info: Any) -> dict:
    """``Observation.info`` as plain JSON (unknown objects become their ``str``), so one task's odd
    value cannot break the trajectory dump; a dict that cannot be written at all fails this episode."""
    if not isinstance(info, dict):
        raise EpisodeFailure("task_error", f"Observation.info must be a dict, got {type(info).__name__}")
    try:
        return json.loads(json.dumps(info, default=str))
    except (TypeError, ValueError) as e:  # circular references, non-string keys that json rejects
        raise EpisodeFailure("task_error", f"Observation.info is not JSON-serialisable: {e}") from None


def _append_assistant(state: EpisodeState, out: GenOutput, stop_ids: set[int], template: ChatTemplate) -> bool:
    """Append a generated turn (mask 1, its logprobs); returns whether it ended on its stop token."""
    ids = list(out.token_ids)
    logprobs = list(out.logprobs) if out.logprobs is not None else [None] * len(ids)
    stopped = ended_on_stop(ids, out.finish_reason, stop_ids)
    content_ids = ids[:-1] if stopped else ids
    content = template.tokenizer.decode(content_ids, skip_special_tokens=False)
    start = len(state.response_ids)
    state.response_ids.extend(ids)
    state.response_mask.extend([1] * len(ids))
    state.response_logprobs.extend(logprobs)
    state.turns.append(Turn("assistant", start, len(state.response_ids), out.text, finish_reason=out.finish_reason))
    state.messages.append({"role": "assistant", "content": content})
    state.num_turns += 1
    state.metrics["generated_tokens"] = state.metrics.get("generated_tokens", 0) + len(ids)
    if out.finish_reason == "length":
        state.metrics["truncated_turns"] = state.metrics.get("truncated_turns", 0) + 1
    return stopped


def _start_row(state: EpisodeState, messages: list[dict], reason: str, template: ChatTemplate,
               limits: LoopLimits) -> bool:
    """Close the current row (into ``state.rows``) and start a new one whose prompt is ``messages``;
    False (the episode ends, ``context_overflow``) when that prompt leaves no room to generate."""
    state.rows.append({"prompt_ids": state.prompt_ids, "response_ids": state.response_ids,
                       "response_mask": state.response_mask, "response_logprobs": state.response_logprobs,
                       "messages": state.messages, "turns": state.turns, "split_reason": str(reason)})
    state.messages, state.turns = list(messages), []
    state.response_ids, state.response_mask, state.response_logprobs = [], [], []
    state.prompt_ids = template.prompt_ids(state.messages, state.tools)
    if len(state.prompt_ids) >= limits.max_total_tokens:
        state.finish_reason = FINISH_LENGTH
        state.error = EpisodeError("context_overflow", (
            f"row {len(state.rows)}'s prompt has {len(state.prompt_ids)} tokens, rollout.max_total_tokens="
            f"{limits.max_total_tokens} leaves no room to generate"))
        return False
    return True


def _append_injected(state: EpisodeState, messages: list[dict], text: str, ids: list[int]) -> None:
    start = len(state.response_ids)
    state.response_ids.extend(ids)
    state.response_mask.extend([0] * len(ids))
    state.response_logprobs.extend([None] * len(ids))
    roles = {m.get("role", "user") for m in messages}
    role = roles.pop() if len(roles) == 1 else "user"
    state.turns.append(Turn(role, start, len(state.response_ids), text, num_messages=len(messages)))
    state.messages.extend(messages)


async def _safe_end(task: Any, state: EpisodeState) -> EpisodeResult:
    try:
        result = await maybe_await(task.end(state))
        if not isinstance(result, EpisodeResult):
            raise TypeError(f"end() must return an EpisodeResult, got {type(result).__name__}")
        return result
    except Exception as e:  # noqa: BLE001 - recorded as the episode's end_error (unless it has one): end() always returns
        if state.error is None:
            state.error = EpisodeError("end_error", f"end: {type(e).__name__}: {e}")
            state.finish_reason = state.finish_reason or FINISH_ERROR
        return EpisodeResult(0.0, {})
