"""GSM8K rows: the prompt generator and the dataset preprocessor (raw ``question`` / ``answer``)."""

from __future__ import annotations

from verl_agentic.tasks.data import PREPROCESS_DATASET, PROMPT_GENERATOR, DatasetError
from verl_agentic.tasks.gsm8k.answer import ground_truth_from_solution
from verl_agentic.tasks.gsm8k.texts import INSTRUCTION


@PROMPT_GENERATOR.register("gsm8k")
def gsm8k_prompt(raw: dict) -> list[dict]:
    question = raw.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DatasetError("field 'question' is missing or empty")
    return [{"role": "user", "content": f"{question.strip()}\n{INSTRUCTION}"}]


@PREPROCESS_DATASET.register("gsm8k")
def gsm8k_preprocess(raw: dict, index: int) -> dict:
    """A raw GSM8K row (``question``, ``answer``) -> a rollout row."""
    if not isinstance(raw.get("answer"), str):
        raise DatasetError("field 'answer' is missing")
    if not isinstance(raw.get("question"), str) or not raw["question"].strip():
        raise DatasetError("field 'question' is missing or empty")
    return {  # the prompt comes from gsm8k_prompt (tasks.data.preprocess_row)
        "data_source": "openai/gsm8k",
        "task_type": "gsm8k",
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth_from_solution(raw["answer"])},
        "extra_info": {"index": index, "question": raw["question"], "answer": raw["answer"]},
    }
