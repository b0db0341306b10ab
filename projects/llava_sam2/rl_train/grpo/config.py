"""GRPO knobs for the dual-loop trainer: TRL's names and meanings where they match, ours where they do not.

Defaults follow TRL ``GRPOConfig`` (huggingface/trl 1.10.0.dev0, ``trl/trainer/grpo_config.py``) except:

* ``max_completion_length`` 128 (TRL 512): region captions are a few sentences; raise it for detailed-caption
  data such as DLC.
* ``beta`` 0.04 (TRL 0.0 since v0.20): the training step keeps a KL to the reference policy, which costs no extra
  model copy here (``WeightSets.reference``); 0.04 is DeepSeekMath's value and TRL's former default.
* ``reward_weights`` maps reward *names* to weights (TRL: a list parallel to ``reward_funcs``), because the two
  loops score with different reward sets.
* ``scale_rewards`` takes only the strings (TRL also accepts True/False for group/none).
* ``importance_sampling_level`` has TRL's values and meaning (token | sequence, GSPO) and applies to both loops;
  ``mask_importance_sampling_level`` overrides it for loop 2, whose action the reward scores as one unit (the
  mask), with ``mask_length_norm`` choosing how loop 2's sequence term normalises its summed log-ratio.

The remaining knobs are ours: the two loop weights, the EMA partner's decay, the mask policy and the dense mask
losses (``*_dense_*``, grpo/dense.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .advantages import SCALE_REWARDS
from .losses import IMPORTANCE_SAMPLING_LEVELS, LOSS_AGGREGATIONS, SEQUENCE_LENGTH_NORMS
from .dense import DENSE_ROLLOUT_WEIGHTS
from .mask_policy import DETERMINISTIC_MASK, MASK_POLICIES, MultimaskPolicy


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"GRPOConfig: {message}")


@dataclass
class GRPOConfig:
    """All GRPO knobs; validated on construction (``__post_init__``), derived values filled there once."""

    # ---- rollout -------------------------------------------------------------------------------------------
    num_generations: int = 8
    """G, rollouts per prompt in each loop; >= 2 for a baseline (G = 2 makes std-scaled advantages +-0.707)."""
    max_completion_length: int = 128
    """Most tokens sampled per caption (loop 1 and the partner's loop-2 captions); dr_grpo's constant T_max."""
    temperature: float = 1.0
    """Sampling temperature of caption tokens; the loss scores tokens at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1.0 keeps every token."""
    generation_chunk_size: int | None = None
    """Rollouts per sampling call (memory knob), a multiple of num_generations; None samples all B * G at once."""
    video_mllm_frames: int = 5
    """Video steps: frames of each clip the language model sees (the first n; upstream's video input uses 5); SAM2
    sees every frame the data gives."""
    mask_truncated_completions: bool = False
    """Drop captions that hit max_completion_length from the loss (DAPO: truncation noise, not bad captions)."""
    prompt_length_multiple: int | None = None
    """Every prompt batch of the step (policy sampling, old/ref/loss scoring, partner passes) is left padded to a
    multiple of this many tokens, e.g. 64, so a run meets a few prompt shapes instead of one per batch (first-shape
    costs, docs/speed.md); the padding is masked and changes no value. None: padded to the batch's longest."""
    completion_length_multiple: int | None = None
    """Sampled completions are right padded to a multiple of this many tokens (at most max_completion_length), e.g.
    32, so the teacher-forced passes over them meet a few lengths; padded tokens are masked out of every loss term.
    None: the longest completion of the batch."""
    decode_backend: str = "fast"
    """Text decoder of every rollout pass: fast (prefill once per prompt, static KV cache, CUDA graph, LoRA merged into
    scratch weights for the call; transformers Qwen2/Qwen3/Llama/Phi3 LMs) | fast_compiled (the same step through
    torch.compile; compiles once per process, on its first decode call) | fast_adapters (fast with LoRA unmerged: no scratch copy of the adapted
    weights, slower steps) | reference (the plain decode loop it is tested against)."""

    # ---- loss ----------------------------------------------------------------------------------------------
    loss_type: str = "dapo"
    """Loss normalisation, a key of LOSS_AGGREGATIONS: grpo | bnpo | dr_grpo | dapo (see losses.py)."""
    beta: float = 0.04
    """Weight of the k3 KL to the reference (SFT) policy; 0 skips the reference pass."""
    epsilon: float = 0.2
    """Lower clip range: the probability ratio is clipped at 1 - epsilon."""
    epsilon_high: float | None = None
    """Upper clip range (ratio <= 1 + epsilon_high); None reuses epsilon, DAPO's clip-higher uses 0.28."""
    num_iterations: int = 1
    """mu, optimisation passes over each batch of rollouts; 1 keeps the ratio at 1 in value."""
    importance_sampling_level: str = "token"
    """Importance ratio per token (PPO/GRPO) | per sequence, exp(mean_t log-ratio) clipped per rollout (GSPO, arXiv
    2507.18071; TRL's knob and default). Loop 1's captions; loop 2 too unless mask_importance_sampling_level is set."""
    mask_importance_sampling_level: str | None = "sequence"
    """Loop 2's level: sequence (default) clips one ratio per mask, the unit the reward scores (per element, a +-0.05
    logit shift leaves every cell's ratio <= 1.05 while the mask's is ~1e25); token; None gives loop 2 TRL's meaning
    of importance_sampling_level, sequence length norm included (mean, unless mask_length_norm is set)."""
    mask_length_norm: str | None = None
    """Loop 2 at sequence level: nu(T) in log ratio = sum_t log-ratio / nu(T) over a mask's T elements: sqrt
    (measured: loop-2 gradients on the shared trainables of loop 1's scale, docs/mask_action.md) | mean (TRL/GSPO) |
    sum (the whole mask's ratio); None (default) is sqrt, or TRL's mean when mask_importance_sampling_level is None.
    The clip bounds |sum_t log-ratio| by about nu(T) * epsilon per mask."""

    logprob_head: str = "reference"
    """How the LM head scores completion tokens in every log-prob pass (old_logp, ref_logp, the loss), a key of
    model/decoding/generation.py LOGPROB_HEADS: reference (the head over every position, chunked by positions and
    checkpointed) | fused (only the real tokens, the vocabulary padded to a multiple of 64 for the GEMMs, one autograd
    Function that never holds [N, T, V] logits; equal to reference up to float order, docs/speed.md)."""
    compile_loss_layers: bool = False
    """Run each decoder layer of the grouped log-prob passes (old_logp, ref_logp, the loss) through torch.compile
    (Inductor): fused elementwise work, no per-operation Python dispatch; one graph serves all layers. Compiles on the
    first step (per grad/train mode, autocast and adapter state; lengths are symbolic); equal to the eager pass up to float order
    (model/decoding/grouped_scoring.py, docs/speed.md). old_logp is then scored with grad on by the loss's own graph,
    so the first ratio stays exactly 1. Trains on one GPU, under DDP and under DeepSpeed ZeRO-2 (`check gpu` with
    configs/rl/gpu_smoke_1b_compiled_loss.py); off in the released configs, where it did not speed up the 4b step."""
    joint_loop_scoring: bool = True
    """When both loops run on the same image samples (paired data, a stochastic mask policy, Sa2VA's InternVL
    family), score them in one pass per chunk: each sample's image block runs once, and loop 2's RES prompt (its
    tokens after the image, then the forced answer) reads it as loop 1's captions do. Used for ref_logp, a
    re-scored old_logp and the loss; equal to the separate passes up to float order (cycle.joint_action_logps). False:
    each loop runs its own prompts."""
    uncheckpointed_layers: int = 0
    """With activation checkpointing on: the last k decoder layers of the grouped log-prob passes keep their
    activations for backward instead of recomputing them (k layer forwards fewer per backward, k layers' activations
    more memory; docs/speed.md says how to pick k by peak memory). 0 checkpoints every layer; at most the LM's layer
    count."""

    # ---- rewards and advantages ----------------------------------------------------------------------------
    scale_rewards: str = "group"
    """Advantage divisor: group (std per prompt, GRPO) | batch (batch std, Lite PPO) | none (Dr. GRPO)."""
    reward_weights: dict[str, float] | None = None
    """Reward name -> weight, overriding each reward's own weight; None keeps them. Finite; a negative weight
    penalises (TRL: total = sum_r w_r v_r), 0 computes and logs the reward without training on it."""
    mask_to_caption_weight: float = 1.0
    """Weight of loop 1's loss (mask -> caption -> mask', reward IoU) in the step's total loss; 0 turns it off."""
    caption_to_mask_weight: float = 1.0
    """Weight of loop 2's loss (caption -> mask -> caption', METEOR + judge) in the total loss; 0 turns it off."""

    # ---- partner -------------------------------------------------------------------------------------------
    ema_decay: float = 0.999
    """EMA partner: partner = decay * partner + (1 - decay) * policy once per iteration, after all its optimizer steps
    (num_iterations x minibatches); the partner is read once per iteration, when rollouts are scored, so the decay
    counts iterations whatever the minibatching."""

    # ---- mask policy (loop 2 action) -----------------------------------------------------------------------
    mask_policy: str = "region"
    """Stochastic mask policy, a key of MASK_POLICIES: region (Bernoulli over the partner's region cells: every draw
    can change the partner's input) | bernoulli (pooled low-res cells) | gaussian_seg | multimask (mask_policy.py);
    or deterministic: no sampled mask, the policy samples its answer text to the RES prompt (GRPO on those tokens,
    at importance_sampling_level) and the mask is the greedy mask of the answer's [SEG] (docs/mask_action.md)."""
    mask_temperature: float = 1.0
    """tau of region / bernoulli (logits / tau) and multimask (scores / tau); < 1 is closer to greedy decoding."""
    mask_pool: int = 4
    """bernoulli: sample on the low-res grid pooled k x k (larger: coherent blocks, less variance, coarser)."""
    seg_noise_std: float = 0.1
    """gaussian_seg: sigma of the noise added to the 256-d [SEG] prompt embedding, in its units."""
    multimask_score: str = "logit_iou"
    """multimask: categorical scores from the IoU head, iou (raw) | logit_iou (logit of the predicted IoU)."""

    # ---- dense mask objectives (Dice + BCE on the policy's [SEG] mask logits; grpo/dense.py) -------------------
    mask_to_caption_dense_weight: float = 0.0
    """Loop 1: weight of a Dice + BCE loss that pulls the policy's own segmentation of each sampled caption (RES
    prompt, teacher-forced [SEG] answer, with gradient) toward the input region; the region is the data's and the
    caption the policy's, so no caption label is used. 0 (default) switches it off: the loss is then exactly the
    policy-gradient loss."""
    mask_to_caption_dense_rollouts: str = "positive"
    """Which loop-1 rollouts get the dense loss, and their weight: positive (advantage > 0, weight 1) | advantage
    (weight max(A, 0)) | best (the group's highest advantage, if > 0); a weighted mean over the minibatch."""
    caption_to_mask_dense_weight: float = 0.0
    """Loop 2 with mask_policy='deterministic': weight of a Dice + BCE self-training loss that pulls every rollout's
    [SEG] mask toward the mask of its group's best-scored member (the one whose partner description scored best);
    groups with equal rewards get none. 0 (default): the answer-token policy gradient alone."""
    dense_num_points: int = 12544
    """PointRend points per mask of both dense losses (upstream's SFT value for 256 x 256 logits)."""

    def __post_init__(self) -> None:
        self._validate_rollout()
        self._validate_loss()
        self._validate_rewards()
        _require(0 < self.ema_decay < 1,
                 f"ema_decay={self.ema_decay}; it must lie in (0, 1), e.g. 0.999 (MMEngine momentum 0.001).")
        self._validate_mask_policy()
        self._validate_dense()
        # Derived once (TRL): the upper clip range defaults to the lower one; loop 2's level to the global one.
        if self.epsilon_high is None:
            self.epsilon_high = self.epsilon
        if self.mask_importance_sampling_level is None:  # TRL's meaning on loop 2: its level and its mean norm
            self.mask_importance_sampling_level = self.importance_sampling_level
            self.mask_length_norm = "mean" if self.mask_length_norm is None else self.mask_length_norm
        elif self.mask_length_norm is None:
            self.mask_length_norm = "sqrt"

    def _validate_rollout(self) -> None:
        G = self.num_generations
        _require(isinstance(G, int) and G >= 2,
                 f"num_generations={G!r}; GRPO needs at least 2 rollouts per prompt for a group baseline "
                 "(>= 8 recommended). Set num_generations >= 2.")
        _require(self.generation_chunk_size is None or (self.generation_chunk_size > 0
                                                        and self.generation_chunk_size % G == 0),
                 f"generation_chunk_size={self.generation_chunk_size} is not a positive multiple of "
                 f"num_generations={G}; a prompt's G rollouts must share one sampling call. Use a multiple of "
                 f"{G} or None.")
        from ..model.decoding.fast_generation import DECODE_BACKENDS  # here: keeps `import grpo` free of transformers' models

        _require(isinstance(self.video_mllm_frames, int) and self.video_mllm_frames >= 1,
                 f"video_mllm_frames={self.video_mllm_frames!r} must be an int >= 1 (upstream: 5)")
        _require(self.decode_backend in DECODE_BACKENDS,
                 f"decode_backend={self.decode_backend!r} is not one of {sorted(DECODE_BACKENDS)}; use 'fast' "
                 "(default) or 'reference' (for LMs the fast path does not support).")
        for knob in ("prompt_length_multiple", "completion_length_multiple"):
            value = getattr(self, knob)
            _require(value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1),
                     f"{knob}={value!r}; use None (no buckets) or an int >= 1, e.g. 64 for prompts, 32 for "
                     "completions.")
        _require(self.max_completion_length >= 1,
                 f"max_completion_length={self.max_completion_length}; it must be >= 1 token.")
        _require(self.temperature > 0, f"temperature={self.temperature}; it must be > 0 (sampling needs it).")
        _require(0 < self.top_p <= 1, f"top_p={self.top_p}; it must lie in (0, 1], 1.0 disables nucleus sampling.")

    def _validate_loss(self) -> None:
        _require(self.loss_type in LOSS_AGGREGATIONS,
                 f"loss_type={self.loss_type!r} is not one of {sorted(LOSS_AGGREGATIONS)}; pick one of them "
                 "('dapo' is TRL's default).")
        _require(self.beta >= 0, f"beta={self.beta}; the KL weight must be >= 0 (0 disables the reference pass).")
        _require(0 < self.epsilon < 1, f"epsilon={self.epsilon}; the clip range must lie in (0, 1), e.g. 0.2.")
        _require(self.epsilon_high is None or self.epsilon_high > 0,
                 f"epsilon_high={self.epsilon_high}; it must be > 0 (DAPO uses 0.28) or None to reuse epsilon.")
        _require(isinstance(self.num_iterations, int) and self.num_iterations >= 1,
                 f"num_iterations={self.num_iterations!r}; it must be an integer >= 1.")
        levels = sorted(IMPORTANCE_SAMPLING_LEVELS)
        _require(self.importance_sampling_level in IMPORTANCE_SAMPLING_LEVELS,
                 f"importance_sampling_level={self.importance_sampling_level!r} is not one of {levels} (TRL's values; "
                 "'token' is TRL's default).")
        _require(self.mask_importance_sampling_level in (*IMPORTANCE_SAMPLING_LEVELS, None),
                 f"mask_importance_sampling_level={self.mask_importance_sampling_level!r} is not one of {levels} or "
                 "None (None reuses importance_sampling_level).")
        _require(self.mask_length_norm in (*SEQUENCE_LENGTH_NORMS, None),
                 f"mask_length_norm={self.mask_length_norm!r} is not one of {sorted(SEQUENCE_LENGTH_NORMS)}; 'sqrt' is "
                 "the default, 'mean' is TRL's sequence level.")
        from ..model.decoding.generation import LOGPROB_HEADS  # here: as DECODE_BACKENDS above

        k = self.uncheckpointed_layers
        _require(isinstance(k, int) and not isinstance(k, bool) and k >= 0,
                 f"uncheckpointed_layers={k!r}; it must be an int >= 0: the number of last decoder layers kept out of "
                 "activation checkpointing (0 checkpoints every layer).")
        _require(self.logprob_head in LOGPROB_HEADS,
                 f"logprob_head={self.logprob_head!r} is not one of {sorted(LOGPROB_HEADS)}; use 'reference' "
                 "(default) or 'fused' (the head over real tokens only, docs/speed.md).")

    def _validate_rewards(self) -> None:
        _require(self.scale_rewards in SCALE_REWARDS,
                 f"scale_rewards={self.scale_rewards!r} is not one of {sorted(SCALE_REWARDS)}; use 'group', "
                 "'batch' or 'none' (strings, not True/False).")
        for name, weight in (self.reward_weights or {}).items():
            _require(math.isfinite(weight), f"reward_weights[{name!r}]={weight}; weights must be finite numbers.")
        loop_weights = (self.mask_to_caption_weight, self.caption_to_mask_weight)
        _require(min(loop_weights) >= 0 and max(loop_weights) > 0,
                 f"mask_to_caption_weight={loop_weights[0]}, caption_to_mask_weight={loop_weights[1]}; both must be "
                 ">= 0 and at least one > 0 (0 switches that loop's loss off).")

    def _validate_mask_policy(self) -> None:
        choices = sorted([*MASK_POLICIES, DETERMINISTIC_MASK])
        _require(self.mask_policy in choices, f"mask_policy={self.mask_policy!r} is not one of {choices}.")
        _require(self.mask_temperature > 0, f"mask_temperature={self.mask_temperature}; it must be > 0.")
        _require(isinstance(self.mask_pool, int) and self.mask_pool >= 1,
                 f"mask_pool={self.mask_pool!r}; it must be an integer >= 1 (1 = no pooling).")
        _require(self.seg_noise_std > 0, f"seg_noise_std={self.seg_noise_std}; it must be > 0.")
        _require(self.multimask_score in MultimaskPolicy.SCORES,
                 f"multimask_score={self.multimask_score!r} is not one of {sorted(MultimaskPolicy.SCORES)}.")

    def _validate_dense(self) -> None:
        for knob in ("mask_to_caption_dense_weight", "caption_to_mask_dense_weight"):
            value = getattr(self, knob)
            _require(math.isfinite(value) and value >= 0, f"{knob}={value}; it must be a finite number >= 0 "
                     "(0 switches the dense loss off).")
        _require(self.mask_to_caption_dense_rollouts in DENSE_ROLLOUT_WEIGHTS,
                 f"mask_to_caption_dense_rollouts={self.mask_to_caption_dense_rollouts!r} is not one of "
                 f"{sorted(DENSE_ROLLOUT_WEIGHTS)}.")
        _require(self.caption_to_mask_dense_weight == 0 or self.mask_policy == DETERMINISTIC_MASK,
                 f"caption_to_mask_dense_weight={self.caption_to_mask_dense_weight} needs "
                 f"mask_policy={DETERMINISTIC_MASK!r} (its target is the best member's deterministic [SEG] mask); "
                 f"got mask_policy={self.mask_policy!r}.")
        _require(isinstance(self.dense_num_points, int) and self.dense_num_points >= 1,
                 f"dense_num_points={self.dense_num_points!r}; it must be an integer >= 1.")
