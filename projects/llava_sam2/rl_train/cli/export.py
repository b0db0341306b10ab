"""Export a trained checkpoint to the upstream HF Sa2VA layout (LoRA merged), ready for ``load_pretrained``
and upstream Sa2VA inference code:

    sa2va-rl export CONFIG CKPT --save-path DIR [--max-shard-size 5GB] [--cfg-options k=v ...]

CONFIG builds the model as in training: from its pretrained checkpoint, or for a preset (random weights) from the
config's ``randomness.seed``, as the Runner did. CKPT holds the trained tensors: an MMEngine checkpoint file
(``state_dict``, trainable tensors only), a DeepSpeed checkpoint directory (``mp_rank_00_model_states.pt``), or a
work dir, whose ``last_checkpoint`` file names the checkpoint. Every trainable tensor of the model must be in CKPT.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

PROG = "sa2va-rl export"


def resolve_checkpoint(path: Path) -> Path:
    """``path`` itself, or for a work dir (it holds ``last_checkpoint``, as MMEngine writes) the checkpoint it names."""
    marker = path / "last_checkpoint"
    if path.is_dir() and marker.is_file():
        return Path(marker.read_text().strip())
    return path


def read_trained_state(checkpoint: Path) -> dict:
    """The model tensors of an MMEngine checkpoint file or DeepSpeed checkpoint directory (wrapper prefixes off)."""
    import torch

    if checkpoint.is_dir():
        states = sorted(checkpoint.glob("mp_rank_*_model_states.pt"))
        if not states:
            raise FileNotFoundError(f"{checkpoint} is a directory without mp_rank_*_model_states.pt; pass a DeepSpeed "
                                    "checkpoint directory or an MMEngine .pth file.")
        state = torch.load(states[0], map_location="cpu", weights_only=False)["module"]
    elif checkpoint.is_file():
        loaded = torch.load(checkpoint, map_location="cpu", weights_only=False)
        if "state_dict" not in loaded:
            raise ValueError(f"{checkpoint} has no 'state_dict' (keys: {sorted(loaded)[:8]}); pass a checkpoint "
                             "written by MMEngine's CheckpointHook.")
        state = loaded["state_dict"]
    else:
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    return {key.removeprefix("module."): value for key, value in state.items()}


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    from mmengine.config import Config, DictAction

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("config", help="training config that built the model")
    parser.add_argument("checkpoint", type=Path,
                        help="MMEngine .pth file, DeepSpeed checkpoint directory, or a work dir (its last checkpoint)")
    parser.add_argument("--save-path", required=True, help="output directory (HF Sa2VA layout)")
    parser.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard, e.g. 5GB")
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, help="key=value overrides of the config")
    args = parser.parse_args(argv)
    from mmengine.registry import MODELS
    from mmengine.runner import set_random_seed

    from projects.llava_sam2.rl_train.engine.registry import build_component

    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    seed = cfg.get("randomness", {}).get("seed")
    if seed is not None:  # a preset model's frozen weights are random: rebuild them as the run did
        set_random_seed(seed)
    model = build_component(MODELS, cfg.model)
    checkpoint = resolve_checkpoint(args.checkpoint)
    result = model.load_state_dict(read_trained_state(checkpoint), strict=True)
    print(f"loaded {checkpoint} ({result})")
    model.export_pretrained(args.save_path, max_shard_size=args.max_shard_size)
    print(f"wrote the merged model and its tokenizer to {args.save_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
