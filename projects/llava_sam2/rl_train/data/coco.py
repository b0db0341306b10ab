"""COCO-style ``annotations.json`` as region samples (one sample per annotation).

Format (docs/data.md): ``images`` (``id``, ``file_name`` relative to ``image_root``, ``height``,
``width``), ``annotations`` (``id``, ``image_id``, ``category_id``, ``segmentation`` as polygons,
compressed RLE or uncompressed RLE, ``iscrowd``) and ``categories``. Optional per-annotation text:
``caption`` (str or list of str) / ``captions`` (list) and ``expressions`` (list of str).

Unpaired data: an annotation may leave out its text (a region only, e.g. an automatic mask) or its ``segmentation``
(a text about the image only, e.g. a referring expression without a mask); the sample's ``gt_mask`` is then None.
One without both is a bad annotation.

The constructor reads the JSON only (no image is opened, no mask decoded); ``load`` decodes one.
"""
from __future__ import annotations

import json
import os
from typing import NamedTuple

from .bad_samples import BadSampleError
from .base import RegionDataset, finish_sample
from .images import load_rgb
from .rle import decode_segmentation
from .types import RegionSample


class ImageRecord(NamedTuple):
    file_name: str
    height: int | None
    width: int | None


class AnnRecord(NamedTuple):
    ann_id: int
    image_id: int
    segmentation: object
    captions: list[str]
    expressions: list[str]
    category: str | None


def read_json(path: str, what: str) -> object:
    """Read a JSON file, turning a missing, non-UTF-8 or malformed file into a ValueError naming it."""
    if not os.path.isfile(path):
        raise ValueError(f"{what} {path} does not exist; set the dataset's path to your local copy")
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ValueError(f"{what} {path} is not valid UTF-8: byte {raw[err.start]:#04x} at offset {err.start} "
                         f"(line {line}) ({err.reason}); JSON files must be UTF-8: re-save it as UTF-8 (e.g. "
                         "iconv -f latin1 -t utf-8) or fix that string") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{what} {path} is not valid JSON ({err}); re-export it") from None


def duplicated(ids) -> set:
    """The values that occur more than once in ``ids``."""
    seen, repeated = set(), set()
    for value in ids:
        (repeated if value in seen else seen).add(value)
    return repeated


def coco_tables(data: object, path: str) -> tuple[dict[int, ImageRecord], dict[int, str], dict[int, list[str]]]:
    """``images`` and ``categories`` of a COCO dict -> ``{image_id: ImageRecord}``, ``{cat_id: name}`` and
    ``{image_id: [file_name, ...]}`` of ids that ``images`` lists more than once (left out of the first
    table: an annotation cannot tell which picture such an id means)."""
    if not isinstance(data, dict) or not isinstance(data.get("images"), list) \
            or not isinstance(data.get("annotations"), list):
        raise ValueError(f"{path}: expected a COCO dict with 'images' and 'annotations' lists, got "
                         f"keys {sorted(data) if isinstance(data, dict) else type(data).__name__}")
    images, duplicates = {}, {}
    for record in data["images"]:
        if not isinstance(record, dict) or "id" not in record or "file_name" not in record:
            raise ValueError(f"{path}: every entry of 'images' needs 'id' and 'file_name', got {record!r}")
        image_id = record["id"]
        if image_id in duplicates:
            duplicates[image_id].append(record["file_name"])
        elif image_id in images:
            duplicates[image_id] = [images.pop(image_id).file_name, record["file_name"]]
        else:
            images[image_id] = ImageRecord(record["file_name"], record.get("height"), record.get("width"))
    categories = {c["id"]: c.get("name") for c in data.get("categories", []) if "id" in c}
    return images, categories, duplicates


def check_image_id(image_id, images: dict, duplicates: dict, **where) -> None:
    """Raise ``BadSampleError`` unless ``image_id`` names exactly one record of ``images``."""
    if image_id in duplicates:
        raise BadSampleError("duplicate_id", f"image_id {image_id} appears {len(duplicates[image_id])} times in "
                             f"'images' (file_name {duplicates[image_id]})", **where)
    if image_id not in images:
        raise BadSampleError("bad_annotation", f"image_id {image_id} is not in 'images'", **where)


def text_list(value, field: str, *, file: str, sample_id: str) -> list[str]:
    """A str or list of str annotation field -> list of non-empty str (None -> [])."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(t, str) and t.strip() for t in items):
        raise BadSampleError("bad_annotation", f"'{field}' must be a non-empty string or a list of them, "
                             f"got {value!r}", file=file, sample_id=sample_id)
    return [t.strip() for t in items]


def load_region(image_path: str, image: ImageRecord, segmentation, *, alpha: str, ann_file: str,
                sample_id: str):
    """Open one image (RGB policy) and decode its region at the image's size."""
    pil = load_rgb(image_path, alpha=alpha, file=image_path, sample_id=sample_id)
    width, height = pil.size
    if (image.height, image.width) != (None, None) and (image.height, image.width) != (height, width):
        raise BadSampleError("image_size_mismatch", f"annotations.json says height={image.height}, "
                             f"width={image.width} but {image_path} is {height}x{width}",
                             file=ann_file, sample_id=sample_id)
    gt_mask = decode_segmentation(segmentation, height, width, file=ann_file, sample_id=sample_id)
    return pil, gt_mask


class CocoRegionDataset(RegionDataset):
    """Region samples from a COCO-style ``annotations.json``.

    Args:
        ann_file: path of ``annotations.json``.
        image_root: folder that ``file_name`` is relative to (default: the folder of ``ann_file``).
        name: dataset name; sample ids are ``"<name>/<image id>#<ann id>"``.
        include_crowd: keep ``iscrowd=1`` annotations (off: crowd regions are not one object).
        on_bad_sample: ``'raise'`` or ``'skip'`` (skip and count).
        alpha: transparency policy of ``data/images.py``.
    """

    def __init__(self, ann_file: str, image_root: str | None = None, *, name: str = "coco",
                 include_crowd: bool = False, on_bad_sample: str = "raise", alpha: str = "raise"):
        super().__init__(name, on_bad_sample, alpha)
        self.ann_file = str(ann_file)
        self.image_root = str(image_root) if image_root is not None else os.path.dirname(self.ann_file)
        data = read_json(self.ann_file, "COCO annotation file")
        self._images, categories, self._duplicate_images = coco_tables(data, self.ann_file)
        annotations = [a for a in data["annotations"] if not (a.get("iscrowd", 0) and not include_crowd)]
        repeated_ids = duplicated(a.get("id") for a in annotations if isinstance(a, dict) and "id" in a)
        self._anns: list[AnnRecord] = []
        for position, ann in enumerate(annotations):
            try:
                self._anns.append(self._index_ann(ann, categories, position, repeated_ids))
            except BadSampleError as err:
                self.index_time_bad(err)

    def _index_ann(self, ann: dict, categories: dict[int, str], position: int, repeated_ids: set) -> AnnRecord:
        sample_id = f"{self.name}/{ann.get('image_id')}#{ann.get('id')}"
        where = dict(file=self.ann_file, sample_id=sample_id)
        for key in ("id", "image_id"):
            if key not in ann:
                raise BadSampleError("bad_annotation", f"annotation has no '{key}'", **where)
        if ann["id"] in repeated_ids:
            raise BadSampleError("duplicate_id", f"annotation id {ann['id']} (entry {position} of 'annotations') "
                                 "is used by more than one annotation", **where)
        check_image_id(ann["image_id"], self._images, self._duplicate_images, **where)
        captions = text_list(ann.get("caption"), "caption", **where) + \
            text_list(ann.get("captions"), "captions", **where)
        expressions = text_list(ann.get("expressions"), "expressions", **where)
        if ann.get("segmentation") is None and not (captions or expressions):
            raise BadSampleError("bad_annotation", "annotation has neither a 'segmentation' nor a text ('caption', "
                                 "'captions', 'expressions')", **where)
        return AnnRecord(ann["id"], ann["image_id"], ann.get("segmentation"), captions, expressions,
                         categories.get(ann.get("category_id")))

    def __len__(self) -> int:
        return len(self._anns)

    def sample_id(self, index: int) -> str:
        """Sample ``index``'s id without loading its image."""
        ann = self._anns[index]
        return f"{self.name}/{ann.image_id}#{ann.ann_id}"

    def load(self, index: int) -> RegionSample:
        ann = self._anns[index]
        image = self._images[ann.image_id]
        sample_id = self.sample_id(index)
        image_path = os.path.join(self.image_root, image.file_name)
        if ann.segmentation is None:  # a text-only annotation (unpaired data): no region to decode
            pil = load_rgb(image_path, alpha=self.alpha, file=image_path, sample_id=sample_id)
            return RegionSample(image=pil, gt_mask=None, captions=list(ann.captions),
                                expressions=list(ann.expressions), sample_id=sample_id, source=self.name,
                                category=ann.category)
        pil, gt_mask = load_region(image_path, image, ann.segmentation, alpha=self.alpha,
                                   ann_file=self.ann_file, sample_id=sample_id)
        return finish_sample(pil, gt_mask, captions=ann.captions, expressions=ann.expressions,
                             sample_id=sample_id, source=self.name, file=self.ann_file,
                             category=ann.category, input_check=self.input_check)
