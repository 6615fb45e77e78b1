"""``turn_loo``: the turn-level advantage with a leave-one-out baseline (verl_plugin/turn_advantage.py).

A constructed batch checks the formula token by token; a two-turn problem whose policy gradient is known
in closed form checks that it is unbiased, and that normalising per turn index (with the episode itself
in the mean) is not; verl's own ``compute_advantage`` runs it by name.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl_agentic.verl_plugin.turn_advantage import NAME, compute_turn_loo_advantage, turn_spans


def _row(turns: list[int], gaps: int = 2, width: int = 16, reward: float = 0.0) -> tuple[list[int], list[float]]:
    """A response of assistant turns of the given lengths separated by ``gaps`` injected tokens, padded;
    the reward on the last generated token."""
    mask: list[int] = []
    for k, n in enumerate(turns):
        if k:
            mask += [0] * gaps
        mask += [1] * n
    last = len(mask) - 1
    mask += [0] * (width - len(mask))
    rewards = [0.0] * width
    rewards[last] = reward
    return mask, rewards


def test_spans_are_the_runs_of_generated_tokens():
    assert turn_spans(torch.tensor([1, 1, 0, 0, 1, 0, 1, 1])) == [(0, 2), (4, 5), (6, 8)]
    assert turn_spans(torch.tensor([0, 0])) == []


def test_each_turn_is_judged_against_the_other_episodes_that_reached_it():
    # group a: episode 0 solved it in one turn, 1 and 2 needed two turns (2 failed both), 3 needed three
    rows = [_row([3], reward=1.0), _row([2, 3], reward=1.0), _row([2, 2], reward=0.0), _row([1, 1, 2], reward=1.0),
            _row([2], reward=0.0)]  # group b: alone
    mask = torch.tensor([m for m, _ in rows], dtype=torch.float32)
    rewards = torch.tensor([r for _, r in rows])
    adv, ret = compute_turn_loo_advantage(rewards, mask, index=np.array(["a", "a", "a", "a", "b"]))
    G = [1.0, 1.0, 0.0, 1.0]  # outcome rewards: every turn's return is the episode's score

    def turn_adv(i: int, t: int) -> float:
        span = turn_spans(mask[i])[t]
        vals = adv[i, span[0]:span[1]]
        assert torch.all(vals == vals[0])  # one advantage for the whole turn
        return float(vals[0])

    # turn 1: the other three episodes of the group
    for i in range(4):
        assert turn_adv(i, 0) == pytest.approx(G[i] - np.mean([G[j] for j in range(4) if j != i]))
    # turn 2: only the others that had a second turn (1, 2, 3)
    assert turn_adv(1, 1) == pytest.approx(1.0 - np.mean([0.0, 1.0]))
    assert turn_adv(2, 1) == pytest.approx(0.0 - np.mean([1.0, 1.0]))
    assert turn_adv(3, 1) == pytest.approx(1.0 - np.mean([1.0, 0.0]))
    # turn 3: nobody else got there: the others' whole-episode returns
    assert turn_adv(3, 2) == pytest.approx(1.0 - np.mean([1.0, 1.0, 0.0]))
    # a group of one has no baseline; injected tokens and padding get nothing
    assert turn_adv(4, 0) == 0.0
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)
    assert torch.equal(ret.sum(-1), (mask * torch.tensor(G + [0.0]).unsqueeze(1)).sum(-1))


def test_per_turn_rewards_and_gamma_give_returns_to_go():
    mask, rewards = _row([2, 2, 2])
    r = torch.tensor([rewards])
    spans = turn_spans(torch.tensor(mask))
    r[0, spans[0][1] - 1] = 0.5   # a reward on turn 1's last token
    r[0, spans[2][1] - 1] = 1.0   # and the outcome
    r[0, spans[1][1]] = 0.25      # one on an injected token after turn 2: counts for turn 2

    class Cfg:
        gamma = 0.5

    _, ret = compute_turn_loo_advantage(r, torch.tensor([mask], dtype=torch.float32), config=Cfg())
    g3 = 1.0
    g2 = 0.25 + 0.5 * g3
    g1 = 0.5 + 0.5 * g2
    assert [float(ret[0, a]) for a, _ in spans] == pytest.approx([g1, g2, g3])


def _two_turn_gradient(estimator, p1: float, p2: float, groups: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Monte-Carlo policy gradient on a two-turn problem: turn 1 is right with probability p1 = sigmoid(t1)
    (then the episode ends, reward 1); else a retry is right with p2 = sigmoid(t2) (reward 1, else 0).
    Returns the gradient estimate w.r.t. (t1, t2) and its standard error, from ``estimator``'s advantages."""
    rng = np.random.default_rng(seed)
    a1 = rng.random((groups, n)) < p1
    a2 = rng.random((groups, n)) < p2
    reward = np.where(a1, 1.0, np.where(a2, 1.0, 0.0))
    width = 4
    mask = np.zeros((groups * n, width), dtype=np.float32)
    mask[:, 0] = 1
    retry = ~a1.reshape(-1)
    mask[retry, 2] = 1
    rewards = np.zeros((groups * n, width), dtype=np.float32)
    last = np.where(retry, 2, 0)
    rewards[np.arange(groups * n), last] = reward.reshape(-1)
    index = np.repeat(np.arange(groups), n)
    adv, _ = estimator(torch.tensor(rewards), torch.tensor(mask), index)
    adv = adv.numpy()
    # d/dt log Bernoulli(a; sigmoid(t)) = a - p
    per_episode = np.stack([adv[:, 0] * (a1.reshape(-1) - p1),
                            np.where(retry, adv[:, 2] * (a2.reshape(-1) - p2), 0.0)], axis=1)
    per_group = per_episode.reshape(groups, n, 2).mean(axis=1)
    return per_group.mean(axis=0), per_group.std(axis=0) / np.sqrt(groups)


def _per_turn_index_normalised(rewards: torch.Tensor, mask: torch.Tensor, index) -> tuple[torch.Tensor, None]:
    """The estimator this module replaces: at each turn index, (G - mean) / (std + eps) over the group's
    episodes that reached it, the episode itself included."""
    adv = torch.zeros_like(rewards)
    spans = [turn_spans(mask[i]) for i in range(len(mask))]
    G = rewards.sum(-1)
    groups: dict = {}
    for i, uid in enumerate(index.tolist()):
        groups.setdefault(uid, []).append(i)
    for members in groups.values():
        for t in range(max(len(spans[i]) for i in members)):
            at = [i for i in members if len(spans[i]) > t]
            g = G[at]
            std = g.std(unbiased=False) if len(at) > 1 else torch.tensor(0.0)
            for i in at:
                a, b = spans[i][t]
                adv[i, a:b] = (G[i] - g.mean()) / (std + 1e-6)
    return adv, None


def test_turn_loo_is_unbiased_and_per_turn_normalisation_is_not():
    p1, p2, n = 0.3, 0.6, 4
    exact = np.array([p1 * (1 - p1) * (1 - p2), (1 - p1) * p2 * (1 - p2)])  # dJ/dt1, dJ/dt2 of J = p1 + (1-p1) p2
    est, se = _two_turn_gradient(lambda r, m, i: compute_turn_loo_advantage(r, m, index=i), p1, p2, 20000, n, seed=0)
    assert np.all(np.abs(est - exact) < 4 * se), (est, exact, se)
    # the baseline: per turn index, the episode itself in the mean and the std
    other, other_se = _two_turn_gradient(_per_turn_index_normalised, p1, p2, 4000, n, seed=0)
    ratio, exact_ratio = other[0] / other[1], exact[0] / exact[1]
    ratio_se = abs(ratio) * np.sqrt((other_se[0] / other[0]) ** 2 + (other_se[1] / other[1]) ** 2)
    assert abs(ratio - exact_ratio) > 5 * ratio_se, (ratio, exact_ratio, ratio_se)  # a different direction


def test_verl_runs_it_by_name():
    from verl import DataProto
    from verl.trainer.ppo import core_algos, ray_trainer

    import verl_agentic.verl_plugin  # noqa: F401 - what `import verl` loads through the entry point

    assert core_algos.get_adv_estimator_fn(NAME) is compute_turn_loo_advantage
    rows = [_row([2, 2], reward=1.0), _row([2], reward=0.0), _row([3, 1], reward=0.0)]
    mask = torch.tensor([m for m, _ in rows], dtype=torch.float32)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": torch.tensor([r for _, r in rows]), "response_mask": mask},
        non_tensors={"uid": np.array(["g", "g", "g"], dtype=object)})
    out = ray_trainer.compute_advantage(data, adv_estimator=NAME, config=None)
    want, _ = compute_turn_loo_advantage(data.batch["token_level_rewards"], mask, index=["g", "g", "g"])
    assert torch.equal(out.batch["advantages"], want)
    assert float(want[0, 0]) == pytest.approx(1.0 - 0.0)  # turn 1 of episode 0 vs the mean of 0 and 0


def test_the_trainer_batch_puts_each_turns_reward_on_its_last_token():
    """``algorithm.turn_rewards``: ``build_batch`` keeps the tasks' per-turn rewards (``turns[k].reward``)
    on each earlier assistant turn's last token, the episode's score on the last one; turn_loo with
    gamma then discounts a late success, and without the option only the outcome is there."""
    from verl_agentic.trainer.batch import build_batch

    def traj(turn_lens: list[int], turn_rewards: list[float]) -> dict:
        ids, mask, turns = [], [], []
        for k, (n, r) in enumerate(zip(turn_lens, turn_rewards)):
            if k:  # two feedback tokens between turns
                turns.append({"role": "user", "start": len(ids), "end": len(ids) + 2, "text": "no"})
                ids += [7, 7]
                mask += [0, 0]
            turns.append({"role": "assistant", "start": len(ids), "end": len(ids) + n, "text": "x", "reward": r})
            ids += [5] * n
            mask += [1] * n
        return {"prompt_ids": [1, 2], "response_ids": ids, "response_mask": mask,
                "response_logprobs": [-0.1 if m else None for m in mask], "turns": turns}

    # the first answer earns 0.5 (say, partial credit), the second 1; one episode right at once
    trajs = [traj([3, 2], [0.5, 1.0]), traj([4], [1.0])]
    per_turn = build_batch(trajs, [1.0, 1.0], pad_id=0, uids=["g", "g"], turn_rewards=True)
    scores = per_turn.token_level_scores()
    assert scores[0].tolist() == [0, 0, 0.5, 0, 0, 0, 1.0] and scores[1].tolist() == [0, 0, 0, 1.0, 0, 0, 0]
    outcome = build_batch(trajs, [1.0, 1.0], pad_id=0, uids=["g", "g"]).token_level_scores()
    assert outcome[0].tolist() == [0, 0, 0, 0, 0, 0, 1.0]
    adv, ret = compute_turn_loo_advantage(scores, per_turn.response_mask, index=["g", "g"], config={"gamma": 0.5})
    # episode 0: G = (0.5 + 0.5 * 1, 1) = (1.0, 1.0); episode 1: G = 1.0; turn 1 of each is judged against the other
    assert ret[0].tolist() == [1.0, 1.0, 1.0, 0, 0, 1.0, 1.0] and ret[1, :4].tolist() == [1.0] * 4
    adv_outcome, ret_outcome = compute_turn_loo_advantage(outcome, per_turn.response_mask, index=["g", "g"],
                                                          config={"gamma": 0.5})
    assert ret_outcome[0, :3].tolist() == [0.5] * 3  # the late success, discounted once
    assert adv_outcome[0, 0] == pytest.approx(-0.5) and adv[0, 0] == pytest.approx(0.0)


def test_per_turn_rewards_give_the_same_advantages_in_verls_trainer_and_in_main_ppo():
    """``agentic.turn_rewards`` (the verl plugin) against ``algorithm.turn_rewards`` (main_ppo): the same
    episodes, through each trainer's own path to the token-level rewards (main_ppo's ``build_batch``;
    verl's ``AgentLoopOutput.as_dict`` with our ``task_agent`` output, the score set as verl's
    streaming reward sets it), then verl's ``compute_advantage`` with ``turn_loo``: equal. Without the
    setting verl sees the outcome only, and the advantages differ."""
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics
    from verl.trainer.ppo import ray_trainer

    from verl_agentic.trainer.batch import build_batch
    from verl_agentic.verl_plugin import upstream
    from verl_agentic.verl_plugin.convert import to_agent_loop_output

    assert upstream.apply("turn_rewards")  # what the task_agent loop does in its worker with agentic.turn_rewards

    def episode(uid: str, turn_lens: list[int], turn_rewards: list[float], score: float, k: int) -> dict:
        ids, mask, turns, messages = [], [], [], [{"role": "user", "content": "q"}]
        for j, (n, r) in enumerate(zip(turn_lens, turn_rewards)):
            if j:
                turns.append({"role": "user", "start": len(ids), "end": len(ids) + 3, "text": "again", "num_messages": 1})
                ids += [7, 8, 9]
                mask += [0, 0, 0]
                messages.append({"role": "user", "content": "again"})
            turns.append({"role": "assistant", "start": len(ids), "end": len(ids) + n, "text": "a", "reward": r,
                          "finish_reason": "stop"})
            ids += list(range(20, 20 + n))
            mask += [1] * n
            messages.append({"role": "assistant", "content": "a"})
        return {"uid": uid, "task_type": "gsm8k", "index": 0, "sample_id": k, "prompt_ids": [1, 2, 3],
                "response_ids": ids, "response_mask": mask, "response_logprobs": [-0.2 if m else None for m in mask],
                "messages": messages, "turns": turns, "reward": score, "num_turns": len(turn_lens),
                "finish_reason": "stop", "error": None, "metrics": {}, "score": score}

    episodes = [episode("a", [3, 2], [0.0, 1.0], 1.0, 0), episode("a", [4], [1.0], 1.0, 1),
                episode("a", [2, 2, 3], [0.0, 0.0, 1.0], 1.0, 2), episode("a", [2, 2], [0.5, 0.0], 0.0, 3),
                episode("b", [5], [0.0], 0.0, 0), episode("b", [1, 4], [0.25, 1.0], 1.0, 1)]
    uids = np.array([e["uid"] for e in episodes], dtype=object)
    config = {"gamma": 0.9}

    ours = build_batch(episodes, [e["score"] for e in episodes], pad_id=0, uids=list(uids), turn_rewards=True)
    want, _ = compute_turn_loo_advantage(ours.token_level_scores(), ours.response_mask, index=list(uids), config=config)

    def verl_advantages(turn_rewards: bool) -> torch.Tensor:
        rows = []
        for e in episodes:
            out = to_agent_loop_output(e, prompt_length=8, response_length=16, logprobs_expected=False,
                                       metrics=AgentLoopMetrics(), turn_rewards=turn_rewards)
            out.reward_score = e["score"]  # as verl's agent-loop worker sets it (the streaming reward)
            rows.append(out.as_dict())
        width = ours.response_len
        pad = lambda t: torch.nn.functional.pad(t.float(), (0, width - t.numel()))  # noqa: E731
        data = DataProto.from_dict(
            tensors={"token_level_rewards": torch.stack([pad(r["rm_scores"]) for r in rows]),
                     "response_mask": torch.stack([pad(r["response_mask"]) for r in rows])},
            non_tensors={"uid": uids})
        return ray_trainer.compute_advantage(data, adv_estimator=NAME, config=config).batch["advantages"]

    torch.testing.assert_close(verl_advantages(True), want, atol=1e-6, rtol=0)
    assert not torch.allclose(verl_advantages(False), want)


def test_a_rows_last_spoken_turn_carries_its_own_reward_and_the_others_are_turn_rewards():
    """``last_turn_reward`` (what an episode's earlier row ends with in ``main_ppo``) and ``turn_rewards``
    share one rule: only assistant turns that generated a token count."""
    from verl_agentic.rollout.trajectory import last_turn_reward, turn_rewards

    row = {"turns": [{"role": "assistant", "start": 0, "end": 3, "reward": 0.25},
                     {"role": "user", "start": 3, "end": 6, "reward": 9.0},
                     {"role": "assistant", "start": 6, "end": 8, "reward": 0.5},
                     {"role": "assistant", "start": 8, "end": 8, "reward": 0.9}]}  # spoke no token
    assert last_turn_reward(row) == 0.5
    assert turn_rewards(row) == [(2, 0.25)]
    assert last_turn_reward({"turns": []}) == 0.0 and last_turn_reward({}) == 0.0


def _episode_of_rows(uid: str, sample: int, rows: list[list[tuple[int, float]]], score: float) -> dict:
    """A trajectory whose assistant turns ``(length, own reward)`` are split into training rows (an agent
    whose history changed: ``rows_before``); each row starts with its own prompt, turns apart by 3 injected
    tokens, the last row's fields at the top level."""
    made = []
    for k, turns_of_row in enumerate(rows):
        ids, mask, turns, messages = [], [], [], [{"role": "user", "content": f"q{k}"}]
        for j, (n, r) in enumerate(turns_of_row):
            if j:
                turns.append({"role": "user", "start": len(ids), "end": len(ids) + 3, "text": "again", "num_messages": 1})
                ids, mask = ids + [7, 8, 9], mask + [0, 0, 0]
                messages.append({"role": "user", "content": "again"})
            turns.append({"role": "assistant", "start": len(ids), "end": len(ids) + n, "text": "a", "reward": r,
                          "finish_reason": "stop"})
            ids, mask = ids + list(range(20, 20 + n)), mask + [1] * n
            messages.append({"role": "assistant", "content": "a"})
        made.append({"prompt_ids": [1, 2, 3 + k], "response_ids": ids, "response_mask": mask,
                     "response_logprobs": [-0.2 if m else None for m in mask], "messages": messages, "turns": turns,
                     "split_reason": "history_changed" if k < len(rows) - 1 else None})
    last = made[-1]
    return {**{k: v for k, v in last.items() if k != "split_reason"}, "rows_before": made[:-1] or None,
            "uid": uid, "group": uid, "task_type": "agent", "index": 0, "sample_id": sample, "reward": score,
            "num_turns": sum(len(r) for r in rows), "finish_reason": "stop", "error": None, "metrics": {}}


def test_turn_loo_over_an_episodes_rows_is_the_same_in_verls_trainer_and_main_ppo():
    """Issue 39: episodes of several rows with ``turn_loo`` and per-turn rewards, through each trainer's
    own path. ``main_ppo``: its ``_batch`` (the score on an episode's last row, an earlier row ending with
    its last turn's own reward) and ``episode_advantages`` (the rows joined) over verl's
    ``compute_advantage``. verl's v1 trainer: our ``task_agent`` outputs, one per row, the episode's
    score on every row as its agent-loop worker sets it, stored under ``{uid}_{session}_{row}`` in a
    shuffled order (its ``_balance_batch``), then ``trainer_base.compute_advantage_for_multi_trajectories``
    with our wrap (``turn_loo_rows``): equal, token by token. verl's function unwrapped counts each row
    as an episode and differs; the wrap leaves GRPO to verl."""
    import random
    import types

    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics
    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.v1 import trainer_base

    from verl_agentic.rollout.trajectory import training_rows
    from verl_agentic.trainer.ppo import PPOTrainer, episode_advantages, to_dataproto
    from verl_agentic.verl_plugin import turn_loo_rows, upstream
    from verl_agentic.verl_plugin.convert import to_agent_loop_output

    assert upstream.apply("turn_rewards")
    turn_loo_rows.install(trainer_base)  # what the plugin does once verl's trainer module is imported (it was)
    wrapped = trainer_base.compute_advantage_for_multi_trajectories
    verls = wrapped.__wrapped__
    assert wrapped.__verl_agentic_turn_loo_rows__ and verls.__module__ == "verl.trainer.ppo.v1.utils"
    episodes = [_episode_of_rows("a", 0, [[(3, 0.25), (2, 0.0)], [(4, 0.5)]], 1.0),  # 3 turns over 2 rows
                _episode_of_rows("a", 1, [[(2, 0.0)]], 0.0),
                _episode_of_rows("a", 2, [[(2, 0.5)], [(3, 0.0), (2, 0.0)], [(1, 0.0)]], 1.0),  # 3 rows
                _episode_of_rows("b", 0, [[(5, 0.0)], [(2, 0.25)]], 0.0),
                _episode_of_rows("b", 1, [[(1, 0.0), (4, 0.0)]], 1.0)]
    config = OmegaConf.create({"gamma": 0.9})

    # main_ppo: its own batch and join
    owner = types.SimpleNamespace(conf=types.SimpleNamespace(algorithm=types.SimpleNamespace(turn_rewards=True)),
                                  pad_id=0, step=0)
    batch, _, episode_of = PPOTrainer._batch(owner, episodes, [e["reward"] for e in episodes])
    data = to_dataproto(batch)
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    want = episode_advantages(data, episode_of, lambda d: ray_trainer.compute_advantage(
        d, adv_estimator=NAME, config=config)).batch["advantages"]
    want_rows = [want[i][batch.response_mask[i].bool()] for i in range(len(episode_of))]

    # verl's v1 trainer
    stored = []
    for e in episodes:
        for k, row in enumerate(training_rows(e)):
            out = to_agent_loop_output(row, prompt_length=8, response_length=32, logprobs_expected=False,
                                       metrics=AgentLoopMetrics(), turn_rewards=True)
            out.reward_score = e["reward"]  # every row: agent_loop_tq.py gives the earlier rows the last one's
            stored.append((f"{e['uid']}_{e['sample_id']}_{k}", out.as_dict()))
    assert len(stored) == len(episode_of) == 9
    order = list(range(len(stored)))
    random.Random(0).shuffle(order)
    keys = [stored[i][0] for i in order]
    pad = torch.nn.utils.rnn.pad_sequence

    def verl_data() -> DataProto:
        fields = [stored[i][1] for i in order]
        data = DataProto.from_single_dict({
            "rm_scores": pad([f["rm_scores"] for f in fields], batch_first=True),
            "response_mask": pad([f["response_mask"] for f in fields], batch_first=True),
            "uid": np.array([key.split("_")[0] for key in keys], dtype=object)})
        data.batch["token_level_scores"] = data.batch["token_level_rewards"] = data.batch["rm_scores"]
        return data

    def advantages_by_row(fn, estimator=NAME) -> list[torch.Tensor]:
        out = fn(verl_data(), batch_keys=keys, adv_estimator=estimator, gamma=0.9, num_repeat=2, config=config)
        by_key = {key: out.batch["advantages"][j][out.batch["response_mask"][j].bool()] for j, key in enumerate(keys)}
        return [by_key[key] for key, _ in stored]

    got = advantages_by_row(wrapped)
    for i, (key, _) in enumerate(stored):
        torch.testing.assert_close(got[i], want_rows[i], atol=1e-6, rtol=0, msg=key)
    assert any(r.abs().sum() > 0 for r in got)
    unjoined = advantages_by_row(verls)
    assert any(not torch.allclose(a, b, atol=1e-4) for a, b in zip(unjoined, want_rows))
    grpo = [a.tolist() for a in advantages_by_row(wrapped, "grpo")]
    assert grpo == [a.tolist() for a in advantages_by_row(verls, "grpo")]  # verl's own, not ours


def test_turn_loo_joins_the_rows_of_an_episode_as_one_sequence():
    """``episode_rows``: an episode split into rows in any order gets, turn by turn, the advantages it
    gets as one row, and a group counts its episodes, not its rows."""
    one = [_row([2, 3], reward=1.0), _row([4]), _row([1, 1], reward=1.0)]
    want, want_ret = compute_turn_loo_advantage(torch.tensor([r for _, r in one]), torch.tensor([m for m, _ in one]),
                                                index=["g"] * 3, config={"gamma": 0.8})
    # episode 0 as two rows (its second turn in a row of its own, stored first), episode 2 likewise
    split = [_row([3], reward=1.0), _row([2]), _row([4]), _row([1]), _row([1], reward=1.0)]
    rewards, mask = torch.tensor([r for _, r in split]), torch.tensor([m for m, _ in split])
    got, got_ret = compute_turn_loo_advantage(rewards, mask, index=["g"] * 5, config={"gamma": 0.8},
                                              episode_rows=[(0, 1), (0, 0), (1, 0), (2, 0), (2, 1)])
    assert got[1, :2].tolist() == want[0, :2].tolist() and got[0, :3].tolist() == want[0, 4:7].tolist()
    assert got[2].tolist() == want[1].tolist() and got_ret[0, :3].tolist() == want_ret[0, 4:7].tolist()
    assert got[3, :1].tolist() == want[2, :1].tolist() and got[4, :1].tolist() == want[2, 3:4].tolist()
    with pytest.raises(ValueError, match=r"episode 0 has rows in groups 'g' and 'h'"):
        compute_turn_loo_advantage(rewards, mask, index=["g", "h", "g", "g", "g"],
                                   episode_rows=[(0, 1), (0, 0), (1, 0), (2, 0), (2, 1)])
