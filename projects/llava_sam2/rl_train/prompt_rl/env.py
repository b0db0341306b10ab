"""Prompt selection as a gymnasium environment: a one-step episode per image (a contextual bandit).

``reset`` draws an image (uniformly, from the environment's seeded ``np_random``) and returns its state, the
image-feature vector (``QualityData.image_features`` reduced by ``FeatureMap``). ``step(k)`` uses candidate
prompt k on that image and returns the table reward ``rewards[i, k]`` (the quality score of that mask: reward
network / calibrated IoU head, GT-free; or the true Dice for a reference run), then terminates. With one-step
episodes the discount and GAE do nothing; PPO here is a policy-gradient contextual-bandit learner.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class FeatureMap:
    """Standardise features with train statistics, then project on the top ``dim`` principal axes (train PCA)."""

    def __init__(self, train_features: np.ndarray, dim: int = 16):
        x = np.asarray(train_features, dtype=np.float64)
        if x.ndim != 2 or len(x) < 2:
            raise ValueError(f"FeatureMap: expected train features [I >= 2, D], got shape {x.shape}")
        if dim < 1:
            raise ValueError(f"FeatureMap: dim={dim}; use >= 1")
        self.mean, self.std = x.mean(0), x.std(0) + 1e-6
        z = (x - self.mean) / self.std
        _, sing, vt = np.linalg.svd(z, full_matrices=False)
        self.dim = min(dim, vt.shape[0])
        self.axes = vt[:self.dim]  # [d, D]
        self.scale = sing[:self.dim] / np.sqrt(len(x)) + 1e-6  # unit variance per component on train

    def __call__(self, features: np.ndarray) -> np.ndarray:
        z = (np.asarray(features, dtype=np.float64) - self.mean) / self.std
        return ((z @ self.axes.T) / self.scale).astype(np.float32)  # [n, d]


class PromptSelectionEnv(gym.Env):
    """One-step episodes: observation = image state ``[d]`` float32, action = prompt index in ``Discrete(K)``.

    Args:
        states: ``[I, d]`` float32 per-image states (already mapped by ``FeatureMap``).
        rewards: ``[I, K]`` reward of prompt k on image i.
    """

    metadata = {"render_modes": []}

    def __init__(self, states: np.ndarray, rewards: np.ndarray):
        states, rewards = np.asarray(states, dtype=np.float32), np.asarray(rewards, dtype=np.float64)
        if rewards.ndim != 2 or rewards.shape[1] < 2:
            raise ValueError(f"PromptSelectionEnv: rewards must be [I, K] with K >= 2 prompts, got {rewards.shape}")
        if states.ndim != 2 or len(states) != len(rewards) or len(states) == 0:
            raise ValueError(f"PromptSelectionEnv: states {states.shape} and rewards {rewards.shape} must both have "
                             "one row per image (I >= 1)")
        if not (np.isfinite(states).all() and np.isfinite(rewards).all()):
            raise ValueError("PromptSelectionEnv: states or rewards hold NaN/inf; check the quality cache")
        self.states, self.rewards = states, rewards
        bound = np.float32(np.abs(states).max() * 10 + 10)
        self.observation_space = spaces.Box(-bound, bound, shape=(states.shape[1],), dtype=np.float32)
        self.action_space = spaces.Discrete(rewards.shape[1])
        self._image: int | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._image = int(self.np_random.integers(len(self.states)))
        return self.states[self._image].copy(), {"image": self._image}

    def step(self, action):
        if self._image is None:
            raise RuntimeError("PromptSelectionEnv.step called before reset")
        if not self.action_space.contains(action):
            raise ValueError(f"PromptSelectionEnv.step: action {action!r} is not in Discrete({self.action_space.n})")
        image, self._image = self._image, None
        reward = float(self.rewards[image, int(action)])
        return self.states[image].copy(), reward, True, False, {"image": image, "action": int(action)}
