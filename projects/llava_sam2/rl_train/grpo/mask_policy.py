"""Stochastic mask policies with exact log-probabilities (the loop-2 action).

Upstream Sa2VA decodes a mask greedily (``sigmoid(logits) > 0.5``), so a mask has no probability and no
policy gradient. Each policy here makes the mask a sample from an explicit distribution whose log-density is
differentiable w.r.t. the model outputs that parametrise it:

* ``bernoulli``:    factorised Bernoulli over the low-res mask logits (the SAM2 decoder's best output);
* ``gaussian_seg``: diagonal Gaussian exploration on the ``[SEG]`` prompt embedding fed to the decoder;
* ``multimask``:    categorical choice among SAM2's 3 multimask outputs, scored by the IoU head.

The default (``GRPOConfig.mask_policy = "bernoulli"``) was chosen by measurement on the shapes-world demo
(docs/demo.md, "Mask policy": the only policy that moved the masks, and the least caption drift).

Every policy returns log-probs ``[N, T]`` over T action elements, so ``losses.PolicyLoss`` treats them like
caption tokens (per-element ratio and clip). ``get_action_and_log_prob`` is the single code path: it samples
when ``action`` is None and re-scores a given action otherwise (CleanRL ``get_action_and_value``).
``decision_logits`` gives low-res logits whose sign is the mask the partner sees; upsample them with the
released chain (``model.logits_to_masks``: bilinear, then > 0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor


class DecoderOutput(Protocol):
    """What the SAM2 mask decoder returns for M prompts (``model.MaskDecoderOutput`` has these fields)."""

    low_res_logits: Tensor  # [M, 3, h, w] multimask logits
    iou_scores: Tensor  # [M, 3] predicted IoU (sigmoid output of the IoU head)
    best_logits: Tensor  # [M, h, w] logits of the output with the highest predicted IoU


@dataclass
class MaskHead:
    """The model side of a mask action for N rollouts.

    Attributes:
        seg_prompt: ``[N, 256]`` ``text_hidden_fcs`` output for the ``[SEG]`` hidden state (carries grad).
        decode: prompt ``[N, 256]`` -> ``DecoderOutput`` (the SAM2 decoder on the step's cached image features);
            called at most once for ``seg_prompt`` (cached) and once per perturbed prompt.
    """

    seg_prompt: Tensor
    decode: Callable[[Tensor], DecoderOutput]

    @cached_property
    def decoded(self) -> DecoderOutput:
        """``decode(seg_prompt)``, computed once."""
        return self.decode(self.seg_prompt)


def _sign_logits(pred_mask: Tensor) -> Tensor:
    """bool ``[N, h, w]`` -> float ±1 logits whose bilinear upsample > 0 is the upsampled binary mask."""
    return pred_mask.float() * 2.0 - 1.0


class MaskPolicy:
    """Shared surface of the mask policies; a subclass implements the two methods that raise here."""

    name: ClassVar[str]

    @classmethod
    def from_config(cls, config) -> "MaskPolicy":
        """Build from a ``GRPOConfig`` (reads only this policy's knobs)."""
        raise NotImplementedError

    def get_action_and_log_prob(self, head: MaskHead, action: Tensor | None = None,
                                generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Sample an action when ``action`` is None, else re-score it; returns (action, log-probs ``[N, T]``)."""
        raise NotImplementedError

    def decision_logits(self, head: MaskHead, action: Tensor) -> Tensor:
        """Low-res logits ``[N, h, w]`` whose sign is the mask the partner sees."""
        raise NotImplementedError

    def sample(self, head: MaskHead, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(action, log-probs ``[N, T]``) for a fresh sample."""
        return self.get_action_and_log_prob(head, None, generator)

    def log_prob(self, head: MaskHead, action: Tensor) -> Tensor:
        """Log-probs ``[N, T]`` of a stored action under the weights that produced ``head``."""
        return self.get_action_and_log_prob(head, action)[1]

    def decoded_mask(self, head: MaskHead, action: Tensor) -> Tensor:
        """bool ``[N, h, w]``: the low-res binary mask of the action (``decision_logits > 0``)."""
        return self.decision_logits(head, action) > 0


class BernoulliMaskPolicy(MaskPolicy):
    """Factorised Bernoulli over the best low-res mask logits z ``[N, h, w]``, on a grid pooled by k.

        z_c = avg_pool_k(z) / tau                                             [N, h/k, w/k]
        log p(m_c) = m_c log sigmoid(z_c) + (1 - m_c) log sigmoid(-z_c)       per cell c; log p(m) is their sum

    Log-probs ``[N, (h/k)(w/k)]``: one element per cell. Pooling (``mask_pool`` = k) trades resolution for
    variance: at k = 1 a 256x256 SAM2 mask is 65,536 independent coin flips, the sampled masks are
    salt-and-pepper noise unlike anything the partner was trained on, and the gradient variance grows with
    the number of cells; a larger k samples coherent k x k blocks (fewer, more meaningful actions) but the
    sampled mask cannot place a boundary finer than k low-res pixels. ``mask_temperature`` tau < 1 sharpens
    towards the greedy mask, tau > 1 explores more.

    Gradient reach: the log-prob is a function of the decoder's best logits, so it reaches the whole SAM2 mask
    decoder (transformer, upscaling, hypernetwork MLPs), ``text_hidden_fcs`` and the LLM (LoRA, ``mlp1``)
    through the ``[SEG]`` hidden state; the IoU head only through the argmax choice, i.e. not at all.
    """

    name: ClassVar[str] = "bernoulli"

    def __init__(self, mask_temperature: float = 1.0, mask_pool: int = 4):
        self.temperature = mask_temperature
        self.pool = mask_pool

    @classmethod
    def from_config(cls, config) -> "BernoulliMaskPolicy":
        return cls(mask_temperature=config.mask_temperature, mask_pool=config.mask_pool)

    def cell_logits(self, head: MaskHead) -> Tensor:
        """Pooled, temperature-scaled logits ``[N, h/k, w/k]``."""
        z = head.decoded.best_logits  # [N, h, w]
        N, h, w = z.shape
        if h % self.pool or w % self.pool:
            raise ValueError(f"bernoulli mask policy: mask_pool={self.pool} does not divide the low-res mask size "
                             f"{h}x{w}; pick a divisor of {math.gcd(h, w)}.")
        z_cells = F.avg_pool2d(z[:, None], self.pool)[:, 0]  # [N, h/k, w/k]
        return z_cells / self.temperature

    def get_action_and_log_prob(self, head: MaskHead, action: Tensor | None = None,
                                generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Sample (``action`` None) or re-score cells m ``[N, h/k, w/k]`` bool; log-probs ``[N, (h/k)(w/k)]``."""
        z = self.cell_logits(head)  # [N, h', w']
        if action is None:
            u = torch.rand(z.shape, generator=generator, device=z.device)  # fp32 even for bf16 logits
            action = u < torch.sigmoid(z.detach().float())  # [N, h', w'] bool
        m = action.to(z.dtype)
        log_prob = m * F.logsigmoid(z) + (1.0 - m) * F.logsigmoid(-z)  # [N, h', w']
        return action, log_prob.flatten(1)  # [N, h'w']

    def decision_logits(self, head: MaskHead, action: Tensor) -> Tensor:
        """The sampled cells upsampled (nearest) to ``[N, h, w]`` as ±1 logits."""
        pred_cells = action.float()[:, None]  # [N, 1, h', w']
        pred_mask = F.interpolate(pred_cells, scale_factor=self.pool, mode="nearest")[:, 0] > 0.5  # [N, h, w]
        return _sign_logits(pred_mask)


class GaussianSegPolicy(MaskPolicy):
    """Diagonal Gaussian on the ``[SEG]`` prompt e ``[N, 256]``: e' = e + sigma * eps, eps ~ N(0, I).

        log N(e'_d; e_d, sigma^2) = -(e'_d - e_d)^2 / (2 sigma^2) - log sigma - log(2 pi) / 2

    Returned per dimension ``[N, 256]``, not summed: the joint ratio exp(sum_d delta_d) over 256 dimensions
    leaves the clip range after tiny per-dimension changes and the clip then zeroes almost every update; per
    dimension, each factor keeps its own trust region, exactly as token-level GRPO treats the factors of a
    sequence. (CleanRL sums because its action spaces have a handful of dimensions.) The mask the partner sees
    comes from re-running the decoder on e' (``decision_logits``). ``seg_noise_std`` sigma is in the units of
    the prompt embedding and is fixed (not learned).

    Gradient reach: the log-prob depends on e only, so it reaches ``text_hidden_fcs`` and the LLM (LoRA,
    ``mlp1``) through the ``[SEG]`` hidden state. It does NOT reach the SAM2 mask decoder: the decoder only maps
    the sampled e' to a mask (part of the environment for this policy) and gets no gradient from loop 2.
    """

    name: ClassVar[str] = "gaussian_seg"

    def __init__(self, seg_noise_std: float = 0.1):
        self.std = seg_noise_std

    @classmethod
    def from_config(cls, config) -> "GaussianSegPolicy":
        return cls(seg_noise_std=config.seg_noise_std)

    def get_action_and_log_prob(self, head: MaskHead, action: Tensor | None = None,
                                generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Sample (``action`` None) or re-score e' ``[N, 256]``; log-probs ``[N, 256]``."""
        e = head.seg_prompt  # [N, 256]
        if action is None:
            noise = torch.randn(e.shape, generator=generator, device=e.device, dtype=e.dtype)
            action = e.detach() + self.std * noise  # [N, 256]
        z = (action - e) / self.std  # [N, 256]
        log_prob = -0.5 * z**2 - math.log(self.std) - 0.5 * math.log(2.0 * math.pi)  # [N, 256]
        return action, log_prob

    def decision_logits(self, head: MaskHead, action: Tensor) -> Tensor:
        """The decoder's best logits ``[N, h, w]`` for the sampled prompt e' (no grad: the environment)."""
        with torch.no_grad():
            return head.decode(action).best_logits


class MultimaskPolicy(MaskPolicy):
    """Categorical over SAM2's 3 multimask outputs, logits s_k / tau from the IoU head's scores ``[N, 3]``.

        s_k = iou_k                 (multimask_score = "iou": scores in (0, 1), a mild preference)
        s_k = log(iou_k / (1 - iou_k))  (multimask_score = "logit_iou": undoes the IoU head's sigmoid)
        log p(k) = log_softmax(s / tau)_k

    One action element per rollout: log-probs ``[N, 1]``. Greedy upstream inference picks argmax_k iou_k,
    the tau -> 0 limit.

    Gradient reach: the log-prob depends on the IoU head's output, so it reaches the IoU prediction head, the
    decoder's two-way transformer (through the IoU token), ``text_hidden_fcs`` and the LLM; it does NOT reach
    the mask upscaling path or the hypernetwork MLPs that shape each candidate mask (Sa2VA's SFT never trained
    the IoU head either: reference/anchors.md §3.2).
    """

    name: ClassVar[str] = "multimask"
    SCORES: ClassVar[dict[str, Callable[[Tensor], Tensor]]] = {
        "iou": lambda iou: iou,
        "logit_iou": lambda iou: torch.logit(iou, eps=1e-6),
    }

    def __init__(self, mask_temperature: float = 1.0, multimask_score: str = "logit_iou"):
        self.temperature = mask_temperature
        self.score = self.SCORES[multimask_score]

    @classmethod
    def from_config(cls, config) -> "MultimaskPolicy":
        return cls(mask_temperature=config.mask_temperature, multimask_score=config.multimask_score)

    def choice_logits(self, head: MaskHead) -> Tensor:
        """Categorical logits ``[N, 3]``."""
        return self.score(head.decoded.iou_scores) / self.temperature

    def get_action_and_log_prob(self, head: MaskHead, action: Tensor | None = None,
                                generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Sample (``action`` None) or re-score the chosen output k ``[N]`` long; log-probs ``[N, 1]``."""
        log_p = torch.log_softmax(self.choice_logits(head), dim=-1)  # [N, 3]
        if action is None:
            action = torch.multinomial(log_p.detach().exp(), 1, generator=generator)[:, 0]  # [N]
        return action, log_p.gather(1, action[:, None])  # [N, 1]

    def decision_logits(self, head: MaskHead, action: Tensor) -> Tensor:
        """Logits ``[N, h, w]`` of the chosen multimask output."""
        low_res = head.decoded.low_res_logits  # [N, 3, h, w]
        return low_res[torch.arange(low_res.shape[0], device=low_res.device), action]  # [N, h, w]


MASK_POLICIES = {p.name: p for p in (BernoulliMaskPolicy, GaussianSegPolicy, MultimaskPolicy)}


def build_mask_policy(config) -> MaskPolicy:
    """``MASK_POLICIES[config.mask_policy]`` built with its knobs from a validated ``GRPOConfig``."""
    return MASK_POLICIES[config.mask_policy].from_config(config)
