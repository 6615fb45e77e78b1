"""The tape: what one episode received from outside, recorded as it came, or played back from a recording.

An episode receives everything from outside through a few doors, and each door asks this module first::

    answer = await door("tool", {"name": "python", "arguments": {...}}, lambda: run_the_tool(),
                        encode=result_as_dict, decode=result_from_dict)

- no tape (the usual case): ``door`` just awaits the call; nothing else happens.
- a recording tape: the call runs, and the request and its answer (or its error, when ``error_of``
  says the error is the outside's answer, e.g. an HTTP service's typed error) are appended to the tape.
- a replaying tape: the door answers from the recording: the first unused recorded event of that door
  whose request equals this one. A request the recording does not hold is the episode's divergence
  (``Tape.divergence`` says which turn and what differs) and raises ``ReplayDivergence``, which ends the
  episode like any failure of that door. A door named in the tape's ``live`` set runs for real instead,
  and an answer that differs from the recorded one is noted as the divergence (the live answer is used).

The doors (``DOORS``): the generation backend (``generate``, ``chat``: ``record/backend.py``), tool calls
and tool rewards (``tool``, ``tool_reward``: ``tools/runner.py``), interactions (``interaction``:
``tasks/tool_agent.py``) and every HTTP request a client sends (``http``: ``serving/client.py``, which the
environment, sandbox and remote reward clients share). Only the outermost door records: a tool that talks
to a sandbox service over HTTP is one ``tool`` event (its HTTP requests run inside it, unrecorded), so a
replay that answers the tool from the recording needs no service.

One kind of event is not a door: what an agent program (``tasks/agent.py``) sent to the episode's
gateway and was answered (``agent_http``, through ``note``). A recording keeps each request and its
answer; a replay runs the agent program again and compares each of its requests, and the answer the
replayed episode gave it, with the recorded ones: the first that differs is the divergence (noted, the
episode goes on: its generation door then says whether the tokens could still be answered).

The tape rides in a context variable set around one episode (``using``): every asyncio task the episode
starts (concurrent tool calls) sees it, and episodes running side by side each see their own.
Requests are compared as JSON; a large part of a request is kept as its SHA-256 (``digest``).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
from typing import Any, Awaitable, Callable, Iterable, Iterator, Optional, TypeVar

T = TypeVar("T")

DOORS = ("generate", "chat", "tool", "tool_reward", "interaction", "http", "agent_http")
# doors a replay may run for real (``--live``): the others either need a model or are never live
LIVE_DOORS = ("tool", "tool_reward", "interaction", "http")

_CURRENT: contextvars.ContextVar[Optional["Tape"]] = contextvars.ContextVar("verl_agentic_tape", default=None)
_INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("verl_agentic_tape_inside", default=False)


class ReplayDivergence(Exception):
    """The episode asked a door for something the recording does not hold (see ``Tape.divergence``)."""


def canonical(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists, unknown objects their ``str``)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def digest(value: Any, keep_chars: int = 400) -> Any:
    """``value`` itself when its JSON is short, else ``{"sha256", "chars"}`` of its JSON: what a request
    is compared by without storing, say, every prompt of an episode in full."""
    text = json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
    if len(text) <= keep_chars:
        return json.loads(text)
    return {"sha256": hashlib.sha256(text.encode()).hexdigest(), "chars": len(text)}


class Tape:
    """One episode's events. ``mode`` is ``"record"`` or ``"replay"``; ``live``: the doors a replay runs
    for real. ``turn`` is the assistant turn the episode is at (0 before the first generation), which
    the backend door advances and every event carries."""

    def __init__(self, mode: str = "record", events: Optional[Iterable[dict]] = None,
                 live: Iterable[str] = ()):
        if mode not in ("record", "replay"):
            raise ValueError(f"Tape mode must be 'record' or 'replay', got {mode!r}")
        self.mode = mode
        self.events: list[dict] = list(events or ())
        self.live = frozenset(live)
        unknown = self.live - set(LIVE_DOORS)
        if unknown:
            raise ValueError(f"doors {sorted(unknown)} cannot run live in a replay; live doors: {list(LIVE_DOORS)}")
        self.turn = 0
        self.divergence: Optional[dict] = None
        self._used = [False] * len(self.events)

    @property
    def recording(self) -> bool:
        return self.mode == "record"

    def unused(self, door: Optional[str] = None) -> list[dict]:
        """Recorded events the replay has not asked for (of ``door``, or all)."""
        return [e for e, used in zip(self.events, self._used) if not used and (door is None or e["door"] == door)]

    def diverge(self, door: str, what: str, expected: Any = None, got: Any = None) -> None:
        """Note the first divergence (later ones follow from it and are not kept)."""
        if self.divergence is None:
            self.divergence = {"turn": self.turn, "door": door, "what": what, "expected": expected, "got": got}

    def take(self, door: str, request: Any) -> Optional[dict]:
        """The first unused recorded event of ``door`` with this request (marked used), or None."""
        for i, e in enumerate(self.events):
            if not self._used[i] and e["door"] == door and e["request"] == request:
                self._used[i] = True
                return e
        return None

    def missing(self, door: str, request: Any) -> ReplayDivergence:
        """Note that ``request`` is not in the recording; the exception the door raises."""
        nxt = self.unused(door)
        expected = nxt[0]["request"] if nxt else None
        self.diverge(door, f"{door} request not in the recording" if nxt
                     else f"{door} request beyond the recording (it holds no more {door} events)",
                     expected=expected, got=request)
        return ReplayDivergence(f"replay: turn {self.turn}: this {door} request is not in the recording")


@contextlib.contextmanager
def using(tape: Optional[Tape]) -> Iterator[Optional[Tape]]:
    """Run the body (one episode) with ``tape`` as the doors' tape (None: no recording)."""
    token = _CURRENT.set(tape)
    try:
        yield tape
    finally:
        _CURRENT.reset(token)


def current() -> Optional[Tape]:
    """The tape of the episode running in this context (None outside a recorded or replayed one)."""
    return None if _INSIDE.get() else _CURRENT.get()


async def door(kind: str, request: Any, call: Callable[[], Awaitable[T]], *,
               encode: Callable[[T], Any] = lambda x: x, decode: Callable[[Any], T] = lambda x: x,
               error_of: Optional[Callable[[BaseException], Optional[dict]]] = None,
               raise_error: Optional[Callable[[dict], BaseException]] = None,
               compared: Optional[Callable[[Any], Any]] = None) -> T:
    """``await call()`` through door ``kind`` (see the module docstring). ``request`` (JSON-able) names
    what is asked; ``encode``/``decode`` turn the answer into JSON and back. ``error_of(exc)`` gives the
    JSON of an error that is the outside's answer (recorded and raised again on replay through
    ``raise_error``), or None for errors that are not (they propagate unrecorded). ``compared(answer JSON)``:
    the part of an answer a live door's answer must match (default: all of it; a tool's latency differs
    every time)."""
    tape = current()
    if tape is None:
        return await call()
    request = canonical(request)
    if tape.mode == "replay" and kind not in tape.live:
        event = tape.take(kind, request)
        if event is None:
            raise tape.missing(kind, request)
        if "error" in event:
            if raise_error is None:
                raise ReplayDivergence(f"replay: a recorded {kind} error cannot be raised again")
            raise raise_error(event["error"])
        return decode(event["answer"])
    token = _INSIDE.set(True)  # doors inside this one run as they are: this one is what is recorded
    try:
        answer = await call()
    except BaseException as e:
        err = error_of(e) if error_of is not None and isinstance(e, Exception) else None
        if err is not None:
            _after(tape, kind, request, {"error": canonical(err)}, compared)
        raise
    finally:
        _INSIDE.reset(token)
    _after(tape, kind, request, {"answer": canonical(encode(answer))}, compared)
    return answer


def note(kind: str, request: Any, outcome: dict, compared: Optional[Callable[[Any], Any]] = None) -> None:
    """An event of the episode that is not a call through a door (``agent_http``: module docstring).
    ``request`` is its JSON, or a function that builds it (called only when there is a tape: the
    episode pays nothing for it otherwise). ``outcome`` is ``{"answer": ...}`` or ``{"error": ...}``;
    ``compared`` as for ``door``. A recording tape keeps it, a replay compares it with the recorded one,
    no tape: nothing."""
    tape = current()
    if tape is not None:
        _after(tape, kind, canonical(request() if callable(request) else request), canonical(outcome), compared)


def _after(tape: Tape, kind: str, request: Any, outcome: dict, compared: Optional[Callable[[Any], Any]]) -> None:
    """Record an event, or (a live door in a replay) compare it with the recorded one."""
    if tape.recording:
        tape.events.append({"door": kind, "turn": tape.turn, "request": request, **outcome})
        return
    event = tape.take(kind, request)
    if event is None:
        tape.missing(kind, request)  # noted; the live answer still serves the episode
        return
    recorded = {k: event[k] for k in ("answer", "error") if k in event}
    if compared is not None:
        recorded = {k: compared(v) if k == "answer" else v for k, v in recorded.items()}
        outcome = {k: compared(v) if k == "answer" else v for k, v in outcome.items()}
    if recorded != outcome:
        tape.diverge(kind, f"{kind} answer differs from the recording", expected=recorded, got=outcome)


__all__ = ["DOORS", "LIVE_DOORS", "ReplayDivergence", "Tape", "canonical", "current", "digest", "door", "note", "using"]
