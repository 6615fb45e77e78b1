"""The one config layer: every section of rollout.yaml and ppo.yaml parsed once into a dataclass, with
unknown keys, wrong types and out-of-range values rejected the same way everywhere."""

import subprocess
import sys
from dataclasses import dataclass, field
from typing import Optional

import pytest

from va_testing import REPO
from verl_agentic.config import (
    ActorConfig,
    AlgorithmConfig,
    CriticConfig,
    DataConfig,
    GenerationConfig,
    KLControlConfig,
    ModelConfig,
    OptimConfig,
    OutputConfig,
    RunConfig,
    TrainerConfig,
    load_config,
    reward_settings,
)
from verl_agentic.interfaces import ConfigError, parse_section
from verl_agentic.reward import RewardConfig
from verl_agentic.rollout import RolloutConfig


def parse(*overrides: str, name: str = "ppo") -> RunConfig:
    return RunConfig.parse(load_config(list(overrides), config_name=name))


def test_the_shipped_configs_parse_into_their_sections():
    r = parse(name="rollout")
    assert (r.task_type, r.seed) == ("gsm8k", 0)
    assert isinstance(r.model, ModelConfig) and isinstance(r.data, DataConfig) and isinstance(r.output, OutputConfig)
    assert isinstance(r.rollout, RolloutConfig) and r.rollout.temperature == 0.7
    assert isinstance(r.generation, GenerationConfig) and r.generation.backend == "hf" and r.generation.hf
    assert isinstance(r.reward, RewardConfig) and r.reward.manager == "naive" and r.reward.progress is True
    assert r.trainer is None and r.actor is None  # main_rollout's config has no training sections
    assert r.task["gsm8k"]["feedback"] == "verify"

    p = parse()
    assert isinstance(p.trainer, TrainerConfig) and p.trainer.experiment_name == "gsm8k"  # ${task_type}
    assert isinstance(p.actor, ActorConfig) and isinstance(p.actor.optim, OptimConfig)
    assert p.actor.optim.betas == (0.9, 0.999) and isinstance(p.actor.optim.lr, float)
    assert isinstance(p.algorithm, AlgorithmConfig) and isinstance(p.algorithm.kl_ctrl, KLControlConfig)
    assert isinstance(p.critic, CriticConfig) and p.rollout.n == 4 and p.data.shuffle is True
    assert p.raw["trainer"]["total_steps"] == p.trainer.total_steps  # what runs record


@pytest.mark.parametrize("key", [
    "foo", "model.foo", "data.foo", "rollout.foo", "output.foo", "trainer.foo", "actor.foo", "actor.optim.foo",
    "algorithm.foo", "algorithm.kl_ctrl.foo", "critic.foo", "reward.foo",
])
def test_an_unknown_key_is_named_with_the_known_ones_in_every_section(key):
    section = key.rsplit(".", 1)[0] if "." in key else "top-level config"
    with pytest.raises(ConfigError, match=rf"^unknown {section} keys \['foo'\]; known: \["):
        parse(f"+{key}=1")


@pytest.mark.parametrize("override,message", [
    ("trainer.total_steps=many", "trainer.total_steps must be an integer, got 'many'"),
    ("trainer.batch_size=0", "trainer.batch_size must be >= 1, got 0"),
    ("trainer.test_freq=-1", "trainer.test_freq must be >= 0, got -1"),
    ("trainer.resume=maybe", "trainer.resume must be true or false, got 'maybe'"),
    ("trainer.stop_after_steps=0", "trainer.stop_after_steps must be >= 1, got 0"),
    ("actor.ppo_epochs=0", "actor.ppo_epochs must be >= 1, got 0"),
    ("actor.dtype=float16", "actor.dtype must be float32 or bfloat16, got 'float16'"),
    ("actor.optim.lr=fast", "actor.optim.lr must be a number, got 'fast'"),
    ("actor.optim.betas=[0.9]", r"actor.optim.betas must be two numbers, got \[0.9\]"),
    ("actor.optim.min_lr_ratio=2", r"actor.optim.min_lr_ratio must be in \[0, 1\], got 2"),
    ("actor.optim.lr_scheduler_type=linear", "unknown actor.optim.lr_scheduler_type 'linear'; choose constant or cosine"),
    ("algorithm.kl_ctrl.horizon=1.5", "algorithm.kl_ctrl.horizon must be an integer, got 1.5"),
    ("algorithm.turn_rewards=1", "algorithm.turn_rewards must be true or false, got 1"),
    ("critic.lr=[1]", r"critic.lr must be a number, got \[1\]"),
    ("model.dtype=int8", "model.dtype must be one of"),
    ("data.val_path=3", "data.val_path must be a string or null, got 3"),
    ("data.max_samples=all", "data.max_samples must be an integer, got 'all'"),
    ("rollout.temperature=hot", "rollout.temperature must be a number, got 'hot'"),
    ("rollout.n=0", "rollout.n must be >= 1, got 0"),
    ("rollout.max_batch_size=0", "rollout.max_batch_size must be >= 1, got 0"),
    ("rollout.backend=trtllm", "unknown rollout.backend 'trtllm'; available: hf, openai"),
    ("output.quiet=loud", "output.quiet must be true or false, got 'loud'"),
    ("seed=abc", "seed must be an integer, got 'abc'"),
    ("task_type=", "task_type must be a task name"),
])
def test_a_bad_value_is_one_error_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        parse(override)


def test_values_are_converted_to_their_fields_types():
    p = parse("actor.optim.lr=1", "rollout.temperature=0", "data.val_path=null", "trainer.stop_after_steps=3")
    assert p.actor.optim.lr == 1.0 and type(p.actor.optim.lr) is float
    assert p.rollout.temperature == 0.0 and type(p.rollout.temperature) is float
    assert p.data.val_path is None and p.trainer.stop_after_steps == 3


def test_the_reward_section_is_parsed_once_for_every_consumer():
    assert parse("reward.manager=none").reward is None and reward_settings(load_config(["reward.manager=none"])) is None
    quiet = parse("output.quiet=true")
    assert quiet.reward.progress is False  # default: progress unless output.quiet
    assert reward_settings(quiet, progress=True)["progress"] is True and quiet.reward.progress is False
    with pytest.raises(ConfigError, match="unknown reward manager 'fancy'"):
        parse("reward.manager=fancy")


def test_a_runconfig_parses_to_itself_and_plain_dicts_parse_too():
    p = parse()
    assert RunConfig.parse(p) is p
    again = RunConfig.parse(p.raw)
    assert again.actor == p.actor and again.trainer == p.trainer and again.rollout == p.rollout


@dataclass(frozen=True)
class _Inner:
    x: int = 1


@dataclass(frozen=True)
class _Outer:
    name: str
    inner: _Inner = field(default_factory=_Inner)
    limit: Optional[float] = None
    tags: list = field(default_factory=list)


def test_parse_section_checks_annotations_nesting_and_required_keys():
    o = parse_section(_Outer, {"name": "a", "inner": {"x": 3}, "limit": 2, "tags": ("t",)}, "demo")
    assert o == _Outer("a", _Inner(3), 2.0, ["t"])
    assert parse_section(_Outer, {"name": "b", "limit": None}, "demo").limit is None
    with pytest.raises(ConfigError, match=r"^demo.name is required$"):
        parse_section(_Outer, {}, "demo")
    with pytest.raises(ConfigError, match=r"^unknown demo.inner keys \['y'\]; known: \['x'\]$"):
        parse_section(_Outer, {"name": "a", "inner": {"y": 1}}, "demo")
    with pytest.raises(ConfigError, match=r"^demo.inner.x must be an integer, got True$"):
        parse_section(_Outer, {"name": "a", "inner": {"x": True}}, "demo")
    with pytest.raises(ConfigError, match=r"^demo.limit must be a number or null, got 'x'$"):
        parse_section(_Outer, {"name": "a", "limit": "x"}, "demo")
    with pytest.raises(ConfigError, match=r"^demo.inner must be a mapping of settings, got int: 5$"):
        parse_section(_Outer, {"name": "a", "inner": 5}, "demo")


@pytest.mark.parametrize("module", ["verl_agentic.main_ppo", "verl_agentic.main_rollout"])
def test_the_clis_report_a_bad_key_in_one_line_before_loading_a_model(module, tmp_path):
    r = subprocess.run([sys.executable, "-m", module, "+rollout.temprature=0.5", f"output.dir={tmp_path}"],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert r.stderr.startswith("error: unknown rollout keys ['temprature']; known: ['n', ") and "temperature" in r.stderr
    assert "model loaded" not in r.stderr


@pytest.mark.parametrize("module", ["verl_agentic.main_ppo", "verl_agentic.main_rollout"])
def test_a_bad_config_and_help_are_answered_without_importing_torch(module, tmp_path):
    """``python -X importtime`` lists every module a process imports: parsing a bad config (or ``--help``)
    loads neither torch nor transformers (config.py used to import backends.packed_linear, and torch)."""
    for args in (["rollout.hf.weight_dtype=bf17", f"output.dir={tmp_path}"], ["--help"]):
        r = subprocess.run([sys.executable, "-X", "importtime", "-m", module, *args], capture_output=True,
                           text=True, cwd=REPO, timeout=300)
        imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
        assert "verl_agentic.config" in imported, r.stderr[-2000:]
        assert not {"torch", "transformers"} & imported, args
        if args[0] != "--help":
            assert r.returncode == 2 and "error: rollout.hf.weight_dtype must be one of float32 (fp32), " \
                "bfloat16 (bf16), int8; got 'bf17'" in r.stderr


def test_every_hf_engine_key_is_classified_for_a_resumed_runs_identity(tmp_path, monkeypatch):
    """A resumed run may change what only moves fp32 rounding (HFConfig.ROUNDING_KEYS), never what
    changes the tokens (PRECISION_KEYS: rollout.hf.weight_dtype used to be dropped with all of
    rollout.hf, so a run resumed in int8 appended int8 episodes to an fp32 run)."""
    from dataclasses import fields as dc_fields

    from verl_agentic.backends import packed_linear
    from verl_agentic.config import HFConfig
    from verl_agentic.main_rollout import run_identity
    from verl_agentic.rollout.journal import JournalError, RolloutJournal

    keys = {f.name for f in dc_fields(HFConfig)}
    assert not set(HFConfig.ROUNDING_KEYS) & set(HFConfig.PRECISION_KEYS)
    assert set(HFConfig.ROUNDING_KEYS) | set(HFConfig.PRECISION_KEYS) == keys, "classify the new rollout.hf key"
    # the CPU check of a low-precision weight_dtype is not what this test is about: a CPU that has both
    monkeypatch.setattr(packed_linear, "cpu_flags", lambda: {"avx512_bf16": True, "avx512_f": True})
    rows = [{"prompt": "p"}]
    ident = lambda *o: run_identity(parse(*o, name="rollout"), rows)  # noqa: E731
    base = ident()
    assert ident("rollout.hf.kv_cache_gb=1", "rollout.hf.packed_linear=false", "rollout.hf.fused_forward=false",
                 "rollout.hf.num_threads=1", "rollout.hf.prefill_chunk_tokens=64") == base
    assert ident("rollout.hf.weight_dtype=fp32") == base  # the default by another name
    assert ident("rollout.hf.weight_dtype=bf16") == ident("rollout.hf.weight_dtype=bfloat16") != base
    RolloutJournal(tmp_path, base)
    with pytest.raises(JournalError, match=r"rollout\.hf"):
        RolloutJournal(tmp_path, ident("rollout.hf.weight_dtype=int8"))


# ----------------------------------------------------------------------------------------------
# one truth: the YAML files hold every key the code reads, with the code's defaults


def _yaml(name: str) -> dict:
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(load_config([], config_name=name), resolve=False)
    raw.pop("hydra", None)
    return raw


def _task_keys() -> dict[str, set]:
    """Every key each built-in task's config reads (its check_config rejects any other)."""
    from dataclasses import fields as dc_fields

    from verl_agentic.tasks.dr import DrConfig
    from verl_agentic.tasks.gen_chat import GenChatConfig
    from verl_agentic.tasks.gsm8k.task import Gsm8kConfig
    from verl_agentic.tasks.swedev.task import SwedevConfig
    from verl_agentic.tasks.tool_agent import ToolAgentConfig

    names = lambda cls: {f.name for f in dc_fields(cls)}  # noqa: E731
    return {"gsm8k": (names(Gsm8kConfig) - {"agent"}) | set(ToolAgentConfig.KEYS), "tool_agent": set(ToolAgentConfig.KEYS),
            "swedev": names(SwedevConfig), "gen_chat": names(GenChatConfig), "dr": names(DrConfig)}


# keys a config section holds only in ppo.yaml: main_rollout does not read them
TRAINER_ONLY = {"data": {"shuffle", "val_path", "val_max_samples"}}
# ppo.yaml's own defaults for keys rollout.yaml also has (the trainer's settings differ on purpose)
PPO_DEFAULTS = {"data.path", "data.max_samples", "rollout.n", "rollout.temperature",
                "rollout.max_new_tokens", "rollout.max_total_tokens", "output.dir", "output.check_drift"}


@pytest.mark.parametrize("name", ["rollout", "ppo"])
def test_the_yaml_files_hold_every_key_the_code_reads(name):
    from dataclasses import fields as dc_fields

    from verl_agentic.backends.hf import OPTION_KEYS
    from verl_agentic.backends.openai_http import OpenAIConfig
    from verl_agentic.config import HFConfig
    from verl_agentic.rollout.task_spec import TASKS

    raw = _yaml(name)
    keys = lambda cls: {f.name for f in dc_fields(cls) if f.init}  # noqa: E731
    sections = {"model": ModelConfig, "data": DataConfig, "output": OutputConfig, "reward": RewardConfig}
    if name == "ppo":
        sections.update(trainer=TrainerConfig, actor=ActorConfig, algorithm=AlgorithmConfig, critic=CriticConfig)
        assert set(raw["actor"]["optim"]) == keys(OptimConfig) and set(raw["algorithm"]["kl_ctrl"]) == keys(KLControlConfig)
    for section, cls in sections.items():
        missing = keys(cls) - set(raw[section]) - (TRAINER_ONLY.get(section, set()) if name == "rollout" else set())
        assert not missing and set(raw[section]) <= keys(cls), (section, missing, set(raw[section]) - keys(cls))
    assert set(raw["rollout"]) == keys(RolloutConfig) | keys(GenerationConfig)
    assert set(raw["rollout"]["hf"]) == keys(HFConfig) == set(OPTION_KEYS)
    assert set(raw["rollout"]["openai"]) == keys(OpenAIConfig)
    task_keys = _task_keys()
    from importlib.metadata import entry_points

    builtin = {ep.name for ep in entry_points(group="verl_agentic.tasks")}  # other tests register tasks of their own
    assert set(task_keys) == builtin == set(raw["task"]) and builtin <= set(TASKS.names())  # a new task: add its section and keys
    for task, section in raw["task"].items():
        assert set(section) == task_keys[task], (task, task_keys[task] ^ set(section))


def test_the_python_api_defaults_are_the_clis():
    """A section built from rollout.yaml equals the dataclass's defaults (the Python API's): one truth."""
    from verl_agentic.backends.openai_http import OpenAIConfig
    from verl_agentic.config import HFConfig

    raw = _yaml("rollout")
    raw["output"].pop("dir")  # a timestamp
    for section, cls in (("model", ModelConfig), ("data", DataConfig), ("output", OutputConfig)):
        assert parse_section(cls, raw[section], section) == cls(), section
    r = dict(raw["rollout"])
    hf, openai = r.pop("hf"), r.pop("openai")
    gen = {k: r.pop(k) for k in ("backend", "max_batch_size")}
    assert parse_section(RolloutConfig, r, "rollout") == RolloutConfig()
    assert parse_section(GenerationConfig, gen, "rollout") == GenerationConfig()
    assert parse_section(HFConfig, hf, "rollout.hf") == HFConfig()
    assert OpenAIConfig.from_dict(openai) == OpenAIConfig()
    assert RewardConfig.from_dict(raw["reward"]) == RewardConfig()
    assert (RolloutConfig().temperature, RolloutConfig().concurrency, DataConfig().max_samples) == (0.7, 16, 8)

    ppo = _yaml("ppo")
    ppo["trainer"].pop("experiment_name")  # ${task_type}
    for section, cls in (("trainer", TrainerConfig), ("actor", ActorConfig), ("algorithm", AlgorithmConfig),
                         ("critic", CriticConfig)):
        assert parse_section(cls, ppo[section], section) == cls(), section
    flat = lambda d, p="": {k2: v2 for k, v in d.items() for k2, v2 in (flat(v, f"{p}{k}.") if isinstance(v, dict) else {f"{p}{k}": v}).items()}  # noqa: E731
    a, b = flat({k: _yaml("rollout")[k] for k in ("data", "rollout", "output")}), flat({k: ppo[k] for k in ("data", "rollout", "output")})
    assert {k for k in a if a[k] != b.get(k)} == PPO_DEFAULTS


@pytest.mark.parametrize("override,message", [
    ("+task.gsm8kk.feedback=retry", r"^unknown task section task.gsm8kk: no task 'gsm8kk' is registered; registered: .*gsm8k"),
    ("reward.scorer_kwargs={gsm8kk: {method: strict}}", r"^reward.scorer_kwargs: no scorer 'gsm8kk' is registered"),
    ("reward.scorer=nope", r"^reward.scorer: no scorer 'nope' is registered"),
    ("rollout.hf.kv_cache_gb=0", r"^rollout.hf.kv_cache_gb must be > 0, got 0"),
    ("rollout.hf.prefill_chunk_tokens=0", r"^rollout.hf.prefill_chunk_tokens must be >= 1, got 0"),
    ("rollout.hf.num_threads=two", r"^rollout.hf.num_threads must be an integer or null, got 'two'"),
    ("+rollout.hf.kv_cache=1", r"^unknown rollout.hf keys \['kv_cache'\]"),
    ("rollout.hf.weight_dtype=bf17", r"^rollout.hf.weight_dtype must be one of float32 \(fp32\), bfloat16 \(bf16\), int8; got 'bf17'"),
    ("reward.timeout_s=soon", r"^reward.timeout_s must be a number or null, got 'soon'"),
    ("trainer.warn_missing_reward_share=2", r"warn_missing_reward_share must be in \[0, 1\], got 2"),
    ("data.on_bad_row=ignore", r"^data.on_bad_row must be one of fail, skip, got 'ignore'"),
])
def test_typos_and_bad_values_are_config_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        parse(override)


def test_scorer_names_are_left_to_a_remote_reward_service_and_documented_forms_compose():
    # the service has its own scorers (and ignores kwargs of scorers no item uses)
    assert parse("reward.manager=swedev", "reward.url=http://127.0.0.1:1", "reward.scorer_kwargs={theirs: {x: 1}}").reward
    # the docs' forms, without hydra's '+': free-form mappings are null in the YAML, so they can be set whole
    p = parse("reward.scorer_kwargs={gsm8k: {method: strict}}", "rollout.chat_template_kwargs={enable_thinking: false}",
              "task.gen_chat.env_config={feedback: verify}", "task.swedev.limits={memory_mb: 512}")
    assert p.reward.scorer_kwargs == {"gsm8k": {"method": "strict"}}
    assert p.rollout.chat_template_kwargs == {"enable_thinking": False} and parse().rollout.chat_template_kwargs == {}


def test_the_hf_engine_device_is_checked_before_the_model_loads():
    """rollout.hf.device: cpu (the default) or cuda[:N] where torch sees CUDA. Another device, a missing
    CUDA, the CPU's weight_dtype copy on CUDA, or a device in main_ppo (it trains on the CPU with the
    rollout's own weights) is one ConfigError naming the key, before any model loads."""
    import torch

    assert parse("rollout.hf.device=cpu", name="rollout").generation.hf["device"] == "cpu"
    with pytest.raises(ConfigError, match=r"^rollout\.hf\.device must be cpu, cuda or cuda:N, got 'mps'$"):
        parse("rollout.hf.device=mps", name="rollout")
    with pytest.raises(ConfigError, match=r"^rollout\.hf\.device: 'gpu0' is not a device"):
        parse("rollout.hf.device=gpu0", name="rollout")
    with pytest.raises(ConfigError, match=r"^rollout\.hf\.device=cuda is main_rollout's: main_ppo trains on the CPU"):
        parse("rollout.hf.device=cuda")
    if torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"weight_dtype=int8 is the CPU's low-precision copy"):
            parse("rollout.hf.device=cuda", "rollout.hf.weight_dtype=int8", name="rollout")
    else:
        with pytest.raises(ConfigError, match=r"^rollout\.hf\.device=cuda: torch \S+ sees no CUDA device here$"):
            parse("rollout.hf.device=cuda", name="rollout")
