"""Stochastic mask policies with exact log-probabilities (the loop-2 action).

Upstream Sa2VA decodes a mask greedily (``sigmoid(logits) > 0.5``), so a mask has no probability and no
policy gradient. Each policy here makes the mask a sample from an explicit distribution whose log-density is
differentiable w.r.t. the model outputs that parametrise it:

* ``region``:       factorised Bernoulli over the partner's g x g region cells, each cell's logit the decoder's
                    best logits through the released chain at that cell's sample point (the default);
* ``bernoulli``:    factorised Bernoulli over the low-res mask logits pooled k x k;
* ``gaussian_seg``: diagonal Gaussian exploration on the ``[SEG]`` prompt embedding fed to the decoder;
* ``multimask``:    categorical choice among SAM2's 3 multimask outputs, scored by the IoU head.

Why ``region`` is the default (docs/mask_action.md has the numbers): the partner reads a mask only through its
region cells (``Sa2VAProcessor.region_cells``), so ``region`` samples exactly what the partner reads: every sampled
element can change the partner's input (share 1.0), against 256-360 of the 4,096 pooled cells of ``bernoulli`` on
the real presets, and a mask is g^2 = 256 elements, not 4,096. Its greedy limit (tau -> 0) is exactly the cells of
upstream's greedy mask.

Every policy returns log-probs ``[N, T]`` over T action elements, computed in fp32 whatever the model's dtype, also under
bf16 autocast (a bf16 log-density is off by ~1e-2 per element); ``losses.PolicyLoss`` turns them into a per-element or per-mask
ratio (``mask_importance_sampling_level``). ``get_action_and_log_prob`` is the single code path: it samples when
``action`` is None and re-scores a given action otherwise (CleanRL ``get_action_and_value``). ``pred_masks`` gives
the image-size masks the partner describes and mask rewards score.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable, ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:  # model/pipeline/region_chain.py imports sam2 (and with it MMEngine); grpo/'s math stays framework-free
    from ..model.pipeline.region_chain import MaskChain


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
        chain: the released chain of the N rows (image sizes, SAM2 input size, region grid): ``pred_masks`` and the
            ``region`` policy need it; None for heads that only score log-probs of grid-free policies.
    """

    seg_prompt: Tensor
    decode: Callable[[Tensor], DecoderOutput]
    chain: MaskChain | None = None

    @cached_property
    def decoded(self) -> DecoderOutput:
        """``decode(seg_prompt)``, computed once."""
        return self.decode(self.seg_prompt)

    @cached_property
    def region_logits(self) -> Tensor:
        """fp32 ``[N, g, g]``: the best logits through the released chain at the region sample points, once."""
        return self.require_chain("region logits").region_logits(self.decoded.best_logits)

    def require_chain(self, what: str) -> MaskChain:
        if self.chain is None:
            raise ValueError(f"MaskHead: {what} need the released chain (image sizes, region grid); build the head "
                             "with chain=MaskChain(...) (grpo.cycle.seg_mask_head does).")
        return self.chain


def _sign_logits(pred_mask: Tensor) -> Tensor:
    """bool ``[N, h, w]`` -> float ±1 logits whose bilinear upsample > 0 is the upsampled binary mask."""
    return pred_mask.float() * 2.0 - 1.0


def bernoulli_log_prob(z: Tensor, action: Tensor) -> Tensor:
    """log p(m) = m log sigmoid(z) + (1 - m) log sigmoid(-z) per element, fp32; z, action ``[N, ...]``."""
    z = z.float()
    m = action.to(z.dtype)
    return m * F.logsigmoid(z) + (1.0 - m) * F.logsigmoid(-z)


def bernoulli_sample(z: Tensor, generator: torch.Generator | None) -> Tensor:
    """bool draws m ~ Bernoulli(sigmoid(z)), shape of ``z``; the uniform draws are fp32 whatever z's dtype."""
    u = torch.rand(z.shape, generator=generator, device=z.device)
    return u < torch.sigmoid(z.detach().float())


class MaskPolicy:
    """Shared surface of the mask policies; a subclass implements the methods that raise here."""

    name: ClassVar[str]

    @classmethod
    def from_config(cls, config) -> "MaskPolicy":
        """Build from a ``GRPOConfig`` (reads only this policy's knobs)."""
        raise NotImplementedError

    def get_action_and_log_prob(self, head: MaskHead, action: Tensor | None = None,
                                generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Sample an action when ``action`` is None, else re-score it; returns (action, fp32 log-probs ``[N, T]``)."""
        raise NotImplementedError

    def decision_logits(self, head: MaskHead, action: Tensor) -> Tensor:
        """Low-res logits ``[N, h, w]`` whose sign is the mask the partner sees (low-res policies only)."""
        raise NotImplementedError(f"mask policy {self.name!r} acts on region cells, not low-res logits; "
                                  "use pred_masks(head, action)")

    def pred_masks(self, head: MaskHead, action: Tensor) -> list[Tensor]:
        """N bool ``[H, W]`` image-size masks of the action: what the partner describes and mask rewards score.

        Default: ``decision_logits`` through the released chain (``MaskChain.to_masks``)."""
        return head.require_chain("pred_masks").to_masks(self.decision_logits(head, action))

    def sample(self, head: MaskHead, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(action, log-probs ``[N, T]``) for a fresh sample."""
        return self.get_action_and_log_prob(head, None, generator)

    def log_prob(self, head: MaskHead, action: Tensor) -> Tensor:
        """Log-probs ``[N, T]`` of a stored action under the weights that produced ``head``."""
        return self.get_action_and_log_prob(head, action)[1]

    def decoded_mask(self, head: MaskHead, action: Tensor) -> Tensor:
        """bool ``[N, h, w]``: the low-res binary mask of the action (``decision_logits > 0``)."""
        return self.decision_logits(head, action) > 0


class RegionMaskPolicy(MaskPolicy):
    """Factorised Bernoulli over the partner's g x g region cells: the action is the partner's input itself.

        Z = A_y z A_x^T / tau        [N, g, g]  best logits z [N, h, w] through the released chain at the cells'
                                                sample points (model/pipeline/region_chain.py), evaluated on the B distinct
                                                prompts of the groups
        log p(m_c) = m_c log sigmoid(Z_c) + (1 - m_c) log sigmoid(-Z_c)     per cell c; log p(m) is their sum

    Log-probs ``[N, g^2]`` (256 for the released presets' 448 px tiles, 64 for tiny). The partner gets exactly the
    sampled cells: ``pred_masks`` paints them at image size so that ``region_cells(pred_mask) == m``, and mask
    rewards score that painted mask. Every element can change the partner's input, and tau -> 0 gives the cells of
    upstream's greedy mask (``Z > 0``). ``mask_temperature`` tau < 1 sharpens towards it.

    Gradient reach: Z is linear in the best logits, so, like ``bernoulli``, the log-prob reaches the SAM2 mask
    decoder (transformer, upscaling, hypernetwork MLPs), ``text_hidden_fcs`` and the LLM (LoRA, ``mlp1``) through
    the ``[SEG]`` state; the IoU head only through the argmax choice, i.e. not at all.
    """

    name: ClassVar[str] = "region"

    def __init__(self, mask_temperature: float = 1.0):
        self.temperature = mask_temperature

    @classmethod
    def from_config(cls, config) -> "RegionMaskPolicy":
        return cls(mask_temperature=config.mask_temperature)

    def cell_logits(self, head: MaskHead) -> Tensor:
        """fp32 temperature-scaled logits ``[N, g, g]`` of the region cells."""
        return head.region_logits / self.temperature

    def get_action_and_log_prob(self, head: MaskHead, action: Tensor | None = None,
                                generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Sample (``action`` None) or re-score cells m ``[N, g, g]`` bool; fp32 log-probs ``[N, g^2]``."""
        z = self.cell_logits(head)  # [N, g, g]
        action = bernoulli_sample(z, generator) if action is None else action  # [N, g, g] bool
        return action, bernoulli_log_prob(z, action).flatten(1)  # [N, g^2]

    def pred_masks(self, head: MaskHead, action: Tensor) -> list[Tensor]:
        """N bool ``[H, W]`` masks whose region cells are exactly the sampled cells."""
        return head.require_chain("pred_masks").cells_to_masks(action)


class BernoulliMaskPolicy(MaskPolicy):
    """Factorised Bernoulli over the best low-res mask logits z ``[N, h, w]``, on a grid pooled by k.

        z_c = avg_pool_k(z) / tau                                             [N, h/k, w/k]
        log p(m_c) = m_c log sigmoid(z_c) + (1 - m_c) log sigmoid(-z_c)       per cell c; log p(m) is their sum

    Log-probs ``[N, (h/k)(w/k)]``: one element per cell. Pooling (``mask_pool`` = k) trades resolution for
    variance: at k = 1 a 256x256 SAM2 mask is 65,536 independent coin flips, the sampled masks are
    salt-and-pepper noise unlike anything the partner was trained on, and the gradient variance grows with
    the number of cells; a larger k samples coherent k x k blocks (fewer, more meaningful actions) but the
    sampled mask cannot place a boundary finer than k low-res pixels. ``mask_temperature`` tau < 1 sharpens
    towards the greedy mask, tau > 1 explores more. Only the cells whose pixels reach a region sample point through
    the chain can change the partner's input (256-360 of 4,096 at k = 4 on the released presets): the others add
    zero-mean noise to the gradient (``region`` samples only the visible ones).

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
        """Pooled, temperature-scaled fp32 logits ``[N, h/k, w/k]``."""
        z = head.decoded.best_logits.float()  # [N, h, w]
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
        action = bernoulli_sample(z, generator) if action is None else action  # [N, h', w'] bool
        return action, bernoulli_log_prob(z, action).flatten(1)  # [N, h'w']

    def decision_logits(self, head: MaskHead, action: Tensor) -> Tensor:
        """The sampled cells upsampled (nearest) to ``[N, h, w]`` as ±1 logits."""
        pred_cells = action.float()[:, None]  # [N, 1, h', w']
        pred_mask = F.interpolate(pred_cells, scale_factor=self.pool, mode="nearest")[:, 0] > 0.5  # [N, h, w]
        return _sign_logits(pred_mask)


class GaussianSegPolicy(MaskPolicy):
    """Diagonal Gaussian on the ``[SEG]`` prompt e ``[N, 256]``: e' = e + sigma * eps, eps ~ N(0, I).

        log N(e'_d; e_d, sigma^2) = -(e'_d - e_d)^2 / (2 sigma^2) - log sigma - log(2 pi) / 2

    Returned per dimension ``[N, 256]``, not summed, so the loss can treat the dimensions like the tokens of a
    sequence (per-element ratio at ``token`` level, one ratio per prompt at ``sequence`` level). The sample e' and
    the log-density are fp32 whatever the model's dtype (in bf16, e' - e would keep ~3 significant digits). The
    mask the partner sees comes from re-running the decoder on e' (``decision_logits``). ``seg_noise_std`` sigma is
    in the units of the prompt embedding and is fixed (not learned).

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
        """Sample (``action`` None) or re-score e' ``[N, 256]`` fp32; fp32 log-probs ``[N, 256]``."""
        e = head.seg_prompt.float()  # [N, 256]
        if action is None:
            noise = torch.randn(e.shape, generator=generator, device=e.device, dtype=torch.float32)
            action = e.detach() + self.std * noise  # [N, 256] fp32
        z = (action.float() - e) / self.std  # [N, 256]
        log_prob = -0.5 * z**2 - math.log(self.std) - 0.5 * math.log(2.0 * math.pi)  # [N, 256]
        return action, log_prob

    def decision_logits(self, head: MaskHead, action: Tensor) -> Tensor:
        """The decoder's best logits ``[N, h, w]`` for the sampled prompt e' (no grad: the environment)."""
        with torch.no_grad():
            return head.decode(action.to(head.seg_prompt.dtype)).best_logits


class MultimaskPolicy(MaskPolicy):
    """Categorical over SAM2's 3 multimask outputs, logits s_k / tau from the IoU head's scores ``[N, 3]``.

        s_k = iou_k                 (multimask_score = "iou": scores in (0, 1), a mild preference)
        s_k = log(iou_k / (1 - iou_k))  (multimask_score = "logit_iou": undoes the IoU head's sigmoid)
        log p(k) = log_softmax(s / tau)_k

    One action element per rollout: log-probs ``[N, 1]`` (fp32). Greedy upstream inference picks argmax_k iou_k,
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
        """Categorical logits ``[N, 3]`` (fp32)."""
        return self.score(head.decoded.iou_scores.float()) / self.temperature

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


MASK_POLICIES = {p.name: p for p in (RegionMaskPolicy, BernoulliMaskPolicy, GaussianSegPolicy, MultimaskPolicy)}

# mask_policy value of the deterministic loop-2 action: no mask distribution, the answer text is the action
# (grpo.cycle.AnswerToMaskLoop); it has no MaskPolicy
DETERMINISTIC_MASK = "deterministic"


def build_mask_policy(config) -> MaskPolicy | None:
    """``MASK_POLICIES[config.mask_policy]`` built with its knobs from a validated ``GRPOConfig``; None for
    ``mask_policy='deterministic'`` (no mask is sampled)."""
    if config.mask_policy == DETERMINISTIC_MASK:
        return None
    return MASK_POLICIES[config.mask_policy].from_config(config)
