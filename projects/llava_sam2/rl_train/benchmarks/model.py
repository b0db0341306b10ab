"""Time `predict` and one SFT step of a Sa2VA preset with random weights (issue: foundation on GPU).

    sa2va-rl bench model --preset 4b --dtype bfloat16 --json out.json

Builds the preset directly on the device (no CPU init of a 4B model), binds the project's tiny
tokenizer (its ids fit inside the real vocabulary; only the text is different), and measures:

* ``predict``: greedy generation of ``--new-tokens`` tokens for one multi-tile image (random weights
  never emit the stop word, so the length is fixed) — wall time, tokens/s, peak memory;
* one SFT step as upstream trains it: LoRA r=128/alpha=256 on the LLM, trainable embeddings, LM head,
  ``mlp1``, mask decoder and ``text_hidden_fcs``, LLM gradient checkpointing, a batch of one
  region-caption and one referring-segmentation sample, forward + backward + AdamW — wall time of the
  second step (the first one warms the allocator), peak memory.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.model.checkpoints.dtypes import as_torch_dtype
from projects.llava_sam2.rl_train.model.network.lora import apply_lora, configure_trainable
from projects.llava_sam2.rl_train.model.network.presets import PRESETS, build_preset
from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel
from projects.llava_sam2.rl_train.model.pipeline.inference import predict
from projects.llava_sam2.rl_train.model.sft.sft_data import RegionSFTDataset
from projects.llava_sam2.rl_train.model.sft.sft_loss import sft_loss
from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor
from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

PROG = "sa2va-rl bench model"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def _to_device(data, device, dtype):
    if isinstance(data, torch.Tensor):
        return data.to(device=device, dtype=dtype if data.is_floating_point() else None)
    if isinstance(data, dict):
        return {k: _to_device(v, device, dtype) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_to_device(v, device, dtype) for v in data)
    return data


def build(preset: str, device: torch.device, dtype: torch.dtype):
    tokenizer = load_tiny_tokenizer()
    config = build_preset(preset, vocab_size=None if preset != "tiny" else len(tokenizer))
    with device:
        model = Sa2VAModel(config).to(dtype)
    model.bind_tokenizer(tokenizer)
    return model, Sa2VAProcessor.from_config(tokenizer, config)


def bench_predict(model, processor, sample, new_tokens: int, device) -> dict:
    text = "<image>\nPlease describe the region region1 in the image in detail."
    torch.cuda.reset_peak_memory_stats(device) if device.type == "cuda" else None
    predict(model, processor, sample.image, text, region_mask=sample.gt_mask, max_new_tokens=4)  # warm-up
    _sync(device)
    start = time.perf_counter()
    out = predict(model, processor, sample.image, text, region_mask=sample.gt_mask, max_new_tokens=new_tokens)
    _sync(device)
    seconds = time.perf_counter() - start
    n_tokens = len(processor.tokenizer(out["prediction"], add_special_tokens=False).input_ids)
    return {"predict_s": seconds, "predict_new_tokens": new_tokens, "predict_decoded_tokens": n_tokens,
            "predict_tokens_per_s": new_tokens / seconds, "predict_peak_gib": _peak_gib(device)}


def bench_sft_step(model, processor, samples, device, dtype, lora_r: int) -> dict:
    model.language_model = apply_lora(model.language_model, r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.05)
    model.language_model.gradient_checkpointing_enable()
    params = configure_trainable(model, train_embeddings=True)
    optimizer = torch.optim.AdamW(list(params.values()), lr=4e-5, betas=(0.9, 0.999), weight_decay=0.05)
    dataset = RegionSFTDataset(samples, processor, tasks=("caption", "segment"))
    batch = _to_device(processor.sft_collate([dataset[0], dataset[1]])["data"], device, dtype)
    model.train()
    times, losses = [], None
    for _ in range(2):
        torch.cuda.reset_peak_memory_stats(device) if device.type == "cuda" else None
        _sync(device)
        start = time.perf_counter()
        losses = sft_loss(model, batch)
        total = sum(losses.values())
        total.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        times.append(time.perf_counter() - start)
    n_trainable = sum(p.numel() for p in params.values())
    return {"sft_step_s": times[-1], "sft_first_step_s": times[0], "sft_peak_gib": _peak_gib(device),
            "sft_losses": {k: v.item() for k, v in losses.items()}, "trainable_params": n_trainable,
            "sft_seq_len": int(batch["input_ids"].shape[1])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--dtype", default=None, help="bfloat16 on CUDA, float32 on CPU by default")
    parser.add_argument("--image-size", type=int, default=None, help="square shapes-world image side")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--lora-r", type=int, default=128)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = as_torch_dtype(args.dtype, "--dtype") if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    torch.manual_seed(0)
    start = time.perf_counter()
    model, processor = build(args.preset, device, dtype)
    _sync(device)
    result = {"preset": args.preset, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "dtype": str(dtype), "build_s": time.perf_counter() - start,
              "params": sum(p.numel() for p in model.parameters()),
              "model_gib": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30}
    image_size = args.image_size or (224 if args.preset == "tiny" else 896)
    samples = ShapesWorld("val", num_samples=2, seed=0, image_size=image_size)
    result["n_tiles"] = processor.preprocess_image(samples[0].image).n_tiles
    result.update(bench_predict(model, processor, samples[0], args.new_tokens, device))
    result.update(bench_sft_step(model, processor, samples, device, dtype, args.lora_r))
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
