"""GSM8K, multi-turn: the model answers, gets feedback, and may revise. The whole task is this folder:

============== ==========================================================================
``texts``      every text the model is shown: the instruction and the feedback messages
``answer``     extracting a response's final number; a reference solution's ground truth
``data``       the prompt generator and the dataset preprocessor (``question`` / ``answer``)
``task``       the episode: ``Gsm8kConfig`` (``task.gsm8k.*``), start / obs / end, registered as ``gsm8k``
``scorer``     the ``gsm8k`` and ``gsm8k_symbolic`` scorers the reward managers use
``interactions`` the ``gsm8k`` and ``code_verify`` interactions
============== ==========================================================================

Importing the package registers all of it; ``pyproject.toml`` names it in the entry-point groups
``verl_agentic.tasks``, ``verl_agentic.scorers`` and ``verl_agentic.interactions``, so the
registries find it without importing it themselves.
"""

from verl_agentic.tasks.gsm8k.answer import EXTRACTIONS, extract_answer, ground_truth_from_solution, normalize_number
from verl_agentic.tasks.gsm8k.data import gsm8k_preprocess, gsm8k_prompt
from verl_agentic.tasks.gsm8k.interactions import CodeVerifyInteraction, Gsm8kInteraction
from verl_agentic.tasks.gsm8k.scorer import gsm8k_score, gsm8k_symbolic_score
from verl_agentic.tasks.gsm8k.task import (
    DEFAULT_RETRY_MESSAGE,
    DEFAULT_VERIFY_MESSAGE,
    FEEDBACK_POLICIES,
    GSM8K,
    Gsm8kConfig,
    Gsm8kState,
    gsm8k_end,
    gsm8k_obs,
    gsm8k_start,
)
from verl_agentic.tasks.gsm8k.texts import INSTRUCTION

__all__ = [
    "CodeVerifyInteraction", "DEFAULT_RETRY_MESSAGE", "DEFAULT_VERIFY_MESSAGE", "EXTRACTIONS", "FEEDBACK_POLICIES",
    "GSM8K", "Gsm8kConfig", "Gsm8kInteraction", "Gsm8kState", "INSTRUCTION", "extract_answer",
    "ground_truth_from_solution", "gsm8k_end", "gsm8k_obs", "gsm8k_preprocess", "gsm8k_prompt", "gsm8k_score",
    "gsm8k_start", "gsm8k_symbolic_score", "normalize_number",
]
