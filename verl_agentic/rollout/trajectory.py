"""Trajectories: the dump schema, JSONL I/O, and the token-exactness (drift) check.

A trajectory is a plain dict (one JSON line), see docs/rollouts.md ("Trajectories and token exactness")::

    {"uid", "task_type", "index", "sample_id", "data_source", "ground_truth", "extra_info",
     "prompt_ids", "response_ids", "response_mask", "response_logprobs", "messages", "turns",
     "reward", "num_turns", "finish_reason", "error", "metrics"}
    (+ "tools" when the episode had tools; + "scorer" when its task names one; + "score", "score_extra", "score_error" once a
    reward manager scored it, see ``verl_agentic.reward``; + "rows_before" when the episode made several
    training rows: its token fields are the last row's, ``rows_before`` the earlier ones, see ``training_rows``)

``check_drift`` verifies a trajectory against the chat template:

(a) ``injected``: every non-generated span (the prompt, each feedback / tool / user delta)
    must equal what the template renders for those messages in that context. Any
    difference is reported with its position in ``response_ids`` (-1 for the prompt).
(b) ``rerender``: the spans a fresh rendering of the whole final conversation would give.
    Templates that rewrite history (Qwen3 drops earlier ``<think>`` blocks) differ here;
    append-only templates (SmolLM2, Qwen2.5) do not. Diagnostic.
(c) ``reencode_changed``: generated tokens that decoding and re-encoding the text would have
    changed, i.e. the drift that token-in/token-out avoids. Diagnostic.
It also checks the structure: mask 1 exactly on assistant spans, logprobs on masked tokens
only, turns contiguous over ``response_ids``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from verl_agentic.interfaces import EpisodeFailure, EpisodeResult, EpisodeState
from verl_agentic.jsonl import read_json_lines, write_json_lines
from verl_agentic.rollout.loops import ended_on_stop
from verl_agentic.rollout.template import ChatTemplate


def build_trajectory(state: EpisodeState, result: EpisodeResult, *, uid: str, task_type: str,
                     index: int, sample_id: int, scorer: Optional[str] = None) -> dict:
    metrics = {**state.metrics, **result.metrics}
    row = state.row or {}
    traj = {
        "uid": uid,
        "task_type": task_type,
        "index": index,
        "sample_id": sample_id,
        "data_source": row.get("data_source"),
        "ground_truth": (row.get("reward_model") or {}).get("ground_truth"),
        "extra_info": row.get("extra_info") or {},
        "prompt_ids": state.prompt_ids,
        "response_ids": state.response_ids,
        "response_mask": state.response_mask,
        "response_logprobs": state.response_logprobs,
        "messages": state.messages,
        "turns": [t.as_dict() for t in state.turns],
        "reward": float(result.reward),
        "num_turns": state.num_turns,
        "finish_reason": state.finish_reason,
        "error": state.error.as_dict() if state.error else None,
        "metrics": metrics,
    }
    if state.tools:
        traj["tools"] = state.tools
    if state.rows:
        traj["rows_before"] = [{**r, "turns": [t.as_dict() for t in r["turns"]]} for r in state.rows]
    if scorer:  # the task names its scorer (TaskSpec.scorer)
        traj["scorer"] = scorer
    return traj


ROW_FIELDS = ("prompt_ids", "response_ids", "response_mask", "response_logprobs", "messages", "turns")


def training_rows(traj: dict) -> list[dict]:
    """The episode's training rows, in order: one per row of ``rows_before`` (the episode's other fields
    with that row's token fields, ``split_reason`` saying why the next row started) and the trajectory's
    own last row. Each carries ``row`` (its position) and ``rows`` (how many the episode made); an
    episode of one row gives ``[traj]`` itself."""
    before = traj.get("rows_before") or []
    if not before:
        return [traj]
    base = {k: v for k, v in traj.items() if k != "rows_before"}
    rows = [{**base, **{k: r[k] for k in ROW_FIELDS}, "split_reason": r.get("split_reason")} for r in before]
    rows.append(base)
    for i, r in enumerate(rows):
        r["row"], r["rows"] = i, len(rows)
    return rows


def _spoken_turns(traj: dict) -> list[dict]:
    """The assistant turns of a trajectory (or row) that generated at least one token."""
    return [t for t in traj.get("turns") or () if t.get("role") == "assistant" and t["end"] > t["start"]]


def turn_rewards(traj: dict) -> list[tuple[int, float]]:
    """``(position in response_ids, reward)`` of each assistant turn's own reward (the task's
    ``turn_reward``) on the turn's last token, for every assistant turn but the last, whose last token
    carries the episode's score. The one rule of per-turn rewards in both trainers (``main_ppo``'s
    ``algorithm.turn_rewards``, the verl plugin's ``agentic.turn_rewards``)."""
    return [(t["end"] - 1, float(t.get("reward") or 0.0)) for t in _spoken_turns(traj)[:-1]]


def row_turn_rewards(row: dict) -> list[tuple[int, float]]:
    """:func:`turn_rewards` of one training row: an episode's earlier row (``row`` < ``rows`` - 1) also
    carries its last assistant turn's own reward on that turn's last token, where the episode's score
    goes on its last row only (``main_ppo``; the verl plugin with ``agentic.turn_rewards``)."""
    pairs = turn_rewards(row)
    spoken = _spoken_turns(row)
    if spoken and row.get("row", 0) < row.get("rows", 1) - 1:
        pairs.append((spoken[-1]["end"] - 1, last_turn_reward(row)))
    return pairs


def last_turn_reward(row: dict) -> float:
    """The own reward of a row's last assistant turn (0 when it has none): what an episode's earlier row
    carries on its last token, where the episode's score goes on its last row (``main_ppo``)."""
    spoken = _spoken_turns(row)
    return float(spoken[-1].get("reward") or 0.0) if spoken else 0.0


def write_jsonl(path: str | Path, records: Iterable[dict]) -> int:
    return write_json_lines(path, records)


def read_jsonl(path: str | Path) -> list[dict]:
    return read_json_lines(path, what="a trajectory", skip_torn=True)


@dataclass
class SpanMismatch:
    span: str  # "prompt" or "turn <i>"
    position: int  # first differing index into response_ids (-1 region: prompt, index into prompt_ids)
    expected: list[int]
    actual: list[int]
    differing_tokens: int

    def as_dict(self) -> dict:
        return {"span": self.span, "position": self.position, "differing_tokens": self.differing_tokens,
                "expected": self.expected[:16], "actual": self.actual[:16]}


@dataclass
class DriftReport:
    structure: list[str] = field(default_factory=list)
    injected: list[SpanMismatch] = field(default_factory=list)
    rerender: list[SpanMismatch] = field(default_factory=list)
    generated_tokens: int = 0
    reencode_changed: int = 0
    injected_tokens: int = 0

    @property
    def ok(self) -> bool:
        """No structural problem and no injected span that differs from the template."""
        return not self.structure and not self.injected

    @property
    def injected_differing_tokens(self) -> int:
        return sum(m.differing_tokens for m in self.injected)

    @property
    def rerender_differing_tokens(self) -> int:
        return sum(m.differing_tokens for m in self.rerender)

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "structure": self.structure,
            "injected_tokens": self.injected_tokens,
            "injected_differing_tokens": self.injected_differing_tokens,
            "injected": [m.as_dict() for m in self.injected],
            "rerender_differing_tokens": self.rerender_differing_tokens,
            "rerender": [m.as_dict() for m in self.rerender],
            "generated_tokens": self.generated_tokens,
            "reencode_changed_tokens": self.reencode_changed,
        }


def _compare(span: str, offset: int, expected: list[int], actual: list[int]) -> Optional[SpanMismatch]:
    if expected == actual:
        return None
    first = next((i for i, (a, b) in enumerate(zip(expected, actual)) if a != b), min(len(expected), len(actual)))
    differing = sum(a != b for a, b in zip(expected, actual)) + abs(len(expected) - len(actual))
    return SpanMismatch(span, offset + first, expected, actual, differing)


def _check_structure(traj: dict) -> list[str]:
    problems = []
    n = len(traj["response_ids"])
    mask, logprobs = traj["response_mask"], traj.get("response_logprobs")
    if len(mask) != n:
        problems.append(f"response_mask has {len(mask)} entries for {n} response tokens")
    if logprobs is not None and len(logprobs) != n:
        problems.append(f"response_logprobs has {len(logprobs)} entries for {n} response tokens")
    cursor = 0
    for i, t in enumerate(traj["turns"]):
        if t["start"] != cursor:
            problems.append(f"turn {i} starts at {t['start']}, expected {cursor} (turns must tile the response)")
        cursor = t["end"]
        want = 1 if t["role"] == "assistant" else 0
        span = mask[t["start"]:t["end"]]
        if any(m != want for m in span):
            problems.append(f"turn {i} ({t['role']}): response_mask must be {want} on all of [{t['start']}, {t['end']})")
        if logprobs is not None and len(logprobs) == n:
            lp = logprobs[t["start"]:t["end"]]
            if want == 0 and any(x is not None for x in lp):
                problems.append(f"turn {i} ({t['role']}): injected tokens must have logprob null")
            if want == 1 and any(x is None for x in lp) and not all(x is None for x in lp):
                problems.append(f"turn {i}: some generated tokens lack a logprob")
    if cursor != n:
        problems.append(f"turns cover {cursor} of {n} response tokens")
    return problems


def _merge(reports: list[tuple[int, "DriftReport"]]) -> "DriftReport":
    merged = DriftReport()
    for row, r in reports:
        merged.structure += [f"row {row}: {p}" for p in r.structure]
        for m in r.injected + r.rerender:
            m.span = f"row {row} {m.span}"
        merged.injected += r.injected
        merged.rerender += r.rerender
        merged.generated_tokens += r.generated_tokens
        merged.reencode_changed += r.reencode_changed
        merged.injected_tokens += r.injected_tokens
    return merged


def check_drift(traj: dict, tokenizer: Any, chat_template_kwargs: Optional[dict] = None,
                stop_token_ids: Optional[Iterable[int]] = None) -> DriftReport:
    """Check one trajectory against the chat template (see the module docstring); an episode of several
    rows (``rows_before``) row by row, the problems of each named by its row."""
    if traj.get("rows_before"):
        return _merge([(r["row"], check_drift(r, tokenizer, chat_template_kwargs, stop_token_ids))
                       for r in training_rows(traj)])
    template = ChatTemplate(tokenizer, chat_template_kwargs)
    report = DriftReport(structure=_check_structure(traj))
    if report.structure or not traj["prompt_ids"]:  # nothing was rendered (start failed)
        return report
    stops = set(stop_token_ids or [])
    tools = traj.get("tools")
    messages = traj["messages"]
    resp = traj["response_ids"]
    n_prompt = len(messages) - sum(t.get("num_messages", 1) for t in traj["turns"])
    if n_prompt < 1:
        report.structure.append(f"{len(messages)} messages cannot hold the prompt plus {len(traj['turns'])} turns")
        return report

    # (a) each injected span against the template rendered in its own context
    prompt_expected = template.prompt_ids(messages[:n_prompt], tools)
    if (m := _compare("prompt", -1, prompt_expected, traj["prompt_ids"])) is not None:
        report.injected.append(m)
    cursor, stop_texts = n_prompt, []
    for i, t in enumerate(traj["turns"]):
        actual = resp[t["start"]:t["end"]]
        if t["role"] == "assistant":
            cursor += 1
            stopped = ended_on_stop(actual, t.get("finish_reason"), stops)
            stop_texts.append(template.stop_text(actual[-1]) if stopped else None)
            content_ids = actual[:-1] if stopped else actual
            report.generated_tokens += len(actual)
            if content_ids:
                reencoded = template.encode(tokenizer.decode(content_ids, skip_special_tokens=False))
                same = sum(b.size for b in difflib.SequenceMatcher(None, content_ids, reencoded,
                                                                   autojunk=False).get_matching_blocks())
                report.reencode_changed += len(content_ids) - same
            continue
        k = t.get("num_messages", 1)
        if i == 0 or traj["turns"][i - 1]["role"] != "assistant":
            report.structure.append(f"turn {i} ({t['role']}) does not follow an assistant turn")
            return report
        expected_text = template.delta_text(messages[:cursor], messages[cursor:cursor + k],
                                            generated_stop_text=stop_texts[-1], tools=tools)
        report.injected_tokens += len(actual)
        if (m := _compare(f"turn {i}", t["start"], template.encode(expected_text), actual)) is not None:
            report.injected.append(m)
        cursor += k

    # (b) the same spans from one fresh rendering of the whole conversation
    try:
        segments = template.split_rendered(messages, add_generation_prompt=False, tools=tools)
    except EpisodeFailure as e:
        report.structure.append(f"re-rendering the conversation failed: {e.message}")
        return report
    if (m := _compare("prompt", -1, template.encode(segments[0]), traj["prompt_ids"])) is not None:
        report.rerender.append(m)
    a = 0
    for i, t in enumerate(traj["turns"]):
        if t["role"] == "assistant":
            a += 1
            continue
        seg = segments[a]
        stop_text = stop_texts[a - 1]
        if stop_text and seg.startswith(stop_text):
            seg = seg[len(stop_text):]
        m = _compare(f"turn {i}", t["start"], template.encode(seg), resp[t["start"]:t["end"]])
        if m is not None:
            report.rerender.append(m)
    return report


def drift_summary(trajectories: Iterable[dict], tokenizer: Any, chat_template_kwargs: Optional[dict] = None,
                  stop_token_ids: Optional[Iterable[int]] = None) -> dict:
    """``check_drift`` over many trajectories, added up; ``examples`` holds the first few failures."""
    stops = list(stop_token_ids or [])
    total = {"episodes": 0, "episodes_ok": 0, "structure_problems": 0, "injected_tokens": 0,
             "injected_differing_tokens": 0, "rerender_differing_tokens": 0, "generated_tokens": 0,
             "reencode_changed_tokens": 0, "examples": []}
    for traj in trajectories:
        r = check_drift(traj, tokenizer, chat_template_kwargs, stops)
        total["episodes"] += 1
        total["episodes_ok"] += r.ok
        total["structure_problems"] += len(r.structure)
        total["injected_tokens"] += r.injected_tokens
        total["injected_differing_tokens"] += r.injected_differing_tokens
        total["rerender_differing_tokens"] += r.rerender_differing_tokens
        total["generated_tokens"] += r.generated_tokens
        total["reencode_changed_tokens"] += r.reencode_changed
        if not r.ok and len(total["examples"]) < 3:
            total["examples"].append({"uid": traj["uid"], "sample_id": traj["sample_id"], **r.as_dict()})
    return total
