"""``python -m verl_agentic.replay RUN_DIR``: re-execute a recorded run's episodes with no model.

Prints one line per episode that differs from its recording (the first turn where anything does, and
what), then a summary; exit 0 when no episode differs, 1 when one does, 2 on bad input. Options:

    --episode ID        only this episode: INDEX, INDEX/SAMPLE or its uid (found without reading the rest)
    --live DOORS        run these doors for real and compare their answers: tool, tool_reward,
                        interaction, http (comma-separated; default: all answered from the recording)
    --task-config JSON  task sections to use instead of the recorded ones, e.g. a service's new url:
                        '{"swedev": {"url": "http://127.0.0.1:8100", ...}}' (the whole section)
    --score             re-score the replayed episodes as the run did (its reward section); a changed score
                        is a difference (at the episode's last turn)
    --scorer NAME       re-score the replayed episodes with this scorer (its kwargs: --scorer-kwargs JSON)
    --tokenizer PATH    the tokenizer to replay with, when the recorded one is not on this machine
    --import MODULE     import a module first (one that registers tasks or scorers; the run's own ``imports``
                        are imported by themselves); repeatable
    --json PATH         write each episode's result (one JSON object a line) to PATH
    --quiet             only the summary line
"""

from __future__ import annotations

import argparse
import json
import sys

from verl_agentic.interfaces import ConfigError
from verl_agentic.jsonl import write_json_lines
from verl_agentic.record import LIVE_DOORS
from verl_agentic.registry import import_modules
from verl_agentic.replay import replay_run, rescore


def _json_arg(text: str, what: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{what} must be a JSON object: {e}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verl_agentic.replay", description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("--episode")
    p.add_argument("--live", default="")
    p.add_argument("--task-config")
    p.add_argument("--score", action="store_true")
    p.add_argument("--scorer")
    p.add_argument("--scorer-kwargs")
    p.add_argument("--tokenizer")
    p.add_argument("--import", dest="imports", action="append", default=[])
    p.add_argument("--json", dest="json_path")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    try:
        live = [d.strip() for d in args.live.split(",") if d.strip()]
        bad = [d for d in live if d not in LIVE_DOORS]
        if bad:
            raise ConfigError(f"--live: unknown doors {bad}; doors that can run live: {', '.join(LIVE_DOORS)}")
        import_modules(args.imports, "--import")
        task_configs = _json_arg(args.task_config, "--task-config") if args.task_config else None
        report = replay_run(args.run_dir, episode=args.episode, live=live, task_configs=task_configs,
                            tokenizer=args.tokenizer)
        scores = None
        if args.score and args.scorer:
            raise ConfigError("--score re-scores as the run did, --scorer with another scorer: give one")
        if args.scorer or args.score:
            kwargs = _json_arg(args.scorer_kwargs, "--scorer-kwargs") if args.scorer_kwargs else None
            scores = rescore(report, args.run_dir, args.scorer, scorer_kwargs=kwargs, scorer_modules=args.imports)
    except ConfigError as e:  # RecordingError included
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.quiet:
        for e in report.differing:  # (after --score: a changed score too)
            d = e.difference
            print(f"episode {e.key} ({e.record['uid']}): turn {d['turn']}: {d['what']} differ: {d['detail']}")
        if scores is not None and args.scorer:  # (--score: a changed score is a difference, listed above)
            for e in report.episodes:
                if e.score != e.recorded_score:
                    print(f"episode {e.key} ({e.record['uid']}): score {e.recorded_score} -> {e.score} "
                          f"({scores['scorer']})")
    if args.json_path:
        write_json_lines(args.json_path, (e.as_dict() for e in report.episodes))
    n, k = len(report.episodes), len(report.differing)
    t = report.timings
    print(f"replayed {n} episode{'s' * (n != 1)} of {args.run_dir}: {n - k} same as recorded, {k} differ "
          f"({t['total_s']:.2f} s: reading {t['read_s']:.2f}, tokenizer {t['tokenizer_s']:.2f} ({t['tokenizer']}), "
          f"replay {t['replay_s']:.2f})")
    if scores is not None:
        mean = (lambda v: "-" if v is None else f"{v:.4f}")
        print(f"re-scored with {scores['scorer']}: {scores['scored']}/{scores['episodes']} scored, mean "
              f"{mean(scores['recorded_mean'])} recorded -> {mean(scores['rescored_mean'])}, "
              f"{scores['changed']} changed, {scores['errors']} scorer errors")
    return 1 if k else 0


if __name__ == "__main__":
    sys.exit(main())
