"""Worker of test_engine_parity.py (run under torchrun, 2 processes): one GRPO update of tiny Sa2VA on a fixed
global batch, as a single process and as two gloo ranks.

Every rank builds the same seeded model and rolls out the same global batch of B = 4 shapes prompts (so the
rollouts are identical whatever the world size), keeps its share of whole groups (B / W prompts), and takes one
``train_step`` with MMEngine's ``OptimWrapper`` (SGD with lr 0, so the weights stay put between the cases), as
``GRPOLoop`` does: directly on the model for the single process (rank 0, before the process group exists), through
MMEngine's DDP wrapper for the two ranks. Rank 0 writes, per world size and case, the logged loss and stats reduced
over ranks, the gradient norm (after DDP's average) and each rank's active-token count to ``argv[1]`` as JSON.
"""
from __future__ import annotations

import faulthandler
import json
import os
import sys
from dataclasses import replace

import torch

from projects.llava_sam2.rl_train.grpo.losses import LOSS_AGGREGATIONS


def caption_hash_reward():
    from projects.llava_sam2.rl_train.rewards import REWARDS, register_reward

    if "parity_caption_hash" in REWARDS:
        return

    @register_reward("parity_caption_hash")
    class CaptionHashReward:
        """Deterministic loop-1 reward that varies between random captions (a random partner's IoU is all 0)."""

        name, weight = "caption_hash", 1.0

        def __call__(self, inputs):
            return [(sum(map(ord, caption)) % 97) / 97 for caption in inputs.pred_captions]


def stop_early(model, bias: float = 6.0) -> None:
    """Add ``bias`` to the stop token's logit (p(stop) ~ 1/4 per step instead of ~1/V): a random tiny LM almost never
    ends a caption, so all would be ``max_completion_length`` long and every rank would hold the same token count."""
    eos = model.processor.tokenizer.eos_token_id

    def add_bias(module, inputs, logits):
        logits = logits.clone()
        logits[..., eos] += bias
        return logits

    model.sa2va.get_output_embeddings().register_forward_hook(add_bias)


def rank_share(rollout, b0: int, b1: int):
    """Groups ``[b0, b1)`` of a global-batch rollout, with image rows renumbered for the rank's own features
    (each shapes sample has its own image, so the global batch's image b is row b - b0 of the rank's)."""
    from projects.llava_sam2.rl_train.grpo.trainer import slice_groups

    part = slice_groups(rollout, b0, b1)
    return replace(part, replay=replace(part.replay, image_index=part.replay.image_index - b0))


CASES = [(loss_type, "group") for loss_type in LOSS_AGGREGATIONS] + [("grpo", "batch")]


def build_model():
    """Tiny Sa2VA (seed 0) with LoRA B off zero, so every LoRA tensor is on a gradient path, and early stops."""
    from projects.llava_sam2.rl_train.engine.train_model import Sa2VATrainModel

    torch.manual_seed(0)
    model = Sa2VATrainModel(preset="tiny", lora=dict(r=4, lora_alpha=8, lora_dropout=0.0),
                            processor_cfg=dict(empty_region="dilate_to_one_cell"))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02)
    stop_early(model)
    return model


def run_cases(model, wrapped, batch: list, rank: int, world: int) -> dict[str, dict]:
    """Per case: one train_step of ``wrapped`` (the model, or its DDP wrapper) on this rank's share of the global
    batch; the stats reduced over ranks, the gradient norm, each rank's active-token count per loop."""
    import torch.distributed as dist
    from mmengine.logging import MessageHub
    from mmengine.optim import OptimWrapper

    from projects.llava_sam2.rl_train.engine.stats import mean_of_logs, reduce_across_ranks, rollout_metrics
    from projects.llava_sam2.rl_train.grpo.trainer import CycleGRPO

    hub = MessageHub.get_instance(f"parity_world{world}")
    optim_wrapper = OptimWrapper(torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0),
                                 clip_grad=dict(max_norm=1e9))
    b0, b1 = rank * len(batch) // world, (rank + 1) * len(batch) // world
    results, full = {}, None
    for loss_type, scale_rewards in CASES:
        algo = model.build_algorithm(dict(
            type=CycleGRPO, seg_answer_max_tokens=4, seed=None,
            rewards=dict(mask_to_caption=[dict(type="parity_caption_hash")], caption_to_mask=[dict(type="iou")]),
            config=dict(num_generations=2, max_completion_length=8, beta=0.04, mask_pool=4, loss_type=loss_type,
                        scale_rewards=scale_rewards)))
        if full is None:  # the same global batch on every rank and in every case
            torch.manual_seed(1)
            full = algo.rollout(algo.encode(batch))
            algo.score(full)
        algo.encode(batch[b0:b1])
        rollouts = [rank_share(r, b0, b1) for r in full]
        algo.compute_advantages(rollouts)
        logs = [wrapped.train_step({"grpo_batch": mb, "algorithm": algo}, optim_wrapper=optim_wrapper)
                for mb in algo.minibatches(rollouts)]
        stats = reduce_across_ranks({**mean_of_logs(logs), **rollout_metrics(rollouts)})
        tokens = [[int(r.action_mask.sum()) for r in rollouts]]
        if world > 1:
            tokens = [None] * world
            dist.all_gather_object(tokens, [int(r.action_mask.sum()) for r in rollouts])
        stats.update(grad_norm=float(hub.get_scalar("train/grad_norm").current()), active_tokens=tokens)
        results[f"{loss_type}/{scale_rewards}"] = stats
    return results


def main(out_path: str) -> None:
    """Rank 0 first trains as a single process (no process group, no DDP: as a 1-GPU run), then both ranks as
    gloo DDP; rank 0 writes ``{"1": ..., "2": ...}``."""
    faulthandler.dump_traceback_later(float(os.environ.get("PARITY_WATCHDOG_S", "600")))  # a stuck rank says where
    torch.set_num_threads(1)  # builds DDP itself without device_ids: no engine/mmengine_seams.cpu_launch needed
    import torch.distributed as dist
    from mmengine.model import MMDistributedDataParallel

    from projects.llava_sam2.rl_train.data.shapes import ShapesWorld

    caption_hash_reward()
    world_data = ShapesWorld("train", num_samples=4, seed=0, image_size=64)
    batch = [world_data[i] for i in range(4)]
    model = build_model()
    results = {}
    if int(os.environ["RANK"]) == 0:
        results["1"] = run_cases(model, model, batch, rank=0, world=1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results[str(world)] = run_cases(model, MMDistributedDataParallel(module=model, find_unused_parameters=True),
                                    batch, rank, world)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
