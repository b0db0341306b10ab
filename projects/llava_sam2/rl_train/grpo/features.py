"""StepFeatures: what the frozen encoders produce for one GRPO step, computed once per image (docs/architecture.md).

``encode_step`` runs InternViT (+ pixel shuffle) and the SAM2 image encoder exactly once per distinct image of
the batch, without grad (``model.pipeline.shared.encode_images``), and keeps the results for every pass of the step:
both loops, the sampling policy, the EMA partner and the reference. ``mlp1`` is trainable and differs between
those weight sets, so it is *not* cached: each pass re-projects ``vit_tokens`` with the weights in effect
(``model.project_vision``).

An image shared by several samples (several regions of one picture) is encoded once when the samples hold the
same PIL object; equal pixels in distinct objects are encoded separately (no hashing of pixels).

Host preprocessing ahead of the step: a batch built by ``data.collate.PreprocessingCollate`` carries the processor's
inputs of its images, masks and region cells (``RegionBatch.prepared``, made in the DataLoader workers of a training
run); ``encode_step`` then only copies tensors to the device (from pinned memory, without blocking) and runs the
encoders. A batch without them (or a sample whose preparation failed) is preprocessed here, by the same functions.

Unpaired data: a sample may carry a region and no text (loop 1 only) or a text and no mask (``gt_mask`` None, loop 2
only). ``loop_rows`` names the samples each loop can use and ``loop_features`` gives a loop its rows, sharing
the encoded images.

Video steps: a batch of ``VideoRegionSample`` (never mixed with images) is encoded once per clip
(``model.pipeline.video.encode_clips``: InternViT on the clip's MLLM frames, plus the key frame of loop 1 when it is
not one of them; SAM2 on every frame). The step's ``StepFeatures`` is then the clips' view (image row = clip, its
tiles = its MLLM frames, ``gt_masks`` the masklets ``[T, H, W]``, ``video`` set), which loop 2 runs on; loop 1 gets
the key-frame view (``loop_features``): image row = the sample's key frame as a one-tile image, so its policy pass is
the image loop's on that frame, while the shared ``vit_tokens`` keep one ``mlp1`` projection per pass for both loops.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from torch import Tensor

from ..data.prepared import PreparedBatch, gt_mask_tensor
from ..data.types import VideoRegionSample
from ..data.video import key_frame
from ..model.pipeline.qwen_vl_regions import DrawnRegions, draw_regions
from ..model.pipeline.shared import EncodedImages, encode_images, is_qwen_vl_model
from ..model.pipeline.video import EncodedClips, encode_clips


@dataclass
class VideoStep:
    """The clips of a video step (``StepFeatures.video``).

    Attributes:
        encoded: the step's distinct clips, encoded once (``EncodedClips``; its still frames are loop 1's key
            frames, one per sample with a masklet, in sample order).
        clip_index: B clip rows of ``encoded``, one per sample.
        key_frames: B loop-1 key frames (``data.video.key_frame`` of the gt masklet), None without a masklet.
        still_index: B rows of ``encoded.stills`` (the sample's key frame as a one-tile image), None without one.
    """

    encoded: EncodedClips
    clip_index: list[int]
    key_frames: list[int | None]
    still_index: list[int | None]

    def select(self, rows: Sequence[int]) -> "VideoStep":
        return replace(self, clip_index=[self.clip_index[r] for r in rows],
                       key_frames=[self.key_frames[r] for r in rows], still_index=[self.still_index[r] for r in rows])


@dataclass
class StepFeatures(EncodedImages):
    """The step's I distinct images, encoded (``EncodedImages``: ``vit_tokens``, ``grounding``, ``image_sizes``,
    ``tile_start``), plus the per-sample targets of its B samples.

    Attributes:
        samples: the B ``RegionSample`` of the step.
        image_index: ``[B]`` long (model device), row of each sample's image in the per-image tensors.
        gt_masks: B bool ``[H, W]`` CPU tensors, the region of each sample (None for a text-only sample).
        region_cells: ``[B, g, g]`` bool region-token cells of each gt_mask (CPU; all False for a text-only
            sample), or None when loop 1 is off or the model is of the Qwen-VL family.
        drawn_regions: the Qwen-VL family's loop-1 region input: each sample's gt_mask drawn into a copy of its
            image, preprocessed once per step (``pipeline.qwen_vl_regions.DrawnRegions``), or None when loop 1 is
            off or the model is of the InternVL family.
        prompt_texts: B texts loop 2 grounds (first caption, else first expression; "" for a region-only sample),
            or None when loop 2 is off.
        references: B lists of reference texts for caption rewards (captions, else expressions).
        video: the clips of a video step (module docstring; ``gt_masks`` then holds masklets ``[T, H, W]`` and
            ``region_cells`` the key-frame regions), None for an image step.
        image_rows: ``image_index`` on the host, given with it (None: read from it once, on first use); per-sample
            lookups then never wait for the device.
    """

    samples: list
    image_index: Tensor
    gt_masks: list[Tensor]
    region_cells: Tensor | None
    prompt_texts: list[str] | None
    references: list[list[str]]
    video: VideoStep | None = None
    drawn_regions: DrawnRegions | None = None
    image_rows: tuple[int, ...] | None = None

    @property
    def num_samples(self) -> int:
        """B."""
        return len(self.samples)

    @property
    def sample_ids(self) -> list[str]:
        return [s.sample_id for s in self.samples]

    def image_of(self, sample: int) -> int:
        if self.image_rows is None:
            self.image_rows = tuple(self.image_index.tolist())
        return self.image_rows[sample]

    def select(self, rows: Sequence[int]) -> "StepFeatures":
        """The features of samples ``rows`` only (the encoded images are shared, not copied); self for all rows."""
        rows = [int(r) for r in rows]
        if rows == list(range(self.num_samples)):
            return self
        return replace(self, samples=[self.samples[r] for r in rows], image_index=self.image_index[rows],
                       image_rows=tuple(self.image_of(r) for r in rows),
                       gt_masks=[self.gt_masks[r] for r in rows],
                       region_cells=None if self.region_cells is None else self.region_cells[rows],
                       prompt_texts=None if self.prompt_texts is None else [self.prompt_texts[r] for r in rows],
                       references=[self.references[r] for r in rows],
                       video=None if self.video is None else self.video.select(rows),
                       drawn_regions=None if self.drawn_regions is None else self.drawn_regions.select(rows))

    def reward_images(self) -> list:
        """B images for rewards that look at pixels: each sample's image, or its clip's loop-1 key frame (frame 0
        without one; loop 2 passes its own key frames)."""
        if self.video is None:
            return [s.image for s in self.samples]
        return [s.frames[k if k is not None else 0] for s, k in zip(self.samples, self.video.key_frames)]


def region_of(sample):
    """The sample's region: ``gt_mask`` of an image sample, the masklet ``gt_masks`` of a video sample (None when
    the sample has text only)."""
    return sample.gt_masks if isinstance(sample, VideoRegionSample) else sample.gt_mask


# loop name -> does a sample carry what that loop needs (loop 1: a region mask; loop 2: a text to ground)
LOOP_NEEDS = {"mask_to_caption": lambda s: region_of(s) is not None,
              "caption_to_mask": lambda s: bool(_reference_texts(s))}


def loop_features(features: StepFeatures, loop_name: str) -> StepFeatures:
    """Loop ``loop_name``'s share of the step (``loop_rows``). For a video step, loop 1's share is the key-frame
    view: image row = the sample's key frame as a one-tile image (``EncodedClips.stills``, sharing ``vit_tokens``)."""
    share = features.select(loop_rows(features, loop_name))
    if share.video is None or loop_name != "mask_to_caption":
        return share
    stills = share.video.encoded.stills
    return replace(share, image_sizes=stills.image_sizes, tile_start=stills.tile_start, grounding=stills.grounding,
                   image_index=torch.tensor(share.video.still_index, dtype=torch.long,
                                            device=share.image_index.device),
                   image_rows=tuple(share.video.still_index))


def loop_rows(features: StepFeatures, loop_name: str) -> list[int]:
    """The samples of the step that loop ``loop_name`` can use; raises when there is none."""
    rows = [b for b, sample in enumerate(features.samples) if LOOP_NEEDS[loop_name](sample)]
    if not rows:
        what = "a region mask" if loop_name == "mask_to_caption" else "a caption or an expression to ground"
        raise ValueError(f"{loop_name} loop: no sample of the step has {what} (e.g. {features.sample_ids[0]!r}); "
                         f"give the RL data such samples or set {loop_name}_weight=0.")
    return rows


def _reference_texts(sample) -> list[str]:
    return [t for t in (list(sample.captions) or list(sample.expressions)) if isinstance(t, str) and t.strip()]


def _gt_masklet(sample, size: tuple[int, int]) -> Tensor | None:
    if sample.gt_masks is None:  # a text-only sample of unpaired data
        return None
    masks = torch.as_tensor(np.asarray(sample.gt_masks))
    expected = (len(sample.frames), *size)
    if tuple(masks.shape) != expected:
        raise ValueError(f"sample {sample.sample_id!r}: gt_masks has shape {tuple(masks.shape)} but the clip is "
                         f"(T, H, W) = {expected}; the masklet needs one mask per frame at frame resolution.")
    masks = masks.bool() if masks.dtype == torch.bool else masks > 0
    if not bool(masks.any()):
        raise ValueError(f"sample {sample.sample_id!r}: the masklet is empty in every frame; an object must be seen "
                         "in at least one frame (drop the sample, or give it no masklet to use it as text only).")
    return masks


def check_one_kind(batch: Sequence) -> bool:
    """True for a batch of ``VideoRegionSample``, False for one of image samples; raises for a mix, naming a sample
    of each kind."""
    is_video = [isinstance(s, VideoRegionSample) for s in batch]
    if all(is_video) or not any(is_video):
        return bool(is_video[0])
    clip, image = batch[is_video.index(True)], batch[is_video.index(False)]
    raise ValueError(f"CycleGRPO.encode: the batch mixes video sample {clip.sample_id!r} with image sample "
                     f"{image.sample_id!r}; a step is all images or all clips (one dataset kind per dataloader).")


@torch.no_grad()
def encode_video_step(model, processor, batch: Sequence, *, use_region_cells: bool, use_prompt_texts: bool,
                      mllm_frames: int) -> StepFeatures:
    """``encode_step`` for a batch of ``VideoRegionSample``: each distinct clip (same frames list) encoded once
    (``encode_clips``), loop 1's key frames exposed as one-tile images; the result is the clips' view (module
    docstring)."""
    rows: dict[int, int] = {}  # id(frames list) -> clip row
    clips, names, clip_index = [], [], []
    for sample in batch:
        if id(sample.frames) not in rows:
            rows[id(sample.frames)] = len(clips)
            clips.append(sample.frames)
            names.append(sample.sample_id)
        clip_index.append(rows[id(sample.frames)])
    sizes = [(frames[0].height, frames[0].width) for frames in clips]
    masklets = [_gt_masklet(s, sizes[c]) for s, c in zip(batch, clip_index)]
    key_frames = [None if m is None else key_frame(m.numpy()) for m in masklets] if use_region_cells \
        else [None] * len(batch)
    stills = [(c, k) for c, k in zip(clip_index, key_frames) if k is not None]
    still_index, next_still = [], 0
    for k in key_frames:
        still_index.append(None if k is None else next_still)
        next_still += k is not None
    encoded = encode_clips(model, processor, clips, names, stills, mllm_frames=mllm_frames)
    region_cells = None
    if use_region_cells and stills:
        cells = {b: processor.region_cells(m[k], sample_id=s.sample_id, size=sizes[c])
                 for b, (s, m, k, c) in enumerate(zip(batch, masklets, key_frames, clip_index)) if k is not None}
        blank = torch.zeros_like(next(iter(cells.values())))
        region_cells = torch.stack([cells.get(b, blank) for b in range(len(batch))])  # [B, g, g]
    references = [_reference_texts(s) for s in batch]
    prompt_texts = [refs[0] if refs else "" for refs in references] if use_prompt_texts else None
    return StepFeatures(
        **{f.name: getattr(encoded.clips, f.name) for f in fields(EncodedImages)}, samples=list(batch),
        image_index=torch.tensor(clip_index, dtype=torch.long, device=model.device), image_rows=tuple(clip_index),
        gt_masks=masklets,
        region_cells=region_cells, prompt_texts=prompt_texts, references=references,
        video=VideoStep(encoded=encoded, clip_index=clip_index, key_frames=key_frames, still_index=still_index))


def prepared_samples(processor, batch: Sequence) -> list:
    """Per sample of an image batch its host inputs made where the batch was built (``RegionBatch.prepared``,
    ``data.prepared``), None where the step makes them; raises when they were made by a processor with other
    preprocessing settings than ``processor``'s."""
    prepared: PreparedBatch | None = getattr(batch, "prepared", None)
    if prepared is None:
        return [None] * len(batch)
    settings = getattr(processor, "preprocessing_settings", None)
    if prepared.settings != settings:
        raise ValueError(f"CycleGRPO.encode: the batch of {batch[0].sample_id!r} was preprocessed by the collate with "
                         f"{prepared.settings}, but the step's processor has {settings}; build the collate "
                         "(data.collate.PreprocessingCollate) with the model's processor.")
    if prepared.sample_ids != [s.sample_id for s in batch]:
        raise ValueError(f"CycleGRPO.encode: the batch holds {[s.sample_id for s in batch]} but its preprocessing "
                         f"(PreprocessingCollate) was made for {prepared.sample_ids}; a batch changed after the "
                         "collate must drop it (batch.prepared = None).")
    return list(prepared.samples)


@torch.no_grad()
def encode_step(model, processor, batch: Sequence, *, use_region_cells: bool, use_prompt_texts: bool,
                mllm_frames: int = 5) -> StepFeatures:
    """Preprocess the batch and run the frozen encoders once per distinct image (one batched call each).

    Args:
        model: the ``Sa2VAModel``; processor: its ``Sa2VAProcessor``.
        batch: B ``RegionSample``. A ``RegionBatch`` from ``PreprocessingCollate`` carries its host preprocessing
            (``prepared``: tiles, SAM2 inputs, gt masks, region cells, made in the DataLoader workers); the step
            uses it and makes what is missing itself, with the same functions (equal features either way).
        use_region_cells: compute loop 1's region input of every gt_mask: its region cells (the processor's
            empty-region policy applies, so a region that hits no grid point raises under
            ``empty_region='raise'``), or on the Qwen-VL family the region drawn into a copy of its image.
        use_prompt_texts: pick the text loop 2 grounds ("" for a sample with neither caption nor expression, which
            ``loop_rows`` leaves out of loop 2).
        mllm_frames: video steps only, the frames of each clip the language model sees.
    """
    if isinstance(batch, (str, bytes)) or len(batch) == 0:
        raise ValueError("CycleGRPO.encode: got an empty batch; the dataloader must yield a non-empty list of "
                         "RegionSample (data.collate.region_collate).")
    is_qwen_vl = is_qwen_vl_model(model)
    if check_one_kind(batch):
        if is_qwen_vl:
            raise ValueError(f"CycleGRPO.encode: video steps (e.g. sample {batch[0].sample_id!r}) are not supported on "
                             "the Qwen-VL family (no clip encoder or video prompt there); train it on image data.")
        return encode_video_step(model, processor, batch, use_region_cells=use_region_cells,
                                 use_prompt_texts=use_prompt_texts, mllm_frames=mllm_frames)
    prepared = prepared_samples(processor, batch)
    rows: dict[int, int] = {}  # id(PIL image) -> image row
    images, names, image_index, ready = [], [], [], []
    for sample, ahead in zip(batch, prepared):
        if id(sample.image) not in rows:
            rows[id(sample.image)] = len(images)
            images.append(sample.image)
            names.append(sample.sample_id)
            ready.append(None if ahead is None else ahead.image_inputs)
        image_index.append(rows[id(sample.image)])
    encoded = encode_images(model, processor, images, names, ready)
    sizes = encoded.image_sizes
    gt_masks = [gt_mask_tensor(s, sizes[i]) if ahead is None else ahead.gt_mask
                for s, i, ahead in zip(batch, image_index, prepared)]
    region_cells = drawn_regions = None
    if use_region_cells and is_qwen_vl:
        drawn_regions = draw_regions(processor, [s.image for s in batch], gt_masks, [s.sample_id for s in batch])
    elif use_region_cells:
        with_cells = getattr(batch, "prepared", None) is not None and batch.prepared.with_region_cells
        cells = {b: ahead.region_cells if ahead is not None and with_cells else
                 processor.region_cells(m, sample_id=s.sample_id, size=sizes[i])
                 for b, (s, m, i, ahead) in enumerate(zip(batch, gt_masks, image_index, prepared))
                 if m is not None}  # b -> [g, g]
        blank = torch.zeros_like(next(iter(cells.values()))) if cells else None
        region_cells = None if blank is None else torch.stack(
            [cells.get(b, blank) for b in range(len(batch))])  # [B, g, g]
    references = [_reference_texts(s) for s in batch]
    prompt_texts = None
    if use_prompt_texts:
        prompt_texts = [refs[0] if refs else "" for refs in references]
    return StepFeatures(
        **{f.name: getattr(encoded, f.name) for f in fields(EncodedImages)}, samples=list(batch),
        image_index=torch.tensor(image_index, dtype=torch.long, device=model.device), image_rows=tuple(image_index),
        gt_masks=gt_masks,
        region_cells=region_cells, prompt_texts=prompt_texts, references=references, drawn_regions=drawn_regions,
    )
