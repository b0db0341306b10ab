#!/usr/bin/env python
"""Export a trained checkpoint to the upstream HF Sa2VA layout (LoRA merged), ready for ``Sa2VAModel.from_pretrained``
and upstream Sa2VA inference code:

    python tools/export_hf.py CONFIG CKPT --save-path DIR [--max-shard-size 5GB] [--cfg-options k=v ...]

CONFIG builds the model as in training: from its pretrained checkpoint, or for a preset (random weights) from the
config's ``randomness.seed``, as the Runner did. CKPT holds the trained tensors: an MMEngine checkpoint file
(``state_dict``, trainable tensors only) or a DeepSpeed checkpoint directory (``mp_rank_00_model_states.pt``). Every
trainable tensor of the model must be in CKPT.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


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


def main(argv: list[str]) -> int:
    os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    if str(REPO_ROOT) not in sys.path:  # the plugin imports as `projects.llava_sam2.rl_train` without pip install -e
        sys.path.insert(0, str(REPO_ROOT))
    from mmengine.config import Config, DictAction
    from mmengine.registry import MODELS
    from mmengine.runner import set_random_seed

    from projects.llava_sam2.rl_train.engine.registry import build_component

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="training config that built the model")
    parser.add_argument("checkpoint", help="MMEngine .pth file or DeepSpeed checkpoint directory")
    parser.add_argument("--save-path", required=True, help="output directory (HF Sa2VA layout)")
    parser.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard, e.g. 5GB")
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, help="key=value overrides of the config")
    args = parser.parse_args(argv)

    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    seed = cfg.get("randomness", {}).get("seed")
    if seed is not None:  # a preset model's frozen weights are random: rebuild them as the run did
        set_random_seed(seed)
    model = build_component(MODELS, cfg.model)
    result = model.load_state_dict(read_trained_state(Path(args.checkpoint)), strict=True)
    print(f"loaded {args.checkpoint} ({result})")
    model.export_pretrained(args.save_path, max_shard_size=args.max_shard_size)
    print(f"wrote the merged model and its tokenizer to {args.save_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
