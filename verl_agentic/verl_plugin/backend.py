"""Generation across the verl boundary, in both directions.

- ``ServerManagerBackend``: verl's ``server_manager`` (the ``LLMServerClient`` an agent loop
  gets; vLLM / SGLang replicas behind it) as one of our ``GenerationBackend``s, so our episode
  loop (``ids_agent_loop``) runs unchanged inside verl. One instance per episode: it carries
  the episode's request id (verl routes every turn of a request id to the same server, which
  keeps its prefix cache warm) and adds up the episode's generation time and preemptions.
- ``BackendLLMClient``: the other way round, one of our backends (e.g. ``HFBackend``) as the
  ``llm_client`` of verl's ``AgentLoopWorker``, so verl's agent loops, ours included, run on a
  CPU without any server (tests, laptops).

Sampling parameters: verl hands an agent loop a dict (``temperature``, ``top_p``, ``top_k``,
``repetition_penalty``, ``logprobs``, built from ``actor_rollout_ref.rollout``); our loop works
with ``SamplingParams``. ``to_verl_sampling`` maps ours onto verl's dict (keeping verl's other
keys), ``from_verl_sampling`` maps a verl dict back and rejects what our backends cannot do.

Stop tokens: verl's ``TokenOutput.stop_reason`` says ``completed`` for a stop and for the length
limit alike, so ``ServerManagerBackend`` decides the finish reason from the tokens: the turn
stopped when its last token is one of the stop ids (the model's EOS ids, also sent to the server
as ``stop_token_ids`` so both sides agree), else it ran into ``max_tokens``.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Optional

from verl_agentic.backends.base import GenerationBackend
from verl_agentic.interfaces import GenOutput, SamplingParams

# the keys of verl's sampling dict that ``from_verl_sampling`` understands
VERL_SAMPLING_KEYS = frozenset({
    "temperature", "top_p", "top_k", "repetition_penalty", "logprobs", "max_tokens", "max_new_tokens",
    "stop_token_ids", "seed",
})


def to_verl_sampling(sampling: SamplingParams, base: dict[str, Any], stop_token_ids: Iterable[int] = ()) -> dict:
    """verl's sampling dict for one request: ``base`` (verl's dict for the episode) with our
    temperature / top-p / top-k, ``max_tokens`` (vLLM's name; SGLang accepts it too), the stop
    ids (``stop_token_ids`` plus the request's own) and the seed when there is one."""
    params = dict(base)
    params.pop("max_new_tokens", None)
    params.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                  max_tokens=sampling.max_new_tokens)
    stops = set(params.get("stop_token_ids") or ()) | set(stop_token_ids) | set(sampling.stop_token_ids or ())
    if stops:
        params["stop_token_ids"] = sorted(stops)
    if sampling.seed is not None:
        params["seed"] = sampling.seed
    return params


def from_verl_sampling(params: dict[str, Any], default_max_tokens: int) -> tuple[SamplingParams, bool]:
    """Our ``SamplingParams`` for a verl sampling dict, and whether logprobs were asked for.

    Raises ``ValueError`` for keys our backends do not implement (naming them), instead of
    silently sampling differently from what verl asked for.
    """
    unknown = sorted(set(params) - VERL_SAMPLING_KEYS)
    if unknown:
        raise ValueError(f"sampling params {unknown} are not supported by verl_agentic backends "
                         f"(supported: {sorted(VERL_SAMPLING_KEYS)})")
    penalty = params.get("repetition_penalty", 1.0)
    if penalty is not None and float(penalty) != 1.0:
        raise ValueError(f"repetition_penalty={penalty} is not supported by verl_agentic backends (use 1.0)")
    max_tokens = params.get("max_tokens", params.get("max_new_tokens"))
    sampling = SamplingParams(
        max_new_tokens=int(default_max_tokens if max_tokens is None else max_tokens),
        temperature=float(params.get("temperature", 1.0)),
        top_p=float(params.get("top_p", 1.0)),
        top_k=int(params.get("top_k", -1)),
        seed=None if params.get("seed") is None else int(params["seed"]),
        stop_token_ids=list(params["stop_token_ids"]) if params.get("stop_token_ids") else None,
    )
    return sampling, bool(params.get("logprobs", False))


class ServerManagerBackend(GenerationBackend):
    """verl's ``server_manager.generate`` as a ``GenerationBackend``, for one episode.

    Args:
        server_manager: verl's ``LLMServerClient`` (or anything with its ``generate``).
        tokenizer: the tokenizer whose ids the server speaks (decodes ``GenOutput.text``).
        stop_token_ids: ids that end a turn (the model's EOS ids); sent to the server with every
            request and used to tell a stop from a cut (see the module docstring).
        base_params: verl's sampling dict for this episode (``repetition_penalty``, ``logprobs``
            and any other key pass through unchanged).
        request_id: the episode's request id (verl's sticky session).
        generate_kwargs: extra keyword arguments for every ``generate`` call (``priority``).

    After the episode: ``generate_s`` (seconds waiting for the server) and ``request_s`` (each
    request's, in order: the per-request latency as the loop saw it), ``num_preempted``
    (summed over turns; None when the server never reported it), ``min_global_steps`` /
    ``max_global_steps`` (the oldest and newest policy version any of its tokens came from, when
    reported: verl uses them for off-policy staleness), and ``turn_versions``, each turn's
    ``[min, max]`` (a turn spans two versions when verl's async trainer aborted it for a weight
    update and resumed it after: ``FullyAsyncLLMServerClient``).
    """

    def __init__(self, server_manager: Any, tokenizer: Any, stop_token_ids: Iterable[int],
                 base_params: dict[str, Any], request_id: str, generate_kwargs: Optional[dict] = None):
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.stop_token_ids = list(dict.fromkeys(stop_token_ids))
        self.base_params = dict(base_params)
        self.request_id = request_id
        self.generate_kwargs = dict(generate_kwargs or {})
        self.generate_s = 0.0
        self.request_s: list[float] = []
        self.num_requests = 0
        self.num_preempted: Optional[int] = None
        self.min_global_steps: Any = None
        self.max_global_steps: Any = None
        self.turn_versions: list[list[Any]] = []

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenOutput:
        if sampling.max_new_tokens <= 0:  # servers reject max_tokens < 1; nothing to generate
            return GenOutput(token_ids=[], logprobs=[], text="", finish_reason="length")
        params = to_verl_sampling(sampling, self.base_params, self.stop_token_ids)
        start = time.perf_counter()
        try:
            out = await self.server_manager.generate(request_id=self.request_id, prompt_ids=list(prompt_ids),
                                                     sampling_params=params, **self.generate_kwargs)
        finally:
            took = time.perf_counter() - start
            self.generate_s += took
            self.request_s.append(took)
            self.num_requests += 1
        if out.stop_reason in ("aborted", "abort"):
            raise RuntimeError(f"request {self.request_id}: the server aborted the generation")
        ids = [int(t) for t in out.token_ids]
        logprobs = None if out.log_probs is None else [float(x) for x in out.log_probs]
        if logprobs is not None and len(logprobs) != len(ids):
            raise RuntimeError(f"request {self.request_id}: the server returned {len(logprobs)} log_probs "
                               f"for {len(ids)} tokens")
        if out.num_preempted is not None:
            self.num_preempted = (self.num_preempted or 0) + int(out.num_preempted)
        fields = out.extra_fields or {}  # verl's client sets min/max_global_steps (the policy version)
        low, high = fields.get("min_global_steps"), fields.get("max_global_steps")
        self.turn_versions.append([low, high])
        if low is not None and (self.min_global_steps is None or low < self.min_global_steps):
            self.min_global_steps = low
        if high is not None and (self.max_global_steps is None or high > self.max_global_steps):
            self.max_global_steps = high
        stops = set(self.stop_token_ids) | set(sampling.stop_token_ids or ())
        if ids and ids[-1] in stops:
            finish = "stop"
        elif len(ids) >= sampling.max_new_tokens:
            finish = "length"
        else:  # the server ended the turn without a stop id of ours (e.g. a stop string): a stop
            finish = "stop"
        return GenOutput(token_ids=ids, logprobs=logprobs,
                         text=self.tokenizer.decode(ids, skip_special_tokens=False), finish_reason=finish)

    def stats(self) -> dict[str, float]:
        return {"requests": self.num_requests, "generate_s": self.generate_s}


class BackendLLMClient:
    """One of our ``GenerationBackend``s as verl's LLM client (``AgentLoopWorker(config, llm_client=...)``).

    Implements ``generate(request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput``
    as verl's agent loops call it. Requests without ``max_tokens`` get ``default_max_tokens``
    (verl's servers default to the rollout's ``response_length``). Log-probs are returned when
    ``sampling_params["logprobs"]`` is true (verl's ``rollout.calculate_log_probs``). Multi-modal
    inputs are refused. The request id is not needed: one in-process backend has no sessions.
    """

    _MULTI_MODAL = ("image_data", "video_data", "audio_data", "mm_processor_output", "mm_processor_kwargs")

    def __init__(self, backend: GenerationBackend, default_max_tokens: int):
        self.backend = backend
        self.default_max_tokens = int(default_max_tokens)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        media = [k for k in self._MULTI_MODAL if kwargs.get(k)]
        if media:
            raise ValueError(f"request {request_id}: {media} given, but {type(self.backend).__name__} is text-only")
        sampling, want_logprobs = from_verl_sampling(sampling_params, self.default_max_tokens)
        out = await self.backend.generate([int(t) for t in prompt_ids], sampling)
        if want_logprobs and out.logprobs is None:
            raise RuntimeError(f"request {request_id}: logprobs were asked for, but "
                               f"{type(self.backend).__name__} returned none")
        # "aborted": the backend was told to stop (verl's partial rollouts resume such a request)
        return TokenOutput(token_ids=list(out.token_ids), log_probs=list(out.logprobs) if want_logprobs else None,
                           stop_reason="aborted" if out.finish_reason == "abort" else "completed")
