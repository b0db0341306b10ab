"""Data-parallel parity of one GRPO update: the same global batch on 1 process and on W ranks gives the same loss and
gradient norm, for every ``loss_type`` (run under torchrun; ``sa2va-rl check gpu`` and tests/test_engine_parity.py).

    python -m torch.distributed.run --nproc_per_node=2 -m projects.llava_sam2.rl_train.engine.parity OUT.json \
        [--preset 1b --device cuda --amp bfloat16]

Why it is a real check: ``dapo`` divides by the active tokens of the *global* batch (TRL's ``num_items_in_batch /
num_processes``) and ``scale_rewards='batch'`` by the global batch std, both summed over ranks
(``engine.stats.sum_across_ranks``); a per-rank statistic makes the result depend on how the batch is split whenever
ranks hold different token counts, which the batch here does (captions stop early at random). ``bnpo`` normalises by
each rank's own tokens by definition (TRL: "normalization is performed over the local batch only"), so it is expected
to differ.

How: every rank builds the same seeded model and rolls out the same global batch of B shapes prompts (identical
rollouts whatever the world size), keeps its share of whole groups (B / W prompts) and takes one ``train_step`` as
``GRPOLoop`` does, with an optimizer of lr 0 so the weights stay put between the cases: directly on the model for the
single process (rank 0, before the process group exists, as a 1-GPU run), then through MMEngine's DDP wrapper on all
ranks. On a GPU the step runs in the configs' precision (bf16 weights, fp32 trained tensors, the AMP wrapper's bf16
autocast). Rank 0 writes, per world size and case, the loss and stats reduced over ranks, the gradient norm (after
DDP's average) and each rank's active-token count.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
from dataclasses import replace

import torch

from ..grpo.losses import LOSS_AGGREGATIONS

CASES = [(loss_type, "group") for loss_type in LOSS_AGGREGATIONS] + [("grpo", "batch")]
LOCAL_BY_DEFINITION = {"bnpo": "bnpo normalises by the local batch's tokens by definition (TRL GRPOConfig)"}
PARITY_REWARD = "parity_caption_hash"


def register_caption_hash_reward() -> None:
    """A deterministic loop-1 reward that varies between random captions (a random partner's IoU is all 0, which
    would leave loop 1 without advantages)."""
    from ..rewards import REWARDS, register_reward

    if PARITY_REWARD in REWARDS:
        return

    @register_reward(PARITY_REWARD)
    class CaptionHashReward:
        name, weight = "caption_hash", 1.0

        def __call__(self, inputs):
            return [(sum(map(ord, caption)) % 97) / 97 for caption in inputs.pred_captions]


def stop_early(model, bias: float = 6.0) -> None:
    """Add ``bias`` to the stop token's logit (p(stop) ~ 1/4 per step instead of ~1/V): a random LM almost never ends
    a caption, so all would be ``max_completion_length`` long and every rank would hold the same token count."""
    eos = model.processor.tokenizer.eos_token_id

    def add_bias(module, inputs, logits):
        logits = logits.clone()
        logits[..., eos] += bias
        return logits

    model.sa2va.get_output_embeddings().register_forward_hook(add_bias)


def rank_share(rollout, b0: int, b1: int):
    """Groups ``[b0, b1)`` of a global-batch rollout, with image rows renumbered for the rank's own features (each
    shapes sample has its own image, so the global batch's image b is row b - b0 of the rank's)."""
    from ..grpo.trainer import slice_groups

    part = slice_groups(rollout, b0, b1)
    return replace(part, replay=replace(part.replay, image_index=part.replay.image_index - b0))


def build_model(preset: str, device: torch.device, dtype: torch.dtype | None):
    """Seeded Sa2VA of ``preset`` with LoRA B off zero (every LoRA tensor on a gradient path) and early stops."""
    from .train_model import Sa2VATrainModel

    torch.manual_seed(0)
    lora = dict(r=4, lora_alpha=8, lora_dropout=0.0) if preset == "tiny" else dict(r=128, lora_alpha=256,
                                                                                      lora_dropout=0.0)
    tokenizer = None if preset == "tiny" else str(_tiny_tokenizer_dir())
    model = Sa2VATrainModel(preset=preset, tokenizer=tokenizer, lora=lora, torch_dtype=dtype,
                            gradient_checkpointing=device.type == "cuda",
                            processor_cfg=dict(empty_region="dilate_to_one_cell")).to(device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02)
    stop_early(model)
    return model


def _tiny_tokenizer_dir():
    from ..model.text.tokenizer import TINY_TOKENIZER_DIR

    return TINY_TOKENIZER_DIR


def build_optim_wrapper(model, amp: str | None):
    """lr-0 SGD in MMEngine's wrapper: ``OptimWrapper``, or ``AmpOptimWrapper`` in the configs' bf16 settings."""
    from mmengine.optim import AmpOptimWrapper, OptimWrapper

    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    if amp is None:
        return OptimWrapper(optimizer, clip_grad=dict(max_norm=1e9))
    return AmpOptimWrapper(optimizer=optimizer, dtype=amp, loss_scale=dict(enabled=False),
                           clip_grad=dict(max_norm=1e9))


def run_cases(model, wrapped, optim_wrapper, batch: list, rank: int, world: int) -> dict[str, dict]:
    """Per case: one train_step of ``wrapped`` (the model, or its DDP wrapper) on this rank's share of the global
    batch; the stats reduced over ranks, the gradient norm, each rank's active-token count per loop."""
    import torch.distributed as dist
    from mmengine.logging import MessageHub

    from ..grpo.rollout import ScoredStep
    from ..grpo.trainer import CycleGRPO
    from .stats import mean_of_logs, reduce_across_ranks, rollout_metrics

    hub = MessageHub.get_current_instance()
    b0, b1 = rank * len(batch) // world, (rank + 1) * len(batch) // world
    results, full = {}, None
    for loss_type, scale_rewards in CASES:
        algo = model.build_algorithm(dict(
            type=CycleGRPO, seg_answer_max_tokens=4, seed=None,
            rewards=dict(mask_to_caption=[dict(type=PARITY_REWARD)], caption_to_mask=[dict(type="iou")]),
            config=dict(num_generations=2, max_completion_length=8, beta=0.04, loss_type=loss_type,
                        scale_rewards=scale_rewards)))
        with optim_wrapper.optim_context(model):  # the rollout's precision is the loss pass's (GRPOLoop)
            if full is None:  # the same global batch on every rank and in every case
                torch.manual_seed(1)
                full = algo.score(algo.rollout(algo.encode(batch)))
            share = ScoredStep(algo.encode(batch[b0:b1]), tuple(rank_share(r, b0, b1) for r in full.rollouts))
        advantaged = algo.compute_advantages(share)
        rollouts = advantaged.rollouts
        logs = [wrapped.train_step({"grpo_batch": mb, "algorithm": algo}, optim_wrapper=optim_wrapper)
                for mb in algo.minibatches(advantaged)]
        stats = reduce_across_ranks({**mean_of_logs(logs), **rollout_metrics(rollouts)})
        tokens = [[int(r.action_mask.sum()) for r in rollouts]]
        if world > 1:
            tokens = [None] * world
            dist.all_gather_object(tokens, [int(r.action_mask.sum()) for r in rollouts])
        stats.update(grad_norm=float(hub.get_scalar("train/grad_norm").current()), active_tokens=tokens)
        results[f"{loss_type}/{scale_rewards}"] = stats
    return results


def compare(results: dict[str, dict], rel: float, abs_tol: float = 1e-7) -> list[dict]:
    """One row per case: the 1-process and W-rank loss and gradient norm, their relative differences and a verdict
    (``bnpo`` may differ by definition, ``LOCAL_BY_DEFINITION``: reported, never failed)."""
    worlds = sorted(results, key=int)
    one, many = results[worlds[0]], results[worlds[-1]]
    rows = []
    for case in one:
        row = {"case": case, "world": int(worlds[-1])}
        ok = True
        for key in ("loss", "grad_norm"):
            a, b = float(one[case][key]), float(many[case][key])
            diff = abs(a - b) / max(abs(a), abs(b), 1e-30)
            row.update({f"{key}_1": a, f"{key}_{worlds[-1]}": b, f"{key}_rel_diff": diff})
            ok = ok and (abs(a - b) <= abs_tol or diff <= rel)
        loss_type = case.split("/")[0]
        row["expected_equal"] = loss_type not in LOCAL_BY_DEFINITION
        row["ok"] = ok or not row["expected_equal"]  # a local-by-definition case is reported, not judged
        rows.append(row)
    return rows


def launch(out, nproc: int, args: list[str], log, env: dict[str, str], timeout_s: float = 600.0,
           exit_grace_s: float = 10.0) -> int:
    """Run this module under torchrun with ``nproc`` processes, writing ``out``; returns torchrun's exit code, or 0
    when rank 0 wrote ``out`` and the launch then failed to end within ``exit_grace_s`` (it is killed).

    Why the grace: on CPU (gloo), some launches here finished every case, wrote ``out`` and then never exited (a rank
    in interpreter shutdown, or torchrun's agent after its workers left); the cause is not found. The results are
    complete once rank 0 wrote them: it writes after the last collective of every rank."""
    import signal
    import socket
    import subprocess
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={port}",
           "-m", __name__ if __name__ != "__main__" else "projects.llava_sam2.rl_train.engine.parity", str(out), *args]
    with open(log, "w") as stream:
        proc = subprocess.Popen(cmd, stdout=stream, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline and not os.path.exists(out):
            time.sleep(0.5)
        try:
            return proc.wait(timeout=exit_grace_s if os.path.exists(out) else max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            stream.write(f"\nparity: killed the launch {exit_grace_s:.0f} s after the results were written\n")
            return 0 if os.path.exists(out) else 124


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m projects.llava_sam2.rl_train.engine.parity",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("out", help="JSON written by rank 0: {world size: {case: stats}}")
    parser.add_argument("--preset", default="tiny", help="model size preset (random weights)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--amp", default=None, choices=("bfloat16", "float16"),
                        help="AmpOptimWrapper dtype (the GPU configs: bfloat16); default: fp32 OptimWrapper")
    parser.add_argument("--batch", type=int, default=4, help="global batch of prompts (a multiple of the world size)")
    parser.add_argument("--image-size", type=int, default=64)
    args = parser.parse_args(argv)
    faulthandler.dump_traceback_later(float(os.environ.get("PARITY_WATCHDOG_S", "900")))  # a stuck rank says where
    from .launch import die_with_parent

    die_with_parent()  # torchrun starts its workers in sessions of their own: ending the launch must end them too
    import torch.distributed as dist
    from mmengine.logging import MessageHub
    from mmengine.model import MMDistributedDataParallel

    from ..data.shapes import ShapesWorld

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    MessageHub.get_instance("parity")
    register_caption_hash_reward()
    world_data = ShapesWorld("train", num_samples=args.batch, seed=0, image_size=args.image_size)
    batch = [world_data[i] for i in range(args.batch)]
    dtype = torch.bfloat16 if args.amp else None
    model = build_model(args.preset, device, dtype)
    optim_wrapper = build_optim_wrapper(model, args.amp)
    results = {}
    if int(os.environ.get("RANK", 0)) == 0:
        results["1"] = run_cases(model, model, optim_wrapper, batch, rank=0, world=1)
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        device_ids = [local_rank] if args.device == "cuda" else None  # DDP of CPU modules takes no device ids
        wrapped = MMDistributedDataParallel(module=model, device_ids=device_ids, find_unused_parameters=True)
        results[str(world)] = run_cases(model, wrapped, optim_wrapper, batch, rank, world)
        dist.destroy_process_group()
    if int(os.environ.get("RANK", 0)) == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's shutdown: in 2 of about 6 launches here a rank wrote its results and then never
    # exited (CPU, gloo; the main thread past main(), a thread-pool worker of the reward runner still alive), which
    # kept torchrun waiting until the caller's timeout. Nothing is left to write here.
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(code)
