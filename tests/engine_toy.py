"""A toy GRPO algorithm and train model that exercise the MMEngine plumbing without Sa2VA (tests only).

The policy picks one of K actions per prompt (a categorical over a linear head on a frozen embedding); rollouts
sample G actions per prompt from the global torch RNG; the reward is 1 for the prompt's target action plus a
small bonus from the EMA partner's probability of the action (so the partner matters); the loss is REINFORCE with
a group-mean baseline. ``ToyREINFORCE`` implements ``grpo.protocol.GRPOAlgorithm`` (``model``, ``weights``; encode /
rollout / score / compute_advantages / minibatches / policy_loss / after_optimizer_step) with the real hand-offs
(``Rollout`` in ``SampledStep`` / ``ScoredStep`` / ``AdvantagedStep``), its one loop named ``toy`` (metrics
``toy/reward_mean`` ...); ``ToyTrainModel`` implements ``GRPOTrainModel`` with the engine's own precision contexts
(``rollout_precision`` / ``update_precision``).

Fault knobs for the failure tests (iterations are 1-based and read from the message hub, so they survive a
resume): ``nan_loss_at`` multiplies the GRPO loss by NaN, ``ToyTrainModel(nan_sft_at=...)`` the SFT loss;
``flaky_reward_at`` scores through the real ``RewardComposer`` with a second reward that returns None, NaN, inf
for some rollouts, and advantages through ``group_advantages``; ``ToyPromptDataset(bad=...)`` returns
``SkippedSample`` for those prompts and ``toy_region_collate`` drops them as ``region_collate`` does;
``signal_at=(iteration, signal number[, rank])`` makes the process send itself that signal in the middle of that
iteration (after its rollout, before its optimizer step), as a scheduler's SIGTERM would arrive, and with
``signal_children=True`` first to its child processes (DataLoader workers) from another process, as SLURM signals
every process of a job step (a DataLoader worker treats a SIGTERM from its parent as a request to exit).
"""
from __future__ import annotations

import itertools
import os
import signal
import subprocess
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.logging import MessageHub
from mmengine.model import BaseModel
from mmengine.registry import RUNNERS
from torch import nn
from torch.utils.data import Dataset

from projects.llava_sam2.rl_train.data.bad_samples import SkippedSample
from projects.llava_sam2.rl_train.data.collate import RegionBatch
from projects.llava_sam2.rl_train.engine.checkpointing import keep_trainable_state
from projects.llava_sam2.rl_train.engine.registry import ALGORITHMS, build_component
from projects.llava_sam2.rl_train.engine.train_model import rollout_precision, update_precision
from projects.llava_sam2.rl_train.grpo.advantages import group_advantages
from projects.llava_sam2.rl_train.grpo.rollout import AdvantagedStep, CaptionReplay, Rollout, SampledStep, ScoredStep
from projects.llava_sam2.rl_train.rewards import RewardComposer
from projects.llava_sam2.rl_train.rewards.base import RewardInputs, RewardResult
from projects.llava_sam2.rl_train.grpo.weights import WeightSets

NUM_PROMPTS, NUM_ACTIONS = 8, 4
TOY_LOOP = "toy"  # the toy's one loop name: Rollout.loop and the metric prefix


def target_action(prompt: torch.Tensor) -> torch.Tensor:
    return (3 * prompt + 1) % NUM_ACTIONS


def current_iteration() -> int:
    """1-based iteration being trained (RuntimeInfoHook keeps ``iter`` in the message hub; 0 outside a run)."""
    return MessageHub.get_current_instance().get_info("iter", -1) + 1


def child_pids() -> list[int]:
    """The processes this one started (Linux ``/proc``)."""
    pids = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            pids += [int(pid) for pid in f.read().split()]
    return pids


class ToyPromptDataset(Dataset):
    """Prompt ids 0..P-1 (no randomness in loading); prompts in ``bad`` load as ``SkippedSample``."""

    def __init__(self, bad: tuple[int, ...] = ()) -> None:
        self.bad = set(bad)

    def __len__(self) -> int:
        return NUM_PROMPTS

    def __getitem__(self, index: int) -> dict | SkippedSample:
        if index in self.bad:
            return SkippedSample(f"toy/{index}", "toy.json", "bad_mask", "injected by the test")
        return {"prompt": index, "sample_id": f"toy/{index}"}


def toy_region_collate(batch: list) -> RegionBatch:
    """``region_collate`` for toy items: skipped samples leave the batch (which may end up empty)."""
    return RegionBatch([b for b in batch if not isinstance(b, SkippedSample)],
                       [b for b in batch if isinstance(b, SkippedSample)])


class ValuesReward:
    """A reward source that returns given values (None, NaN, inf included) and failure counts, whatever the
    inputs (as a judge does: an invalid answer is None plus a counted failure)."""

    def __init__(self, name: str, weight: float, values: list, failures: dict[str, int] | None = None) -> None:
        self.name, self.weight, self.values, self.failures = name, weight, values, dict(failures or {})

    def __call__(self, inputs) -> RewardResult:
        return RewardResult(values=list(self.values), failures=dict(self.failures))


def toy_sft_collate(batch: list[dict]) -> dict:
    """SFT batches in the ``{'data': ..., 'data_samples': None}`` layout: supervise the target action."""
    prompt = torch.tensor([item["prompt"] for item in batch])
    return {"data": {"prompt": prompt, "target": target_action(prompt)}, "data_samples": None}


class ToyPolicy(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.encoder = nn.Embedding(NUM_PROMPTS, dim)  # frozen "backbone"
        self.head = nn.Linear(dim, NUM_ACTIONS)  # trainable

    def logits(self, prompt: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(prompt))  # [N, K]


@dataclass
class ToyMinibatch:
    rollout: Rollout


@ALGORITHMS.register_module()
class ToyREINFORCE:
    def __init__(self, model: ToyPolicy, weights: WeightSets, num_generations: int = 4,
                 partner_bonus: float = 0.1, fail_at_iter: int | None = None, nan_loss_at: tuple[int, ...] = (),
                 flaky_reward_at: tuple[int, ...] = (), num_iterations: int = 1, signal_at: tuple[int, ...] = (),
                 signal_children: bool = False) -> None:
        self.model, self.weights = model, weights
        self.num_iterations = num_iterations  # passes over each iteration's rollouts: one optimizer step each
        self.num_generations, self.partner_bonus = num_generations, partner_bonus
        self.fail_at_iter, self.calls = fail_at_iter, 0
        self.nan_loss_at, self.flaky_reward_at = set(nan_loss_at), set(flaky_reward_at)
        self.signal_at, self.signal_children = tuple(signal_at), signal_children

    def encode(self, batch: list[dict]) -> torch.Tensor:
        if len(batch) == 0:  # as CycleGRPO.encode (grpo/features.py)
            raise ValueError("ToyREINFORCE.encode: got an empty batch")
        return torch.tensor([sample["prompt"] for sample in batch])  # [B]

    @torch.no_grad()
    def rollout(self, prompts: torch.Tensor) -> SampledStep:
        if self.fail_at_iter is not None and self.calls == self.fail_at_iter:
            raise RuntimeError("ToyREINFORCE: failing on purpose")
        self.calls += 1
        if self.signal_at and current_iteration() == self.signal_at[0]:
            from mmengine.dist import get_rank

            if len(self.signal_at) < 3 or self.signal_at[2] == get_rank():
                if self.signal_children:
                    subprocess.run(["kill", "-s", signal.Signals(self.signal_at[1]).name[3:],
                                    *map(str, child_pids())], check=True)
                os.kill(os.getpid(), signal.Signals(self.signal_at[1]))
        B, G = len(prompts), self.num_generations
        probs = self.model.logits(prompts).softmax(-1)  # [B, K]
        actions = torch.multinomial(probs, G, replacement=True)  # [B, G]
        replay = CaptionReplay(prompt_ids=prompts.repeat_interleave(G)[:, None],  # [N, 1]
                               prompt_attention=torch.ones(B * G, 1, dtype=torch.bool),
                               completion_ids=actions.reshape(B * G, 1),  # [N, 1]
                               image_index=torch.arange(B).repeat_interleave(G))
        rollout = Rollout(group_size=G, old_logp=None, ref_logp=None,
                          action_mask=torch.ones(B * G, 1, dtype=torch.bool),
                          rewards=torch.full((B, G), float("nan")), is_truncated=torch.zeros(B * G, dtype=torch.bool),
                          max_action_length=1, replay=replay, loop=TOY_LOOP)
        inputs = RewardInputs(sample_ids=[f"toy/{int(p)}" for p in prompts.repeat_interleave(G)])
        return SampledStep(prompts, (rollout,), reward_inputs=(inputs,), rollout_stats=({},))

    @torch.no_grad()
    def score(self, sampled: SampledStep) -> ScoredStep:
        scored = []
        for rollout in sampled.rollouts:
            prompts, actions = rollout.replay.prompt_ids[:, 0], rollout.replay.completion_ids[:, 0]  # [N]
            is_hit = (actions == target_action(prompts)).float()  # [N]
            with self.weights.partner(self.model):
                partner_prob = self.model.logits(prompts).softmax(-1).gather(1, actions[:, None])[:, 0]  # [N]
            rewards = (is_hit + self.partner_bonus * partner_prob).reshape(rollout.rewards.shape)
            rollout = rollout.with_rewards(rewards, {"hit/mean": is_hit.mean().item(), "judge/failures/timeout": 1.0})
            if current_iteration() in self.flaky_reward_at:
                rollout = self._score_with_flaky_source(rollout)
            scored.append(rollout)
        return ScoredStep(sampled.features, tuple(scored))

    @staticmethod
    def _score_with_flaky_source(rollout: Rollout) -> Rollout:
        """Re-score through ``RewardComposer``: the toy reward (weight 1) plus a source (weight 0.5) that returns
        None, NaN and inf for the first three rollouts and 0.5 for the others."""
        N = rollout.num_rollouts
        flaky = [None, float("nan"), float("inf")][:N] + [0.5] * max(0, N - 3)
        composer = RewardComposer([ValuesReward("hit", 1.0, rollout.rewards.reshape(-1).tolist()),
                                   ValuesReward("flaky", 0.5, flaky, failures={"invalid_answer": 1})])
        total, stats = composer.compute(RewardInputs(sample_ids=[f"toy/{n}" for n in range(N)]))  # [N]
        return rollout.with_rewards(total.reshape(rollout.rewards.shape), {**rollout.reward_stats, **stats})

    def compute_advantages(self, scored: ScoredStep) -> AdvantagedStep:
        rollouts = []
        for rollout in scored.rollouts:
            if current_iteration() in self.flaky_reward_at:  # the GRPO advantages: unscored rollouts get 0
                advantages, _ = group_advantages(rollout.rewards, "none")  # [N]
            else:
                advantages = (rollout.rewards - rollout.rewards.mean(dim=1, keepdim=True)).reshape(-1)  # [N]
            rollouts.append(rollout.with_advantages(advantages))
        return AdvantagedStep(scored.features, tuple(rollouts))

    def minibatches(self, advantaged: AdvantagedStep):
        for _ in range(self.num_iterations):
            for rollout in advantaged.rollouts:
                yield ToyMinibatch(rollout)

    def policy_loss(self, model: ToyPolicy, minibatch: ToyMinibatch) -> dict[str, torch.Tensor]:
        rollout = minibatch.rollout
        logp = model.logits(rollout.replay.prompt_ids[:, 0]).log_softmax(-1)  # [N, K]
        logp = logp.gather(1, rollout.replay.completion_ids)[:, 0]  # [N]
        loss = -(rollout.advantages * logp).mean()
        if current_iteration() in self.nan_loss_at:
            loss = loss * float("nan")  # a NaN that reaches the gradients, as a real overflow does
        return {"loss": loss, "logp_mean": logp.detach().mean()}

    def after_optimizer_step(self) -> None:
        pass


class ToyTrainModel(BaseModel):
    """A ``grpo.protocol.GRPOTrainModel``: ``build_algorithm`` gives the algorithm new weight sets it owns."""

    def __init__(self, ema_decay: float = 0.9, nan_sft_at: tuple[int, ...] = (),
                 weights_storage_device: str | None = None) -> None:
        super().__init__()
        self.weights_storage_device = weights_storage_device
        self.nan_sft_at = set(nan_sft_at)
        self.policy = ToyPolicy()
        self.policy.encoder.requires_grad_(False)
        self.ema_decay = ema_decay
        keep_trainable_state(self)

    def build_algorithm(self, cfg) -> ToyREINFORCE:
        weights = WeightSets.from_model(self.policy, ema_decay=self.ema_decay, use_reference=False,
                                        storage_device=self.weights_storage_device)
        return build_component(ALGORITHMS, cfg, model=self.policy, weights=weights)

    def rollout_context(self, optim_wrapper):
        return rollout_precision(self, optim_wrapper)

    def update_context(self, optim_wrapper):
        return update_precision(self, optim_wrapper)

    def forward(self, data=None, data_samples=None, mode: str = "loss", grpo_batch=None, algorithm=None,
                sft_loss_weight=1.0):
        losses = {}
        if grpo_batch is not None:
            out = algorithm.policy_loss(self.policy, grpo_batch)
            losses["grpo_loss"] = out.pop("loss")
            losses.update(out)
        if data is not None:
            logits = self.policy.logits(data["prompt"])
            losses["sft_loss"] = sft_loss_weight * F.cross_entropy(logits, data["target"])
            if current_iteration() in self.nan_sft_at:
                losses["sft_loss"] = losses["sft_loss"] * float("nan")
        return losses


TOY_CONFIG = """
# Toy GRPO run written as a lazy pure-Python MMEngine config, like the Sa2VA-RL configs.
from mmengine.dataset import DefaultSampler
from mmengine.hooks import LoggerHook
from mmengine.optim import CosineAnnealingLR, LinearLR, OptimWrapper
from torch.optim import AdamW

from engine_toy import ToyPromptDataset, ToyREINFORCE, ToyTrainModel, toy_region_collate, toy_sft_collate
from projects.llava_sam2.rl_train.engine.hooks import AtomicCheckpointHook, EMAPartnerHook, TrainStateHook
from projects.llava_sam2.rl_train.engine.loop import GRPOLoop

max_iters = 6
model = dict(type=ToyTrainModel)
# bad samples: train_dataloader.dataset.bad=(...) loads those prompts as SkippedSample, which the collate drops
train_dataloader = dict(batch_size=2, num_workers=0, dataset=dict(type=ToyPromptDataset, bad=()),
                        sampler=dict(type=DefaultSampler, shuffle=True), collate_fn=dict(type=toy_region_collate))
sft_dataloader = dict(batch_size=2, num_workers=0, dataset=dict(type=ToyPromptDataset),
                      sampler=dict(type=DefaultSampler, shuffle=True), collate_fn=dict(type=toy_sft_collate))
train_cfg = dict(type=GRPOLoop, max_iters=max_iters, algorithm=dict(type=ToyREINFORCE))
optim_wrapper = dict(type=OptimWrapper, optimizer=dict(type=AdamW, lr=0.05, betas=(0.9, 0.999), weight_decay=0.05),
                     clip_grad=dict(max_norm=1.0))
param_scheduler = [dict(type=LinearLR, start_factor=0.1, by_epoch=False, begin=0, end=2),
                   dict(type=CosineAnnealingLR, eta_min=0.0, by_epoch=False, begin=2, end=max_iters)]
default_hooks = dict(checkpoint=dict(type=AtomicCheckpointHook, interval=3, by_epoch=False),
                     logger=dict(type=LoggerHook, interval=1))
custom_hooks = [dict(type=EMAPartnerHook), dict(type=TrainStateHook)]
randomness = dict(seed=0)
log_processor = dict(by_epoch=False, window_size=1)
env_cfg = dict(dist_cfg=dict(backend="gloo"))
visualizer = None
log_level = "WARNING"
"""


def write_toy_config(directory) -> str:
    """Write the toy config into ``directory`` and return its path (load it with ``Config.fromfile``)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(os.fspath(directory), "toy_grpo.py")
    with open(path, "w") as f:
        f.write(TOY_CONFIG)
    return path


class RecordHook(Hook):
    """Keeps what the loop hands to hooks, to compare runs: the hook points seen and each iteration's outputs
    (without wall-clock values such as ``time/<phase>`` or ``<reward>/time_s``, which differ between runs)."""

    priority = "LOWEST"

    def __init__(self) -> None:
        self.outputs: dict[int, dict[str, float]] = {}
        self.seen: list[tuple[str, int, float]] = []

    def after_rollout(self, runner, batch_idx, data_batch, rollouts) -> None:
        self.seen.append(("after_rollout", batch_idx, float(torch.isnan(rollouts[0].rewards).float().mean())))

    def after_reward(self, runner, batch_idx, data_batch, rollouts) -> None:
        self.seen.append(("after_reward", batch_idx, float(torch.isnan(rollouts[0].rewards).float().mean())))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.outputs[batch_idx + 1] = {k: v for k, v in outputs.items()
                                       if not (k.startswith("time/") or k.endswith("/time_s"))}


_RUNS = itertools.count()


def run_config(config: str, work_dir, *, runner_type: str | None = None, resume_from: str | None = None,
               extra_hooks=(), **options):
    """Train ``config`` in-process (``options``: ``--cfg-options`` style overrides); returns (runner, RecordHook).

    ``resume_from='auto'`` resumes as ``resume=True`` does (MMEngine follows ``last_checkpoint``). Each run gets its
    own experiment name: MMEngine keys the message hub by it, and two runs started within the same second would
    otherwise share one (and its runtime info). ``extra_hooks`` (hook objects) are registered beside the config's.
    """
    cfg = Config.fromfile(str(config))
    cfg.work_dir = str(work_dir)
    cfg.log_level = "WARNING"
    cfg.experiment_name = f"run{os.getpid()}_{next(_RUNS)}"
    if runner_type is not None:
        cfg.runner_type = runner_type
    if resume_from == "auto":
        cfg.resume, cfg.load_from = True, None
    elif resume_from is not None:
        cfg.resume, cfg.load_from = True, resume_from
    cfg.merge_from_dict(options)
    runner = RUNNERS.build(cfg)  # Runner unless cfg.runner_type says otherwise
    record = RecordHook()
    runner.register_hook(record)
    for hook in extra_hooks:
        runner.register_hook(hook)
    runner.train()
    return runner, record
