"""OpenAI's Responses API (``POST /v1/responses``) in terms of chat completions: the gateway's second door.

An agent that speaks the Responses API (the OpenAI Agents SDK's default model, NeMo Gym's contract) sends
its whole conversation as ``input`` items; :func:`chat_request` turns the request into the
``/v1/chat/completions`` body the episode's session answers, and :func:`response_object` turns that
answer back into a ``response`` object. Stateless, as with ``store=false``: ``previous_response_id`` and
``conversation`` are refused (the gateway keeps no responses). ``stream=true`` is answered with the
Responses protocol's server-sent events (:func:`response_events`): the response created, each output item
added, its whole text or arguments in one delta, done, and the response completed (or incomplete). The
turn is generated whole before it is answered, as for streamed chat completions.

Input items, in order, become chat messages: ``instructions`` a first system message; a message item
(``role`` user / system / developer / assistant, ``content`` a string or ``input_text`` / ``output_text``
parts) a message with its text; consecutive ``function_call`` items the ``tool_calls`` of one assistant
message (joined to the assistant text just before them, as one model turn answered both);
``function_call_output`` a tool message for its ``call_id``. ``reasoning`` items carry nothing to render
and are dropped. Function tools become chat tools; any other tool type is refused, naming it.
The answer: a ``message`` item with the text (when there is any) and a ``function_call`` item per tool
call, whose ``call_id`` is the chat tool call's id, so the next request's items match what was answered.
A turn cut by ``max_output_tokens`` is ``status: incomplete`` (``incomplete_details.reason``), as OpenAI's.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from verl_agentic.serving.errors import ServiceError

_UNSUPPORTED = {"previous_response_id": "the gateway keeps no responses: send the whole conversation as input",
                "conversation": "the gateway keeps no conversations: send the whole conversation as input"}


def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("input_text", "output_text", "text"):
                parts.append(part.get("text") or "")
            elif kind != "refusal":
                raise ServiceError(400, "unsupported", f"{where}: content part of type {kind!r}: this gateway takes "
                                                       "text parts (input_text, output_text) only")
        return "".join(parts)
    raise ServiceError(400, "bad_request", f"{where}: content must be a string or a list of parts")


def _tool(tool: Any, i: int) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise ServiceError(400, "unsupported", f"tools[{i}] is of type {kind!r}: this gateway serves function tools only")
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": function}


def chat_request(body: dict) -> dict:
    """The ``/v1/chat/completions`` body for a ``/v1/responses`` request (see the module docstring)."""
    for key, why in _UNSUPPORTED.items():
        if body.get(key):
            raise ServiceError(400, "unsupported", f"{key}: {why}")
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise ServiceError(400, "bad_request", "input must be a string or a non-empty list of items")
    messages: list[dict] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ServiceError(400, "bad_request", f"input[{i}] must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = {"developer": "system"}.get(item.get("role"), item.get("role"))
            if role not in ("user", "system", "assistant"):
                raise ServiceError(400, "bad_request", f"input[{i}]: role {item.get('role')!r} is not one of user, "
                                                       "system, developer, assistant")
            messages.append({"role": role, "content": _text(item.get("content"), f"input[{i}]")})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else _text(output, f"input[{i}]")})
        elif kind != "reasoning":
            raise ServiceError(400, "unsupported", f"input[{i}] is of type {kind!r}: this gateway takes messages, "
                                                   "function_call and function_call_output items")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if body.get("tools"):
        chat["tools"] = [_tool(t, i) for i, t in enumerate(body["tools"])]
    tool_choice = body.get("tool_choice")
    if isinstance(tool_choice, str):
        chat["tool_choice"] = tool_choice
    for ours, theirs in (("max_tokens", "max_output_tokens"), ("temperature", "temperature"), ("top_p", "top_p")):
        if body.get(theirs) is not None:
            chat[ours] = body[theirs]
    return chat


def response_object(completion: dict, request: dict) -> dict:
    """The ``response`` object for a chat ``completion`` that answered ``request`` (a Responses body)."""
    choice = completion["choices"][0]
    message = choice["message"]
    output: list[dict] = []
    if message.get("content"):
        output.append({"type": "message", "id": "msg_" + secrets.token_hex(12), "status": "completed",
                       "role": "assistant",
                       "content": [{"type": "output_text", "text": message["content"], "annotations": []}]})
    for call in message.get("tool_calls") or []:
        output.append({"type": "function_call", "id": "fc_" + secrets.token_hex(12), "call_id": call["id"],
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                       "status": "completed"})
    usage = completion.get("usage") or {}
    cut = choice.get("finish_reason") == "length"
    return {
        "id": "resp_" + secrets.token_hex(12), "object": "response", "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
        "model": completion.get("model"), "output": output,
        "instructions": request.get("instructions"), "tools": request.get("tools") or [],
        "tool_choice": request.get("tool_choice") or "auto", "parallel_tool_calls": True,
        "temperature": request.get("temperature"), "top_p": request.get("top_p"),
        "max_output_tokens": request.get("max_output_tokens"), "metadata": request.get("metadata") or {},
        "text": {"format": {"type": "text"}}, "truncation": "disabled", "store": False,
        "usage": {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0),
                  "total_tokens": usage.get("total_tokens", 0), "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }


def response_events(response: dict) -> list[dict]:
    """A ``response`` object as the server-sent events of a streamed Responses request, in the protocol's
    order (``sequence_number`` counting from 0): ``response.created`` and ``response.in_progress`` (no
    output yet); per output item, ``response.output_item.added``, then a message's content part added, its
    whole text in one ``response.output_text.delta``, the text done and the part done, or a function call's
    whole arguments in one ``response.function_call_arguments.delta`` and done; ``response.output_item.done``;
    last ``response.completed`` (``response.incomplete`` for a turn cut by ``max_output_tokens``)."""
    events: list[dict] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    started = {**response, "status": "in_progress", "output": [], "incomplete_details": None}
    emit("response.created", response=started)
    emit("response.in_progress", response=started)
    for k, item in enumerate(response["output"]):
        where = {"item_id": item["id"], "output_index": k}
        if item["type"] == "message":
            emit("response.output_item.added", output_index=k, item={**item, "status": "in_progress", "content": []})
            for c, part in enumerate(item["content"]):
                emit("response.content_part.added", **where, content_index=c, part={**part, "text": ""})
                emit("response.output_text.delta", **where, content_index=c, delta=part["text"], logprobs=[])
                emit("response.output_text.done", **where, content_index=c, text=part["text"], logprobs=[])
                emit("response.content_part.done", **where, content_index=c, part=part)
        else:  # a function call
            emit("response.output_item.added", output_index=k, item={**item, "status": "in_progress", "arguments": ""})
            emit("response.function_call_arguments.delta", **where, delta=item["arguments"])
            emit("response.function_call_arguments.done", **where, arguments=item["arguments"], name=item["name"])
        emit("response.output_item.done", output_index=k, item=item)
    emit("response.incomplete" if response["status"] == "incomplete" else "response.completed", response=response)
    return events


__all__ = ["chat_request", "response_events", "response_object"]
