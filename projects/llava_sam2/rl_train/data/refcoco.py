"""RefCOCO / RefCOCO+ / RefCOCOg (``refs(<split_by>).p`` + ``instances.json``) as region samples.

One sample per ref of the chosen split: the mask of the ref's annotation (polygons or RLE in
``instances.json``) and its sentences as ``expressions`` (``sent``, the lower-cased form the RES
evaluation uses). ``captions`` stay empty: these are referring expressions, not descriptions.
Splits: ``unc`` (refcoco, refcoco+) has train/val/testA/testB, ``umd`` (refcocog) train/val/test.
"""
from __future__ import annotations

import os
from typing import NamedTuple

from .bad_samples import BadSampleError
from .base import RegionDataset, finish_sample
from .coco import check_image_id, coco_tables, duplicated, load_region, read_json
from .pickles import load_data_file
from .types import RegionSample

DEFAULT_SPLIT_BY = {"refcoco": "unc", "refcoco+": "unc", "refcocog": "umd"}


class RefRecord(NamedTuple):
    ref_id: int
    image_id: int
    ann_id: int
    expressions: list[str]


class RefCocoRegionDataset(RegionDataset):
    """Referring-segmentation samples of one RefCOCO-family split.

    Args:
        data_root: folder holding ``instances.json`` and ``refs(<split_by>).p``
            (upstream layout: ``data/ref_seg/refcoco``).
        image_root: folder of the COCO train2014 images named in ``instances.json``.
        dataset: ``'refcoco'``, ``'refcoco+'`` or ``'refcocog'`` (picks the default ``split_by``).
        split: e.g. ``'val'``, ``'testA'``; must occur in the refs file.
        split_by: refs file variant (``'unc'``, ``'umd'``, ``'google'``); default from ``dataset``.
        name: dataset name in sample ids (default ``"<dataset>_<split_by>_<split>"``).
    """

    def __init__(self, data_root: str, image_root: str, *, dataset: str = "refcoco",
                 split: str = "val", split_by: str | None = None, name: str | None = None,
                 on_bad_sample: str = "raise", alpha: str = "raise"):
        if dataset not in DEFAULT_SPLIT_BY:
            raise ValueError(f"RefCocoRegionDataset: dataset={dataset!r} is not one of "
                             f"{sorted(DEFAULT_SPLIT_BY)}")
        split_by = split_by or DEFAULT_SPLIT_BY[dataset]
        super().__init__(name or f"{dataset}_{split_by}_{split}", on_bad_sample, alpha)
        self.image_root = str(image_root)
        self.ann_file = os.path.join(str(data_root), "instances.json")
        self.refs_file = os.path.join(str(data_root), f"refs({split_by}).p")
        if not os.path.isfile(self.refs_file):
            raise ValueError(f"RefCocoRegionDataset: {self.refs_file} does not exist; data_root must hold "
                             f"refs({split_by}).p (split_by={split_by!r}) next to instances.json")
        refs = load_data_file(self.refs_file)
        if not isinstance(refs, list):
            raise ValueError(f"{self.refs_file}: expected a pickled list of ref dicts, got "
                             f"{type(refs).__name__}")
        splits = sorted({r.get("split") for r in refs if isinstance(r, dict)}, key=str)
        if split not in splits:
            raise ValueError(f"RefCocoRegionDataset: split={split!r} is not in {self.refs_file} "
                             f"(splits there: {splits})")
        data = read_json(self.ann_file, "RefCOCO instances file")
        self._images, categories, self._duplicate_images = coco_tables(data, self.ann_file)
        selected = [r for r in refs if isinstance(r, dict) and r.get("split") == split]
        wanted = {r.get("ann_id") for r in selected}
        chosen = [a for a in data["annotations"] if isinstance(a, dict) and a.get("id") in wanted]
        self._repeated_anns = duplicated(a["id"] for a in chosen)
        self._anns = {a["id"]: (a.get("segmentation"), categories.get(a.get("category_id"))) for a in chosen}
        self._refs: list[RefRecord] = []
        for ref in selected:
            try:
                self._refs.append(self._index_ref(ref))
            except BadSampleError as err:
                self.index_time_bad(err)

    def _index_ref(self, ref: dict) -> RefRecord:
        sample_id = f"{self.name}/{ref.get('image_id')}#{ref.get('ref_id')}"
        where = dict(file=self.refs_file, sample_id=sample_id)
        if ref.get("ann_id") not in self._anns:
            raise BadSampleError("bad_annotation", f"ann_id {ref.get('ann_id')} is not in "
                                 f"{self.ann_file}", **where)
        if ref.get("ann_id") in self._repeated_anns:
            raise BadSampleError("duplicate_id", f"ann_id {ref.get('ann_id')} is used by more than one annotation "
                                 f"of {self.ann_file}", **where)
        check_image_id(ref.get("image_id"), self._images, self._duplicate_images, **where)
        sentences = ref.get("sentences")
        if not isinstance(sentences, list) or not sentences:
            raise BadSampleError("bad_annotation", "ref has no 'sentences' list", **where)
        expressions = []
        for sentence in sentences:
            text = sentence.get("sent", sentence.get("raw")) if isinstance(sentence, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise BadSampleError("bad_annotation", f"sentence without text: {sentence!r}", **where)
            expressions.append(text.strip())
        return RefRecord(ref["ref_id"], ref["image_id"], ref["ann_id"], expressions)

    def __len__(self) -> int:
        return len(self._refs)

    def load(self, index: int) -> RegionSample:
        ref = self._refs[index]
        sample_id = f"{self.name}/{ref.image_id}#{ref.ref_id}"
        image = self._images[ref.image_id]
        segmentation, category = self._anns[ref.ann_id]
        image_path = os.path.join(self.image_root, image.file_name)
        pil, gt_mask = load_region(image_path, image, segmentation, alpha=self.alpha,
                                   ann_file=self.ann_file, sample_id=sample_id)
        return finish_sample(pil, gt_mask, captions=[], expressions=ref.expressions,
                             sample_id=sample_id, source=self.name, file=self.ann_file,
                             category=category, input_check=self.input_check)
