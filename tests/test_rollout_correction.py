"""verl's rollout correction (``algorithm.rollout_correction``: TIS/MIS) in ``main_ppo``'s trainer.

The rollout really differs from the trainer: the HF backend generates with a copy of the policy whose
weights carry seeded noise (as a bf16 or fp8 rollout engine differs from an fp32 trainer), so the
rollout's logprobs differ from the trainer's by ~0.4 nats a token. verl's helper
(``rollout_corr_helper.compute_rollout_correction_and_add_to_batch``) is watched, not replaced: the tests
check what the trainer hands it (the trainer's own old logprobs), what it gets back, and what the update
then does with it. Tiny random model, real tokenizer, real scorer (``va_vowel_share``), as in
``test_trainer.py``.
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest
import torch

from verl_agentic.interfaces import ConfigError
from verl_agentic.main_rollout import load_config

RC = "algorithm.rollout_correction."


def _cfg(model_dir: str, out: Path, *extra: str):
    return load_config([
        f"model.path={model_dir}", "data.path=data/gsm8k/train.jsonl", "data.max_samples=16",
        "trainer.total_steps=1", "trainer.batch_size=2", "rollout.n=3", "rollout.max_turns=2",
        "rollout.max_new_tokens=12", "rollout.max_batch_size=8", "actor.ppo_mini_batch_size=6",
        "actor.ppo_micro_batch_size=3", "actor.optim.lr=1e-3", "reward.scorer=va_vowel_share",
        "reward.scorer_modules=[va_scorers]", "task.gsm8k.feedback=always_verify", f"output.dir={out}",
        "output.quiet=true", "trainer.save_hf_model=false", "trainer.monitors.enabled=false", *extra,
    ], config_name="ppo")


def _trainer(model_dir, out, *extra):
    from verl_agentic.trainer import PPOTrainer

    return PPOTrainer(_cfg(model_dir, out, *extra))


def _rollout_from_perturbed_copy(tr, scale: float = 0.02) -> None:
    """The trainer's rollout generates with a copy of its policy whose weights carry seeded noise
    (``scale`` x each tensor's std); the trainer keeps the unperturbed weights."""
    from verl_agentic.backends.hf import HFBackend

    other = copy.deepcopy(tr.model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std().clamp(min=1e-3))
    asyncio.run(tr.backend.close())
    tr.backend = HFBackend(other, tr.tokenizer, max_batch_size=8, seed=tr.seed, **tr.hf_options)


def _watch(tr, monkeypatch) -> tuple[list, list]:
    """(what verl's correction helper was given and returned, the batches the update saw)."""
    from verl.trainer.ppo import rollout_corr_helper

    real = rollout_corr_helper.compute_rollout_correction_and_add_to_batch
    calls, updates = [], []

    def helper(data, config):
        given = {k: data.batch[k].clone() for k in ("old_log_probs", "rollout_log_probs", "response_mask")}
        out, metrics = real(data, config)
        calls.append((given, out.batch["response_mask"].clone(), out.batch.get("rollout_is_weights"), config))
        return out, metrics

    monkeypatch.setattr(rollout_corr_helper, "compute_rollout_correction_and_add_to_batch", helper)
    update = tr.actor.update

    def watched(batch, measure_gap):
        updates.append(copy.deepcopy(batch))
        return update(batch, measure_gap)

    tr.actor.update = watched
    return calls, updates


def _pg_token_mean(adv: torch.Tensor, mask: torch.Tensor, w: torch.Tensor | None = None) -> float:
    """The vanilla loss at ratio 1 (the first update of a step), token-mean: -sum(A [* w]) / tokens."""
    return float(-(adv * (w if w is not None else 1.0) * mask).sum() / mask.sum())


def test_token_tis_weights_are_truncated_and_multiply_the_policy_loss(tiny_smol_dir, tmp_path, monkeypatch, capfd):
    tr = _trainer(tiny_smol_dir, tmp_path / "tis", f"{RC}rollout_is=token", f"{RC}rollout_is_threshold=1.5",
                  "output.quiet=false")
    _rollout_from_perturbed_copy(tr)
    initial = copy.deepcopy(tr.model)
    calls, updates = _watch(tr, monkeypatch)
    try:
        m = tr.train_step()
    finally:
        tr.close()
    err = capfd.readouterr().err
    assert err.count("rollout correction on (rollout_is=token, threshold 1.5") == 1, err[-2000:]
    assert "old logprobs recomputed by the trainer (actor.recompute_old_logprobs=false overridden)" in err

    (given, mask_out, weights, config), = calls
    assert config.rollout_is == "token" and config.rollout_is_threshold == 1.5
    batch = updates[0]
    mask = given["response_mask"]
    # pi_old is the trainer's own recomputation with the weights before the update, not the rollout's logprobs
    own, _ = tr.actor.no_grad_pass(batch, initial)
    torch.testing.assert_close(given["old_log_probs"], own, rtol=0, atol=1e-6)
    torch.testing.assert_close(given["rollout_log_probs"], batch.rollout_log_probs)
    gap = ((own - batch.rollout_log_probs).abs() * mask).sum() / mask.sum()
    assert gap > 0.1 and m["actor/logprob_gap_mean"] == pytest.approx(float(gap), rel=1e-5)

    # token TIS: exp(old - rollout), truncated at 1.5, 0 off the response mask; nothing rejected
    raw = torch.exp(own - batch.rollout_log_probs) * mask
    torch.testing.assert_close(weights, raw.clamp(max=1.5), rtol=1e-5, atol=1e-6)
    assert (raw > 1.5).any() and float(weights.max()) == 1.5, "no weight reached the threshold"
    assert ((weights < 0.9) & (mask > 0)).any(), "no weight below 1: the rollout does not differ"
    assert torch.equal(mask_out, mask) and torch.equal(batch.response_mask, mask)
    torch.testing.assert_close(batch.extra["rollout_is_weights"], weights)
    assert m["rollout_corr/rollout_is_max"] == 1.5  # of the weights applied (token level)
    above = float(((raw > 1.5) * mask).sum() / mask.sum())
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(above)
    assert m["rollout_corr/kl"] > 0  # the rollout is surer of its own samples than the trainer
    logged = json.loads((tmp_path / "tis" / "metrics.jsonl").read_text().splitlines()[-1])
    assert {k: v for k, v in logged.items() if k.startswith("rollout_corr/")} == {
        k: v for k, v in m.items() if k.startswith("rollout_corr/")}

    # the weights multiply the policy-gradient loss per token: the loss is -mean(A w), not -mean(A) ...
    adv = batch.extra["advantages"]
    corrected, plain = _pg_token_mean(adv, mask, weights), _pg_token_mean(adv, mask)
    assert m["actor/pg_loss"] == pytest.approx(corrected, rel=1e-4, abs=1e-7)
    assert abs(corrected - plain) > 0.05 * abs(plain)
    # ... and the update is the uncorrected trainer's update with advantages A * w, not with A
    as_weighted = _trainer(tiny_smol_dir, tmp_path / "aw", "actor.recompute_old_logprobs=true")
    as_plain = _trainer(tiny_smol_dir, tmp_path / "a", "actor.recompute_old_logprobs=true")
    try:
        for other, scale in ((as_weighted, weights), (as_plain, None)):
            b = copy.deepcopy(batch)
            b.extra.pop("rollout_is_weights")
            if scale is not None:
                b.extra["advantages"] = b.extra["advantages"] * scale
            mo = other.actor.update(b, measure_gap=False)
            assert mo["actor/pg_loss"] == pytest.approx(_pg_token_mean(b.extra["advantages"], mask), rel=1e-4, abs=1e-7)
        # (compared as updates, relative to the step taken: Adam's first step is ~lr * sign(gradient), so
        # float noise in a near-zero gradient moves an element by up to 2 lr; measured ~1e-5 here, vs ~0.7)
        for (name, a), w_, p_, p0 in zip(tr.model.named_parameters(), as_weighted.model.parameters(),
                                         as_plain.model.parameters(), initial.parameters()):
            a, w_, p_, p0 = a.detach(), w_.detach(), p_.detach(), p0.detach()
            step = (w_ - p0).norm().clamp(min=1e-12)
            assert float((a - w_).norm() / step) < 1e-3, name
            assert float((a - p_).norm() / step) > 0.1, name
    finally:
        as_weighted.close()
        as_plain.close()


@pytest.mark.parametrize("weight_dtype", ["bfloat16", "int8"])
def test_a_low_precision_rollout_is_corrected_against_the_fp32_trainer(tiny_smol_dir, tmp_path, monkeypatch,
                                                                        weight_dtype):
    """The case the correction exists for: the rollout generates with bf16 / int8 copies of the weights
    (``rollout.hf.weight_dtype``), the trainer keeps fp32. Measured on this model: a gap of ~0.05 (bf16) and
    ~0.13 (int8) nats a token, raw weights ~0.6-1.7; fp32 rollouts agree to ~3e-6."""
    from verl_agentic.backends.packed_linear import FAST_PATH_FLAGS, cpu_flags

    dtype = getattr(torch, weight_dtype)
    if not any(cpu_flags().get(flag) for flag in FAST_PATH_FLAGS[dtype]):
        pytest.skip(f"this CPU lacks the instructions of {weight_dtype}'s fast kernel ({FAST_PATH_FLAGS[dtype]})")
    tr = _trainer(tiny_smol_dir, tmp_path, f"rollout.hf.weight_dtype={weight_dtype}", f"{RC}rollout_is=token",
                  f"{RC}rollout_is_threshold=1.1")
    initial = copy.deepcopy(tr.model)
    calls, updates = _watch(tr, monkeypatch)
    try:
        m = tr.train_step()
    finally:
        tr.close()
    (given, _, weights, _), = calls
    batch, mask = updates[0], given["response_mask"]
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())
    own, _ = tr.actor.no_grad_pass(batch, initial)  # the fp32 trainer's logprobs
    torch.testing.assert_close(given["old_log_probs"], own, rtol=0, atol=1e-6)
    assert m["actor/logprob_gap_mean"] > 0.01, "the low-precision rollout should differ from the fp32 trainer"
    raw = torch.exp(own - batch.rollout_log_probs) * mask
    torch.testing.assert_close(weights, raw.clamp(max=1.1), rtol=1e-5, atol=1e-6)
    assert (raw > 1.1).any() and float(weights.max()) == pytest.approx(1.1)
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] > 0 and m["actor/grad_norm"] > 0


@pytest.mark.parametrize("option,threshold", [("token_k1", "0.5_2.0"), ("seq_mean_k1", "0.8_1.2")])
def test_rejection_drops_exactly_what_verls_helper_says(tiny_smol_dir, tmp_path, monkeypatch, option, threshold):
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_rejection_mask

    tr = _trainer(tiny_smol_dir, tmp_path, f"{RC}rollout_rs={option}", f"{RC}rollout_rs_threshold={threshold}")
    _rollout_from_perturbed_copy(tr)
    initial = copy.deepcopy(tr.model)
    calls, updates = _watch(tr, monkeypatch)
    try:
        m = tr.train_step()
    finally:
        tr.close()
    (given, mask_out, weights, _), = calls
    batch = updates[0]
    mask = given["response_mask"]
    assert weights is None and "rollout_is_weights" not in batch.extra  # rejection only
    own, _ = tr.actor.no_grad_pass(batch, initial)
    expect, _ = compute_rollout_rejection_mask(own - batch.rollout_log_probs, mask, rollout_rs=option,
                                               rollout_rs_threshold=threshold)
    assert torch.equal(mask_out, expect) and torch.equal(batch.response_mask, expect)
    # the rule itself: keep where log(lower) <= -log r <= log(upper), per token or per sequence mean
    lower, upper = (float(x) for x in threshold.split("_"))
    neg_log_r = batch.rollout_log_probs - own
    if option == "token_k1":
        keep = (neg_log_r >= torch.log(torch.tensor(lower))) & (neg_log_r <= torch.log(torch.tensor(upper)))
        assert torch.equal(expect, mask * keep)
        partly = ((expect < mask).any(-1) & (expect > 0).any(-1))
        assert partly.any(), "no sequence kept some tokens and lost others"
    else:
        seq = (neg_log_r * mask).sum(-1) / mask.sum(-1)
        keep = (seq >= torch.log(torch.tensor(lower))) & (seq <= torch.log(torch.tensor(upper)))
        assert torch.equal(expect, mask * keep[:, None])
    dropped = (mask > 0) & (expect == 0)
    assert dropped.any() and (expect > 0).any(), "the threshold should reject some tokens and keep others"
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(float(dropped.sum() / mask.sum()), rel=1e-5)
    # as in verl's trainer the rejection precedes the advantages: a rejected token has none, so no gradient
    adv = batch.extra["advantages"]
    assert torch.all(adv[dropped] == 0) and (adv[expect > 0] != 0).any()
    rows = (adv * expect).abs().amax(-1) > 0  # forwarded rows (actor.skip_zero_advantage)
    assert m["actor/updated_rows"] == pytest.approx(float(rows.float().mean()))


def test_identical_rollout_and_trainer_weights_are_one_and_the_update_unchanged(tiny_smol_dir, tmp_path, monkeypatch):
    """The rollout generates with the trained weights themselves (the default): every IS weight is 1 up to
    float noise (~1e-5: a decode step and the trainer's full forward sum in different orders), nothing is
    rejected, and the step equals the uncorrected one (recomputed old logprobs too)."""
    common = ("rollout.concurrency=1",)
    corrected = _trainer(tiny_smol_dir, tmp_path / "c", *common, f"{RC}rollout_is=sequence", f"{RC}rollout_rs=token_k1",
                         f"{RC}rollout_rs_threshold=0.5_2.0")
    plain = _trainer(tiny_smol_dir, tmp_path / "p", *common, "actor.recompute_old_logprobs=true")
    calls, _ = _watch(corrected, monkeypatch)
    try:
        mc = corrected.train_step()
        mp = plain.train_step()
    finally:
        corrected.close()
        plain.close()
    (given, mask_out, weights, _), (plain_given, plain_mask_out, plain_weights, plain_config) = calls
    mask = given["response_mask"]
    assert float((weights - mask).abs().max()) < 1e-4 and torch.equal(mask_out, mask)
    # without rollout_is/rollout_rs verl's helper only measures: no weights, the mask as it was
    assert plain_config.rollout_is is None and plain_config.rollout_rs is None
    assert plain_weights is None and torch.equal(plain_mask_out, plain_given["response_mask"])
    assert mc["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    assert abs(mc["rollout_corr/rollout_is_max"] - 1) < 1e-4 and abs(mc["rollout_corr/rollout_is_min"] - 1) < 1e-4
    # the uncorrected run logs verl's mismatch metrics too (recomputed old logprobs: as verl's trainer does)
    assert abs(mp["rollout_corr/kl"]) < 1e-5 and "rollout_corr/rollout_is_mean" not in mp
    for key in ("reward/mean", "actor/grad_norm", "actor/entropy"):
        assert mc[key] == pytest.approx(mp[key], rel=1e-4), key
    assert mc["actor/pg_loss"] == pytest.approx(mp["actor/pg_loss"], abs=1e-5)  # ~1e-6: GRPO's advantages average 0
    for (name, a), b in zip(corrected.model.named_parameters(), plain.model.parameters()):
        assert float((a - b).detach().norm() / b.detach().norm().clamp(min=1e-12)) < 1e-4, name


def test_bypass_mode_takes_the_rollout_logprobs_and_verls_bypass_loss(tiny_smol_dir, tmp_path, monkeypatch):
    """bypass_mode: no recomputation (old = the rollout's logprobs); verl's ``bypass_mode`` loss computes
    the weights against the current policy inside the loss (REINFORCE with sequence TIS here)."""
    from verl.trainer.ppo import core_algos

    tr = _trainer(tiny_smol_dir, tmp_path, f"{RC}bypass_mode=true", f"{RC}loss_type=reinforce",
                  f"{RC}rollout_is=sequence")
    _rollout_from_perturbed_copy(tr)
    losses = []
    real = core_algos.get_policy_loss_fn("bypass_mode")
    monkeypatch.setitem(core_algos.POLICY_LOSS_REGISTRY, "bypass_mode",
                        lambda **kw: losses.append(kw) or real(**kw))
    calls, updates = _watch(tr, monkeypatch)
    try:
        m = tr.train_step()
    finally:
        tr.close()
    assert not calls, "bypass mode computes the correction in the loss, not before the advantages"
    batch = updates[0]
    assert torch.equal(batch.extra["old_log_probs"], batch.rollout_log_probs)
    assert losses and all(kw["rollout_is_weights"] is None for kw in losses)
    assert m["actor/updated_rows"] == 1.0  # bypass_mode is not among the losses whose zero-advantage rows are skipped
    assert m["actor/logprob_gap_mean"] > 0.1 and 0 < m["rollout_corr/rollout_is_mean"] <= 2.0
    rows = [json.loads(x) for x in (tmp_path / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert not any("trainer_logprobs" in r for r in rows)  # not recomputed


@pytest.mark.parametrize("override,message", [
    (f"{RC}rollout_is=tokn",
     r"^algorithm.rollout_correction.rollout_is must be null \(off\), token or sequence, got 'tokn'"),
    (f"+{RC}rollout_iss=token",
     r"^unknown algorithm.rollout_correction keys \['rollout_iss'\]; known: \['rollout_is', "),
    (f"{RC}rollout_rs=token_k1", r"^algorithm.rollout_correction: rollout_rs_threshold must be explicitly provided"),
    (f"{RC}rollout_rs=token_k9,{RC}rollout_rs_threshold=2.0",
     r"^algorithm.rollout_correction: Invalid rollout_rs option: token_k9. Must be one of seq_max_k2, .*token_k1"),
    (f"{RC}rollout_rs=seq_max_k2,{RC}rollout_rs_threshold=0.5_2.0",
     r"option 'seq_max_k2' must provide a single upper bound .*\(rollout_rs_threshold: one value for all"),
    (f"{RC}rollout_is=token,{RC}rollout_is_threshold=high",
     r"^algorithm.rollout_correction: Invalid rollout_is_threshold 'high'. \(rollout_is_threshold: a number > 0 "),
    (f"{RC}rollout_is=sequence,{RC}rollout_is_threshold='2_1'", r"lower bound must be <= upper bound"),
    (f"{RC}rollout_is_threshold=[2]",
     r"^algorithm.rollout_correction.rollout_is_threshold must be a number or a string"),
    (f"{RC}loss_type=ppo", r"^algorithm.rollout_correction.loss_type must be ppo_clip or reinforce, got 'ppo'"),
    (f"{RC}bypass_mode=yes", r"^algorithm.rollout_correction.bypass_mode must be true or false, got 'yes'"),
])
def test_a_bad_setting_is_one_error_naming_the_valid_values(override, message):
    from verl_agentic.config import RunConfig

    with pytest.raises(ConfigError, match=message):
        RunConfig.parse(load_config(override.split(","), config_name="ppo"))


@pytest.mark.parametrize("extra,message", [
    (("actor.policy_loss=gspo",), r"bypass_mode=true uses verl's bypass_mode loss \(loss_type=ppo_clip\|reinforce\), "
                                  r"not actor.policy_loss='gspo'"),
    (("actor.recompute_old_logprobs=true",), r"bypass_mode=true takes the rollout's logprobs as the old logprobs"),
])
def test_bypass_mode_refuses_settings_it_would_ignore(tmp_path, extra, message):
    from verl_agentic.trainer.verl_config import actor_config

    with pytest.raises(ConfigError, match=message):
        actor_config(_cfg("unused", tmp_path, f"{RC}bypass_mode=true", *extra))


def test_the_defaults_are_verls():
    """ppo.yaml's section has verl 0.9.1's keys and defaults (its rollout_correction.yaml: all off)."""
    import verl.trainer.config as verl_config
    from omegaconf import OmegaConf

    from verl_agentic.config import RunConfig
    from verl_agentic.trainer.verl_config import algo_config

    verl_yaml = OmegaConf.to_container(OmegaConf.load(
        Path(verl_config.__file__).parent / "algorithm" / "rollout_correction.yaml"))
    ours = load_config([], config_name="ppo")
    assert OmegaConf.to_container(ours.algorithm.rollout_correction) == verl_yaml
    assert not RunConfig.parse(ours).algorithm.rollout_correction.corrects
    assert algo_config(ours).rollout_correction.rollout_is is None


def test_main_ppo_reports_a_bad_setting_in_one_line(tmp_path):
    """The CLI: exit code 2 and the message, no traceback, before any model loads."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "verl_agentic.main_ppo", f"output.dir={tmp_path}",
                        f"{RC}rollout_is=tokn"], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).parent.parent)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "algorithm.rollout_correction.rollout_is must be null (off), token or sequence, got 'tokn'" in r.stderr
