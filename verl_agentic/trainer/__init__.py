"""Single-machine GRPO/PPO trainer on verl's ``core_algos`` (``python -m verl_agentic.main_ppo``)."""

from verl_agentic.trainer.batch import TrainBatch, build_batch
from verl_agentic.trainer.actor import forward_batch
from verl_agentic.trainer.metrics import rollout_metrics
from verl_agentic.trainer.ppo import PPOTrainer

__all__ = ["PPOTrainer", "TrainBatch", "build_batch", "forward_batch", "rollout_metrics"]
