"""``dr``: search-augmented answering. The model searches a corpus, reads the results, answers.

The episode is ``tool_agent`` with one tool, ``search`` (``verl_agentic.tools.search``: BM25 over a
local SQLite FTS5 index or a search service): each assistant turn is parsed for tool calls
(``parser``); calls run and their results go back as ``tool`` messages; a turn without calls is
the answer and ends the episode. The reward is the score of that answer by the row's scorer
(picked as the reward managers pick it: ``scorer`` if set, else the one registered for the row's
``data_source``, else one registered as ``dr``), so the in-episode reward and a reward manager's
score agree. A row no scorer is registered for ends with an ``end_error`` listing the registered ones.

Config (``task.dr.*``):

- ``index``: the index file (``python -m verl_agentic.tools.search build CORPUS.jsonl INDEX.db``),
  or ``url``: a search service (``python -m verl_agentic.tools.search serve INDEX.db``); one of them.
- ``top_k`` (3), ``max_chars`` (600): results per search, characters per result.
- ``parser`` (hermes), ``call_timeout_s`` (30), ``max_calls_per_turn`` (4): as in ``tool_agent``.
- ``scorer`` (null), ``scorer_kwargs`` ({}): force a scorer, and its keyword arguments (for the
  in-episode reward; the reward manager after the rollout has its own ``reward.*`` settings).

Rows: ``question`` and ``answer`` (a GSM8K-style ``#### N`` answer makes the row an
``openai/gsm8k`` row scored by the gsm8k scorer; otherwise the row's ``data_source`` names the
scorer). The example (``examples/dr``) answers GSM8K test questions with the GSM8K train worked
solutions as the corpus.

Metrics: the tool_agent ones (``tool_calls``, ``tool_ok``, ``tool_error``, ``parse_errors``, ...),
``searches`` (successful searches), ``answered`` and the scorer's numeric extras (``acc``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

from verl_agentic.interfaces import ConfigError, EpisodeResult, EpisodeState, RolloutContext, check_keys
from verl_agentic.reward.base import RewardItem
from verl_agentic.reward.scorers import run_scorer
from verl_agentic.rollout.task_spec import TaskSpec, register_task
from verl_agentic.tasks.data import PREPROCESS_DATASET, PROMPT_GENERATOR, DatasetError
from verl_agentic.tasks.gsm8k import ground_truth_from_solution
from verl_agentic.tasks.tool_agent import ToolAgentConfig, tool_agent_end, tool_agent_obs, tool_agent_start
from verl_agentic.tools.search import BUILD_COMMAND

INSTRUCTION = (
    "You can call the search tool to look up similar solved problems and learn from their solutions. "
    'Then solve this problem step by step and output the final answer after "####".'
)
BUILD_HINT = BUILD_COMMAND.format(index="INDEX.db")


@dataclass
class DrConfig:
    index: Optional[str] = None
    url: Optional[str] = None
    top_k: int = 3
    max_chars: int = 600
    parser: str = "hermes"
    call_timeout_s: Optional[float] = 30.0
    max_calls_per_turn: int = 4
    max_consecutive_invalid_tool_calls: Optional[int] = None  # null: the rollout's default
    scorer: Optional[str] = None
    scorer_kwargs: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> "DrConfig":
        check_keys(d, [f.name for f in fields(cls)], "task.dr")
        cfg = cls(**d)
        if bool(cfg.index) == bool(cfg.url):
            raise ConfigError(f"task.dr needs exactly one of 'index' (a search index; build one with: {BUILD_HINT}) "
                              "and 'url' (a search service: python -m verl_agentic.tools.search serve INDEX.db)")
        cfg.scorer_kwargs = dict(cfg.scorer_kwargs or {})
        return cfg

    def agent_config(self) -> ToolAgentConfig:
        tool_config = {"top_k": self.top_k, "max_chars": self.max_chars,
                       **({"index": str(self.index)} if self.index else {"url": self.url})}
        return ToolAgentConfig(tools=[{"class_name": "search", "config": tool_config}], parser=self.parser,
                               call_timeout_s=self.call_timeout_s, max_calls_per_turn=self.max_calls_per_turn,
                               max_consecutive_invalid_tool_calls=self.max_consecutive_invalid_tool_calls)


def check_config(d: dict) -> DrConfig:
    """Validate ``task.dr`` and open the index now (a missing one names the build command)."""
    cfg = DrConfig.from_dict(d)
    cfg.agent_config().checked("task.dr")
    return cfg


@PROMPT_GENERATOR.register("dr")
def dr_prompt(raw: dict) -> list[dict]:
    question = raw.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DatasetError("field 'question' is missing or empty")
    return [{"role": "user", "content": f"{question.strip()}\n{INSTRUCTION}"}]


@PREPROCESS_DATASET.register("dr")
def dr_preprocess(raw: dict, index: int) -> dict:
    """A raw ``question`` / ``answer`` row -> a dr rollout row (see the module docstring)."""
    answer = raw.get("answer")
    if not isinstance(answer, str) or not answer.strip():
        raise DatasetError("field 'answer' is missing or empty")
    if "####" in answer:
        data_source, ground_truth = raw.get("data_source") or "openai/gsm8k", ground_truth_from_solution(answer)
    else:
        data_source, ground_truth = raw.get("data_source"), answer.strip()
    return {
        "data_source": data_source,
        "task_type": "dr",
        "prompt": PROMPT_GENERATOR["dr"](raw),
        "ability": "search",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"index": index, "question": raw["question"], "answer": answer},
    }


async def dr_start(row: dict, ctx: RolloutContext) -> EpisodeState:
    return await tool_agent_start(row, ctx, DrConfig.from_dict(dict(ctx.task_config)).agent_config())


async def dr_end(state: EpisodeState) -> EpisodeResult:

    result = await tool_agent_end(state)  # releases the tool; tool metrics
    if state.task is None:
        return result
    cfg = DrConfig.from_dict(dict(state.ctx.task_config))
    row = state.row
    item = RewardItem(solution_str=state.last_assistant_text,
                      ground_truth=(row.get("reward_model") or {}).get("ground_truth"),
                      data_source=row.get("data_source"), task_type="dr",
                      extra_info=dict(row.get("extra_info") or {}), scorer=cfg.scorer)
    score, extra = run_scorer(item, None, cfg.scorer_kwargs)  # a ScoreError becomes the episode's end_error
    metrics: dict[str, Any] = {**result.metrics, "searches": result.metrics.get("tool_ok", 0.0)}
    metrics.update({k: float(v) for k, v in extra.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return EpisodeResult(float(score), metrics)


DR = register_task("dr", TaskSpec(start=dr_start, obs=tool_agent_obs, end=dr_end, check_config=check_config))
