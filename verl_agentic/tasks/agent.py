"""Bring your own agent: a program that calls an OpenAI-style endpoint, trained as a task, token-exact.

The agent is unchanged: a Python callable ``agent(row, client)`` (sync or async; ``client`` is an
``openai.OpenAI`` / ``openai.AsyncOpenAI`` pointed at this episode's endpoint) or a command (run with
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` in its environment and the row as JSON on stdin). Register it
like any task, in a module that ``imports=[...]`` (or ``+agentic.imports``) names::

    from verl_agentic.tasks import register_task
    from verl_agentic.tasks.agent import agent_task

    async def solve(row, client):
        reply = await client.chat.completions.create(model="policy", messages=row["prompt"], tools=TOOLS)
        ...
        return {"reward": 1.0 if right else 0.0, "metrics": {"calls": n}}

    register_task("my_agent", agent_task(solve))                      # rows with task_type: my_agent
    register_task("my_cli_agent", agent_task(command=["python", "agent.py"]))

How an episode runs (the rollout's own loop, ``rollout/loops.py``; this module supplies its functions)::

    start: open a session on the gateway (serving/gateway.py), start the agent, wait for its first request;
           its messages and tools are the prompt, rendered by the rollout's chat template
    gen:   generate from the episode's token ids (the rollout's sampling; the request's max_tokens caps it)
    obs:   parse the generated text with the task's parser, answer the agent with an OpenAI message
           (content + tool_calls), wait for its next request: the messages it adds after our answer are
           the observation (rendered as the template's delta, mask 0); a request with another history
           starts a new training row (Observation.new_row); the agent returning ends it
    end:   the agent's result is the reward; a request still waiting is refused with the reason

A recorded episode (``output.record=true``) keeps each request and its answer on its tape
(``taped_request``, ``record.tape.note``), and a replay compares the agent's requests with them.

So the captured ids are what the model saw and generated, by construction: generated tokens are never
decoded and re-encoded, and what the agent adds is rendered in the conversation's real context.
Calls merge into one training row while each request continues the conversation the gateway answered:
its messages start with the previous request's messages plus our answer (compared as role, text and
tool calls, ignoring ids and empty fields). A request that changes the history (a summarised context,
a sub-agent with a fresh conversation, a retry) starts a new row of the same episode, its whole
conversation rendered as the row's prompt; the reason is kept on the row (``split_reason``:
``history_changed``) and the episode's ``agent_rows`` metric counts its rows. With ``split_rows=false``
such a request is refused with a 400 ``history_changed`` instead (counted in ``agent_rejected_requests``).

The result: a number (the reward), or a dict with ``reward``, optional ``metrics`` (numbers) and
optional ``call_rewards`` (one per model call, in order: the assistant turns' rewards, for
``turn_loo`` and per-turn credit). An agent that raises or exits non-zero makes a ``task_error``
episode (reward 0) that keeps its tokens.

Config (``task.<name>.*``): ``parser`` (hermes), ``finish_timeout_s`` (30: how long ``end`` waits for
the agent after the episode stopped, before cancelling it), ``model_name`` (policy: what
``/v1/models`` lists, and the one model a request may name), ``split_rows`` (true: a changed history
starts a new row; false: it is refused). The rollout's ``max_turns`` bounds the model calls of an episode and
``max_total_tokens`` its tokens. What the gateway ignores, on purpose: a request's ``temperature``,
``top_p`` and ``seed`` (the rollout's sampling rules: it is the policy being trained); ``stop`` strings;
``tool_choice`` other than ``none`` (calls are parsed whenever the model writes them). ``n`` other
than 1, another model and ``max_tokens`` above the context are refused; ``stream=true`` gets the whole
answer as chunks (the turn is generated whole first). ``/v1/responses`` requests, streamed or not, are
translated to these (``serving/responses.py``). ``logprobs=true`` answers each token's logprob, with no
``top_logprobs`` (the engine keeps the sampled token's only).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
import shlex
import ssl
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

from verl_agentic.interfaces import (
    ConfigError,
    EpisodeError,
    EpisodeFailure,
    EpisodeResult,
    EpisodeState,
    GenOutput,
    Observation,
    RolloutContext,
    SamplingParams,
    parse_section,
)
from verl_agentic.record.tape import note
from verl_agentic.rollout.loops import default_gen
from verl_agentic.rollout.task_spec import TaskSpec
from verl_agentic.serving.errors import ServiceError
from verl_agentic.serving.gateway import gateway_for_loop
from verl_agentic.tools.parsers import get_parser


@dataclass
class AgentConfig:
    parser: str = "hermes"
    finish_timeout_s: float = 30.0
    model_name: str = "policy"
    split_rows: bool = True

    def __post_init__(self) -> None:
        if self.finish_timeout_s <= 0:
            raise ConfigError(f"finish_timeout_s must be > 0, got {self.finish_timeout_s}")
        get_parser(self.parser)  # an unknown name lists the registered ones


# ---------------------------------------------------------------- messages: the agent's form and ours


def _text(content: Any) -> str:
    """A message's content as text (OpenAI's list of parts joined; None as empty)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise ServiceError(400, "bad_request", f"message content must be a string or a list of parts, got {content!r}")


def _arguments(raw: Any) -> dict:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
    except ValueError:
        raise ServiceError(400, "bad_request", f"tool call arguments are not JSON: {raw!r}") from None
    if not isinstance(value, dict):
        raise ServiceError(400, "bad_request", f"tool call arguments must be a JSON object, got {raw!r}")
    return value


def for_template(message: Any, index: int) -> dict:
    """An agent's message as the chat template takes it: text content, tool-call arguments as objects."""
    if not isinstance(message, dict) or message.get("role") not in ("system", "developer", "user", "assistant", "tool"):
        raise ServiceError(400, "bad_request", f"messages[{index}] must be an object with a role of system, user, "
                                               f"assistant or tool, got {message!r:.200}")
    out: dict = {"role": "system" if message["role"] == "developer" else message["role"],
                 "content": _text(message.get("content"))}
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [{"type": "function", "function": {"name": c["function"]["name"],
                                                               "arguments": _arguments(c["function"].get("arguments"))}}
                             for c in calls]
    if message["role"] == "tool" and message.get("tool_call_id"):
        out["tool_call_id"] = message["tool_call_id"]
    return out


def same_turn(a: dict, b: dict) -> bool:
    """Whether two template-form messages say the same: role, text and tool calls (ids aside)."""
    calls = lambda m: [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls", [])]  # noqa: E731
    return a["role"] == b["role"] and a["content"].strip() == b["content"].strip() and calls(a) == calls(b)


# ---------------------------------------------------------------- one episode's side of the gateway


class AgentSession:
    """The requests of one episode's agent, answered one at a time by the task functions below."""

    def __init__(self, cfg: AgentConfig, tokenizer: Any, max_total_tokens: Optional[int] = None):
        self.cfg, self.tokenizer, self.parser = cfg, tokenizer, get_parser(cfg.parser)
        self.model_name = cfg.model_name  # what GET /v1/models lists, and the one model a request may name
        self.max_total_tokens = max_total_tokens  # the episode's context, where known
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.pending: Optional[asyncio.Future] = None  # the answer the agent waits for
        self.request: dict = {}
        self.request_messages: list[dict] = []  # the waiting request's whole conversation (template form)
        self.new_row: Optional[str] = None  # why the waiting request starts a new row (None: it continues)
        self.taped: Callable[[], dict] = dict  # builds the waiting request as a recording keeps it (taped_request)
        self.answered: list[dict] = []  # the conversation the next request must start with (template form)
        self.agent: Optional[asyncio.Task] = None
        self.key = ""
        self.calls = 0
        self.rejected = 0
        self.parse_errors = 0  # tool-call markup the parser could not read (answered as plain content)

    async def complete(self, body: dict) -> dict:  # the gateway's side
        answer = asyncio.get_running_loop().create_future()
        await self.inbox.put((body, answer))
        return await answer

    async def next_request(self) -> Optional[list[dict]]:
        """The next acceptable request's messages (template form), or None once the agent has finished.
        A request that cannot be taken is refused (a 400 to the agent) and the wait goes on."""
        while True:
            get = asyncio.ensure_future(self.inbox.get())
            await asyncio.wait({get, self.agent}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                return None
            body, answer = get.result()
            try:
                messages, continues = self._accept(body)
            except ServiceError as e:
                self.rejected += 1
                note("agent_http", functools.partial(taped_request, body, 0), {"error": {"status": e.status, "type": e.type}})
                answer.set_exception(e)
                continue
            self.request, self.request_messages, self.pending = body, messages, answer
            self.new_row = None if continues else "history_changed"
            self.taped = functools.partial(taped_request, body, len(self.answered) if continues else 0)
            return messages[len(self.answered):] if continues else messages

    def _accept(self, body: dict) -> tuple[list[dict], bool]:
        """The request's conversation in template form, and whether it continues what was answered (a
        changed history: a new row, or a 400 with ``split_rows=false``)."""
        if body.get("n", 1) not in (1, None):
            raise ServiceError(400, "unsupported", f"n={body['n']}: this gateway generates one choice per request")
        if body.get("model") != self.cfg.model_name:
            raise ServiceError(404, "model_not_found", (
                f"the model {body.get('model')!r} is not served here: this episode's policy is "
                f"{self.cfg.model_name!r} (task.<name>.model_name)"))
        for key in ("max_completion_tokens", "max_tokens"):
            cap = body.get(key)
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
                raise ServiceError(400, "bad_request", f"{key} must be a positive integer, got {cap!r}")
            if cap is not None and self.max_total_tokens is not None and cap > self.max_total_tokens:
                raise ServiceError(400, "context_length_exceeded", (
                    f"{key}={cap} is more than this episode's context of {self.max_total_tokens} tokens "
                    "(rollout.max_total_tokens: prompt and response together); ask for fewer"),
                    limit=self.max_total_tokens)
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise ServiceError(400, "bad_request", "messages must be a non-empty list")
        messages = [for_template(m, i) for i, m in enumerate(raw)]
        if not self.answered:
            return messages, True
        same = len(messages) > len(self.answered) and all(
            same_turn(a, b) for a, b in zip(messages, self.answered))
        if not same and self.cfg.split_rows:
            return messages, False
        if not same:
            at = next((i for i, (a, b) in enumerate(zip(messages, self.answered)) if not same_turn(a, b)),
                      min(len(messages), len(self.answered)))
            raise ServiceError(400, "history_changed", (
                f"this request does not continue the episode's conversation (message {at} differs from what was "
                "sent and answered, or nothing was added after the last answer): the gateway trains one row per "
                "episode while each request continues the conversation, and task.<name>.split_rows=false "
                "refuses a request that does not"))
        return messages, True

    def answer(self, state: EpisodeState, out: GenOutput, prompt_tokens: int) -> None:
        """Answer the waiting request with the assistant message just generated."""
        text = state.messages[-1]["content"]
        tools = self.request.get("tools")
        parsed = self.parser.parse(text) if tools and self.request.get("tool_choice") != "none" else None
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish = "length" if out.finish_reason == "length" else "stop"
        if parsed is not None and parsed.calls:
            message = {"role": "assistant", "content": parsed.content or None, "tool_calls": [
                {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in parsed.calls]}
            finish = "tool_calls"
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        if self.request.get("logprobs") and out.logprobs is not None:
            choice["logprobs"] = {"content": [
                {"token": self.tokenizer.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                for t, lp in zip(out.token_ids, out.logprobs)]}
        if parsed is not None:
            self.parse_errors += len(parsed.errors)
        if self.pending.done():  # the agent went away (its request was cancelled): nobody to answer
            raise EpisodeFailure("task_error", "the agent's request was cancelled before its answer was ready "
                                               "(its client timed out or disconnected)")
        response = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
            "model": self.cfg.model_name, "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(out.token_ids),
                      "total_tokens": prompt_tokens + len(out.token_ids)}}
        note("agent_http", self.taped, {"answer": response}, compared=without_ids)
        self.pending.set_result(response)
        self.pending = None
        self.calls += 1
        self.answered = self.request_messages + [for_template(message, -1)]

    def refuse_pending(self, why: str) -> None:
        if self.pending is not None and not self.pending.done():
            note("agent_http", self.taped, {"error": {"status": 400, "type": "episode_ended"}})
            self.pending.set_exception(ServiceError(400, "episode_ended", why))
        self.pending = None


def without_ids(value: Any) -> Any:
    """``value`` (a request or an answer, as JSON) without what differs on every run: the ids the gateway
    makes (``id``, ``tool_call_id``) and ``created``."""
    if isinstance(value, dict):
        return {k: without_ids(v) for k, v in value.items() if k not in ("id", "tool_call_id", "created")}
    if isinstance(value, list):
        return [without_ids(v) for v in value]
    return value


def taped_request(body: dict, answered: int) -> dict:
    """What the recording keeps of an agent's request (``record.tape.note``): its fields, and of its
    messages the ones after the ``answered`` the episode's conversation already holds (counted, not
    repeated), without the ids the gateway made."""
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    return without_ids({**{k: v for k, v in body.items() if k != "messages"}, "messages_before": answered,
                        "messages": messages[answered:]})


# ---------------------------------------------------------------- running the agent


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """One TLS context for every episode's client: the gateway is plain HTTP on loopback, but each new
    httpx client builds one unless given it (a new AsyncOpenAI took 22 ms here with its own, 5 ms with
    this one; timed beside a training run, DEVLOG 2026-11-27)."""
    return ssl.create_default_context()


async def _run_callable(fn: Callable, row: dict, base_url: str, key: str) -> Any:
    import openai

    if inspect.iscoroutinefunction(fn):
        async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0,
                                      http_client=openai.DefaultAsyncHttpxClient(verify=_tls_context())) as client:
            return await fn(row, client)

    def run() -> Any:
        with openai.OpenAI(base_url=base_url, api_key=key, max_retries=0,
                           http_client=openai.DefaultHttpxClient(verify=_tls_context())) as client:
            return fn(row, client)

    return await asyncio.to_thread(run)


async def _run_command(command: list[str], row: dict, base_url: str, key: str) -> Any:
    proc = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key})
    try:
        stdout, stderr = await proc.communicate(json.dumps(row).encode())
    except asyncio.CancelledError:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} exited {proc.returncode}: "
                           f"{stderr.decode(errors='replace')[-500:].strip() or '(no stderr)'}")
    lines = [line for line in stdout.decode(errors="replace").splitlines() if line.strip()]
    if not lines:
        raise RuntimeError(f"{shlex.join(command)} printed no result (a JSON number or object on its last line)")
    try:
        return json.loads(lines[-1])
    except ValueError:
        raise RuntimeError(f"{shlex.join(command)}: its last line is not JSON: {lines[-1][:200]!r}") from None


def _result(value: Any) -> tuple[float, dict, Optional[list]]:
    """``(reward, metrics, call_rewards)`` from what the agent returned."""
    if isinstance(value, bool) or not isinstance(value, (int, float, dict)):
        raise TypeError(f"the agent must return a number or a dict with 'reward', got {value!r:.200}")
    if not isinstance(value, dict):
        return float(value), {}, None
    unknown = set(value) - {"reward", "metrics", "call_rewards"}
    if unknown or isinstance(value.get("reward"), bool) or not isinstance(value.get("reward"), (int, float)):
        raise TypeError(f"the agent's dict must have a number 'reward' (and optional 'metrics', 'call_rewards'), "
                        f"got {value!r:.200}")
    metrics = {k: float(v) for k, v in (value.get("metrics") or {}).items() if isinstance(v, (int, float))}
    return float(value["reward"]), metrics, value.get("call_rewards")


def agent_task(agent: Optional[Callable] = None, *, command: Union[Sequence[str], str, None] = None) -> TaskSpec:
    """The task that runs ``agent`` (a callable ``agent(row, client)``) or ``command`` (argv, or a string
    split like a shell's) as its episodes; register it with ``register_task(name, agent_task(...))``."""
    if (agent is None) == (command is None):
        raise ConfigError("agent_task: give either an agent callable or command=[...], not both or neither")
    if agent is not None and not callable(agent):
        raise ConfigError(f"agent_task: the agent must be callable as agent(row, client), got {agent!r}")
    argv = shlex.split(command) if isinstance(command, str) else list(command or [])
    if command is not None and not argv:
        raise ConfigError("agent_task: command is empty")

    def run(row: dict, base_url: str, key: str) -> Any:
        if agent is not None:
            return _run_callable(agent, row, base_url, key)
        return _run_command(argv, row, base_url, key)

    async def start(row: dict, ctx: RolloutContext) -> EpisodeState:
        cfg = parse_section(AgentConfig, dict(ctx.task_config), "task.<agent task>")
        session = AgentSession(cfg, ctx.tokenizer, ctx.max_total_tokens)
        gateway = gateway_for_loop()
        base_url, session.key = await gateway.open(session)
        session.agent = asyncio.ensure_future(run(row, base_url, session.key))
        try:
            messages = await session.next_request()
            if messages is None:
                error = session.agent.exception()
                raise EpisodeFailure("task_error", f"the agent made no model call: it "
                                     + (f"raised {type(error).__name__}: {error}" if error else "returned first"))
        except BaseException as e:  # a start cut by the episode's timeout (cancelled) stops the agent at once
            await _stop(session, 0 if isinstance(e, asyncio.CancelledError) else cfg.finish_timeout_s)
            raise
        tools = session.request.get("tools") or None  # OpenAI's form, as the tools' own schemas are
        return EpisodeState(row=row, messages=messages, ctx=ctx, tools=list(tools) if tools else None, task=session)

    async def gen(state: EpisodeState, backend: Any, sampling: SamplingParams) -> GenOutput:
        request = state.task.request
        cap = request.get("max_completion_tokens") or request.get("max_tokens")
        if isinstance(cap, int) and cap > 0:
            sampling = sampling.replace(max_new_tokens=min(sampling.max_new_tokens, cap))
        return await default_gen(state, backend, sampling)

    async def obs(state: EpisodeState, out: GenOutput) -> Observation:
        session: AgentSession = state.task
        session.answer(state, out, prompt_tokens=state.num_tokens - len(out.token_ids))
        messages = await session.next_request()
        if messages is None:
            return Observation(done=True)
        return Observation(messages=messages, new_row=session.new_row)

    async def end(state: EpisodeState) -> EpisodeResult:
        session: AgentSession = state.task
        outcome = await _stop(session, session.cfg.finish_timeout_s, why=(
            f"the episode ended ({state.finish_reason}: the rollout's max_turns or max_total_tokens ran out, "
            "or the episode failed) before this request could be answered"))
        metrics = {"agent_calls": float(session.calls), "agent_rejected_requests": float(session.rejected),
                   "agent_parse_errors": float(session.parse_errors), "agent_rows": float(len(state.rows) + 1)}
        if isinstance(outcome, BaseException):
            if state.error is None:
                state.error = EpisodeError("task_error", f"agent: {type(outcome).__name__}: {outcome}")
                state.finish_reason = "error"
            return EpisodeResult(0.0, metrics)
        try:
            reward, extra, call_rewards = _result(outcome)
        except TypeError as e:
            if state.error is None:
                state.error = EpisodeError("task_error", str(e))
                state.finish_reason = "error"
            return EpisodeResult(0.0, metrics)
        if call_rewards is not None:
            assistant = [t for t in state.all_turns if t.role == "assistant"]
            if len(call_rewards) != len(assistant):
                raise EpisodeFailure("task_error", f"the agent gave {len(call_rewards)} call_rewards for "
                                                   f"{len(assistant)} model calls")
            for turn, value in zip(assistant, call_rewards):
                turn.reward = float(value)
        return EpisodeResult(reward, {**metrics, **extra})

    # what a registry error names as this task's definition: the user's agent, not this module
    if agent is not None:
        start.__wrapped__ = agent  # type: ignore[attr-defined]
    else:
        start.__qualname__ = f"agent_task(command={shlex.join(argv)!r})"
    return TaskSpec(start=start, gen=gen, obs=obs, end=end,
                    check_config=lambda d: parse_section(AgentConfig, dict(d or {}), "task.<agent task>"))


async def _stop(session: AgentSession, timeout_s: float, why: str = "the episode ended") -> Any:
    """Refuse a waiting request, let the agent finish (cancel it after ``timeout_s``), close its
    session; returns what the agent returned, or the exception it raised."""
    session.refuse_pending(why)
    outcome: Any = None
    if session.agent is not None:
        try:
            outcome = await asyncio.wait_for(asyncio.shield(session.agent), timeout_s)
        except asyncio.TimeoutError:
            session.agent.cancel()
            outcome = TimeoutError(f"the agent did not finish within finish_timeout_s={timeout_s} after the "
                                   "episode ended; cancelled")
        except Exception as e:  # noqa: BLE001 - the agent's own failure: the episode's error, reported by end()
            outcome = e
    if session.key:
        await gateway_for_loop().close(session.key)
        session.key = ""
    return outcome


__all__ = ["AgentConfig", "AgentSession", "agent_task"]
