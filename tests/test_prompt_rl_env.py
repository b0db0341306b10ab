"""prompt_rl: the gymnasium prompt-selection env (checker, semantics, bad input), the feature map, LinUCB, PPO."""
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from projects.llava_sam2.rl_train.prompt_rl.bandit import LinUCB, train_linucb
from projects.llava_sam2.rl_train.prompt_rl.env import FeatureMap, PromptSelectionEnv


def _table(I=12, K=3, d=4, seed=0):
    rng = np.random.default_rng(seed)
    states = rng.normal(size=(I, d)).astype(np.float32)
    best = (states[:, 0] > 0).astype(int)  # prompt 1 is best where feature 0 > 0, prompt 0 elsewhere
    rewards = np.full((I, K), 0.2)
    rewards[np.arange(I), best] = 0.9
    return states, rewards, best


def test_gymnasium_checker_passes():
    states, rewards, _ = _table()
    check_env(PromptSelectionEnv(states, rewards), skip_render_check=True)


def test_one_step_episode_returns_the_table_reward():
    states, rewards, _ = _table()
    env = PromptSelectionEnv(states, rewards)
    obs, info = env.reset(seed=3)
    i = info["image"]
    np.testing.assert_array_equal(obs, states[i])
    obs2, reward, terminated, truncated, info2 = env.step(2)
    assert reward == rewards[i, 2] and terminated and not truncated and info2 == {"image": i, "action": 2}
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(0)  # the episode is over
    env.reset(seed=3)
    with pytest.raises(ValueError, match="not in Discrete"):
        env.step(7)


def test_same_seed_same_images():
    states, rewards, _ = _table()
    a, b = PromptSelectionEnv(states, rewards), PromptSelectionEnv(states, rewards)
    first = [a.reset(seed=5 if k == 0 else None)[1]["image"] for k in range(10)]
    second = [b.reset(seed=5 if k == 0 else None)[1]["image"] for k in range(10)]
    assert first == second and len(set(first)) > 1


@pytest.mark.parametrize("K", [0, 1])
def test_fewer_than_two_prompts_is_an_error(K):
    states, rewards, _ = _table()
    with pytest.raises(ValueError, match="K >= 2"):
        PromptSelectionEnv(states, rewards[:, :K])


def test_bad_tables_are_errors():
    states, rewards, _ = _table()
    with pytest.raises(ValueError, match="one row per image"):
        PromptSelectionEnv(states[:5], rewards)
    bad = rewards.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        PromptSelectionEnv(states, bad)


def test_feature_map_whitens_train_and_reduces_dim():
    x = np.random.default_rng(0).normal(size=(50, 8)) * np.arange(1, 9) + 3
    fmap = FeatureMap(x, dim=3)
    z = fmap(x)
    assert z.shape == (50, 3) and z.dtype == np.float32
    np.testing.assert_allclose(z.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(z.std(0), 1, atol=1e-3)
    with pytest.raises(ValueError, match="train features"):
        FeatureMap(x[:1])


def test_linucb_learns_the_contextual_rule():
    states, rewards, best = _table(I=40)
    bandit = train_linucb(states, rewards, steps=600, alpha=0.5, seed=0)
    chosen = np.array([bandit.act(s, explore=False) for s in states])
    assert (chosen == best).mean() >= 0.9
    with pytest.raises(ValueError, match="num_arms >= 2"):
        LinUCB(1, 4)


def test_linucb_sherman_morrison_matches_the_inverse():
    bandit = LinUCB(2, 3, lam=2.0)
    rng = np.random.default_rng(1)
    xs = rng.normal(size=(5, 3))
    for x in xs:
        bandit.update(x, 1, 1.0)
    X = np.hstack([xs, np.ones((5, 1))])  # the bandit appends an intercept
    np.testing.assert_allclose(bandit.A_inv[1], np.linalg.inv(2.0 * np.eye(4) + X.T @ X), atol=1e-10)
    np.testing.assert_allclose(bandit.A_inv[0], np.eye(4) / 2.0)


def test_ppo_runs_on_cpu_and_prefers_the_better_prompt():
    import torch

    from projects.llava_sam2.rl_train.prompt_rl.policy import policy_choice, train_ppo

    torch.set_num_threads(1)  # tiny MLP: extra threads only contend with other processes

    states, rewards, _ = _table(I=16, K=3)
    rewards[:, 2] = 1.0  # a context-free best prompt: PPO must find it in a few updates
    model, stats = train_ppo(states, rewards, 1024, seed=0, n_steps=16, learning_rate=3e-3)
    assert str(model.device) == "cpu" and stats["timesteps"] == 1024 and stats["steps_per_second"] > 0
    assert (policy_choice(model, states) == 2).mean() >= 0.75
    assert stats["reward_curve"][-1] > stats["reward_curve"][0]
