"""``python -m verl_agentic.inspect OUTPUT_DIR``: a static HTML report of a rollout output dir.

Usage::

    python -m verl_agentic.inspect outputs/my-run                 # -> outputs/my-run/report/index.html
    python -m verl_agentic.inspect outputs/my-run --out /tmp/rep  # elsewhere
    python -m verl_agentic.inspect outputs/my-run --serve --port 8000   # and serve it on 127.0.0.1
    python -m verl_agentic.inspect outputs/my-run --tokenizer /path/to/hf_model  # override the tokenizer

``OUTPUT_DIR`` is what ``python -m verl_agentic.main_rollout`` wrote (``trajectories.jsonl``,
``summary.json``). The report is one self-contained ``index.html`` (no server, no network
needed): a run view (per-task summary table, episode list with filters, sorting and paging)
and an episode view (the conversation, the tokens shaded by loss mask with their logprobs on
hover, turn boundaries and rewards, errors, and the token-exactness check of the episode).
Token strings come from the tokenizer of ``config.model.path`` in ``summary.json`` (or
``--tokenizer``); without one the page shows token ids.
"""

from verl_agentic.inspect.report import build_data, embed_json, load_run, render_html, serve, write_report

__all__ = ["build_data", "embed_json", "load_run", "render_html", "serve", "write_report"]
