"""The clipped GRPO objective, its KL term, the importance-sampling levels and the four loss normalisations (TRL's
``importance_sampling_level`` and ``loss_type`` names).

Per action element t of rollout i (a caption token, or one element of a mask action):

    log_w         = logp - old_logp                                       token level: one weight per element [N, T]
    log_w_i       = sum_t (logp - old_logp) / nu(T_i)                     sequence level: one per rollout     [N, 1]
    ratio         = exp(log_w)
    clipped_ratio = clamp(ratio, 1 - epsilon, 1 + epsilon_high)
    kl            = exp(ref_logp - logp) - (ref_logp - logp) - 1           (k3 estimator, >= 0)
    per_token     = -min(ratio * A_i, clipped_ratio * A_i) + beta * s_i * kl

(DeepSeekMath GRPO, arXiv 2402.03300, eq. 3 and the k3 estimator of eq. 4; asymmetric clipping ``epsilon_high``
from DAPO, arXiv 2503.14476; the sequence level from GSPO, arXiv 2507.18071.) At sequence level the rollout's
clipped term is broadcast over its T_i elements, as TRL does, and ``nu`` is the length normalisation
(``SEQUENCE_LENGTH_NORMS``): ``mean`` nu = T_i is TRL's and GSPO's s_i = exp(mean_t log-ratio); ``sqrt`` nu = sqrt(T_i);
``sum`` nu = 1 makes s_i the ratio of the whole action, pi(a_i) / pi_old(a_i). The clip then bounds
|sum_t log-ratio| by about nu(T_i) * epsilon per rollout, and the gradient of the term is s_i A_i / nu(T_i) *
sum_t grad logp_t. The KL is weighted s_i = T_i / nu(T_i) at sequence level (1 at token level), so that after the
per-token aggregation a rollout's KL term is sum_t kl_t / nu(T_i), normalised like its policy term (``mean``: TRL's
per-token KL; ``sum``: the KL of the whole factorised action).

``IMPORTANCE_SAMPLING_LEVELS`` and ``LOSS_AGGREGATIONS`` are the two tables; ``PolicyLoss.from_config`` picks
from both once, so nothing downstream branches on ``importance_sampling_level`` or ``loss_type``.
"""
from __future__ import annotations

import functools
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


def clipped_objective(log_weights: Tensor, advantages: Tensor, *, epsilon: float, epsilon_high: float
                      ) -> tuple[Tensor, Tensor, Tensor]:
    """Clipped surrogate -min(ratio * A, clamp(ratio, 1 - eps, 1 + eps_high) * A), ratio = exp(log_weights).

    Args:
        log_weights: ``[N, T]`` (token level) or ``[N, 1]`` (sequence level) log importance weights, with grad.
        advantages: ``[N]`` one advantage per rollout, broadcast over its elements.

    Returns:
        pg_loss, ratio, clipped_ratio, each of ``log_weights``' shape.
    """
    ratio = torch.exp(log_weights)  # [N, T] | [N, 1]
    clipped_ratio = torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon_high)
    A = advantages[:, None]  # [N, 1]
    pg_loss = -torch.min(ratio * A, clipped_ratio * A)
    return pg_loss, ratio, clipped_ratio


# ---- importance-sampling levels: log-ratio [N, T], 0/1 weights [N, T] -> (log weights, KL scale [N, 1]) -------

# nu(T_i) of the sequence level, from the active-element counts T_i [N, 1].
SEQUENCE_LENGTH_NORMS: dict[str, Callable[[Tensor], Tensor]] = {
    "mean": lambda count: count,  # TRL / GSPO: geometric mean of the element ratios
    "sqrt": torch.sqrt,
    "sum": torch.ones_like,  # the ratio of the whole action
}


def token_log_weights(log_ratio: Tensor, weights: Tensor, *, length_norm: Callable[[Tensor], Tensor]
                      ) -> tuple[Tensor, Tensor]:
    """token (PPO / GRPO): one ratio per element, log_w = logp - old_logp ``[N, T]``; KL scale 1."""
    return log_ratio, torch.ones_like(log_ratio[:, :1])  # [N, T], [N, 1]


def sequence_log_weights(log_ratio: Tensor, weights: Tensor, *, length_norm: Callable[[Tensor], Tensor]
                         ) -> tuple[Tensor, Tensor]:
    """sequence (GSPO): one ratio per rollout, log_w_i = sum_t w_t (logp - old_logp) / nu(T_i) ``[N, 1]``;
    KL scale T_i / nu(T_i). A rollout without active elements gets log_w 0 (its elements have weight 0 anyway)."""
    count = weights.sum(-1, keepdim=True)  # [N, 1]
    nu = length_norm(count).clamp(min=1.0)  # [N, 1]
    return (log_ratio * weights).sum(-1, keepdim=True) / nu, count / nu  # [N, 1], [N, 1]


IMPORTANCE_SAMPLING_LEVELS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "token": token_log_weights,
    "sequence": sequence_log_weights,
}


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
        log_weights: one value of ``IMPORTANCE_SAMPLING_LEVELS`` with its ``length_norm`` bound.
    """

    epsilon: float
    epsilon_high: float
    beta: float
    aggregate: Callable[..., Tensor]
    use_truncation_mask: bool = False
    log_weights: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] = functools.partial(
        token_log_weights, length_norm=SEQUENCE_LENGTH_NORMS["mean"])

    @classmethod
    def from_config(cls, config, importance_sampling_level: str | None = None,
                    length_norm: str = "mean") -> "PolicyLoss":
        """Resolve ``config.loss_type`` and the importance-sampling level (default ``config.importance_sampling_level``;
        a loop passes its own, e.g. loop 2 ``mask_importance_sampling_level`` and ``mask_length_norm``) once."""
        level = config.importance_sampling_level if importance_sampling_level is None else importance_sampling_level
        for knob, value, table in (("importance_sampling_level", level, IMPORTANCE_SAMPLING_LEVELS),
                                   ("length_norm", length_norm, SEQUENCE_LENGTH_NORMS)):
            if value not in table:
                raise ValueError(f"PolicyLoss: {knob}={value!r} is not one of {sorted(table)}.")
        return cls(epsilon=config.epsilon, epsilon_high=config.epsilon_high, beta=config.beta,
                   aggregate=LOSS_AGGREGATIONS[config.loss_type],
                   use_truncation_mask=config.mask_truncated_completions,
                   log_weights=functools.partial(IMPORTANCE_SAMPLING_LEVELS[level],
                                                 length_norm=SEQUENCE_LENGTH_NORMS[length_norm]))

    def __call__(self, logp: Tensor, rollout: Rollout,
                 num_active_tokens: float | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """Scalar loss for ``logp [N, T]`` (current weights, with grad) plus detached 0-dim stats.

        Stats (no key contains "loss": MMEngine's ``parse_losses`` would add it to the total): ``pg_term`` (the
        aggregated clipped surrogate, i.e. the loss without the KL term), ``kl`` (mean k3 to the reference per
        element, 0 without one), ``approx_kl`` (mean k3 from the sampling policy per element, CleanRL's drift
        monitor), and over the importance weights the loss clips (per element at token level, per rollout at
        sequence level, as TRL's ``masked_batch_mean``): ``ratio_mean``, ``clip_frac_low`` / ``clip_frac_high``
        (ratio below 1 - eps with A < 0 / above 1 + eps_high with A > 0: the weights whose gradient the clip
        removes), ``clip_frac_region`` (either).
        """
        weights = self._weights(logp, rollout)  # [N, T]
        old_logp = logp.detach() if rollout.old_logp is None else rollout.old_logp
        A = rollout.advantages
        log_ratio = logp - old_logp  # [N, T]
        log_w, kl_scale = self.log_weights(log_ratio, weights)  # [N, T] | [N, 1], [N, 1]
        pg_loss, ratio, _ = clipped_objective(log_w, A, epsilon=self.epsilon, epsilon_high=self.epsilon_high)
        kl = kl_k3(logp, rollout.ref_logp) if rollout.ref_logp is not None else torch.zeros_like(logp)
        per_token = pg_loss + self.beta * kl_scale * kl  # [N, T]
        agg = dict(max_action_length=rollout.max_action_length, num_active_tokens=num_active_tokens)
        loss = self.aggregate(per_token, weights, **agg)

        with torch.no_grad():
            weight_mean = functools.partial(_weight_mean, weights=weights)
            is_low = (ratio < 1.0 - self.epsilon) & (A[:, None] < 0)  # [N, T] | [N, 1]
            is_high = (ratio > 1.0 + self.epsilon_high) & (A[:, None] > 0)
            stats = {
                "pg_term": self.aggregate(pg_loss.detach().expand_as(weights), weights, **agg),
                "kl": masked_mean(kl.detach(), weights),
                "approx_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, weights),
                "ratio_mean": weight_mean(ratio),
                "clip_frac_low": weight_mean(is_low.float()),
                "clip_frac_high": weight_mean(is_high.float()),
                "clip_frac_region": weight_mean((is_low | is_high).float()),
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


def _weight_mean(x: Tensor, weights: Tensor) -> Tensor:
    """Mean of per-element ``[N, T]`` values over active elements, or of per-rollout ``[N, 1]`` values over rollouts
    with an active element (TRL's ``masked_batch_mean``, which averages ``[N, 1]`` values over rollouts)."""
    if x.shape[1] == weights.shape[1]:
        return masked_mean(x, weights)
    return masked_mean(x, (weights.sum(-1, keepdim=True) > 0).to(x.dtype))
