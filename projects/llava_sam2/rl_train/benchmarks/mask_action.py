"""Loop 1 vs loop 2 of one GRPO step: gradient scale on the shared trainables, the mask action's size and
partner-visible share, and what one optimizer step does to the per-element and per-mask ratios (docs/mask_action.md).

    python -m projects.llava_sam2.rl_train.benchmarks.mask_action --preset tiny                     # defaults
    python -m projects.llava_sam2.rl_train.benchmarks.mask_action --preset tiny --mask-policy bernoulli \
        --mask-importance-sampling-level token                                                      # the old default
    python -m projects.llava_sam2.rl_train.benchmarks.mask_action --preset 1b --device cuda --dtype bfloat16 \
        --lora-r 128 --image-size 448 --variants before region_sqrt region_mean region_sum          # a real preset

One ``CycleGRPO`` step on a shapes-world batch, with the GRPO knobs given as flags (``--mask-policy``,
``--importance-sampling-level``, ``--mask-importance-sampling-level``, ``--mask-length-norm``, ...) or as named
``--variants`` laid over them (``VARIANTS``; each variant starts from the same weights, batch and draws):

1. rollout of both loops (random weights unless ``--checkpoint``; ``num_iterations=2`` so ``old_logp`` is stored);
   the advantages are replaced by seeded N(0, 1) draws, so the loops are compared on the estimator's scale, not on
   what the random model happens to earn;
2. per loop, the loss of that loop alone (loop weight 1) is back-propagated and the gradient norm is read per
   trainable group: ``llm_lora``, ``mlp1``, ``text_hidden_fcs`` (the shared trainables, also as ``shared``) and
   ``sam2_mask_decoder``;
3. loop 2's action: elements per rollout (T) and the share of them that can change the partner's input, the
   region cells (``region``: flip each cell of one mask per group and check ``region_cells`` of the painted mask;
   ``bernoulli``: pooled cells that reach a region sample point through the released chain; none for
   ``gaussian_seg`` / ``multimask``, whose actions are not cell grids);
4. one Adam step (``--lr``) on the sum of both loop losses, then the stored actions are re-scored: per loop the
   largest |log-ratio| of an element and of a whole action (the sum over its elements), the fraction of elements and
   of whole actions whose ratio left [1 - epsilon, 1 + epsilon_high], and the fraction of importance weights the loss
   clips (per element at token level, per action at sequence level; TRL's sign-aware count).

Random-weight caveat: the gradient that reaches the LLM through a random SAM2 decoder is not a pretrained model's; the
loop-2 / loop-1 ratio is the comparison this measures (``--checkpoint`` runs the same on trained weights).
Results: docs/mask_action.md.
"""
from __future__ import annotations

import argparse
import json
import math
import resource
import time
from collections.abc import Callable

import torch

from ..data.shapes import ShapesWorld
from ..grpo.rollout import AdvantagedStep
from ..grpo.trainer import CycleGRPO
from ..grpo.weights import WeightSets
from ..model.checkpoints.dtypes import as_torch_dtype, default_dtype
from ..model.checkpoints.hf_checkpoint import load_pretrained
from ..model.network.lora import apply_lora, configure_trainable
from ..model.network.presets import build_preset
from ..model.network.sa2va import Sa2VAModel
from ..model.pipeline.region_chain import MaskChain, chain_rows
from ..model.text.processor import Sa2VAProcessor
from ..model.text.tokenizer import load_tiny_tokenizer

# trainable group -> predicate on the parameter name
GROUPS: dict[str, Callable[[str], bool]] = {
    "llm_lora": lambda name: "lora_" in name,
    "mlp1": lambda name: name.startswith("mlp1."),
    "text_hidden_fcs": lambda name: name.startswith("text_hidden_fcs."),
    "sam2_mask_decoder": lambda name: ".sam_mask_decoder." in name,
}
SHARED = ("llm_lora", "mlp1", "text_hidden_fcs")  # what both loops train


def build(args) -> tuple[Sa2VAModel, Sa2VAProcessor]:
    """The preset with random weights (built directly in ``--dtype``) or ``--checkpoint``, LoRA r / alpha 2r with
    lora_B ~ N(0, 0.02) (at B = 0 lora_A gets no gradient) and the SFT trainable set."""
    tokenizer = load_tiny_tokenizer()
    dtype = as_torch_dtype(args.dtype, "--dtype")
    torch.manual_seed(args.seed)
    if args.checkpoint:
        model = load_pretrained(args.checkpoint, torch_dtype=dtype, device=args.device)
    else:
        with default_dtype(dtype), torch.device(args.device):
            model = Sa2VAModel(build_preset(args.preset, vocab_size=len(tokenizer)))
    model.bind_tokenizer(tokenizer)
    model.language_model = apply_lora(model.language_model, r=args.lora_r, lora_alpha=2 * args.lora_r,
                                      lora_dropout=0.0)
    configure_trainable(model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02)
    return model, Sa2VAProcessor.from_config(tokenizer, model.config, empty_region="dilate_to_one_cell")


def grad_norms(model) -> dict[str, float]:
    """L2 norm of the gradient per trainable group, plus ``shared`` (the groups both loops train)."""
    sq = {group: 0.0 for group in GROUPS}
    for name, param in model.named_parameters():
        for group, is_member in GROUPS.items():
            if param.grad is not None and is_member(name):
                sq[group] += float(param.grad.float().pow(2).sum())
    norms = {group: math.sqrt(value) for group, value in sq.items()}
    norms["shared"] = math.sqrt(sum(sq[group] for group in SHARED))
    return norms


# ---- partner-visible share of loop 2's action elements, per mask policy ---------------------------------------


def region_share(algo, rollout, features) -> float:
    """``region``: flip each cell of the first mask of every group; the share whose flip changes the partner's cells."""
    proc, G, g = algo.processor, rollout.group_size, algo.processor.region_grid_size
    shares = []
    for row in range(0, rollout.num_rollouts, G):
        size = tuple(features.image_sizes[int(rollout.replay.image_index[row])])
        chain = MaskChain(sizes=(size,), sam_image_size=int(algo.model.config.sam_image_size), grid_size=g)
        cells = rollout.replay.action[row].cpu()  # [g, g] bool
        seen = proc.region_cells(chain.cells_to_masks(cells[None])[0], size=size, empty_region="keep")
        changed = 0
        for r, c in torch.cartesian_prod(torch.arange(g), torch.arange(g)).tolist():
            flipped = cells.clone()
            flipped[r, c] = ~flipped[r, c]
            mask = chain.cells_to_masks(flipped[None])[0]
            changed += int(not torch.equal(proc.region_cells(mask, size=size, empty_region="keep"), seen))
        shares.append(changed / g**2)
    return sum(shares) / len(shares)


def pooled_share(algo, rollout, features) -> float:
    """``bernoulli``: pooled k x k cells with a pixel whose logit reaches a region sample point through the chain
    (h -> S_sam -> (H, W) bilinear): a cell outside that support cannot change the partner's cells."""
    k, G = algo.context.mask_policy.pool, rollout.group_size
    sam, g = int(algo.model.config.sam_image_size), algo.processor.region_grid_size
    h, w = (side * k for side in rollout.replay.action.shape[1:])
    shares = []
    for row in range(0, rollout.num_rollouts, G):
        H, W = features.image_sizes[int(rollout.replay.image_index[row])]
        rows = (chain_rows(h, sam, int(H), g).abs() > 0).any(0).view(-1, k).any(-1)  # [h/k]
        cols = (chain_rows(w, sam, int(W), g).abs() > 0).any(0).view(-1, k).any(-1)  # [w/k]
        shares.append(float((rows[:, None] & cols[None, :]).float().mean()))
    return sum(shares) / len(shares)


VISIBLE_SHARE = {"region": region_share, "bernoulli": pooled_share}  # other policies: not a cell grid


# ---- the measurement ------------------------------------------------------------------------------------------


def loop_gradients(algo, model, features, rollouts) -> dict[str, dict]:
    """Per loop: gradient norms of that loop's loss alone, its action size and (loop 2) partner-visible share."""
    out = {}
    B = features.num_samples
    model.train()
    for loop, rollout in zip(algo.loops, rollouts):
        model.zero_grad(set_to_none=True)
        tiles = model.project_vision(features.vit_tokens)  # [n_tiles, t, D]
        logp = loop.action_logp(model, features, tiles, rollout, range(B))  # [N, T]
        loss, _ = loop.loss_fn(logp, rollout)
        loss.backward()
        share = VISIBLE_SHARE.get(algo.config.mask_policy) if loop.name == "caption_to_mask" else None
        out[loop.name] = {"grad_norm": grad_norms(model), "action_elements": int(logp.shape[1]),
                          "active_elements_mean": float(rollout.action_mask.float().sum(1).mean()),
                          "partner_visible_share": None if share is None else share(algo, rollout, features)}
    model.zero_grad(set_to_none=True)
    return out


def after_one_step(algo, model, advantaged: AdvantagedStep, lr: float) -> dict[str, dict]:
    """One Adam step on both loops' loss, then per loop the ratios of the stored actions under the new weights."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=lr)
    features, rollouts = advantaged.features, advantaged.rollouts
    minibatch = next(iter(algo.minibatches(advantaged)))
    algo.policy_loss(model, minibatch)["loss"].backward()
    optimizer.step()
    model.zero_grad(set_to_none=True)
    lo, hi = 1.0 - algo.config.epsilon, 1.0 + algo.config.epsilon_high
    out = {}
    with torch.no_grad():
        tiles = model.project_vision(features.vit_tokens)
        for loop, rollout in zip(algo.loops, rollouts):
            logp = loop.action_logp(model, features, tiles, rollout, range(features.num_samples))  # [N, T]
            weights = rollout.action_mask.float()  # [N, T]
            log_ratio = (logp - rollout.old_logp) * weights  # [N, T]
            whole = log_ratio.sum(1)  # [N]: log pi(a) / pi_old(a) of each whole action
            is_out = ((log_ratio.exp() < lo) | (log_ratio.exp() > hi)).float() * weights
            _, stats = loop.loss_fn(logp, rollout)
            out[loop.name] = {
                "max_abs_log_ratio_element": float(log_ratio.abs().max()),
                "max_abs_log_ratio_action": float(whole.abs().max()),
                "clip_frac_element": float(is_out.sum() / weights.sum()),
                "clip_frac_action": float(((whole.exp() < lo) | (whole.exp() > hi)).float().mean()),
                "loss_clip_frac": float(stats["clip_frac_region"]),
            }
    return out


# variant name -> GRPO knobs laid over the flags' (the same weights, batch and draws for every variant)
VARIANTS: dict[str, dict] = {
    "flags": {},
    "before": dict(mask_policy="bernoulli", mask_pool=4, mask_importance_sampling_level="token"),  # the old default
    "region_mean": dict(mask_policy="region", mask_importance_sampling_level="sequence", mask_length_norm="mean"),
    "region_sqrt": dict(mask_policy="region", mask_importance_sampling_level="sequence", mask_length_norm="sqrt"),
    "region_sum": dict(mask_policy="region", mask_importance_sampling_level="sequence", mask_length_norm="sum"),
}


def measure(model, processor, args, config: dict) -> dict:
    """One variant: roll out once with ``config``, then gradients per loop and one optimizer step."""
    weights = WeightSets.from_model(model, ema_decay=0.9, use_reference=False)
    rewards = {"mask_to_caption": [dict(type="iou")], "caption_to_mask": [dict(type="iou")]}
    algo = CycleGRPO(model, processor, weights, rewards=rewards, config=config, seed=args.seed,
                     use_partner_captions=False, seg_answer_max_tokens=4)
    world = ShapesWorld("train", num_samples=args.batch, seed=args.seed, image_size=args.image_size)
    features = algo.encode([world[i] for i in range(args.batch)])
    scored = algo.score(algo.rollout(features))
    generator = torch.Generator().manual_seed(args.seed)
    advantaged = AdvantagedStep(features, tuple(
        r.with_advantages(torch.randn(r.num_rollouts, generator=generator).to(r.action_mask.device))
        for r in scored.rollouts))
    loops = loop_gradients(algo, model, features, advantaged.rollouts)
    for name, stats in after_one_step(algo, model, advantaged, args.lr).items():
        loops[name]["after_one_step"] = stats
    shared = [loops[name]["grad_norm"]["shared"] for name in ("mask_to_caption", "caption_to_mask")]
    ratio = shared[1] / shared[0] if shared[0] else float("nan")
    return {"grpo_config": config, **loops, "caption_to_mask_over_mask_to_caption_shared_grad": ratio}


def run(args) -> dict:
    """Build once, measure each of ``--variants`` from the same weights; returns the result dict."""
    torch.set_num_threads(args.threads)
    start = time.time()
    model, processor = build(args)
    base = dict(num_generations=args.num_generations, max_completion_length=args.max_completion_length, beta=0.0,
                num_iterations=2, mask_policy=args.mask_policy, mask_pool=args.mask_pool,
                importance_sampling_level=args.importance_sampling_level,
                mask_importance_sampling_level=args.mask_importance_sampling_level,
                mask_length_norm=args.mask_length_norm)
    initial = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    variants = {}
    for name in args.variants:
        with torch.no_grad():  # every variant starts from the same trainable weights
            for n, p in model.named_parameters():
                if n in initial:
                    p.copy_(initial[n])
        variants[name] = measure(model, processor, args, {**base, **VARIANTS[name]})
    peak = torch.cuda.max_memory_allocated() / 2**30 if model.device.type == "cuda" else None
    return {"settings": vars(args), "variants": variants, "cuda_peak_gb": peak,
            "wall_s": round(time.time() - start, 1),
            "max_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}


def table(result: dict) -> str:
    """A markdown table of the result, one column per loop."""
    rows = [("grad norm shared (LoRA+mlp1+fcs)", "grad_norm", "shared"), ("grad norm LLM LoRA", "grad_norm", "llm_lora"),
            ("grad norm mlp1", "grad_norm", "mlp1"), ("grad norm text_hidden_fcs", "grad_norm", "text_hidden_fcs"),
            ("grad norm SAM2 decoder", "grad_norm", "sam2_mask_decoder"), ("action elements T", None, "action_elements"),
            ("partner-visible share", None, "partner_visible_share"),
            ("max abs log-ratio, element", "after_one_step", "max_abs_log_ratio_element"),
            ("max abs log-ratio, whole action", "after_one_step", "max_abs_log_ratio_action"),
            ("clip frac, elements", "after_one_step", "clip_frac_element"),
            ("clip frac, whole actions", "after_one_step", "clip_frac_action"),
            ("clip frac the loss applies", "after_one_step", "loss_clip_frac")]
    lines = ["| | loop 1 | loop 2 |", "|---|---|---|"]
    for label, section, key in rows:
        cells = [(result[loop][section] if section else result[loop]).get(key)
                 for loop in ("mask_to_caption", "caption_to_mask")]
        lines.append(f"| {label} | " + " | ".join("-" if v is None else f"{v:.3g}" for v in cells) + " |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sa2va-rl bench mask-action", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = p.add_argument
    add("--preset", default="tiny", help="size preset (tiny | 1b | 4b | 8b), random weights")
    add("--checkpoint", default=None, help="HF Sa2VA checkpoint directory instead of random weights")
    add("--dtype", default="float32", choices=["float32", "bfloat16"], help="model dtype")
    add("--device", default="cpu", help="cpu | cuda: where the model is built and run")
    add("--mask-policy", default="region", help="GRPOConfig.mask_policy")
    add("--mask-pool", type=int, default=4, help="GRPOConfig.mask_pool (bernoulli)")
    add("--importance-sampling-level", default="token", help="GRPOConfig.importance_sampling_level")
    add("--mask-importance-sampling-level", default="sequence", help="GRPOConfig.mask_importance_sampling_level")
    add("--mask-length-norm", default="sqrt", help="GRPOConfig.mask_length_norm")
    add("--batch", type=int, default=4, help="B, prompts per loop")
    add("--num-generations", type=int, default=4, help="G")
    add("--max-completion-length", type=int, default=12, help="caption tokens of loop 1")
    add("--lora-r", type=int, default=8, help="LoRA rank (alpha = 2r)")
    add("--lr", type=float, default=1e-3, help="Adam learning rate of the one optimizer step")
    add("--image-size", type=int, default=224, help="shapes-world image side in pixels")
    add("--seed", type=int, default=0, help="seed of the weights, the batch, the draws and the advantages")
    add("--threads", type=int, default=1, help="torch intra-op threads")
    add("--variants", nargs="+", default=["flags"], choices=sorted(VARIANTS),
        help="variants measured from the same weights: flags (the knobs above) or named knob sets over them")
    add("--json", default=None, help="write the result here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    result = run(args)
    for name, variant in result["variants"].items():
        print(f"\n{name}: {variant['grpo_config']}\n{table(variant)}")
        ratio = variant["caption_to_mask_over_mask_to_caption_shared_grad"]
        print(f"caption_to_mask / mask_to_caption shared grad norm: {ratio:.3g}")
    print(f"wall {result['wall_s']} s; max RSS {result['max_rss_gb']} GB; CUDA peak {result['cuda_peak_gb']} GB")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
