"""Where a replayed episode first differs from its recording: the turn, what differs, and how.

Checked in the order an episode runs, the first difference wins:

- the prompt the task built (turn 0, ``messages``);
- an episode of several rows (an agent whose history changed) row by row, its turns counted across them;
- each turn of the trajectory, in order: an assistant turn's token ids, text, finish reason and reward
  (``tokens``, ``reward``), then the observation that followed it (tool results, feedback, a user's
  reply: ``messages``, numbered with the assistant turn it answers);
- what a door was asked (``Tape.divergence``: a request the recording does not hold, or a live door's
  answer that differs), at the turn the episode was in;
- recorded events the replay never asked for (a tool the changed task no longer calls);
- the end: the finish reason, the error type, the episode's reward (``turn`` = the last turn).
"""

from __future__ import annotations

from typing import Any, Optional

from verl_agentic.rollout.trajectory import training_rows


def _first_index(a: list, b: list) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def _clip(text: Any, n: int = 160) -> str:
    text = str(text)
    return text if len(text) <= n else text[: n - 3] + "..."


def _ids_detail(recorded: list[int], replayed: list[int], tokenizer: Any) -> str:
    p = _first_index(recorded, replayed)
    lo = max(0, p - 6)

    def show(ids: list[int]) -> str:
        if tokenizer is None:
            return str(ids[lo:p + 10])
        return repr(_clip(tokenizer.decode(ids[lo:p + 10], skip_special_tokens=False), 120))

    return (f"token {p} of {len(recorded)} recorded / {len(replayed)} replayed: "
            f"recorded {show(recorded)}, replayed {show(replayed)}")


def _diff(turn: int, what: str, detail: str) -> dict:
    return {"turn": turn, "what": what, "detail": detail}


def trajectory_difference(recorded: dict, replayed: dict, tokenizer: Any = None) -> Optional[dict]:
    """The first turn where ``replayed`` (a trajectory) differs from ``recorded`` (a recording's
    ``outcome``), not counting the end (``end_difference``)."""
    if recorded.get("rows_before") or replayed.get("rows_before"):
        return _rows_difference(recorded, replayed, tokenizer)
    if recorded["prompt_ids"] != replayed["prompt_ids"]:
        return _diff(0, "messages", "the prompt differs: " + _ids_detail(recorded["prompt_ids"], replayed["prompt_ids"],
                                                                          tokenizer))
    rec_ids, rep_ids = recorded["response_ids"], replayed["response_ids"]
    turn = 0
    for a, b in zip(recorded["turns"], replayed["turns"]):
        if a["role"] == "assistant":
            turn += 1
        seg_a, seg_b = rec_ids[a["start"]:a["end"]], rep_ids[b["start"]:b["end"]]
        kind = "tokens" if a["role"] == "assistant" else "messages"
        if a["role"] != b["role"]:
            return _diff(turn, "messages", f"a {b['role']} turn where the recording has a {a['role']} turn")
        if seg_a != seg_b:
            return _diff(turn, kind, f"{a['role']} turn: " + _ids_detail(seg_a, seg_b, tokenizer))
        if a.get("text") != b.get("text"):
            return _diff(turn, kind, f"{a['role']} text: recorded {_clip(a.get('text'))!r}, "
                                     f"replayed {_clip(b.get('text'))!r}")
        if a.get("finish_reason") != b.get("finish_reason"):
            return _diff(turn, "tokens", f"finish reason: recorded {a.get('finish_reason')!r}, "
                                         f"replayed {b.get('finish_reason')!r}")
        if a.get("reward") != b.get("reward"):
            return _diff(turn, "reward", f"turn reward: recorded {a.get('reward')!r}, replayed {b.get('reward')!r}")
    na, nb = len(recorded["turns"]), len(replayed["turns"])
    if na != nb:
        return _diff(turn + (1 if na > nb and recorded["turns"][nb]["role"] == "assistant" else 0), "messages",
                     f"the replay has {nb} turns (assistant and observation), the recording {na}")
    if recorded["messages"] != replayed["messages"]:  # covered by the tokens, but a task may keep messages apart
        i = _first_index(recorded["messages"], replayed["messages"])
        return _diff(turn, "messages", f"message {i}: recorded {_clip(recorded['messages'][i:i + 1])}, "
                                       f"replayed {_clip(replayed['messages'][i:i + 1])}")
    return None


def _rows_difference(recorded: dict, replayed: dict, tokenizer: Any) -> Optional[dict]:
    done = 0  # assistant turns of the rows before
    rec, rep = training_rows(recorded), training_rows(replayed)
    for a, b in zip(rec, rep):
        d = trajectory_difference(a, b, tokenizer)
        if d is not None:
            return {**d, "turn": d["turn"] + done, "detail": f"row {a['row']}: {d['detail']}"}
        done += sum(1 for t in a["turns"] if t["role"] == "assistant")
    if len(rec) != len(rep):
        return _diff(done, "messages", f"the replay made {len(rep)} rows, the recording {len(rec)}")
    return None


def end_difference(recorded: dict, replayed: dict) -> Optional[dict]:
    turn = sum(1 for t in replayed["turns"] if t["role"] == "assistant")
    if recorded["finish_reason"] != replayed["finish_reason"]:
        return _diff(turn, "finish_reason", f"recorded {recorded['finish_reason']!r}, replayed "
                                            f"{replayed['finish_reason']!r}")
    err_a, err_b = recorded.get("error") or {}, replayed.get("error") or {}
    if err_a.get("type") != err_b.get("type"):
        return _diff(turn, "error", f"recorded {err_a.get('type')!r} ({_clip(err_a.get('message'), 100)}), "
                                    f"replayed {err_b.get('type')!r} ({_clip(err_b.get('message'), 100)})")
    if recorded["reward"] != replayed["reward"]:
        return _diff(turn, "reward", f"episode reward: recorded {recorded['reward']!r}, replayed {replayed['reward']!r}")
    return None


def first_difference(recorded: dict, replayed: dict, tape: Any, tokenizer: Any = None) -> Optional[dict]:
    """The episode's first difference (module docstring), or None when the replay is the recording.
    ``tape``: the replay's ``Tape``."""
    found = []
    traj = trajectory_difference(recorded, replayed, tokenizer)
    if tape.divergence is not None:
        d = tape.divergence
        detail = (f"{d['what']}: recorded {_clip(d['expected'], 300)}, replayed {_clip(d['got'], 300)}")
        found.append(_diff(d["turn"], d["door"], detail))
    if traj is not None:
        # on a tie the trajectory's difference says more (which message), unless it only shows where the
        # divergence ended the episode (fewer turns, an empty prompt): then the door's says why
        caused = "ReplayDivergence" in ((replayed.get("error") or {}).get("message") or "")
        found.insert(len(found) if caused or "turns (assistant" in traj["detail"] else 0, traj)
    if not found:
        left = tape.unused()
        if left:
            e = left[0]
            found.append(_diff(e["turn"], e["door"], f"the replay never asked for {len(left)} recorded event(s); "
                                                     f"the first: {e['door']} {_clip(e['request'], 200)}"))
    if found:
        return min(found, key=lambda d: d["turn"])  # the first of the earliest turn
    return end_difference(recorded, replayed)
