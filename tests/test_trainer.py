"""The single-machine trainer (verl_agentic.trainer) on a tiny random model with a real tokenizer.

Rewards come from a real scorer (``va_scorers.va_vowel_share``: the share of vowels in the
answer; random text varies in it), so advantages are non-zero and updates change the weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verl_agentic.interfaces import ConfigError
import va_scorers  # noqa: F401 - registers va_vowel_share
from verl_agentic.main_rollout import load_config


def _cfg(model_dir: str, out: Path, *extra: str):
    return load_config([
        f"model.path={model_dir}", "data.path=data/gsm8k/train.jsonl", "data.max_samples=16",
        "trainer.total_steps=3", "trainer.batch_size=2", "rollout.n=3", "rollout.max_turns=2",
        "rollout.max_new_tokens=12", "rollout.max_batch_size=8", "actor.ppo_mini_batch_size=6",
        "actor.ppo_micro_batch_size=3", "actor.optim.lr=1e-3", "reward.scorer=va_vowel_share", "reward.scorer_modules=[va_scorers]",
        "task.gsm8k.feedback=always_verify", f"output.dir={out}", "output.quiet=true",
        "trainer.save_hf_model=false", *extra,
    ], config_name="ppo")


def _trainer(model_dir, out, *extra):
    from verl_agentic.trainer import PPOTrainer

    return PPOTrainer(_cfg(model_dir, out, *extra))


def _step_batch(trainer):
    """A real step's batch (rollout + rewards + advantages), without the update."""
    from verl_agentic.trainer.batch import build_batch

    trajs = trainer._rollout(trainer.data.next_rows())
    rewards = trainer._rewards(trajs)
    return trajs, build_batch(trajs, rewards, trainer.pad_id, uids=[str(t["index"]) for t in trajs])


def test_masked_tokens_get_zero_gradient(tiny_smol_dir, tmp_path):
    """Injected (feedback) tokens and padding: exactly zero gradient on their logits; generated: not."""
    from verl_agentic.trainer.actor import forward_batch

    tr = _trainer(tiny_smol_dir, tmp_path, "actor.entropy_coeff=0.01", "actor.use_kl_loss=true")
    try:
        trajs, batch = _step_batch(tr)
        assert any(0 in t["response_mask"][: len(t["response_ids"])] for t in trajs), "no injected tokens"
        captured = {}

        def keep_logits(_module, _inp, output):
            output.retain_grad()
            captured["logits"] = output

        handle = tr.model.lm_head.register_forward_hook(keep_logits)
        from verl.trainer.ppo import core_algos

        out = forward_batch(tr.model, batch, tr.actor.temperature, entropy="grad")
        ref, _ = tr.actor.no_grad_pass(batch, tr.ref_model)
        m = batch.response_mask
        adv = torch.randn_like(m)  # every token gets a non-zero advantage: only the mask can zero it
        tr.actor_cfg.global_batch_info.update(dp_size=1, batch_num_tokens=float(m.sum()),
                                              global_batch_size=float(batch.size))
        loss, _ = core_algos.get_policy_loss_fn("vanilla")(
            old_log_prob=out.log_probs.detach(), log_prob=out.log_probs, advantages=adv, response_mask=m,
            loss_agg_mode="token-mean", config=tr.actor_cfg)
        loss = loss - 0.01 * core_algos.agg_loss(out.entropy, m, "token-mean")
        loss = loss + core_algos.agg_loss(core_algos.kl_penalty(out.log_probs, ref, "low_var_kl") + out.log_probs, m,
                                          "token-mean")
        loss.backward()
        handle.remove()
        grad = captured["logits"].grad[:, :-1]  # position t predicts response token t
        per_token = grad.abs().sum(-1)
        assert per_token.shape == m.shape
        assert torch.all(per_token[m == 0] == 0), "a token outside response_mask received gradient"
        assert torch.all(per_token[m == 1] > 0), "a generated token received no gradient"
        # the parameters do get gradient
        assert tr.model.lm_head.weight.grad is not None or tr.model.get_input_embeddings().weight.grad is not None
    finally:
        tr.close()


def test_rollout_logprobs_match_trainer_recompute(tiny_smol_dir, tmp_path):
    tr = _trainer(tiny_smol_dir, tmp_path, "actor.recompute_old_logprobs=true", "trainer.total_steps=1")
    m = tr.train_step()
    tr.close()
    assert m["actor/logprob_gap_mean"] < 1e-4, m["actor/logprob_gap_mean"]
    rows = [json.loads(x) for x in (tmp_path / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(r["step"] == 1 for r in rows)
    # clip_ratio counts assistant turns cut at max_new_tokens, from the dumped turns themselves
    turns = [u for r in rows for u in r["turns"] if u["role"] == "assistant"]
    cut = [u for u in turns if u.get("finish_reason") == "length"]
    assert m["response_length/clip_ratio"] == pytest.approx(len(cut) / len(turns))
    assert cut and all(u["end"] - u["start"] == 12 for u in cut)  # rollout.max_new_tokens=12
    for r in rows:
        assert len(r["trainer_logprobs"]) == len(r["response_ids"])
        for lp, tlp, mk in zip(r["response_logprobs"], r["trainer_logprobs"], r["response_mask"]):
            assert (tlp is None) == (mk == 0)
            if mk:
                assert abs(lp - tlp) < 1e-3


@pytest.mark.parametrize("estimator,extra", [
    ("grpo", ()),
    ("rloo", ("actor.loss_agg_mode=seq-mean-token-sum",)),
    ("reinforce_plus_plus", ("actor.loss_agg_mode=seq-mean-token-mean", "algorithm.use_kl_in_reward=true")),
    ("gae", ("actor.use_kl_loss=true", "actor.dtype=bfloat16")),
    ("turn_loo", ()),
    ("turn_loo", ("algorithm.turn_rewards=true", "algorithm.gamma=0.9")),
])
def test_estimators_train(tiny_smol_dir, tmp_path, estimator, extra):
    tr = _trainer(tiny_smol_dir, tmp_path, f"algorithm.adv_estimator={estimator}", "trainer.total_steps=1", *extra)
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    m = tr.train_step()
    tr.close()
    changed = sum(not torch.equal(before[k], v) for k, v in tr.model.state_dict().items())
    assert changed > 0, "the update did not change the weights"
    for key in ("reward/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac",
                "timing/rollout_s", "timing/update_s", "turns/mean", "response_length/mean"):
        assert key in m and m[key] == m[key], key  # present and not NaN
    assert m["actor/grad_norm"] > 0
    if estimator == "gae":
        assert "critic/vf_loss" in m and "actor/kl_loss" in m
    if "algorithm.use_kl_in_reward=true" in extra:
        assert "actor/reward_kl_penalty" in m


def test_losses_listed_as_zero_at_zero_advantage_are(tiny_smol_dir, tmp_path):
    """The skip of all-zero-advantage rows is exact only for losses whose value and gradient vanish
    there: each listed verl loss is checked, and kl_cov (not listed) is shown not to."""
    from verl.trainer.ppo import core_algos

    from verl_agentic.trainer.actor import ZERO_AT_ZERO_ADVANTAGE
    from verl_agentic.trainer.verl_config import actor_config

    base = _cfg(tiny_smol_dir, tmp_path)
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(4, 10, generator=gen) - 2
    new = old + 0.3 * torch.randn(4, 10, generator=gen)
    for name in (*ZERO_AT_ZERO_ADVANTAGE, "kl_cov"):
        base.actor.policy_loss = name
        cfg = actor_config(base)
        cfg.global_batch_info.update(dp_size=1, batch_num_tokens=40.0, global_batch_size=4.0)
        lp = new.clone().requires_grad_()
        loss, _ = core_algos.get_policy_loss_fn(name)(old_log_prob=old, log_prob=lp, advantages=torch.zeros(4, 10),
                                                      response_mask=torch.ones(4, 10), loss_agg_mode="token-mean",
                                                      config=cfg)
        loss.backward()
        zero = float(loss.detach()) == 0.0 and float(lp.grad.abs().max()) == 0.0
        assert zero == (name != "kl_cov"), name


@pytest.mark.parametrize("micro", [1, 2])
def test_skipping_zero_advantage_rows_gives_the_same_update(tiny_smol_dir, tmp_path, micro):
    """Two updates (Adam keeps momentum) of the same batch: with rows of all-zero advantage left out,
    and one mini-batch made only of such rows, the weights end where the full update puts them.

    A zero-advantage row adds an exact 0.0 to every gradient, so the update is the same sum. With one
    row per micro-batch (``micro=1``) both runs forward the same rows in the same shapes: the weights
    must agree to the bit. With two (``micro=2``) the skipping run packs rows 0 and 2 together where
    the full run forwards [0, 1] and [2]: other shapes, so the GEMMs may sum in another order and the
    gradients agree only to float rounding (~1e-7 relative). Adam then divides each gradient by its own
    running scale, which turns a rounding difference on a near-zero gradient into a difference of
    up to lr per step, so there the losses and gradient norms are compared, not the weights (seen on
    an Intel Xeon in CI at a75e1bc: v_proj weights apart beyond 1e-6 with the same loss)."""
    kw = ("actor.ppo_mini_batch_size=3", f"actor.ppo_micro_batch_size={micro}")
    skip = _trainer(tiny_smol_dir, tmp_path / "skip", *kw)
    full = _trainer(tiny_smol_dir, tmp_path / "full", *kw, "actor.skip_zero_advantage=false")
    try:
        _, batch = _step_batch(skip)
        assert batch.size == 6
        adv = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(1))
        adv[[1, 3, 4, 5]] = 0.0  # mini-batch 1: rows 0, 2 live; mini-batch 2: none
        batch.extra.update(advantages=adv * batch.response_mask, returns=torch.zeros_like(adv),
                           old_log_probs=batch.rollout_log_probs.clone())
        for a, b in zip(skip.model.parameters(), full.model.parameters()):
            assert torch.equal(a, b)
        for _ in range(2):
            m_skip = skip.actor.update(batch, measure_gap=False)
            m_full = full.actor.update(batch, measure_gap=False)
        assert m_skip["actor/updated_rows"] == pytest.approx(2 / 6) and m_full["actor/updated_rows"] == 1.0
        assert m_skip["actor/pg_loss"] == pytest.approx(m_full["actor/pg_loss"], rel=1e-5, abs=1e-7)
        assert m_skip["actor/grad_norm"] == pytest.approx(m_full["actor/grad_norm"], rel=1e-4)
        if micro == 1:
            moved = 0
            for (name, a), b, b0 in zip(skip.model.named_parameters(), full.model.parameters(),
                                        _trainer_weights(tiny_smol_dir)):
                assert torch.equal(a, b), f"{name}: max difference {float((a - b).abs().max())}"
                moved += not torch.equal(b, b0)
            assert moved > 0, "the updates did not change the weights"
    finally:
        skip.close()
        full.close()


def _trainer_weights(model_dir: str) -> list[torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return [p.detach() for p in AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).parameters()]


def test_cosine_lr_decays_to_its_floor_at_the_last_step(tiny_smol_dir, tmp_path):
    """lr_scheduler_type=cosine: warm-up, then verl's cosine down to min_lr_ratio * lr at the last
    optimizer step of trainer.total_steps (3 steps x 6 episodes / mini-batch 3 = 6 optimizer steps)."""
    tr = _trainer(tiny_smol_dir, tmp_path, "actor.optim.lr_scheduler_type=cosine", "actor.optim.min_lr_ratio=0.1",
                  "actor.optim.lr_warmup_steps=2", "actor.ppo_mini_batch_size=3")
    try:
        lrs = []  # the lr each of the 6 optimizer steps uses
        for _ in range(6):
            lrs.append(tr.actor.optimizer.param_groups[0]["lr"])
            tr.actor.optimizer.step()
            tr.actor.scheduler.step()
        assert lrs[0] == pytest.approx(0.5e-3) and lrs[1] == pytest.approx(1e-3)  # warm-up: (s + 1) / 2
        assert all(a > b for a, b in zip(lrs[1:], lrs[2:])) and lrs[-1] == pytest.approx(1e-4)
    finally:
        tr.close()
    with pytest.raises(ConfigError, match="unknown actor.optim.lr_scheduler_type 'linear'; choose constant or cosine"):
        _trainer(tiny_smol_dir, tmp_path, "actor.optim.lr_scheduler_type=linear")


def test_resume_continues_exactly(tiny_smol_dir, tmp_path):
    full = tmp_path / "full"
    tr = _trainer(tiny_smol_dir, full)
    hist = tr.fit()
    assert [h["reward/mean"] for h in hist] and len(hist) == 3

    part = tmp_path / "part"
    tr1 = _trainer(tiny_smol_dir, part, "trainer.stop_after_steps=2")
    first = tr1.fit()
    assert len(first) == 2 and (part / "checkpoints" / "step_000002" / "state.pt").is_file()
    tr2 = _trainer(tiny_smol_dir, part, "trainer.resume=true")
    assert tr2.step == 2
    rest = tr2.fit()
    assert len(rest) == 1
    a, b = hist[2], rest[0]
    assert a["reward/mean"] == pytest.approx(b["reward/mean"], abs=1e-6)
    assert a["response_length/mean"] == b["response_length/mean"]
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert a[key] == pytest.approx(b[key], rel=1e-3, abs=1e-5), key
    lines = [json.loads(x) for x in (part / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    # Tokens are exact; log-probs are not bitwise: with continuous batching a row's floats depend on which
    # rows share its decode steps (~1e-6), and Adam can turn that into a sign flip of a near-zero update
    # (<= lr = 1e-3) in a few elements. A resume that lost the optimizer state or a step moves every
    # element by ~lr (relative difference ~0.1 here); these agree to 1e-3 relative, each within 2 steps.
    sd_full = tr.model.state_dict()
    for k, v in tr2.model.state_dict().items():
        assert float((v - sd_full[k]).norm() / sd_full[k].norm().clamp(min=1e-12)) < 1e-3, k
        assert float((v - sd_full[k]).abs().max()) <= 2e-3, k


def _without_timing(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith(("timing/", "perf/"))} for m in history]


def _logged(out: Path) -> list[dict]:
    return _without_timing([json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()])


@pytest.fixture(scope="module")
def uninterrupted(tiny_smol_dir, tmp_path_factory):
    """3 steps with ``rollout.concurrency=1`` (one request at a time: every run computes the same floats,
    so an interrupted and resumed run must match it bit for bit): (metrics, weights)."""
    out = tmp_path_factory.mktemp("uninterrupted")
    tr = _trainer(tiny_smol_dir, out, "rollout.concurrency=1")
    tr.fit()
    return _logged(out), {k: v.clone() for k, v in tr.model.state_dict().items()}


def _resume_and_compare(tiny_smol_dir, out: Path, uninterrupted, step: int, *extra: str) -> None:
    assert [p.name for p in (out / "checkpoints").iterdir()] == [f"step_{step:06d}"]
    tr = _trainer(tiny_smol_dir, out, "rollout.concurrency=1", "trainer.resume=true", *extra)
    assert tr.step == step
    tr.fit()
    metrics, weights = uninterrupted
    assert _logged(out) == metrics
    assert all(torch.equal(v, weights[k]) for k, v in tr.model.state_dict().items())


@pytest.mark.parametrize("when", ["rollout", "update"])
def test_a_stop_mid_step_checkpoints_and_resumes_exactly(tiny_smol_dir, tmp_path, uninterrupted, when):
    """SIGTERM through main_ppo's handler (``StopSignals`` -> ``request_stop``) in step 2, during its rollout
    or during its update: the run stops at once with the checkpoint of step 1 (in the update: the one
    written as step 2 began) and step 2 is redone on resume."""
    import signal

    from verl_agentic.main_rollout import StopSignals

    tr = _trainer(tiny_smol_dir, tmp_path, "rollout.concurrency=1")
    sent = []

    def stop(*_):  # a real signal, sent at a known point of step 2 (from the engine thread or the main one)
        if tr.step == 1 and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)

    if when == "rollout":  # the embedding: every forward calls it, the engine's fused one included
        tr.model.get_input_embeddings().register_forward_pre_hook(stop)
    else:
        tr.actor.optimizer.register_step_pre_hook(stop)
    with StopSignals(on_stop=tr.request_stop) as signals, pytest.raises(KeyboardInterrupt):
        tr.fit()
    assert sent and signals.received == signal.SIGTERM
    assert [m["step"] for m in _logged(tmp_path)] == [1]
    _resume_and_compare(tiny_smol_dir, tmp_path, uninterrupted, 1)


def test_a_failure_inside_the_update_leaves_the_last_step_and_resumes_exactly(tiny_smol_dir, tmp_path, capfd):
    """An allocation torch's allocator refuses (out of memory) in step 2's update, after its first optimizer
    step has changed the weights (``actor.ppo_epochs=2``: two optimizer steps a step), with the default
    ``trainer.save_freq=0``: the checkpoint of step 1, written as step 2 began, is there, and the resumed
    run ends where an uninterrupted one does, bit for bit."""
    kw = ("rollout.concurrency=1", "actor.ppo_epochs=2")
    ref = _trainer(tiny_smol_dir, tmp_path / "ref", *kw)
    ref.fit()
    reference = _logged(tmp_path / "ref"), {k: v.clone() for k, v in ref.model.state_dict().items()}

    out = tmp_path / "run"
    tr = _trainer(tiny_smol_dir, out, *kw)
    stepped = []
    tr.actor.optimizer.register_step_post_hook(lambda *_: stepped.append(tr.step))

    def allocate_too_much(*_):
        if torch.is_grad_enabled() and stepped.count(1) == 1:  # step 2's update, after its first optimizer step
            torch.empty(2 ** 62, dtype=torch.uint8)

    tr.model.register_forward_pre_hook(allocate_too_much)
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        tr.fit()
    assert stepped == [0, 0, 1]  # step 1's two optimizer steps, then step 2's first
    assert f"in step 2: checkpoint of step 1 written to {out / 'checkpoints' / 'step_000001'}" in capfd.readouterr().err
    _resume_and_compare(tiny_smol_dir, out, reference, 1, *kw[1:])


def test_an_exception_mid_step_checkpoints_and_resumes_exactly(tiny_smol_dir, tmp_path, uninterrupted, capfd):
    """A scorer that breaks in step 2 (every episode masked: the trainer raises) leaves a checkpoint of step 1."""
    va_scorers.CALLS["va_fails_after"] = 0
    tr = _trainer(tiny_smol_dir, tmp_path, "rollout.concurrency=1", "reward.scorer=va_fails_after",
                  "reward.scorer_kwargs={va_fails_after: {after: 6}}")
    with pytest.raises(RuntimeError, match="step 2: no episode has a reward"):
        tr.fit()
    err = capfd.readouterr().err
    assert "warning: step 2: 6 of 6 episodes have no reward (scorer_error: 6)" in err
    assert f"training failed (RuntimeError: step 2: no episode has a reward and a generated token to train on) in " \
           f"step 2: checkpoint of step 1 written to {tmp_path / 'checkpoints' / 'step_000001'}" in err
    _resume_and_compare(tiny_smol_dir, tmp_path, uninterrupted, 1)


def test_config_errors_name_the_choices(tiny_smol_dir, tmp_path):
    with pytest.raises(ConfigError, match="rloo"):
        _trainer(tiny_smol_dir, tmp_path, "algorithm.adv_estimator=nope")
    with pytest.raises(ConfigError, match="vanilla"):
        _trainer(tiny_smol_dir, tmp_path, "actor.policy_loss=nope")
    with pytest.raises(ConfigError, match="loss_agg_mode"):
        _trainer(tiny_smol_dir, tmp_path, "actor.loss_agg_mode=mean")


def test_main_ppo_cli(tiny_smol_dir, tmp_path):
    out = tmp_path / "run"
    args = [sys.executable, "-m", "verl_agentic.main_ppo", f"model.path={tiny_smol_dir}", "data.max_samples=8",
            "trainer.total_steps=2", "trainer.batch_size=2", "rollout.n=2", "rollout.max_new_tokens=8",
            "rollout.max_turns=2", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=4",
            "trainer.logger=[jsonl,tensorboard]", f"output.dir={out}"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "reward: first-5-step mean" in r.stdout
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    assert (out / "hf_model" / "config.json").is_file()
    assert any((out / "tensorboard").rglob("events.out.tfevents.*"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and "first5/reward/mean" in summary
    step_s = sum(x["timing/step_s"] for x in lines)
    assert step_s <= summary["wall_s"] < step_s + 240  # the steps plus loading, not some other clock
    bad = subprocess.run(args[:-1] + ["algorithm.adv_estimator=nope", f"output.dir={tmp_path / 'bad'}"],
                         capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent.parent)
    assert bad.returncode == 2 and "grpo" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.serial  # a Ray cluster of its own
def test_ray_workers_generate_what_the_local_rollout_does(tiny_smol_dir, tmp_path, monkeypatch):
    """trainer.use_ray: rollout + reward in Ray actors give the local step's episodes and rewards."""
    tests_dir = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", tests_dir + (":" + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
    local = _trainer(tiny_smol_dir, tmp_path / "local", "trainer.total_steps=1")
    m_local = local.train_step()
    local.close()
    remote = _trainer(tiny_smol_dir, tmp_path / "ray", "trainer.total_steps=1", "trainer.use_ray=true",
                      "trainer.ray_init.num_cpus=2")
    try:
        m_ray = remote.train_step()
    finally:
        remote.close()
        import ray

        ray.shutdown()
    a = [json.loads(x) for x in (tmp_path / "local" / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "ray" / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert [t["response_ids"] for t in a] == [t["response_ids"] for t in b]
    assert [t["score"] for t in a] == [t["score"] for t in b]
    assert m_ray["reward/mean"] == m_local["reward/mean"]
    assert m_ray["actor/pg_loss"] == pytest.approx(m_local["actor/pg_loss"], rel=1e-4, abs=1e-6)


def test_validation_before_training_and_every_k_steps(tiny_smol_dir, tmp_path):
    """Greedy held-out episodes: a step-0 row for the base model, then after steps 2 and 3 (test_freq=2,
    and the last step); the val/* figures are the rates of the episodes written to validation/."""
    from verl_agentic.trainer.metrics import validation_metrics

    tr = _trainer(tiny_smol_dir, tmp_path, "data.val_path=data/gsm8k/test.jsonl", "data.val_max_samples=4",
                  "trainer.test_freq=2")
    again = tr.validate()  # the same weights twice: greedy, so the same episodes and figures
    first_ids = [json.loads(x)["response_ids"] for x in (tmp_path / "validation" / "step_000000.jsonl").read_text().splitlines()]
    tr.fit()
    rows = {r["step"]: r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())}
    assert sorted(rows) == [0, 1, 2, 3]
    assert [s for s in rows if "val/accuracy/final" in rows[s]] == [0, 2, 3]
    assert set(rows[0]) == {"step", *(k for k in rows[2] if k.startswith(("val/", "heldout/", "monitor/heldout_"))),
                            "timing/val_s"}  # the held-out figures and the monitor that reads them
    assert {k: v for k, v in rows[0].items() if k.startswith("val/")} == {
        k: v for k, v in again.items() if k.startswith("val/")}
    for step in (0, 2, 3):
        episodes = [json.loads(x) for x in (tmp_path / "validation" / f"step_{step:06d}.jsonl").read_text().splitlines()]
        assert len(episodes) == 4 and len({e["index"] for e in episodes}) == 4  # n=1 per held-out row
        assert all(e["step"] == step for e in episodes)
        expect = validation_metrics(episodes, [e["score"] for e in episodes])
        assert {f"val/{k}": v for k, v in expect.items()} == {k: v for k, v in rows[step].items() if k.startswith("val/")}
        assert rows[step]["val/episodes"] == 4
        first = [e["metrics"]["first_correct"] for e in episodes]
        assert rows[step]["val/accuracy/first_turn"] == pytest.approx(sum(first) / 4)
    # greedy: the base model's episodes again, token for token (the training rollouts sample at T=1)
    ids = [json.loads(x)["response_ids"] for x in (tmp_path / "validation" / "step_000000.jsonl").read_text().splitlines()]
    assert ids == first_ids and all(ids)
    assert ids != [json.loads(x)["response_ids"] for x in (tmp_path / "validation" / "step_000003.jsonl").read_text().splitlines()]
    assert not (tmp_path / "rollouts" / "step_000000.jsonl").exists()
    # the inspector plots the held-out figures per step, from metrics.jsonl
    from verl_agentic.inspect.plots import _step_plots
    from verl_agentic.inspect.runs import load_run

    val = next(p for p in _step_plots(load_run(tmp_path)) if p["id"] == "validation")
    series = {x["name"]: x["y"] for x in val["series"]}
    assert series["val/accuracy/final"] == [rows[0]["val/accuracy/final"], None, rows[2]["val/accuracy/final"],
                                           rows[3]["val/accuracy/final"]]
    assert "val/answered" in series and not any(k.endswith("episodes") or "reward" in k for k in series)


def test_a_negative_test_freq_is_a_clear_error(tiny_smol_dir, tmp_path):
    with pytest.raises(ConfigError, match="trainer.test_freq must be >= 0, got -1"):
        _trainer(tiny_smol_dir, tmp_path, "data.val_path=data/gsm8k/test.jsonl", "trainer.test_freq=-1")


def test_validation_metrics_are_rates_per_task():
    from verl_agentic.trainer.metrics import validation_metrics

    def ep(task, first, final, w2r, r2w, answered):
        return {"task_type": task, "metrics": {"first_correct": first, "final_correct": final, "flips_wrong_to_right": w2r,
                                               "flips_right_to_wrong": r2w, "answered": answered}}

    trajs = [ep("gsm8k", 0.0, 1.0, 1, 0, 1.0), ep("gsm8k", 1.0, 0.0, 0, 1, 1.0), ep("gsm8k", 0.0, 0.0, 0, 0, 0.0),
             ep("dr", 1.0, 1.0, 0, 0, 1.0)]
    m = validation_metrics(trajs, [1.0, 0.0, None, 1.0])
    assert m["reward/mean"] == pytest.approx(2 / 3)  # the unscored episode is left out
    assert m["accuracy/first_turn"] == 0.5 and m["accuracy/final"] == 0.5
    assert m["flip_rate/wrong_to_right"] == 0.25 and m["flip_rate/right_to_wrong"] == 0.25
    assert m["answered"] == 0.75 and m["episodes"] == 4
    assert m["gsm8k/accuracy/final"] == pytest.approx(1 / 3) and m["dr/accuracy/final"] == 1.0
    assert m["gsm8k/episodes"] == 3 and m["gsm8k/reward/mean"] == 0.5
