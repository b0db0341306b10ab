"""The clipped GRPO objective, its KL term and the four loss normalisations (TRL's ``loss_type`` names).

Per action element t of rollout i (a caption token, or one element of a mask action):

    ratio         = exp(logp - old_logp)
    clipped_ratio = clamp(ratio, 1 - epsilon, 1 + epsilon_high)
    kl            = exp(ref_logp - logp) - (ref_logp - logp) - 1           (k3 estimator, >= 0)
    per_token     = -min(ratio * A_i, clipped_ratio * A_i) + beta * kl

(DeepSeekMath GRPO, arXiv 2402.03300, eq. 3 and the k3 estimator of eq. 4; asymmetric clipping
``epsilon_high`` from DAPO, arXiv 2503.14476.) ``LOSS_AGGREGATIONS`` turns ``per_token [N, T]`` into the
scalar loss; ``PolicyLoss.from_config`` picks the aggregation once, so nothing downstream branches on
``loss_type``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .rollout import Rollout


def masked_mean(x: Tensor, weights: Tensor) -> Tensor:
    """sum(x * w) / max(sum(w), 1) over all elements; ``weights`` is a 0/1 float mask of x's shape."""
    return (x * weights).sum() / weights.sum().clamp(min=1.0)


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator of KL(pi || pi_ref) per element: exp(ref - logp) - (ref - logp) - 1, shape of ``logp``.

    Unbiased for the KL when the action was sampled from pi, never negative (Schulman, "Approximating KL
    divergence", 2020; used by DeepSeekMath GRPO eq. 4).
    """
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def clipped_objective(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, *, epsilon: float, epsilon_high: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-element clipped surrogate -min(ratio * A, clamp(ratio, 1 - eps, 1 + eps_high) * A).

    Args:
        logp: ``[N, T]`` log-probs under the current weights (carries grad).
        old_logp: ``[N, T]`` detached log-probs under the sampling weights.
        advantages: ``[N]`` one advantage per rollout, broadcast over its T elements.

    Returns:
        pg_loss ``[N, T]``, ratio ``[N, T]``, clipped_ratio ``[N, T]``.
    """
    ratio = torch.exp(logp - old_logp)  # [N, T]
    clipped_ratio = torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon_high)  # [N, T]
    A = advantages[:, None]  # [N, 1]
    pg_loss = -torch.min(ratio * A, clipped_ratio * A)  # [N, T]
    return pg_loss, ratio, clipped_ratio


# ---- aggregations: per_token [N, T] and 0/1 weights [N, T] -> scalar loss ----------------------------------
# One signature for all, so the table is the only place a loss_type is looked at. ``max_action_length`` is
# dr_grpo's constant; ``num_active_tokens`` is dapo's normaliser (defaults to the local count).


def aggregate_grpo(per_token: Tensor, weights: Tensor, *, max_action_length: int,
                   num_active_tokens: float | None = None) -> Tensor:
    """grpo (DeepSeekMath): mean over each sequence's active elements, then mean over the N sequences.

    Long sequences get a smaller per-token weight, the length bias Dr. GRPO (arXiv 2503.20783) points out.
    """
    seq_loss = (per_token * weights).sum(-1) / weights.sum(-1).clamp(min=1.0)  # [N]
    return seq_loss.mean()  # []


def aggregate_bnpo(per_token: Tensor, weights: Tensor, *, max_action_length: int,
                   num_active_tokens: float | None = None) -> Tensor:
    """bnpo: token sum / active elements of this local batch (depends on the micro-batch split)."""
    return masked_mean(per_token, weights)  # []


def aggregate_dr_grpo(per_token: Tensor, weights: Tensor, *, max_action_length: int,
                      num_active_tokens: float | None = None) -> Tensor:
    """dr_grpo (Dr. GRPO, arXiv 2503.20783): token sum / (N * T_max), a constant, so no length bias."""
    N = per_token.shape[0]
    return (per_token * weights).sum() / (N * max_action_length)  # []


def aggregate_dapo(per_token: Tensor, weights: Tensor, *, max_action_length: int,
                   num_active_tokens: float | None = None) -> Tensor:
    """dapo (DAPO, arXiv 2503.14476, token-level loss): token sum / active elements of the global batch.

    ``num_active_tokens`` is that global count, over all micro-batches of the optimizer step (and divided by
    the world size under data parallel, since DDP averages gradients: TRL's ``num_items_in_batch /
    num_processes``). None means this call holds the whole batch: the local count, i.e. bnpo.
    """
    if num_active_tokens is None:
        num_active_tokens = weights.sum()
    return (per_token * weights).sum() / torch.as_tensor(num_active_tokens, dtype=per_token.dtype).clamp(min=1.0)


LOSS_AGGREGATIONS: dict[str, Callable[..., Tensor]] = {
    "grpo": aggregate_grpo,
    "bnpo": aggregate_bnpo,
    "dr_grpo": aggregate_dr_grpo,
    "dapo": aggregate_dapo,
}


@dataclass(frozen=True)
class PolicyLoss:
    """The GRPO loss with its knobs fixed at build time; call it on fresh log-probs and a ``Rollout``.

    Attributes:
        epsilon: lower clip range (ratio >= 1 - epsilon).
        epsilon_high: upper clip range (ratio <= 1 + epsilon_high).
        beta: weight of the k3 KL to the reference; 0 needs no ``ref_logp``.
        aggregate: one value of ``LOSS_AGGREGATIONS``.
        use_truncation_mask: drop rollouts with ``is_truncated`` from the loss (``mask_truncated_completions``).
    """

    epsilon: float
    epsilon_high: float
    beta: float
    aggregate: Callable[..., Tensor]
    use_truncation_mask: bool = False

    @classmethod
    def from_config(cls, config) -> "PolicyLoss":
        """Resolve ``config.loss_type`` (a validated ``GRPOConfig``) to its aggregation once."""
        return cls(epsilon=config.epsilon, epsilon_high=config.epsilon_high, beta=config.beta,
                   aggregate=LOSS_AGGREGATIONS[config.loss_type],
                   use_truncation_mask=config.mask_truncated_completions)

    def __call__(self, logp: Tensor, rollout: Rollout,
                 num_active_tokens: float | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """Scalar loss for ``logp [N, T]`` (current weights, with grad) plus detached 0-dim stats.

        Stats (no key contains "loss": MMEngine's ``parse_losses`` would add it to the total): ``pg_term`` (the
        aggregated clipped surrogate, i.e. the loss without the KL term), ``kl`` (mean k3 to the reference, 0 without
        one), ``approx_kl`` (mean k3 from the sampling policy, CleanRL's drift monitor), ``ratio_mean``,
        ``clip_frac_low`` / ``clip_frac_high`` (ratio below 1 - eps with A < 0 / above 1 + eps_high with A > 0:
        the elements whose gradient the clip removes), ``clip_frac_region`` (either), all over active elements.
        """
        weights = self._weights(logp, rollout)  # [N, T]
        old_logp = logp.detach() if rollout.old_logp is None else rollout.old_logp
        A = rollout.advantages
        pg_loss, ratio, _ = clipped_objective(logp, old_logp, A, epsilon=self.epsilon,
                                              epsilon_high=self.epsilon_high)  # [N, T]
        kl = kl_k3(logp, rollout.ref_logp) if rollout.ref_logp is not None else torch.zeros_like(logp)
        per_token = pg_loss + self.beta * kl  # [N, T]
        agg = dict(max_action_length=rollout.max_action_length, num_active_tokens=num_active_tokens)
        loss = self.aggregate(per_token, weights, **agg)

        with torch.no_grad():
            log_ratio = logp - old_logp
            is_low = (ratio < 1.0 - self.epsilon) & (A[:, None] < 0)  # [N, T]
            is_high = (ratio > 1.0 + self.epsilon_high) & (A[:, None] > 0)  # [N, T]
            stats = {
                "pg_term": self.aggregate(pg_loss.detach(), weights, **agg),
                "kl": masked_mean(kl.detach(), weights),
                "approx_kl": masked_mean((ratio - 1.0) - log_ratio, weights),
                "ratio_mean": masked_mean(ratio, weights),
                "clip_frac_low": masked_mean(is_low.float(), weights),
                "clip_frac_high": masked_mean(is_high.float(), weights),
                "clip_frac_region": masked_mean((is_low | is_high).float(), weights),
            }
        return loss, stats

    def _weights(self, logp: Tensor, rollout: Rollout) -> Tensor:
        """0/1 float ``[N, T]``: active elements, minus truncated rollouts when asked; validates inputs."""
        if tuple(logp.shape) != tuple(rollout.action_mask.shape):
            raise ValueError(f"PolicyLoss: logp has shape {tuple(logp.shape)} but the rollout's action_mask is "
                             f"{tuple(rollout.action_mask.shape)}; re-score exactly the rollout's action elements.")
        if rollout.advantages is None:
            raise ValueError("PolicyLoss: rollout.advantages is None; call "
                             "rollout.with_advantages(group_advantages(rollout.rewards, ...)[0]) first.")
        if self.beta != 0.0 and rollout.ref_logp is None:
            raise ValueError(f"PolicyLoss: beta={self.beta} needs rollout.ref_logp; compute it inside "
                             "WeightSets.reference(model), or set beta=0.")
        is_active = rollout.action_mask
        if self.use_truncation_mask:
            is_active = is_active & ~rollout.is_truncated[:, None]  # [N, T]
        return is_active.to(logp.dtype)
