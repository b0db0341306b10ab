"""The mask-quality dataset: K candidate prompts per sample, the model's masks for each, and their true quality.

For each of I samples (one referring target each) and each of K ``PromptSpec`` the builder records the prompt
text, the low-res mask logits ``[h, w]``, the binary mask at image size (COCO RLE), SAM2's predicted IoU of that
mask and the true Dice / IoU / precision / recall against the ground truth (rewards.mask_metrics conventions).
Per sample it keeps the image resized to ``image_side`` (reward-network input), the mean projected ViT token
(prompt-policy state), the ground-truth RLE and a split tag. The split is by *image* (``sample_id`` up to '#'), so
several regions of one picture never straddle train and held-out.

Cache layout (a directory): ``quality.npz`` (arrays, dense ``[I, K, ...]``) + ``meta.json`` (config, sample ids,
prompt texts, RLEs). ``load_quality_data`` checks every field and shape and names the file and field it misses.
Degenerate predictions (empty or full masks) are kept as they are and counted in ``meta['degenerate']``.
"""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..data.rle import encode_mask
from ..model.pipeline.shared import SEG_ANSWER
from ..rewards.mask_metrics import mask_metrics
from .prompts import PromptSpec, candidate_expressions, check_prompt_specs
from .segment import SegmentRows, segment_rows

ARRAY_FIELDS = {  # name -> (dims after [I] or [I, K], dtype kind)
    "images": "I", "image_sizes": "I", "image_features": "I", "is_heldout": "I",
    "logits": "IK", "pred_iou": "IK", "dice": "IK", "iou": "IK", "precision": "IK", "recall": "IK",
    "pred_area": "IK",
}
METRICS = ("dice", "iou", "precision", "recall")


@dataclass
class QualityData:
    """In-memory quality dataset; arrays are numpy, ``[I]`` per sample or ``[I, K]`` per (sample, prompt).

    images uint8 [I, R, R, 3]; image_sizes int [I, 2] (H, W); image_features float32 [I, D]; is_heldout bool [I];
    logits float16 [I, K, h, w]; pred_iou float32 [I, K]; dice/iou/precision/recall float64 [I, K];
    pred_area float64 [I, K] (foreground fraction of the binary mask). ``meta`` holds sample_ids [I],
    prompt_texts [I][K], prompt_labels [K], gt_rles [I], pred_rles [I][K] and the build settings.
    """

    arrays: dict[str, np.ndarray]
    meta: dict = field(default_factory=dict)

    def __getattr__(self, name: str) -> np.ndarray:
        arrays = self.__dict__.get("arrays", {})
        if name in arrays:
            return arrays[name]
        raise AttributeError(name)

    @property
    def num_samples(self) -> int:
        return int(self.arrays["dice"].shape[0])

    @property
    def num_prompts(self) -> int:
        return int(self.arrays["dice"].shape[1])

    def split_indices(self, split: str) -> np.ndarray:
        """Sample indices of ``'train'`` or ``'heldout'``."""
        if split not in ("train", "heldout"):
            raise ValueError(f"split={split!r}: expected 'train' or 'heldout'")
        return np.flatnonzero(self.arrays["is_heldout"] == (split == "heldout"))

    def gt_mask(self, i: int) -> np.ndarray:
        from pycocotools import mask as mask_utils

        rle = dict(self.meta["gt_rles"][i])
        return mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode("ascii")}).astype(bool)


def image_key(sample_id: str) -> str:
    """``"<dataset>/<image key>#<ann id>"`` -> ``"<dataset>/<image key>"``: the unit of the train/held-out split."""
    return sample_id.split("#", 1)[0]


def split_by_image(sample_ids: Sequence[str], heldout_fraction: float, seed: int) -> np.ndarray:
    """bool [I], True for held-out samples: a seeded permutation of the distinct image keys, the first
    ``round(n_images * heldout_fraction)`` (at least 1, at most n_images - 1) held out."""
    if not 0 < heldout_fraction < 1:
        raise ValueError(f"heldout_fraction={heldout_fraction}: expected a fraction in (0, 1), e.g. 0.4")
    keys = sorted(set(image_key(s) for s in sample_ids))
    if len(keys) < 2:
        raise ValueError(f"split_by_image: {len(keys)} distinct image(s); need >= 2 for a train/held-out split")
    order = np.random.default_rng(seed).permutation(len(keys))
    n_held = min(max(1, round(len(keys) * heldout_fraction)), len(keys) - 1)
    held = {keys[k] for k in order[:n_held]}
    return np.array([image_key(s) in held for s in sample_ids], dtype=bool)


def resize_image(image, side: int) -> np.ndarray:
    """PIL image -> uint8 ``[side, side, 3]`` (area resampling; the reward network's image input)."""
    pixels = torch.as_tensor(np.array(image.convert("RGB")), dtype=torch.float32).permute(2, 0, 1)[None]
    small = F.interpolate(pixels, size=(side, side), mode="area")[0]  # [3, R, R]
    return small.round().clamp(0, 255).byte().permute(1, 2, 0).numpy()  # [R, R, 3]


def _chunk_records(model, processor, samples, specs, answer: str, side: int, chunk_size: int) -> dict:
    """Segment every (sample, spec) pair of one chunk of samples; per-sample and per-pair records."""
    K = len(specs)
    exprs = [candidate_expressions(s.expressions, specs, s.sample_id) for s in samples]  # [n][K]
    rows = SegmentRows(image_index=[i for i in range(len(samples)) for _ in range(K)],
                       expressions=[e for per in exprs for e in per], questions=[sp.question for _ in samples
                                                                                  for sp in specs])
    out = segment_rows(model, processor, [s.image for s in samples], rows, answer=answer, chunk_size=chunk_size)
    gts = [np.asarray(s.gt_mask, dtype=bool) for s in samples]
    per_sample = [mask_metrics(np.stack(out.pred_masks[i * K:(i + 1) * K]), np.repeat(g[None], K, axis=0))
                  for i, g in enumerate(gts)]  # one batched call per sample: {metric: [K]}
    h, w = out.low_res_logits.shape[-2:]
    return {
        "images": np.stack([resize_image(s.image, side) for s in samples]),
        "image_sizes": np.array([g.shape for g in gts], dtype=np.int64),
        "image_features": out.image_features.numpy().astype(np.float32),
        "logits": out.low_res_logits.numpy().astype(np.float16).reshape(len(samples), K, h, w),
        "pred_iou": out.pred_iou.numpy().astype(np.float32).reshape(len(samples), K),
        **{k: np.stack([m[k].numpy() for m in per_sample]) for k in METRICS},
        "pred_area": np.array([m.mean() for m in out.pred_masks]).reshape(len(samples), K),
        "pred_rles": [[encode_mask(out.pred_masks[i * K + k]) for k in range(K)] for i in range(len(samples))],
        "gt_rles": [encode_mask(g) for g in gts],
        "prompt_texts": [[sp.template_text().format(e) for sp, e in zip(specs, per)] for per in exprs],
    }


def build_quality_data(model, processor, dataset, specs: Sequence[PromptSpec], *, heldout_fraction: float = 0.4,
                       seed: int = 0, answer: str = SEG_ANSWER, image_side: int = 64, samples_per_chunk: int = 8,
                       chunk_size: int = 32, source: dict | None = None) -> QualityData:
    """Run the model over every sample of ``dataset`` (RegionSamples with expressions) with every spec."""
    specs = check_prompt_specs(specs, where="build_quality_data specs")
    if len(dataset) < 2:
        raise ValueError(f"build_quality_data: dataset has {len(dataset)} sample(s); need >= 2 images to split")
    start, parts = time.perf_counter(), []
    for s0 in range(0, len(dataset), samples_per_chunk):
        samples = [dataset[i] for i in range(s0, min(s0 + samples_per_chunk, len(dataset)))]
        parts.append(_chunk_records(model, processor, samples, specs, answer, image_side, chunk_size))
    arrays = {k: np.concatenate([p[k] for p in parts]) for k in ARRAY_FIELDS if k != "is_heldout"}
    sample_ids = [dataset[i].sample_id for i in range(len(dataset))]
    arrays["is_heldout"] = split_by_image(sample_ids, heldout_fraction, seed)
    area = arrays["pred_area"]
    meta = {"sample_ids": sample_ids, "prompt_labels": [s.label for s in specs],
            "prompt_specs": [[s.template, s.slot] for s in specs],
            "prompt_texts": [t for p in parts for t in p["prompt_texts"]],
            "gt_rles": [r for p in parts for r in p["gt_rles"]], "pred_rles": [r for p in parts for r in p["pred_rles"]],
            "answer": answer, "image_side": image_side, "heldout_fraction": heldout_fraction, "seed": seed,
            "sam_image_size": int(model.config.sam_image_size), "source": source or {},
            "degenerate": {"empty": int((area == 0).sum()), "full": int((area == 1).sum()), "pairs": int(area.size)},
            "build_seconds": round(time.perf_counter() - start, 1), "torch_threads": torch.get_num_threads()}
    return QualityData(arrays, meta)


def save_quality_data(data: QualityData, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / "quality.npz", **data.arrays)
    (out / "meta.json").write_text(json.dumps(data.meta))
    return out


def load_quality_data(path: str | Path) -> QualityData:
    """Load and validate a cache directory written by ``save_quality_data``."""
    path = Path(path)
    for name in ("quality.npz", "meta.json"):
        if not (path / name).is_file():
            raise ValueError(f"quality cache {path}: missing {name}; build it with "
                             "`sa2va-rl prompt-rl quality-dataset`")
    with np.load(path / "quality.npz") as npz:
        missing = [k for k in ARRAY_FIELDS if k not in npz.files]
        if missing:
            raise ValueError(f"quality cache {path / 'quality.npz'}: missing model outputs {missing}; rebuild the cache")
        arrays = {k: npz[k] for k in ARRAY_FIELDS}
    meta = json.loads((path / "meta.json").read_text())
    check_quality_arrays(arrays, meta, str(path))
    return QualityData(arrays, meta)


def check_quality_arrays(arrays: dict[str, np.ndarray], meta: dict, where: str) -> None:
    """Shapes agree ([I] / [I, K]), no NaN in model outputs or metrics, K >= 2, meta lists match I and K."""
    I, K = arrays["dice"].shape
    if K < 2:
        raise ValueError(f"quality cache {where}: K={K} prompt(s) per sample; prompt selection needs K >= 2")
    for name, dims in ARRAY_FIELDS.items():
        lead = (I,) if dims == "I" else (I, K)
        if arrays[name].shape[:len(lead)] != lead:
            raise ValueError(f"quality cache {where}: field {name!r} has shape {arrays[name].shape}, expected leading "
                             f"dims {lead}")
        if arrays[name].dtype.kind == "f" and not np.isfinite(arrays[name]).all():
            raise ValueError(f"quality cache {where}: field {name!r} holds NaN/inf model outputs; rebuild the cache")
    for key, n in (("sample_ids", I), ("gt_rles", I), ("pred_rles", I), ("prompt_texts", I), ("prompt_labels", K)):
        if len(meta.get(key, ())) != n:
            raise ValueError(f"quality cache {where}: meta[{key!r}] has {len(meta.get(key, ()))} entries, expected {n}")
    if arrays["is_heldout"].all() or not arrays["is_heldout"].any():
        raise ValueError(f"quality cache {where}: the split has no train or no held-out sample; rebuild with "
                         "0 < heldout_fraction < 1")
