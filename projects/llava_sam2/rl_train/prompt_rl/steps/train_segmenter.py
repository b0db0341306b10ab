"""Short, seeded CPU SFT of the tiny Sa2VA preset on shapes-world referring segmentation.

    sa2va-rl prompt-rl segmenter OUT_DIR [--steps 400] [--batch-size 8] [--lr 2e-3] [--seed 0]

Trains with the upstream SFT loss (``model/sft/sft_loss.py`` ``sft_loss``: token CE + 2.0 BCE + 0.5 Dice on PointRend
points) over ``RegionSFTDataset(ShapesWorld('train'), tasks=('segment',))`` with AdamW (linear warm-up, cosine
decay). ``--init DIR`` starts from a checkpoint instead of random weights.

Encoders: ``Sa2VAModel.encode_vision`` and ``GroundingEncoder.encode`` run under ``no_grad`` by design (upstream
freezes pretrained encoders). A *random* frozen SAM2 encoder leaves the tiny decoder unable to tell objects apart:
measured here, even an oracle colour+shape prompt embedding plateaued at point-Dice loss ~0.33 on 2+-object
scenes. So by default this step trains the encoders too, by calling the undecorated functions (``__wrapped__``)
on this model instance only; ``--freeze-encoders`` keeps the frozen behaviour. The saved checkpoint is an ordinary
one: inference and RL keep the encoders frozen.

LLM: ``--train-llm head`` (default) trains only the LM head of the tiny LLM and keeps its random body frozen.
Trained in full from random init, the LM loss at the ``[SEG]`` position (whose next token is always '.') collapses
the ``[SEG]`` state to a constant: measured, its std across prompts fell from 0.49 (random body) to 0.017, and the
masks no longer depended on the text at all. A pretrained LLM (real Sa2VA) does not have this problem; ``full``
trains every LLM weight as upstream SFT does.

IoU head: Sa2VA keeps SAM2's multimask decoding and picks the output with the highest *predicted* IoU, but its SFT
loss never trains that head (the released model inherits it from SAM2's own training). From random init the head
is untrained, its argmax flips between the three outputs, only the picked one is trained, and at test time another
(untrained, often empty) output can be picked. So this step adds SAM's IoU-prediction loss
(``sft_loss(..., iou_loss_weight=w)``: ``w * MSE(iou_scores, IoU of each of the 3 outputs vs GT)``, Kirillov et
al. 2023).
This stands in for SAM2's pretraining; the SFT loss itself is upstream's. OUT_DIR gets the HF-layout checkpoint
(``save_pretrained``), the tokenizer and ``train_log.json`` (losses, held-out IoU/Dice on ``ShapesWorld('val')`` with the RES eval prompt, wall time).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import types
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint import load_pretrained, save_pretrained
from projects.llava_sam2.rl_train.model.network.presets import build_preset
from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel
from projects.llava_sam2.rl_train.model.sft.sft_data import RegionSFTDataset
from projects.llava_sam2.rl_train.model.sft.sft_loss import sft_loss
from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor, sft_collate
from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer, load_tokenizer
from projects.llava_sam2.rl_train.prompt_rl.evaluate import evaluate_default_prompt, text_sensitivity

PROG = "sa2va-rl prompt-rl segmenter"


def build_model(init: str | None, seed: int) -> tuple[Sa2VAModel, object]:
    """The tiny preset at random init (seeded), or a checkpoint; returns (model, tokenizer)."""
    if init:
        tokenizer = load_tokenizer(init)
        model = load_pretrained(init, torch_dtype=torch.float32)
    else:
        tokenizer = load_tiny_tokenizer()
        torch.manual_seed(seed)
        model = Sa2VAModel(build_preset("tiny", vocab_size=len(tokenizer)))
    model.bind_tokenizer(tokenizer)
    return model, tokenizer


def set_trainable(model: Sa2VAModel, freeze_encoders: bool, train_llm: str) -> list[torch.nn.Parameter]:
    """All tensors trainable except: the LLM body unless ``train_llm == 'full'`` (and its head with ``'none'``);
    the encoders when ``freeze_encoders`` (then they stay random and frozen)."""
    model.requires_grad_(True)
    if train_llm != "full":
        model.language_model.requires_grad_(False)
        if train_llm == "head":
            model.get_output_embeddings().requires_grad_(True)
    if freeze_encoders:
        model.vision_model.requires_grad_(False)
        model.grounding_encoder.sam2_model.image_encoder.requires_grad_(False)
    else:  # instance-level override of the no_grad encoder calls (see module doc); the classes are untouched
        model.encode_vision = types.MethodType(type(model).encode_vision.__wrapped__, model)
        grounding = model.grounding_encoder
        grounding.encode = types.MethodType(type(grounding).encode.__wrapped__, grounding)
    return [p for p in model.parameters() if p.requires_grad]


def lr_factor(step: int, steps: int, warmup: int) -> float:
    """Linear warm-up to 1 over ``warmup`` steps, then cosine decay to 0.1 at ``steps``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def train(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    model, tokenizer = build_model(args.init, args.seed)
    processor = Sa2VAProcessor.from_config(tokenizer, model.config)
    world = ShapesWorld("train", args.num_samples, seed=args.seed, min_objects=args.min_objects,
                        max_objects=args.max_objects)
    data = RegionSFTDataset(world, processor,
                            tasks=("segment",), seed=args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, collate_fn=sft_collate, drop_last=True,
                        generator=torch.Generator().manual_seed(args.seed))
    params = set_trainable(model, args.freeze_encoders, args.train_llm)
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, args.steps, args.warmup))
    points = torch.Generator().manual_seed(args.seed)
    log, step, start = [], 0, time.perf_counter()
    model.train()
    while step < args.steps:
        for batch in loader:
            losses = sft_loss(model, batch, num_points=args.num_points, generator=points,
                              iou_loss_weight=args.iou_loss_weight)
            total = losses["llm_loss"] + args.mask_loss_weight * (losses["loss_mask"] + losses["loss_dice"]) \
                + losses.get("loss_iou", 0.0)
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            if step % args.log_every == 0 or step == args.steps:
                row = {"step": step, **{k: round(float(v.detach()), 4) for k, v in losses.items()},
                       "elapsed_s": round(time.perf_counter() - start, 1)}
                log.append(row)
                print(json.dumps(row), flush=True)
            if step == args.steps:
                break
    train_s = time.perf_counter() - start
    val_world = ShapesWorld("val", args.eval_samples, seed=args.seed)
    held_out = evaluate_default_prompt(model, processor, val_world)
    held_out["text_sensitivity"] = text_sensitivity(model, processor, val_world)
    print(json.dumps({"held_out": held_out}), flush=True)
    out = Path(args.out_dir)
    save_pretrained(model, out)
    tokenizer.save_pretrained(str(out))
    result = {"args": vars(args), "train_seconds": round(train_s, 1), "log": log, "held_out": held_out,
              "threads": torch.get_num_threads()}
    (out / "train_log.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="checkpoint directory to write")
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=8, help="SFT items per step")
    parser.add_argument("--lr", type=float, default=2e-3, help="AdamW peak learning rate")
    parser.add_argument("--warmup", type=int, default=20, help="linear warm-up steps")
    parser.add_argument("--num-samples", type=int, default=4000, help="ShapesWorld('train') pool size")
    parser.add_argument("--mask-loss-weight", type=float, default=1.0,
                        help="scale of loss_mask + loss_dice against llm_loss (1 = upstream's sum)")
    parser.add_argument("--iou-loss-weight", type=float, default=1.0,
                        help="weight of SAM's IoU-prediction MSE (0 = upstream SFT loss only; see module doc)")
    parser.add_argument("--min-objects", type=int, default=1,
                        help="objects per training scene, at least (2 forces the text to pick the target, but "
                             "measured it only lowered IoU: 0.18 vs 0.39 after 400 steps, text-blind either way)")
    parser.add_argument("--max-objects", type=int, default=4, help="objects per training scene, at most")
    parser.add_argument("--num-points", type=int, default=784,
                        help="PointRend points per mask (784 = 19%% of 64x64 logits, upstream's fraction of 256x256)")
    parser.add_argument("--eval-samples", type=int, default=64, help="ShapesWorld('val') images for the held-out IoU")
    parser.add_argument("--freeze-encoders", action="store_true",
                        help="keep InternViT and the SAM2 image encoder frozen (random at init: weak segmenter)")
    parser.add_argument("--train-llm", choices=("head", "full", "none"), default="head",
                        help="LLM weights to train: LM head only (default, see module doc), all, or none")
    parser.add_argument("--init", default=None, help="start from this checkpoint dir instead of random weights")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights, data order and point sampling")
    parser.add_argument("--log-every", type=int, default=25, help="print losses every N steps")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1: on a shared 2-core machine 2 threads ran ~10x slower)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1:
        parser.error(f"--steps={args.steps} and --batch-size={args.batch_size} must both be >= 1")
    torch.set_num_threads(args.threads)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
