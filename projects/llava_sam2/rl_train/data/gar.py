"""Grasp-Any-Region (GAR) data: Arrow *stream* shards written by ``datasets.save_to_disk``.

Layout (docs/data.md): ``<root>/<Subset>/data-XXXXX-of-NNNNN.arrow`` with columns ``image``
(``{bytes, path}``), ``conversations`` (``[{from, value}]``), ``mask_rle`` (one RLE dict, or a list
of them) and the misspelled ``catagory``. Captions are the gpt turns of the conversation.

* a row with one mask gives one sample whose captions are all its gpt turns;
* a row with N masks and no ``<PromptK>`` in its text gives N samples, mask k paired with gpt turn k
  (GAR's per-mask captioning); a mask/answer count mismatch is a bad sample;
* rows whose text refers to ``<PromptK>`` (Relation data: one answer about several masks) and rows
  without a mask are not single-region samples: they are left out of the index and counted in
  ``excluded``.

Index (construction): the shards are memory-mapped and only the ``mask_rle`` list lengths and the
conversation text are scanned; images stay on disk. ``load`` slices one row (per-process maps).
"""
from __future__ import annotations

import base64
import glob
import json
import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .bad_samples import BadSampleError
from .base import ProcessLocal, RegionDataset, finish_sample
from .images import load_rgb
from .rle import decode_rle
from .types import RegionSample

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("image", "conversations", "mask_rle")
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # Arrow IPC end-of-stream marker
_PROMPT_REF = r"<Prompt\d+>"
_ROLES = {"human": "human", "user": "human", "gpt": "gpt", "assistant": "gpt"}


def read_stream(path: str) -> tuple[pa.Table, str | None]:
    """Memory-map one Arrow stream shard: the readable record batches and a truncation note.

    The stream reader treats a cut at a batch boundary as a normal end, so a shard is whole only
    if it also ends with the end-of-stream marker.
    """
    source = pa.memory_map(path, "r")
    try:
        reader = pa.ipc.open_stream(source)
    except (pa.ArrowInvalid, OSError) as err:
        return pa.table({}), f"not an Arrow stream ({err})"
    batches, problem = [], None
    while True:
        try:
            batches.append(reader.read_next_batch())
        except StopIteration:
            break
        except (pa.ArrowInvalid, OSError) as err:
            problem = f"record batch {len(batches)} is cut short ({err})"
            break
    if problem is None:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - len(_EOS)))
            if handle.read() != _EOS:
                problem = "no end-of-stream marker"
    return pa.Table.from_batches(batches, schema=reader.schema), problem


def _open_table(path: str) -> pa.Table:
    return read_stream(path)[0]


def mask_counts(column: pa.ChunkedArray) -> np.ndarray:
    """Number of masks per row: 1 for an RLE struct, the list length for a list, 0 for null."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        lengths = pc.list_value_length(column)
    else:
        lengths = pc.if_else(pc.is_valid(column), 1, 0)
    return np.asarray(pc.fill_null(lengths, 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def mentions_prompts(column: pa.ChunkedArray) -> np.ndarray:
    """Rows whose conversation text contains ``<PromptK>`` (list of turns, or a JSON string)."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        hits = pc.match_substring_regex(column, _PROMPT_REF)
        return np.asarray(pc.fill_null(hits, False).to_numpy(zero_copy_only=False), dtype=bool)
    flags = np.zeros(len(column), dtype=bool)
    start = 0
    for chunk in column.chunks:  # list<struct<from, value>>
        values = pc.struct_field(pc.list_flatten(chunk), "value")
        hits = np.asarray(pc.fill_null(pc.match_substring_regex(values, _PROMPT_REF), False)
                          .to_numpy(zero_copy_only=False), dtype=bool)
        parents = np.asarray(pc.list_parent_indices(chunk).to_numpy(zero_copy_only=False))
        flags[start + parents[hits]] = True
        start += len(chunk)
    return flags


def parse_conversation(raw, *, file: str, sample_id: str) -> list[tuple[str, str]]:
    """``[{from, value}, ...]`` (or its JSON string) -> ``[(role, text)]`` with role human|gpt."""
    def bad(detail):
        return BadSampleError("bad_conversation", detail, file=file, sample_id=sample_id)

    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as err:
            raise bad(f"conversation string is not JSON ({err})") from None
    if not isinstance(raw, list) or not raw:
        raise bad(f"conversation must be a non-empty list of turns, got {type(raw).__name__}")
    turns = []
    for turn in raw:
        if not isinstance(turn, dict) or _ROLES.get(turn.get("from")) is None \
                or not isinstance(turn.get("value"), str):
            raise bad(f"turn {turn!r} is not {{'from': 'human'|'gpt', 'value': str}}")
        turns.append((_ROLES[turn["from"]], turn["value"]))
    if not any(role == "gpt" and text.strip() for role, text in turns):
        raise bad("conversation has no non-empty gpt turn to use as the caption")
    return turns


class GARRegionDataset(RegionDataset):
    """Region captions from GAR ``save_to_disk`` shards.

    Args:
        data_root: folder holding the subset folders.
        subsets: folder names or glob patterns under ``data_root`` (``'Fine-Grained-Dataset*'``
            matches the ``-Part1``/``-Part2`` folders of the Hugging Face copy).
        name: dataset name; sources are ``"<name>/<folder>"``, sample ids
            ``"<name>/<folder>/<shard stem>:<row>#<mask index>"``.
        on_bad_sample: ``'raise'`` or ``'skip'`` (a truncated shard is found while indexing).
        alpha: transparency policy of ``data/images.py``.
    """

    def __init__(self, data_root: str, subsets=("Fine-Grained-Dataset*",), *, name: str = "gar",
                 on_bad_sample: str = "raise", alpha: str = "raise"):
        super().__init__(name, on_bad_sample, alpha)
        subsets = [subsets] if isinstance(subsets, str) else list(subsets)
        self.data_root = str(data_root)
        self.shards: list[str] = []
        self.excluded = {"relation_rows": 0, "rows_without_mask": 0}
        samples = []  # per shard: int64 [n, 3] of (shard index, row, mask index)
        for subset in subsets:
            folders = sorted(p for p in glob.glob(os.path.join(self.data_root, subset)) if os.path.isdir(p))
            shard_paths = [s for f in folders for s in sorted(glob.glob(os.path.join(f, "*.arrow")))]
            if not shard_paths:
                raise ValueError(f"GARRegionDataset: no *.arrow shards under {self.data_root}/{subset}; "
                                 "expected <Subset>/data-00000-of-0000N.arrow from save_to_disk")
            for path in shard_paths:
                self._index_shard(path, samples)
        self._samples = np.concatenate(samples) if samples else np.zeros((0, 3), np.int64)  # [N, 3]
        self._tables = ProcessLocal(_open_table)
        if any(self.excluded.values()):
            logger.info("%s: left out rows that are not single regions: %s", name, self.excluded)

    def _index_shard(self, path: str, samples: list) -> None:
        table, problem = read_stream(path)
        if problem:
            self.index_time_bad(BadSampleError(
                "truncated_shard", f"{problem}; rows from {table.num_rows} on are lost", file=path,
                sample_id=f"{self._key(path, table.num_rows)}#*"))
        missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
        if table.num_rows and missing:
            raise ValueError(f"{path}: GAR shard lacks columns {missing} (has {table.column_names})")
        if not table.num_rows:
            return
        self.shards.append(path)
        n_masks = mask_counts(table.column("mask_rle"))
        is_relation = mentions_prompts(table.column("conversations"))
        self.excluded["rows_without_mask"] += int((n_masks == 0).sum())
        self.excluded["relation_rows"] += int(((n_masks > 0) & is_relation).sum())
        rows = np.flatnonzero((n_masks > 0) & ~is_relation)
        counts = n_masks[rows]
        row_of = np.repeat(rows, counts)                                     # [n]
        mask_index = np.arange(len(row_of)) - np.repeat(np.cumsum(counts) - counts, counts)  # [n]
        samples.append(np.stack([np.full_like(row_of, len(self.shards) - 1), row_of, mask_index], 1))

    def _source(self, path: str) -> str:
        return f"{self.name}/{os.path.basename(os.path.dirname(path))}"

    def _key(self, path: str, row: int) -> str:
        return f"{self._source(path)}/{os.path.splitext(os.path.basename(path))[0]}:{row}"

    def __len__(self) -> int:
        return len(self._samples)

    def load(self, index: int) -> RegionSample:
        shard, row, k = (int(v) for v in self._samples[index])
        path = self.shards[shard]
        sample_id = f"{self._key(path, row)}#{k}"
        where = dict(file=path, sample_id=sample_id)
        record = self._row(self._tables.get(path), row, where)
        turns = parse_conversation(record["conversations"], **where)
        answers = [text.strip() for role, text in turns if role == "gpt" and text.strip()]
        rles = record["mask_rle"] if isinstance(record["mask_rle"], list) else [record["mask_rle"]]
        if len(rles) > 1 and len(answers) != len(rles):
            raise BadSampleError("bad_conversation", f"{len(rles)} masks but {len(answers)} gpt answers;"
                                 " cannot pair mask k with answer k", **where)
        image = load_rgb(self._image_source(record["image"], path, where), alpha=self.alpha, **where)
        gt_mask = decode_rle(rles[k], image.height, image.width, **where)
        category = record.get("catagory", record.get("category"))
        return finish_sample(image, gt_mask, captions=answers if len(rles) == 1 else [answers[k]],
                             expressions=[], sample_id=sample_id, source=self._source(path), file=path,
                             category=category if isinstance(category, str) else None, input_check=self.input_check)

    @staticmethod
    def _row(table: pa.Table, row: int, where: dict) -> dict:
        """One row as Python values; a string that is not valid UTF-8 is a bad sample naming its column."""
        record = {}
        for column in (c for c in (*REQUIRED_COLUMNS, "catagory", "category") if c in table.column_names):
            try:
                record[column] = table.column(column).slice(row, 1).to_pylist()[0]
            except UnicodeDecodeError as err:
                raise BadSampleError("bad_text", f"column {column!r} holds a string that is not valid UTF-8 "
                                     f"({err.reason}: byte {err.object[err.start:err.start + 1]!r} at offset "
                                     f"{err.start} of {err.object[max(0, err.start - 20):err.end + 20]!r})",
                                     **where) from None
        return record

    @staticmethod
    def _image_source(value, shard_path: str, where: dict):
        """HF ``Image`` struct (bytes or path), a path string, or a ``data:...;base64,`` string."""
        if isinstance(value, dict):
            if value.get("bytes"):
                return value["bytes"]
            value = value.get("path")
        if isinstance(value, str) and value.startswith("data:") and "base64," in value:
            try:
                return base64.b64decode(value.split("base64,", 1)[1], validate=True)
            except ValueError as err:
                raise BadSampleError("bad_image", f"invalid base64 image ({err})", **where) from None
        if not isinstance(value, str) or not value:
            raise BadSampleError("missing_image", "row has neither image bytes nor an image path", **where)
        return value if os.path.isabs(value) else os.path.join(os.path.dirname(shard_path), value)
