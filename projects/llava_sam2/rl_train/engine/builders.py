"""Config-time builders shared by the train model and the SFT datasets.

Both sides must agree on the tokenizer and the chat template, so both build them from the same description: a
local HF Sa2VA checkpoint (``pretrained_path``: its ``config.json`` and tokenizer) or a size preset plus a tokenizer.
Config values may be built objects, config dicts (``dict(type=<callable>, **kwargs)``, as lazy configs write them)
or, for the tokenizer, a path.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mmengine.registry import DATASETS

from ..data.unpaired import UnpairedRegionDataset
from ..model.network.configuration import Sa2VAConfig
from ..model.network.presets import build_preset
from ..model.sft.sft_data import RegionSFTDataset
from ..model.text.input_check import InputCheck, region_grid_size
from ..model.text.processor import Sa2VAProcessor
from ..model.text.tokenizer import sa2va_tokenizer
from .registry import build_component


def build_tokenizer(tokenizer: Any = None, pretrained_path: str | os.PathLike | None = None,
                    preset: str | None = None):
    """The tokenizer from an object, a config dict, a path, or None: the checkpoint's (``pretrained_path``) or, for
    ``preset='tiny'``, the shipped tiny tokenizer."""
    if isinstance(tokenizer, Mapping):
        args = dict(tokenizer.items())
        return args.pop("type")(**args)
    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    return sa2va_tokenizer(tokenizer if tokenizer is not None else pretrained_path, preset)


def check_model_source(pretrained_path: str | os.PathLike | None, preset: str | None,
                       upstream_sft: Mapping | None = None) -> None:
    """Exactly one of ``pretrained_path`` / ``preset`` / ``upstream_sft``; a ``pretrained_path`` must be a checkpoint
    directory."""
    given = [v is not None for v in (pretrained_path, preset, upstream_sft)]
    if sum(given) != 1:
        raise ValueError(f"give exactly one of pretrained_path (a local HF Sa2VA checkpoint, e.g. "
                         f"./pretrained/Sa2VA-4B), preset (tiny/1b/4b/8b) and upstream_sft (an upstream XTuner SFT "
                         f"run); got pretrained_path={pretrained_path!r}, preset={preset!r}, "
                         f"upstream_sft={'set' if upstream_sft is not None else None}.")
    if pretrained_path is not None:
        path = Path(pretrained_path)
        problem = ("does not exist" if not path.exists() else "is not a directory" if not path.is_dir()
                   else "has no config.json" if not (path / "config.json").is_file() else None)
        if problem:
            raise FileNotFoundError(
                f"pretrained_path {os.fspath(pretrained_path)!r} {problem} (relative paths start at "
                f"{os.getcwd()}); it must be a local HF Sa2VA checkpoint directory (config.json, weights, tokenizer "
                "files), e.g. ./pretrained/Sa2VA-4B. Download it first, or set model.pretrained_path (nothing is "
                "downloaded at run time).")


def model_config(pretrained_path: str | os.PathLike | None, preset: str | None, vocab_size: int) -> Sa2VAConfig:
    """The Sa2VA config of a checkpoint directory or of a preset sized to ``vocab_size``."""
    check_model_source(pretrained_path, preset)
    if preset is not None:
        return build_preset(preset, vocab_size=vocab_size)
    config_file = Path(pretrained_path) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} is missing; pretrained_path must be a Sa2VA HF checkpoint directory.")
    return Sa2VAConfig.from_json_file(config_file)


def region_sft_dataset(region_dataset: Any, *, pretrained_path: str | None = None, preset: str | None = None,
                       tokenizer: Any = None, processor_cfg: Mapping[str, Any] | None = None,
                       **kwargs: Any) -> RegionSFTDataset:
    """``RegionSFTDataset`` (caption + segment items) over a region dataset, with the processor of the model given
    by ``pretrained_path`` / ``preset`` (same arguments as ``Sa2VATrainModel``), so SFT prompts use its template.

    ``region_dataset`` is a dataset or its config; ``kwargs`` go to ``RegionSFTDataset`` (tasks, seed, max_length...).
    """
    check_model_source(pretrained_path, preset)
    if isinstance(region_dataset, Mapping):
        region_dataset = build_component(DATASETS, region_dataset)
    tokenizer = build_tokenizer(tokenizer, pretrained_path, preset)
    config = model_config(pretrained_path, preset, vocab_size=len(tokenizer))
    processor = Sa2VAProcessor.from_config(tokenizer, config, **dict(processor_cfg or {}))
    return RegionSFTDataset(region_dataset, processor, **kwargs)


def input_check_from_config(model_cfg: Mapping[str, Any]) -> InputCheck | None:
    """The input check (``Sa2VAProcessor.input_check``) of a ``Sa2VATrainModel`` config, without building the model:
    the region grid of its preset or of its ``pretrained_path``'s config.json, ``processor_cfg``'s geometry overrides
    and ``empty_region`` (default 'raise', the processor's). None when neither source can be read (an
    ``upstream_sft`` run, a checkpoint not on this machine)."""
    overrides = dict(model_cfg.get("processor_cfg") or {})
    path = model_cfg.get("pretrained_path")
    if model_cfg.get("preset") is not None:
        config = build_preset(model_cfg["preset"])
    elif path is not None and (Path(path) / "config.json").is_file():
        config = Sa2VAConfig.from_json_file(Path(path) / "config.json")
    else:
        return None
    geometry = dict(image_size=int(config.force_image_size or config.vision_config.image_size),
                    patch_size=int(config.vision_config.patch_size), downsample_ratio=float(config.downsample_ratio))
    geometry.update({k: overrides[k] for k in geometry if k in overrides})
    return InputCheck(region_grid_size(**geometry), overrides.get("empty_region", "raise"))


def unpaired_region_dataset(regions: Any, texts: Any) -> UnpairedRegionDataset:
    """``UnpairedRegionDataset`` of two region datasets or their configs (loop 1's regions, loop 2's texts)."""
    regions, texts = (build_component(DATASETS, d) if isinstance(d, Mapping) else d for d in (regions, texts))
    return UnpairedRegionDataset(regions, texts)
