"""LinUCB with disjoint linear arms (Li et al., WWW 2010, Algorithm 1): the contextual-bandit baseline.

For arm k: ``A_k = lam I + sum x x^T``, ``b_k = sum r x``, ``theta_k = A_k^-1 b_k``; choose
``argmax_k theta_k . x + alpha sqrt(x^T A_k^-1 x)`` while learning, ``argmax_k theta_k . x`` (greedy) when evaluating.
x is the image state with a constant 1 appended (per-arm intercept).
"""
from __future__ import annotations

import numpy as np


class LinUCB:
    def __init__(self, num_arms: int, dim: int, alpha: float = 1.0, lam: float = 1.0):
        if num_arms < 2 or dim < 1 or alpha < 0 or lam <= 0:
            raise ValueError(f"LinUCB: need num_arms >= 2, dim >= 1, alpha >= 0, lam > 0; got {num_arms}, {dim}, "
                             f"{alpha}, {lam}")
        self.alpha = alpha
        d = dim + 1
        self.A_inv = np.stack([np.eye(d) / lam] * num_arms)  # [K, d, d]
        self.b = np.zeros((num_arms, d))  # [K, d]

    @staticmethod
    def _x(state: np.ndarray) -> np.ndarray:
        return np.append(np.asarray(state, dtype=np.float64), 1.0)  # [d]

    def scores(self, state: np.ndarray, explore: bool) -> np.ndarray:
        x = self._x(state)
        theta = np.einsum("kij,kj->ki", self.A_inv, self.b)  # [K, d]
        mean = theta @ x  # [K]
        if not explore:
            return mean
        return mean + self.alpha * np.sqrt(np.einsum("i,kij,j->k", x, self.A_inv, x))

    def act(self, state: np.ndarray, explore: bool = True) -> int:
        return int(np.argmax(self.scores(state, explore)))

    def update(self, state: np.ndarray, arm: int, reward: float) -> None:
        """Sherman-Morrison rank-1 update of ``A_k^-1``."""
        x = self._x(state)
        Ax = self.A_inv[arm] @ x
        self.A_inv[arm] -= np.outer(Ax, Ax) / (1.0 + x @ Ax)
        self.b[arm] += reward * x


def train_linucb(states: np.ndarray, rewards: np.ndarray, steps: int, *, alpha: float = 1.0, seed: int = 0) -> LinUCB:
    """``steps`` rounds on uniformly drawn train images (seeded), the same interaction budget as the PPO run."""
    rng = np.random.default_rng(seed)
    bandit = LinUCB(rewards.shape[1], states.shape[1], alpha=alpha)
    for image in rng.integers(len(states), size=steps):
        arm = bandit.act(states[image], explore=True)
        bandit.update(states[image], arm, float(rewards[image, arm]))
    return bandit
