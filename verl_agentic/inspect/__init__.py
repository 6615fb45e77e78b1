"""``python -m verl_agentic.inspect OUTPUT_DIR``: a static HTML report of a rollout or training output dir.

Usage::

    python -m verl_agentic.inspect outputs/my-run                 # -> outputs/my-run/report/index.html
    python -m verl_agentic.inspect outputs/my-run --out /tmp/rep  # elsewhere
    python -m verl_agentic.inspect outputs/my-run --serve --port 8000   # and serve it on 127.0.0.1
    python -m verl_agentic.inspect outputs/my-run --tokenizer /path/to/hf_model  # override the tokenizer
    python -m verl_agentic.inspect outputs/run-a --compare outputs/run-b     # -> outputs/run-a/compare-run-b/

``OUTPUT_DIR`` is what ``python -m verl_agentic.main_rollout`` wrote (``trajectories.jsonl``,
``summary.json``) or what ``python -m verl_agentic.main_ppo`` wrote (``metrics.jsonl``,
``rollouts/step_*.jsonl``), see :mod:`verl_agentic.inspect.runs`. The report is one
self-contained ``index.html`` (no server, no network needed) plus its plots as PNG files in
``plots/``:

- a run view: per-task summary table, plots (reward and accuracy per step, turns, tool outcomes,
  feedback flips, response length, rollout-vs-trainer logprob gap), and the episode list with
  filters (task, step, error type), sorting and paging;
- an episode view: the conversation, the tokens shaded by loss mask with their logprobs (and the
  trainer's) on hover, turn boundaries and rewards, errors, and the token-exactness check;
- with ``--compare``: both runs' views, the per-task metric deltas, and the same prompts side by side.

Token strings come from the tokenizer of the run's ``model.path`` (or ``--tokenizer``); without
one the page shows token ids.
"""

from verl_agentic.inspect.report import embed_json, render_html, serve, write_report
from verl_agentic.inspect.runs import Run, load_run

__all__ = ["Run", "embed_json", "load_run", "render_html", "serve", "write_report"]
