"""Build the static HTML report of an output directory (see ``verl_agentic.inspect``).

The report is one self-contained ``index.html`` plus PNG copies of its plots in ``plots/``. The
CSS and JS from ``static/`` are inlined. The data is JSON in ``<script type="application/json">``
elements: one blob (``#va-data``) with the run-level tables, the plots and one light row per
episode, and one element per episode (``#va-ep-a-<i>``, ``#va-ep-b-<i>`` for a compared run) with
its tokens, conversation and drift check, parsed only when that episode is opened. That keeps a
10,000-episode report quick to open. All JSON is escaped so that no model text can end the
script element (``<``, ``>``, ``&``, U+2028, U+2029 become ``\\u003c`` etc.), and the page builds
its DOM with ``textContent`` only, so model text always renders as text. Token strings and the
token-exactness check (``check_drift``) are computed here in Python; the page needs no tokenizer
and no network.
"""

from __future__ import annotations

import html
import json
import math
import time
from pathlib import Path
from typing import Any, Optional

from verl_agentic.backends.base import eos_ids
from verl_agentic.inspect.compare import compare_runs
from verl_agentic.inspect.plots import run_plots, write_pngs
from verl_agentic.inspect.runs import Run, load_run
from verl_agentic.inspect.stats import accuracy_of, logprob_gaps
from verl_agentic.models.embedded import resolve_model_path
from verl_agentic.rollout.metrics import summarize
from verl_agentic.rollout.trajectory import check_drift

STATIC_DIR = Path(__file__).parent / "static"
DATA_ELEMENT_ID = "va-data"
LOGPROB_DECIMALS = 3  # logprobs in the page (hover text); the stats use the exact values


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


def load_tokenizer(run: Run, override: Optional[str] = None) -> tuple[Any, Optional[Path], str]:
    """(tokenizer or None, its folder, a note for the page) from ``--tokenizer``, the run's ``model.path``,
    or a training dir's saved policy (``hf_model/``)."""
    source = override or run.model_path
    if source is None and (run.path / "hf_model" / "config.json").exists():
        source = str(run.path / "hf_model")
    if source is None and not run.config:
        return None, None, "no config in the run dir: token ids shown (pass --tokenizer)"
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
    if model_dir is None:
        return []
    values = []
    for name in ("generation_config.json", "config.json"):
        p = Path(model_dir) / name
        if not p.exists():
            continue
        try:
            values.append(json.loads(p.read_text()).get("eos_token_id"))
        except (OSError, ValueError):
            continue
    return eos_ids(*values)


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


def _logprobs(values: Optional[list]) -> Optional[list]:
    return None if values is None else [None if x is None else round(x, LOGPROB_DECIMALS) for x in values]


def episode_data(i: int, t: dict, drift: Optional[dict]) -> tuple[dict, dict]:
    """(the light row the episode list needs, the details the episode view parses when opened)."""
    mask = t["response_mask"]
    gaps = logprob_gaps(t)
    row = {
        "i": i, "uid": t.get("uid"), "task_type": t.get("task_type"), "index": t.get("index"),
        "sample_id": t.get("sample_id"), "step": t.get("step"), "reward": t["reward"], "score": t.get("score"),
        "acc": accuracy_of(t), "num_turns": t["num_turns"], "finish_reason": t.get("finish_reason"),
        "errors": _error_types(t, drift), "n_tokens": len(t["response_ids"]), "n_trained": sum(mask),
        "exact": None if drift is None else bool(drift.get("ok")),
        "gap": _round(sum(gaps) / len(gaps)) if gaps else None,
    }
    turns, messages = t["turns"], t["messages"]
    details = {
        "data_source": t.get("data_source"), "ground_truth": t.get("ground_truth"), "score_extra": t.get("score_extra"),
        "score_error": t.get("score_error"), "error": t.get("error"),
        "metrics": {k: _round(v) for k, v in (t.get("metrics") or {}).items()},
        "messages": messages, "n_prompt_messages": len(messages) - sum(x.get("num_messages", 1) for x in turns),
        "turns": [{k: v for k, v in x.items() if k != "text"} for x in turns],  # the tokens show the text
        "tools": t.get("tools"), "prompt_ids": t["prompt_ids"], "response_ids": t["response_ids"],
        "mask": "".join("1" if m else "0" for m in mask), "logprobs": _logprobs(t.get("response_logprobs")),
        "trainer_logprobs": _logprobs(t.get("trainer_logprobs")), "drift": drift,
    }
    return row, details


def build_run_data(run: Run, tokenizer: Any = None, *, drift: bool = True, stop_token_ids: Optional[list[int]] = None,
                   tokenizer_note: str = "") -> tuple[dict, list[dict]]:
    """One run's part of the page data, and the per-episode details (in episode order)."""
    trajectories = run.trajectories
    vocab, special = {}, []
    if tokenizer is not None:
        used: set[int] = set()
        for t in trajectories:
            used.update(t["prompt_ids"])
            used.update(t["response_ids"])
        vocab, special = _token_strings(tokenizer, used)
    ctk = (run.config.get("rollout") or {}).get("chat_template_kwargs") or {}
    rows, details = [], []
    for i, t in enumerate(trajectories):
        d = None
        if drift and tokenizer is not None:
            try:
                d = check_drift(t, tokenizer, ctk, stop_token_ids).as_dict()
            except Exception as e:  # noqa: BLE001 - a broken trajectory is shown, not fatal
                d = {"ok": False, "structure": [f"check_drift raised {type(e).__name__}: {e}"], "injected": [],
                     "rerender": []}
        row, det = episode_data(i, t, d)
        rows.append(row)
        details.append(det)
    if run.kind == "rollout" and run.summary.get("tasks"):
        tasks, tasks_note = run.summary["tasks"], "from summary.json"
    else:
        tasks = summarize(trajectories) if trajectories else {}
        tasks_note = f"over the episodes of all {len(run.step_numbers)} steps" if run.kind == "training" else ""
    data = {
        "meta": {"source": str(run.path.resolve()), "kind": run.kind, "model_path": run.model_path,
                 "tokenizer": tokenizer_note, "episodes": len(trajectories), "steps": run.step_numbers,
                 "created": time.strftime("%Y-%m-%d %H:%M:%S"), "drift_checked": bool(drift and tokenizer is not None),
                 "tasks_note": tasks_note},
        "tasks": tasks, "backend": run.summary.get("backend"), "reward": run.summary.get("reward"),
        "drift": run.summary.get("drift"), "vocab": vocab, "special": special, "episodes": rows,
        "plots": run_plots(run),
    }
    return data, details


def prepare_run(run: Run, tokenizer_path: Optional[str] = None, drift: bool = True) -> tuple[dict, list[dict]]:
    """``build_run_data`` with the run's own tokenizer, stop ids and chat-template arguments."""
    tokenizer, tok_dir, note = load_tokenizer(run, tokenizer_path)
    return build_run_data(run, tokenizer, drift=drift,
                          stop_token_ids=run.summary.get("stop_token_ids") or stop_token_ids_of(tok_dir),
                          tokenizer_note=note)


def render_html(data: dict, details: dict[str, list[dict]]) -> str:
    """The page: ``data`` as the #va-data blob, ``details[prefix][i]`` as element ``va-ep-<prefix>-<i>``."""
    css = (STATIC_DIR / "report.css").read_text(encoding="utf-8")
    js = (STATIC_DIR / "report.js").read_text(encoding="utf-8")
    assert "</script" not in js.lower() and "</style" not in css.lower()
    title = f"rollout report: {data['meta'].get('source', '')}"
    if data.get("compare"):
        title += f" vs {data['compare']['run']['meta'].get('source', '')}"
    parts = ["<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
             f"<title>{html.escape(title)}</title>\n<style>\n{css}\n</style>\n</head>\n<body>\n",
             "<div id=\"app\"><noscript>This report needs JavaScript (it runs offline).</noscript></div>\n",
             f"<script type=\"application/json\" id=\"{DATA_ELEMENT_ID}\">{embed_json(data)}</script>\n"]
    for prefix, items in details.items():
        parts += [f"<script type=\"application/json\" id=\"va-ep-{prefix}-{i}\">{embed_json(d)}</script>\n"
                  for i, d in enumerate(items)]
    parts.append(f"<script>\n{js}\n</script>\n</body>\n</html>\n")
    return "".join(parts)


def write_report(output_dir: str | Path, out_dir: str | Path | None = None, *, tokenizer_path: Optional[str] = None,
                 drift: bool = True, compare: str | Path | None = None) -> Path:
    """Write ``<out_dir>/index.html`` and ``<out_dir>/plots/*.png``; return the index path.

    ``out_dir`` defaults to ``<output_dir>/report``, or ``<output_dir>/compare-<name of the other run>``
    with ``compare``."""

    run = load_run(output_dir)
    other = load_run(compare) if compare is not None else None  # both read before the slow part
    data, det_a = prepare_run(run, tokenizer_path, drift)
    details = {"a": det_a}
    default = "report" if other is None else f"compare-{other.path.resolve().name}"
    out = Path(out_dir) if out_dir else run.path / default
    out.mkdir(parents=True, exist_ok=True)
    write_pngs(data["plots"], out)
    if other is not None:
        data_b, details["b"] = prepare_run(other, tokenizer_path, drift)
        name_a, name_b = _run_names(run.path, other.path)
        cmp = compare_runs(run, other, name_a, name_b)
        cmp["run"] = data_b
        data["compare"] = cmp
        write_pngs(data_b["plots"], out, "plots/b")
        write_pngs(cmp["plots"], out, "plots/compare")
    index = out / "index.html"
    index.write_text(render_html(data, details), encoding="utf-8")
    return index


def _run_names(a: Path, b: Path) -> tuple[str, str]:
    """Short labels for two runs: their folder names, or their paths when those are the same."""
    na, nb = a.resolve().name, b.resolve().name
    return (f"A: {na}", f"B: {nb}") if na != nb else (f"A: {a.resolve()}", f"B: {b.resolve()}")


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
