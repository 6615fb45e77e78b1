"""Reward managers (naive | prime | swedev) over registered scorers. See ``base.py``."""

from verl_agentic.reward.base import (
    FAILURE_POLICIES,
    REWARD_ERROR_TYPES,
    REWARD_MANAGERS,
    RewardConfig,
    RewardError,
    RewardItem,
    RewardManager,
    RewardResult,
    item_from_trajectory,
    make_reward_manager,
    register_reward_manager,
    score_trajectories,
)
from verl_agentic.reward.scorers import SCORERS, register_scorer, resolve_scorer, run_scorer

__all__ = [
    "FAILURE_POLICIES", "REWARD_ERROR_TYPES", "REWARD_MANAGERS", "RewardConfig", "RewardError", "RewardItem",
    "RewardManager", "RewardResult", "item_from_trajectory", "make_reward_manager", "register_reward_manager",
    "score_trajectories", "SCORERS", "register_scorer", "resolve_scorer", "run_scorer",
]
