"""Batches of the tiny pretraining recipe (``demo/pretrain_tiny.py``), from ``ShapesWorld('train')`` scenes only.

Every batch is a pure function of (seed, stage, step): scene ``i`` of step ``t`` is ``ShapesWorld('train', seed)``
sample ``base(stage) + t · S + i`` and every random choice comes from ``default_rng([seed, stage, t])``, so a run
is the same whatever the DataLoader workers. The held-out ``'val'`` stream is never touched here.

* :class:`PromptBatch` (stage ``sam``): every object of S scenes with a SAM-style prompt — one or two clicks
  inside it, its box with jitter, or (``attribute_share``) the attributes one of its referring expressions
  states (colour, shape, size, cell; the rest "unstated"), read by a learned embedding in the ``[SEG]`` slot.
* :class:`TextBatch` (stage ``lm``): rows of shapes-world phrases (expressions and captions), for next-token
  language pretraining of the tiny LLM.
* :class:`VideoBatch` (stage ``video``): C ``ShapesVideoWorld('train')`` clips, every object of a clip a video RES
  row (its referring expression or caption, asked as in stage ``joint``, over the clip's first n MLLM frames, one
  tile each: the prompt layout of ``model/pipeline/video.py``) with its masklet over all T frames as the target.
  With ``image_share`` > 0 that share of the steps (spread evenly) are stage-``joint`` image batches instead, so
  the image skills keep being trained.
* :class:`JointBatch` (stage ``joint``): Sa2VA SFT rows in the ``sft_collate`` layout. With ``group_by_scene``
  every object of a scene is a referring-segmentation row with its own text (so a mask that ignores the text is
  wrong for all but one row of the image); ``captions_per_scene`` objects also get a region-caption row. Texts are
  the object's referring expressions and its caption, asked with the 16 RefCOCO questions or the RES eval
  prompt; captions are asked with the RefCOCOg eval question or an Osprey one. Images are sent once per scene
  and expanded to rows on the device (:meth:`JointBatch.sft_data`). With ``region_input='drawn'`` a caption row
  shows its region drawn into a copy of the scene (``processor.region_outline``: an extra image of the batch) and
  asks the outline-naming question, with no region tokens; the random stream is consumed as for a native row, so
  both inputs see the same scenes, segmentation rows and captioned objects.

GT masks travel at the SAM2 low-res logits size (h = S_sam / 4, nearest, the resize ``sft_loss`` itself applies),
stacked, so a batch moves to the device in a few copies instead of one per mask.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import PIL.Image
import torch
from torch.utils.data import Dataset

from ..data.shapes import ShapesWorld
from ..data.shapes_video import ShapesVideoWorld
from ..data.shapes_scene import (CELL_PHRASES, COLOURS, SHAPES, SIZES, canonical_caption, parse_phrase,
                                 referring_expressions, sample_scene)
from ..model.sft.sft_data import DEFAULT_CAPTION_QUESTIONS
from ..model.sft.sft_loss import resize_gt_masks
from ..model.text.drawn_region import REGION_INPUTS
from ..model.text.processor import Sa2VAProcessor, sft_collate
from ..model.text.prompts import ANSWER_LIST, RES_EVAL_PROMPT, SEG_QUESTIONS, normalize_expression

ATTRIBUTES = {"colour": tuple(COLOURS), "shape": tuple(SHAPES), "size": tuple(SIZES),
              "cell": tuple(name for name, _ in CELL_PHRASES.values())}
# RefCOCO training questions plus the RES eval prompt the evaluation and the RL loops use
SEGMENT_QUESTIONS = SEG_QUESTIONS + (RES_EVAL_PROMPT.replace("{sent}", "{class_name}"),)
STAGE_BASES = {"sam": 0, "lm": 0, "joint": 10**9, "video": 2 * 10**9}  # first train-scene index of each stage
PROMPT_KINDS = ("point", "box", "attributes")


def attribute_ids(text: str) -> list[int]:
    """Index of each attribute ``text`` states, in ``ATTRIBUTES`` order; ``len(values)`` = unstated."""
    stated = parse_phrase(text)
    return [values.index(stated[name]) if name in stated else len(values) for name, values in ATTRIBUTES.items()]


def object_texts(scene, k: int) -> list[str]:
    """The texts that name object ``k``: its referring expressions and its canonical caption."""
    return [*referring_expressions(scene, k), canonical_caption(scene.attrs[k])]


class SceneSource:
    """Rendered training scenes with the processor's inputs (tiles for the LLM, the SAM2 resize). Scene ``i`` is
    drawn at side ``image_sizes[i % len(image_sizes)]`` (the demo renders 128 px, the tiny model reads 224 px)."""

    def __init__(self, processor: Sa2VAProcessor, seed: int, image_sizes: Sequence[int]):
        self.processor = processor
        self.worlds = [ShapesWorld("train", 10**12, seed, image_size=int(side)) for side in image_sizes]

    def get(self, index: int):
        scene, inputs, _ = self.get_with_image(index)
        return scene, inputs

    def get_with_image(self, index: int):
        """``get`` and the rendered PIL image."""
        scene, pixels = self.worlds[index % len(self.worlds)].scene(index)
        image = PIL.Image.fromarray(pixels)
        return scene, self.processor.preprocess_image(image, where=f"train scene {index}"), image


@dataclass
class PromptBatch:
    """M prompts on S images (stage ``sam``).

    g_pixel_values: uint8 ``[S, 3, S_sam, S_sam]``; gt_mask: float ``[M, h, h]`` at the logits size;
    image_index: long ``[M]``;
    point_coords: float ``[M, 2, 2]`` (x, y in SAM input pixels) and point_labels: int ``[M, 2]`` (1 click,
    -1 pad, 2/3 box corners); is_attribute: bool ``[M]`` (prompt = ``attributes`` instead of the points);
    attributes: long ``[M, 4]``.
    """

    g_pixel_values: torch.Tensor
    gt_mask: torch.Tensor
    image_index: torch.Tensor
    point_coords: torch.Tensor
    point_labels: torch.Tensor
    is_attribute: torch.Tensor
    attributes: torch.Tensor


@dataclass
class TextBatch:
    """input_ids / attention_mask / labels ``[B, L]`` (labels -100 on padding) of phrase rows (stage ``lm``)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor


@dataclass
class JointBatch:
    """B SFT rows over S images (stage ``joint``); ``sft_data`` gives the ``sft_collate`` layout.

    pixel_values: float ``[S + D, n, 3, s, s]``: the S scenes, then the D drawn copies (``region_input='drawn'``);
    g_pixel_values: uint8 ``[S, 3, S_sam, S_sam]``, the scenes' SAM2 inputs (only segmentation rows read them);
    text: ``sft_collate`` of the rows without images (input_ids, labels, attention_mask, position_ids ``[B, L]``);
    row_image: long ``[B]``; is_caption: bool ``[B]``; region_rows: bool ``[B]``, the caption rows whose prompt holds
    region tokens (all of them with native input, none drawn); prompt_masks: bool ``[C, g, g]``, those rows' regions;
    masks: float ``[M, h, h]`` GT of the segmentation rows at the logits size; seg_attributes: long ``[M, 4]``.
    """

    pixel_values: torch.Tensor
    g_pixel_values: torch.Tensor
    text: dict
    row_image: torch.Tensor
    is_caption: torch.Tensor
    prompt_masks: torch.Tensor
    masks: torch.Tensor
    seg_attributes: torch.Tensor
    region_rows: torch.Tensor

    def sft_data(self, device: torch.device | str) -> dict:
        """The ``sft_collate(...)['data']`` dict of these rows, images expanded on ``device``."""
        pixel_values = self.pixel_values.to(device)[self.row_image.to(device)]  # [B, n, 3, s, s]
        n = pixel_values.shape[1]
        vp = torch.zeros(len(self.row_image), n, dtype=torch.bool)  # region tokens come from the last tile
        vp[:, -1] = self.region_rows
        seg_images = self.row_image[~self.is_caption].to(device)  # [M]
        g = self.g_pixel_values.to(device)[seg_images].float()  # [M, 3, S_sam, S_sam]
        data = {k: v.to(device) for k, v in self.text.items()}
        data.update(pixel_values=pixel_values, vp_overall_mask=vp.flatten(),
                    prompt_masks=list(self.prompt_masks.to(device)[:, None]), frames_per_batch=[1] * len(seg_images),
                    g_pixel_values=list(g), masks=list(self.masks.to(device)[:, None]))
        return data


@dataclass
class VideoBatch:
    """B video RES rows over C clips of T frames (stage ``video``).

    pixel_values: float ``[C, n, 3, s, s]``, one tile per MLLM frame; g_pixel_values: uint8 ``[C, T, 3, S_sam,
    S_sam]``; text: ``sft_collate`` of the rows (input_ids, labels, attention_mask, position_ids ``[B, L]``, one
    ``[SEG]`` per row); row_clip: long ``[B]``; masklets: float ``[B, T, h, h]`` GT at the logits size.
    """

    pixel_values: torch.Tensor
    g_pixel_values: torch.Tensor
    text: dict
    row_clip: torch.Tensor
    masklets: torch.Tensor

    @property
    def num_mllm_frames(self) -> int:
        return self.pixel_values.shape[1]


class _TextCache:
    """``processor.encode_fn`` of (user text, answer), memoised (the templates and phrases repeat a lot)."""

    def __init__(self, processor: Sa2VAProcessor, max_entries: int = 50_000):
        self.processor, self.max_entries, self.cache = processor, max_entries, {}

    def encode(self, key: tuple, text_fn, answer: str) -> dict:
        if key not in self.cache:
            if len(self.cache) >= self.max_entries:
                self.cache.clear()
            encoded = self.processor.encode_fn({"conversation": [{"input": text_fn(), "output": answer}]}, 4096)
            self.cache[key] = (np.asarray(encoded["input_ids"], np.int64), np.asarray(encoded["labels"], np.int64))
        ids, labels = self.cache[key]
        return {"input_ids": ids.tolist(), "labels": labels.tolist()}


class StageBatches(Dataset):
    """Map-style dataset: item ``t`` is the batch of step ``t`` of one stage (use ``batch_size=None``)."""

    def __init__(self, stage: str, processor: Sa2VAProcessor, *, seed: int, steps: int, scenes_per_batch: int,
                 image_sizes: Sequence[int] = (224,), attribute_share: float = 0.0, group_by_scene: bool = True,
                 captions_per_scene: int = 1, text_rows: int = 32, clips_per_batch: int = 8,
                 video_frames: int = 16, video_image_size: int = 128, mllm_frames: int = 5,
                 image_share: float = 0.0, region_input: str = "native"):
        if stage not in STAGE_BASES:
            raise ValueError(f"StageBatches: stage={stage!r}; expected one of {tuple(STAGE_BASES)}")
        if region_input not in REGION_INPUTS:
            raise ValueError(f"StageBatches: region_input={region_input!r}; expected one of {REGION_INPUTS}")
        self.region_input = region_input
        self.stage, self.processor, self.seed, self.steps = stage, processor, int(seed), int(steps)
        self.scenes_per_batch, self.image_size = int(scenes_per_batch), int(image_sizes[0])
        self.attribute_share, self.group_by_scene = float(attribute_share), bool(group_by_scene)
        self.captions_per_scene, self.text_rows = int(captions_per_scene), int(text_rows)
        self.source = SceneSource(processor, seed, image_sizes)
        self.low_res = (processor.sam_image_size // 4,) * 2  # SAM2 logits: 4 x (S_sam / 16)
        self.texts = _TextCache(processor)
        self.clips_per_batch, self.mllm_frames, self.image_share = int(clips_per_batch), int(mllm_frames), image_share
        self.clips = ShapesVideoWorld("train", 10**12, self.seed, image_size=int(video_image_size),
                                      num_frames=int(video_frames))

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int):
        if not 0 <= step < self.steps:
            raise IndexError(f"{self.stage} batch {step} out of range [0, {self.steps})")
        rng = np.random.default_rng([self.seed, list(STAGE_BASES).index(self.stage), step])
        first = STAGE_BASES[self.stage] + step * self.scenes_per_batch * 4
        if self.stage == "video":
            if is_image_step(step, self.image_share):
                return self._joint_batch(rng, first)
            return self._video_batch(rng, step * self.clips_per_batch)
        build = {"sam": self._prompt_batch, "lm": self._text_batch, "joint": self._joint_batch}[self.stage]
        return build(rng, first)

    # ------------------------------------------------------------------------------------------- stage sam
    def _prompt_batch(self, rng: np.random.Generator, first: int) -> PromptBatch:
        g_pixels, gts, image_index, coords, labels, is_attr, attrs = [], [], [], [], [], [], []
        shares = [(1 - self.attribute_share) / 2] * 2 + [self.attribute_share]
        for i in range(self.scenes_per_batch):
            scene, inputs = self.source.get(first + i)
            g_pixels.append(inputs.g_pixel_values.to(torch.uint8))  # integer-valued 0..255: exact
            scale = self.processor.sam_image_size / scene.visible.shape[1]
            for k, visible in enumerate(scene.visible):
                kind = PROMPT_KINDS[int(rng.choice(3, p=shares))]
                c, lab = _point_prompt(rng, visible, scale) if kind == "point" else _box_prompt(rng, visible, scale)
                texts = referring_expressions(scene, k)
                gts.append(resize_gt_masks([torch.from_numpy(visible)[None]], self.low_res))
                image_index.append(i)
                coords.append(c)
                labels.append(lab)
                is_attr.append(kind == "attributes")
                attrs.append(attribute_ids(texts[int(rng.integers(len(texts)))]))
        return PromptBatch(torch.stack(g_pixels), torch.cat(gts), torch.tensor(image_index),
                           torch.tensor(np.stack(coords), dtype=torch.float32), torch.tensor(np.stack(labels)),
                           torch.tensor(is_attr), torch.tensor(attrs))

    # -------------------------------------------------------------------------------------------- stage lm
    def _text_batch(self, rng: np.random.Generator, first: int) -> TextBatch:
        tok = self.processor.tokenizer
        rows = []
        for _ in range(self.text_rows):
            scene = sample_scene(rng, self.image_size)
            phrases = [t for k in range(len(scene.objects)) for t in object_texts(scene, k)]
            picked = [phrases[int(j)] for j in rng.permutation(len(phrases))[:4]]
            rows.append(tok.encode(". ".join(picked) + ".", add_special_tokens=False) + [tok.eos_token_id])
        L = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), L), tok.pad_token_id, dtype=torch.long)  # [B, L]
        attention = torch.zeros(len(rows), L, dtype=torch.bool)  # [B, L]
        for b, row in enumerate(rows):
            input_ids[b, :len(row)] = torch.tensor(row)
            attention[b, :len(row)] = True
        return TextBatch(input_ids, attention, input_ids.masked_fill(~attention, -100))

    # ----------------------------------------------------------------------------------------- stage joint
    def _joint_batch(self, rng: np.random.Generator, first: int) -> JointBatch:
        """Grouped: S scenes, a row per object. Ungrouped: about as many segmentation rows (2.5 S, the mean
        object count of 1-4-object scenes), one object each from as many scenes."""
        n_scenes = self.scenes_per_batch if self.group_by_scene else int(round(2.5 * self.scenes_per_batch))
        pixel_values, g_pixels, items, row_image, is_caption = [], [], [], [], []
        prompt_masks, masks, seg_attributes, drawn = [], [], [], []
        for i in range(n_scenes):
            scene, inputs, image = self.source.get_with_image(first + i)
            pixel_values.append(inputs.pixel_values)
            g_pixels.append(inputs.g_pixel_values.to(torch.uint8))
            n = len(scene.objects)
            objects = range(n) if self.group_by_scene else [int(rng.integers(n))]
            for k in objects:
                items.append(self._segment_row(rng, scene, k, inputs.n_tiles, seg_attributes))
                masks.append(resize_gt_masks([torch.from_numpy(scene.visible[k])[None]], self.low_res))
                row_image.append(i)
                is_caption.append(False)
            if i < self.scenes_per_batch:
                for k in rng.permutation(n)[:self.captions_per_scene]:
                    if self.region_input == "drawn":
                        copy = self.processor.preprocess_image(
                            self.processor.region_outline.draw(image, scene.visible[k]),
                            where=f"train scene {first + i}, object {k} drawn")
                        items.append(self._drawn_caption_row(rng, scene, int(k), copy.n_tiles))
                        drawn.append(copy.pixel_values)
                        row_image.append(n_scenes + len(drawn) - 1)
                    else:
                        cells = self.processor.region_cells(scene.visible[k], sample_id=f"train scene {first + i}",
                                                            size=inputs.size)  # [g, g]
                        items.append(self._caption_row(rng, scene, int(k), inputs.n_tiles, cells))
                        prompt_masks.append(cells)
                        row_image.append(i)
                    is_caption.append(True)
        g = self.processor.region_grid_size
        is_caption = torch.tensor(is_caption)
        return JointBatch(torch.stack(pixel_values + drawn), torch.stack(g_pixels), sft_collate(items)["data"],
                          torch.tensor(row_image), is_caption,
                          torch.stack(prompt_masks) if prompt_masks else torch.zeros(0, g, g, dtype=torch.bool),
                          torch.cat(masks), torch.tensor(seg_attributes),
                          region_rows=is_caption & (self.region_input == "native"))

    # ----------------------------------------------------------------------------------------- stage video
    def _video_batch(self, rng: np.random.Generator, first: int) -> VideoBatch:
        """Clips ``first .. first + C - 1`` of the training stream, a row per object of each."""
        pixel_values, g_pixels, items, row_clip, masklets = [], [], [], [], []
        for c in range(self.clips_per_batch):
            clip, frames = self.clips.clip(first + c)
            inputs = self.processor.preprocess_video([PIL.Image.fromarray(f) for f in frames], self.mllm_frames,
                                                     where=f"train clip {first + c}")
            pixel_values.append(inputs.pixel_values)
            g_pixels.append(inputs.g_pixel_values.to(torch.uint8))  # integer-valued 0..255: exact
            for k in range(len(clip.objects)):
                items.append(self._video_row(rng, clip, k, inputs.num_mllm_frames))
                masklets.append(resize_gt_masks([torch.from_numpy(clip.visible[k])], self.low_res)[None])
                row_clip.append(c)
        return VideoBatch(torch.stack(pixel_values), torch.stack(g_pixels), sft_collate(items)["data"],
                          torch.tensor(row_clip), torch.cat(masklets))

    def _video_row(self, rng, clip, k: int, n_frames: int) -> dict:
        texts = object_texts(clip, k)
        text = normalize_expression(texts[int(rng.integers(len(texts)))])
        q, a = int(rng.integers(len(SEGMENT_QUESTIONS))), int(rng.integers(len(ANSWER_LIST)))
        question = SEGMENT_QUESTIONS[q].format(class_name=text)
        if "<image>" not in question:
            question = "<image>\n" + question
        return self.texts.encode(("video", q, text, a, n_frames),
                                 lambda: self.processor.expand_video(question, n_frames), ANSWER_LIST[a])

    def _segment_row(self, rng, scene, k: int, n_tiles: int, seg_attributes: list) -> dict:
        texts = object_texts(scene, k)
        text = normalize_expression(texts[int(rng.integers(len(texts)))])
        q, a = int(rng.integers(len(SEGMENT_QUESTIONS))), int(rng.integers(len(ANSWER_LIST)))
        seg_attributes.append(attribute_ids(text))
        question = SEGMENT_QUESTIONS[q]
        return self.texts.encode(("seg", q, text, a, n_tiles),
                                 lambda: self.processor.segment_text(n_tiles, text, question), ANSWER_LIST[a])

    def _caption_row(self, rng, scene, k: int, n_tiles: int, cells: torch.Tensor) -> dict:
        q = int(rng.integers(len(DEFAULT_CAPTION_QUESTIONS)))
        caption = canonical_caption(scene.attrs[k])
        return self.texts.encode(("cap", q, int(cells.sum()), caption, n_tiles),
                                 lambda: self.processor.caption_text(n_tiles, cells, DEFAULT_CAPTION_QUESTIONS[q]),
                                 caption)


    def _drawn_caption_row(self, rng, scene, k: int, n_tiles: int) -> dict:
        """A caption row about the region drawn into an image of ``n_tiles``: the outline-naming question."""
        rng.integers(len(DEFAULT_CAPTION_QUESTIONS))  # the native row's question draw: keeps both streams in step
        caption = canonical_caption(scene.attrs[k])
        outline = self.processor.region_outline
        return self.texts.encode(("drawn", caption, n_tiles),
                                 lambda: outline.caption_text(self.processor, n_tiles), caption)


def _point_prompt(rng: np.random.Generator, visible: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """One click inside the object, and half the time a second one (else the pad point, label -1)."""
    ys, xs = np.nonzero(visible)
    picks = rng.integers(len(ys), size=2)
    coords = np.stack([xs[picks], ys[picks]], -1).astype(np.float32) * scale  # [2, 2] (x, y)
    labels = np.array([1, 1 if rng.random() < 0.5 else -1], dtype=np.int64)
    coords[labels < 0] = 0.0
    return coords, labels


def _box_prompt(rng: np.random.Generator, visible: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """The object's box, each side moved by N(0, 10 % of the box side), as SAM2's two corner points (labels 2, 3)."""
    ys, xs = np.nonzero(visible)
    box = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=np.float32)
    side = np.array([box[2] - box[0], box[3] - box[1]] * 2, dtype=np.float32)
    box = np.clip(box + rng.normal(0, 0.1, size=4) * side, 0, visible.shape[1]) * scale
    return box.reshape(2, 2).astype(np.float32), np.array([2, 3], dtype=np.int64)


def is_image_step(step: int, image_share: float) -> bool:
    """Whether batch ``step`` (0-based) of the video stage is an image batch: ``image_share`` of the batches, spread
    evenly, batch 0 a video one (so the rows logged at every ``log_every``-th step show video losses)."""
    return step > 0 and int(step * image_share) > int((step - 1) * image_share)


def loader(batches: StageBatches, num_workers: int) -> Sequence:
    """Batches in step order (``num_workers`` processes build them ahead; 0 = in this process)."""
    if num_workers <= 0:
        return batches
    return torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False, num_workers=num_workers,
                                       persistent_workers=False, prefetch_factor=4)
