"""Build the static HTML report of a rollout output directory (see ``verl_agentic.inspect``).

The report is one self-contained ``index.html``: the CSS and JS from ``static/`` are inlined
and all data is one JSON blob in ``<script type="application/json" id="va-data">``, escaped
so that no model text can end the script element (``<``, ``>``, ``&``, U+2028, U+2029 become
``\\u003c`` etc.). The page builds its DOM with ``textContent`` only, so model text always
renders as text. Token strings and the token-exactness check (``check_drift``) are computed
here in Python; the page needs no tokenizer and no network.
"""

from __future__ import annotations

import html
import json
import math
import time
from pathlib import Path
from typing import Any, Optional

STATIC_DIR = Path(__file__).parent / "static"
DATA_ELEMENT_ID = "va-data"


def _finite(obj: Any) -> Any:
    """``obj`` with NaN / +-inf floats replaced by None (``JSON.parse`` rejects them)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def embed_json(obj: Any) -> str:
    """JSON safe to put inside ``<script type="application/json">`` (and to ``JSON.parse`` back)."""
    try:
        s = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a NaN / inf somewhere (e.g. a -inf logprob)
        s = json.dumps(_finite(obj), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    # These characters can only occur inside JSON strings, where \\uXXXX is an exact equivalent.
    return (s.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def load_run(output_dir: str | Path) -> tuple[list[dict], dict]:
    """(trajectories, summary) of a ``main_rollout`` output dir; summary is {} when absent."""
    from verl_agentic.rollout.trajectory import read_jsonl

    d = Path(output_dir)
    path = d / "trajectories.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{str(path)!r} does not exist (expected a main_rollout output dir)")
    summary_path = d / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return read_jsonl(path), summary


def model_path_of(summary: dict) -> Optional[str]:
    return ((summary.get("config") or {}).get("model") or {}).get("path")


def load_tokenizer(summary: dict, override: Optional[str] = None) -> tuple[Any, Optional[Path], str]:
    """(tokenizer or None, its folder, a note for the page) from ``--tokenizer`` or ``config.model.path``."""
    from verl_agentic.models.embedded import resolve_model_path

    source = override if override else model_path_of(summary)
    if source is None and not override and not summary:
        return None, None, "no summary.json: token ids shown (pass --tokenizer)"
    try:
        path = Path(override).expanduser() if override else resolve_model_path(source)
        if not path.exists():
            raise FileNotFoundError(f"{str(path)!r} does not exist")
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path)), path, f"tokenizer: {path}"
    except Exception as e:  # noqa: BLE001 - any failure: fall back to showing ids
        return None, None, f"no tokenizer ({type(e).__name__}: {e}); token ids shown"


def stop_token_ids_of(model_dir: Optional[Path]) -> list[int]:
    """The model's EOS ids from generation_config.json / config.json (as the HF backend uses them), for
    runs whose summary.json predates its ``stop_token_ids`` field."""
    ids: list[int] = []
    if model_dir is None:
        return ids
    for name in ("generation_config.json", "config.json"):
        p = Path(model_dir) / name
        if not p.exists():
            continue
        try:
            value = json.loads(p.read_text()).get("eos_token_id")
        except (OSError, ValueError):
            continue
        for t in [value] if isinstance(value, int) else value or []:
            if t not in ids:
                ids.append(t)
    return ids


def _token_strings(tokenizer: Any, ids: set[int]) -> tuple[dict[str, str], list[int]]:
    """{id: text of that token alone} (special tokens literally) and the special ids among them."""
    ordered = sorted(ids)
    texts = tokenizer.batch_decode([[i] for i in ordered], skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    for tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok[1], "special", False):
            special.add(tok[0])
    return {str(i): t for i, t in zip(ordered, texts)}, sorted(i for i in ordered if i in special)


def _error_types(traj: dict, drift: Optional[dict]) -> list[str]:
    kinds = []
    if traj.get("error"):
        kinds.append(f"episode:{traj['error'].get('type', 'error')}")
    m = traj.get("metrics") or {}
    if (m.get("tool_error") or 0) > 0:
        kinds.append("tool_error")
    if (m.get("tool_timeout") or 0) > 0:
        kinds.append("tool_timeout")
    if (m.get("parse_errors") or 0) > 0:
        kinds.append("parse_error")
    if traj.get("score_error"):
        kinds.append(f"score:{traj['score_error'].get('type', 'error')}")
    if drift is not None and not drift.get("ok", True):
        kinds.append("drift")
    return kinds


def _round(x: Any) -> Any:
    return round(x, 4) if isinstance(x, float) else x


def build_data(trajectories: list[dict], summary: dict, tokenizer: Any = None, *, drift: bool = True,
               chat_template_kwargs: Optional[dict] = None, stop_token_ids: Optional[list[int]] = None,
               tokenizer_note: str = "", source: str = "") -> dict:
    """The report's JSON blob: run-level tables plus, per episode, everything the episode view shows."""
    from verl_agentic.rollout.metrics import summarize
    from verl_agentic.rollout.trajectory import check_drift

    vocab, special = {}, []
    if tokenizer is not None:
        used: set[int] = set()
        for t in trajectories:
            used.update(t.get("prompt_ids") or [])
            used.update(t.get("response_ids") or [])
        vocab, special = _token_strings(tokenizer, used)

    episodes = []
    for i, t in enumerate(trajectories):
        d = None
        if drift and tokenizer is not None:
            try:
                d = check_drift(t, tokenizer, chat_template_kwargs, stop_token_ids).as_dict()
            except Exception as e:  # noqa: BLE001 - a broken trajectory is shown, not fatal
                d = {"ok": False, "structure": [f"check_drift raised {type(e).__name__}: {e}"], "injected": [],
                     "rerender": []}
        turns = t.get("turns") or []
        messages = t.get("messages") or []
        n_prompt = len(messages) - sum(x.get("num_messages", 1) for x in turns)
        mask = t.get("response_mask") or []
        episodes.append({
            "i": i, "uid": t.get("uid"), "task_type": t.get("task_type"), "index": t.get("index"),
            "sample_id": t.get("sample_id"), "data_source": t.get("data_source"),
            "ground_truth": t.get("ground_truth"),
            "reward": t.get("reward"), "score": t.get("score"), "score_extra": t.get("score_extra"),
            "score_error": t.get("score_error"), "num_turns": t.get("num_turns"),
            "finish_reason": t.get("finish_reason"), "error": t.get("error"),
            "errors": _error_types(t, d), "metrics": {k: _round(v) for k, v in (t.get("metrics") or {}).items()},
            "n_tokens": len(t.get("response_ids") or []), "n_trained": sum(mask),
            "prompt_ids": t.get("prompt_ids") or [], "response_ids": t.get("response_ids") or [],
            "response_mask": mask, "response_logprobs": [_round(x) for x in (t.get("response_logprobs") or [])],
            "messages": messages, "n_prompt_messages": n_prompt, "turns": turns, "tools": t.get("tools"),
            "drift": d,
        })
    tasks = summary.get("tasks") or (summarize(trajectories) if trajectories else {})
    return {
        "meta": {"source": source, "model_path": model_path_of(summary), "tokenizer": tokenizer_note,
                 "episodes": len(trajectories), "created": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "drift_checked": bool(drift and tokenizer is not None)},
        "tasks": tasks, "backend": summary.get("backend"), "reward": summary.get("reward"),
        "drift": summary.get("drift"), "vocab": vocab, "special": special, "episodes": episodes,
    }


def render_html(data: dict) -> str:
    css = (STATIC_DIR / "report.css").read_text(encoding="utf-8")
    js = (STATIC_DIR / "report.js").read_text(encoding="utf-8")
    assert "</script" not in js.lower() and "</style" not in css.lower()
    title = html.escape(f"rollout report: {data['meta'].get('source', '')}")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{title}</title>\n<style>\n{css}\n</style>\n</head>\n<body>\n"
        "<div id=\"app\"><noscript>This report needs JavaScript (it runs offline).</noscript></div>\n"
        f"<script type=\"application/json\" id=\"{DATA_ELEMENT_ID}\">{embed_json(data)}</script>\n"
        f"<script>\n{js}\n</script>\n</body>\n</html>\n"
    )


def write_report(output_dir: str | Path, out_dir: str | Path | None = None, *, tokenizer_path: Optional[str] = None,
                 drift: bool = True) -> Path:
    """Write ``<out_dir>/index.html`` (default ``<output_dir>/report``) and return its path."""
    trajectories, summary = load_run(output_dir)
    tokenizer, tok_dir, note = load_tokenizer(summary, tokenizer_path)
    ctk = ((summary.get("config") or {}).get("rollout") or {}).get("chat_template_kwargs") or {}
    data = build_data(trajectories, summary, tokenizer, drift=drift, chat_template_kwargs=ctk,
                      stop_token_ids=summary.get("stop_token_ids") or stop_token_ids_of(tok_dir), tokenizer_note=note,
                      source=str(Path(output_dir).resolve()))
    out = Path(out_dir) if out_dir else Path(output_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    index = out / "index.html"
    index.write_text(render_html(data), encoding="utf-8")
    return index


def serve(report_dir: str | Path, port: int = 8000) -> None:
    """Serve ``report_dir`` on 127.0.0.1 until interrupted."""
    import functools
    import http.server

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(report_dir))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as httpd:
        print(f"serving http://127.0.0.1:{httpd.server_address[1]}/index.html (Ctrl-C to stop)", flush=True)
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            pass
