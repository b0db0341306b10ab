"""PPO (stable-baselines3, CPU, MlpPolicy) on ``PromptSelectionEnv`` and the per-image choices of trained policies.

PPO runs on CPU on purpose: SB3 says PPO with an MLP policy is "primarily intended to run on the CPU", and one
table-lookup env step is far cheaper than a GPU round trip. Knobs are SB3's names; defaults here differ from SB3's
(n_steps 2048 -> 32 per env x 8 envs, ent_coef 0 -> 0.01) because episodes are one step long and the action set is
small: 256 one-step episodes per update are plenty, 8 vectorised envs cut the per-step Python overhead, and a little
entropy keeps all K prompts tried early.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from .env import PromptSelectionEnv

NUM_ENVS = 8
PPO_DEFAULTS = dict(learning_rate=3e-4, n_steps=32, batch_size=64, n_epochs=10, gamma=0.99, gae_lambda=0.95,
                    clip_range=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5)


def train_ppo(states: np.ndarray, rewards: np.ndarray, total_timesteps: int, *, seed: int = 0,
              num_envs: int = NUM_ENVS, net_arch: tuple[int, ...] = (64, 64), **overrides) -> tuple[object, dict]:
    """Train SB3 PPO on one-step prompt episodes; returns (model, stats with steps/s and the reward curve)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    if total_timesteps < 1:
        raise ValueError(f"train_ppo: total_timesteps={total_timesteps}; use >= n_steps * num_envs (e.g. 5000)")
    env = make_vec_env(lambda: PromptSelectionEnv(states, rewards), n_envs=num_envs, seed=seed)
    kwargs = {**PPO_DEFAULTS, **overrides}
    model = PPO("MlpPolicy", env, device="cpu", seed=seed, verbose=0, policy_kwargs=dict(net_arch=list(net_arch)),
                **kwargs)
    curve: list[float] = []

    class RewardCurve(BaseCallback):
        """Mean reward of the rollout's episodes, once per rollout."""

        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            curve.append(float(self.locals["rollout_buffer"].rewards.mean()))

    start = time.perf_counter()
    model.learn(total_timesteps=total_timesteps, callback=RewardCurve())
    seconds = time.perf_counter() - start
    chunks = np.array_split(np.asarray(curve), min(10, max(1, len(curve))))
    stats = {"timesteps": int(total_timesteps), "seconds": round(seconds, 2), "num_envs": num_envs,
             "steps_per_second": round(total_timesteps / max(seconds, 1e-9), 1),
             "reward_curve": [round(float(c.mean()), 4) for c in chunks if len(c)], "ppo_kwargs": kwargs,
             "net_arch": list(net_arch), "torch_threads": torch.get_num_threads()}
    return model, stats


def policy_choice(model, states: np.ndarray) -> np.ndarray:
    """Deterministic (argmax) action of a trained SB3 policy for each state ``[n, d]`` -> ``[n]``."""
    actions, _ = model.predict(np.asarray(states, dtype=np.float32), deterministic=True)
    return np.asarray(actions, dtype=np.int64).reshape(-1)
