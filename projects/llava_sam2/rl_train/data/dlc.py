"""describe-anything (DLC) training data: ``<root>/<Subset>/annotations.json`` + ``images/*.tar``.

Layout (docs/data.md): each tar shard holds ``<key>.jpg`` and ``<key>.pickle`` (a list of region
dicts ``{img_id, ann_id, image, category, caption, mask_rle}``); ``annotations.json`` maps each key
to the same region list (plus ``tar_file``). One sample per region.

Index (construction): ``annotations.json`` for keys, region positions and ann ids, and the tar
headers (``tarfile``) for member offsets -- no image or pickle is read. ``load`` seeks to the two
members of one key in the shard (a file handle per process), so memory stays bounded.
The pickles are unpickled with a data-only unpickler (``data/pickles.py``); only read your own
local copy of the data.
"""
from __future__ import annotations

import glob
import os
import pickle
import tarfile
from typing import NamedTuple

import numpy as np

from .bad_samples import BadSampleError
from .base import ProcessLocal, RegionDataset, finish_sample
from .coco import read_json
from .images import load_rgb
from .pickles import loads_data
from .rle import decode_rle
from .types import RegionSample

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
_BLOCK = 512  # tar block size


class Member(NamedTuple):
    offset: int
    size: int


class KeyRecord(NamedTuple):
    subset: str
    key: str
    shard: int          # index into DLCRegionDataset.shards
    image: Member
    pickle: Member


def split_member_name(name: str) -> tuple[str, str] | None:
    """WebDataset convention: key = path up to the first dot of the basename, ext = the rest."""
    dot = name.find(".", name.rfind("/") + 1)
    return None if dot < 0 else (name[:dot], name[dot + 1:].lower())


def scan_tar(path: str) -> tuple[dict[str, dict[str, Member]], str | None]:
    """Member offsets of a tar shard by key and extension, plus a truncation note (None if whole).

    ``tarfile`` stops silently at a cut between members, so a shard is whole only when every member
    fits in the file and the end-of-archive marker (two zero blocks) follows the last one.
    """
    file_size, members, end = os.path.getsize(path), {}, 0
    try:
        archive = tarfile.open(path, "r:")
    except tarfile.TarError as err:
        return members, f"not a readable tar ({err})"
    with archive:
        while True:
            try:
                info = archive.next()
            except (tarfile.TarError, EOFError) as err:
                return members, f"unreadable tar header after byte {end} ({err})"
            if info is None:
                break
            if info.offset_data + info.size > file_size:
                return members, (f"member {info.name} needs bytes up to {info.offset_data + info.size} "
                                 f"but the file has {file_size}")
            end = info.offset_data + -(-info.size // _BLOCK) * _BLOCK
            parts = split_member_name(info.name) if info.isfile() else None
            if parts:
                members.setdefault(parts[0], {})[parts[1]] = Member(info.offset_data, info.size)
    with open(path, "rb") as handle:
        handle.seek(end)
        marker = handle.read(2 * _BLOCK)
    if len(marker) < 2 * _BLOCK or any(marker):
        return members, f"no end-of-archive marker after byte {end} (file size {file_size})"
    return members, None


def _open_rb(path: str):
    return open(path, "rb")


class DLCRegionDataset(RegionDataset):
    """Region captions of describe-anything subsets (``COCOStuff``, ``LVIS``, ``PACO``, ...).

    Args:
        data_root: folder holding one folder per subset.
        subsets: subset folder names to read (the SAV video subset is not supported).
        name: dataset name; sources are ``"<name>/<subset>"``, sample ids
            ``"<name>/<subset>/<key>#<ann_id>"``.
        on_bad_sample: ``'raise'`` or ``'skip'``. Keys missing from the shards (or lost to a
            truncated shard) are found while indexing: raised at construction, or left out and counted.
        alpha: transparency policy of ``data/images.py``.
    """

    def __init__(self, data_root: str, subsets: list[str] | tuple[str, ...] = ("COCOStuff",), *,
                 name: str = "dlc", on_bad_sample: str = "raise", alpha: str = "raise"):
        super().__init__(name, on_bad_sample, alpha)
        if isinstance(subsets, str):
            subsets = [subsets]
        self.data_root = str(data_root)
        self.shards: list[str] = []
        self._keys: list[KeyRecord] = []
        key_index, ann_ids = [], []  # per sample: (key record, region position), ann id
        for subset in subsets:
            self._index_subset(subset, key_index, ann_ids)
        self._regions = np.asarray(key_index, dtype=np.int64).reshape(-1, 2)  # [N, 2]
        self._ann_ids = np.asarray(ann_ids, dtype=np.int64 if all(
            isinstance(a, (int, np.integer)) for a in ann_ids) else object)
        self._files = ProcessLocal(_open_rb)

    def _index_subset(self, subset: str, key_index: list, ann_ids: list) -> None:
        subset_dir = os.path.join(self.data_root, subset)
        ann_path = os.path.join(subset_dir, "annotations.json")
        annotations = read_json(ann_path, f"DLC {subset} annotation file")
        if not isinstance(annotations, dict):
            raise ValueError(f"{ann_path}: expected a JSON object {{image key: [region, ...]}}, got "
                             f"{type(annotations).__name__}")
        shard_paths = sorted(glob.glob(os.path.join(subset_dir, "images", "*.tar")))
        if not shard_paths:
            raise ValueError(f"DLCRegionDataset: no tar shards in {subset_dir}/images/; expected "
                             "images/00000000.tar ... next to annotations.json")
        found, truncated = self._scan_shards(shard_paths)
        for key, regions in annotations.items():
            regions = regions if isinstance(regions, list) else [regions]  # SAV stores one dict
            entry = found.get(key) or (found.get(str(int(key))) if key.isdigit() else None)
            for pos, region in enumerate(regions):
                ann_id = region.get("ann_id", pos) if isinstance(region, dict) else pos
                sample_id = f"{self.name}/{subset}/{key}#{ann_id}"
                try:
                    record = self._key_record(subset, key, region, entry, truncated, ann_path, sample_id)
                except BadSampleError as err:
                    self.index_time_bad(err)
                    continue
                if not self._keys or self._keys[-1] != record:
                    self._keys.append(record)
                key_index.append((len(self._keys) - 1, pos))
                ann_ids.append(ann_id)

    def _scan_shards(self, shard_paths: list[str]):
        found, truncated = {}, {}
        for path in shard_paths:
            members, problem = scan_tar(path)
            self.shards.append(path)
            if problem:
                truncated[os.path.basename(path)] = problem
            for key, exts in members.items():
                found[key] = (len(self.shards) - 1, exts)
                if key.isdigit():  # keys may or may not carry zero padding on either side
                    found.setdefault(str(int(key)), found[key])
        return found, truncated

    def _key_record(self, subset, key, region, entry, truncated, ann_path, sample_id) -> KeyRecord:
        if not isinstance(region, dict) or isinstance(region.get("mask_rle"), list):
            raise BadSampleError("bad_annotation", "region must be a dict with one mask_rle (multi-frame "
                                 "SAV video regions are not supported)", file=ann_path, sample_id=sample_id)
        exts = entry[1] if entry else {}
        image_ext = next((e for e in IMAGE_EXTS if e in exts), None)
        if image_ext is None or "pickle" not in exts:
            tar_file = region.get("tar_file")
            lost = [f"{name}: {why}" for name, why in truncated.items() if tar_file in (None, name)]
            missing = [m for m, ok in ((f"{key}.jpg", image_ext), (f"{key}.pickle", "pickle" in exts))
                       if not ok]
            where = tar_file or "any shard"
            if lost:
                raise BadSampleError("truncated_shard", f"{missing} not in {where}; truncated: {lost}",
                                     file=ann_path, sample_id=sample_id)
            raise BadSampleError("missing_member", f"{missing} not found in {where} of {subset}/images",
                                 file=ann_path, sample_id=sample_id)
        return KeyRecord(subset, key, entry[0], exts[image_ext], exts["pickle"])

    def __len__(self) -> int:
        return len(self._regions)

    def load(self, index: int) -> RegionSample:
        key_index, pos = (int(v) for v in self._regions[index])
        record, ann_id = self._keys[key_index], self._ann_ids[index]
        shard = self.shards[record.shard]
        sample_id = f"{self.name}/{record.subset}/{record.key}#{ann_id}"
        where = dict(file=shard, sample_id=sample_id)
        image_bytes = self._read(shard, record.image, where)
        region = self._region(self._read(shard, record.pickle, where), ann_id, pos, where)
        image = load_rgb(image_bytes, alpha=self.alpha, **where)
        gt_mask = decode_rle(region.get("mask_rle"), image.height, image.width, **where)
        caption = region.get("caption")
        if not isinstance(caption, str) or not caption.strip():
            raise BadSampleError("bad_annotation", f"region caption must be a non-empty string, got "
                                 f"{caption!r}", **where)
        category = region.get("category")
        return finish_sample(image, gt_mask, captions=[caption.strip()], expressions=[],
                             sample_id=sample_id, source=f"{self.name}/{record.subset}", file=shard,
                             category=category if isinstance(category, str) else None, input_check=self.input_check)

    def _read(self, shard: str, member: Member, where: dict) -> bytes:
        handle = self._files.get(shard)
        handle.seek(member.offset)
        payload = handle.read(member.size)
        if len(payload) != member.size:
            raise BadSampleError("truncated_shard", f"member at byte {member.offset} has "
                                 f"{len(payload)} of {member.size} bytes", **where)
        return payload

    @staticmethod
    def _region(payload: bytes, ann_id, pos: int, where: dict) -> dict:
        """Pick the region with ``ann_id`` (or at ``pos`` when regions carry no ann id) from a pickle."""
        try:
            regions = loads_data(payload)
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
            raise BadSampleError("bad_annotation", f"cannot unpickle the region list ({err})",
                                 **where) from None
        regions = [regions] if isinstance(regions, dict) else regions
        if not isinstance(regions, list) or not all(isinstance(r, dict) for r in regions):
            raise BadSampleError("bad_annotation", "the pickle must hold a list of region dicts",
                                 **where)
        if any("ann_id" in r for r in regions):
            matches = [r for r in regions if r.get("ann_id") == ann_id]
            if len(matches) != 1:
                raise BadSampleError("bad_annotation", f"annotations.json ann_id {ann_id} matches "
                                     f"{len(matches)} regions in the pickle (ann_ids "
                                     f"{[r.get('ann_id') for r in regions]})", **where)
            return matches[0]
        if pos >= len(regions):
            raise BadSampleError("bad_annotation", f"region {pos} requested but the pickle has "
                                 f"{len(regions)}", **where)
        return regions[pos]
