"""Tiny DLC, GAR, COCO and RefCOCO datasets in their real on-disk layouts (docs/data.md).

Each ``make_*`` writes under ``root`` and returns the paths plus the samples a loader must yield:
``Expected(sample_id, gt_mask, captions, expressions, category, size)``. Masks are drawn here with
numpy (random blobs, or rectangles whose pixels are known by slicing), then encoded with
pycocotools, so a loader test checks decoding against an independent ground truth.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import tarfile
from dataclasses import dataclass

import numpy as np
import PIL.Image
from pycocotools import mask as mask_utils


@dataclass
class Expected:
    sample_id: str
    gt_mask: np.ndarray          # bool [H, W]
    captions: list
    expressions: list
    category: str | None
    size: tuple                  # PIL (W, H)
    problem: str | None = None   # bad-sample kind, for the bad fixtures


def rgb_image(seed: int, height: int, width: int, mode: str = "RGB") -> PIL.Image.Image:
    """A seeded image with structure (gradient + noise), converted to ``mode``."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:height, 0:width]
    base = np.stack([xs * 255 // max(width - 1, 1), ys * 255 // max(height - 1, 1),
                     np.full_like(xs, 128)], -1)                                  # [H, W, 3]
    pixels = np.clip(base + rng.integers(-30, 31, size=(height, width, 3)), 0, 255).astype(np.uint8)
    return PIL.Image.fromarray(pixels).convert(mode)


def image_bytes(image: PIL.Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def blob_mask(seed: int, height: int, width: int) -> np.ndarray:
    """A seeded non-empty bool mask: a rectangle plus scattered pixels."""
    rng = np.random.default_rng(seed)
    gt_mask = rng.random((height, width)) < 0.15
    y0, x0 = rng.integers(0, height // 2), rng.integers(0, width // 2)
    gt_mask[y0:y0 + height // 3, x0:x0 + width // 3] = True
    return gt_mask


def rect_mask(height: int, width: int, *boxes) -> np.ndarray:
    """Union of boxes (x0, y0, x1, y1): pycocotools rasterises the polygon of such a box to
    rows y0..y1-1 and columns x0..x1-1 (checked with pycocotools 2.0.11)."""
    gt_mask = np.zeros((height, width), dtype=bool)
    for x0, y0, x1, y1 in boxes:
        gt_mask[y0:y1, x0:x1] = True
    return gt_mask


def rect_polygons(*boxes) -> list:
    return [[x0, y0, x1, y0, x1, y1, x0, y1] for x0, y0, x1, y1 in boxes]


def rle(gt_mask: np.ndarray) -> dict:
    """Compressed RLE with str counts, as the datasets store it."""
    encoded = mask_utils.encode(np.asfortranarray(gt_mask.astype(np.uint8)))
    return {"size": [int(v) for v in encoded["size"]], "counts": encoded["counts"].decode("ascii")}


def uncompressed_rle(gt_mask: np.ndarray) -> dict:
    """Runs over the column-major flattening, starting with a (possibly empty) 0-run."""
    flat = gt_mask.flatten(order="F").astype(np.int8)
    changes = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
    runs = np.diff(np.concatenate([[0], changes]))
    return {"size": list(gt_mask.shape), "counts": [int(v) for v in runs]}


def truncate_file(path: str, keep: int) -> None:
    with open(path, "rb") as handle:
        payload = handle.read()
    with open(path, "wb") as handle:
        handle.write(payload[:keep])


# --------------------------------------------------------------------------- COCO-style
def replace_bytes(path: str, old: bytes, new: bytes) -> None:
    """Overwrite ``old`` (which must occur once) with ``new`` of the same length in a file, e.g. to put
    bytes that are not valid UTF-8 into a string that a writer would refuse."""
    data = open(path, "rb").read()
    if data.count(old) != 1 or len(old) != len(new):
        raise ValueError(f"{path}: {old!r} occurs {data.count(old)} times (need 1, same length as {new!r})")
    with open(path, "wb") as handle:
        handle.write(data.replace(old, new))


def make_coco(root: str) -> tuple[str, list[Expected]]:
    """annotations.json with polygons, compressed and uncompressed RLE, caption / expressions."""
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    sizes = {1: (30, 40), 2: (24, 36), 3: (32, 32)}  # image id -> (H, W)
    for image_id, (h, w) in sizes.items():
        rgb_image(image_id, h, w).save(os.path.join(root, "images", f"{image_id:03d}.png"))
    m11 = rect_mask(30, 40, (4, 3, 20, 15))
    m12, m21 = blob_mask(12, 30, 40), blob_mask(21, 24, 36)
    m31, m32 = blob_mask(31, 32, 32), blob_mask(32, 32, 32)
    m22 = rect_mask(24, 36, (2, 2, 8, 6), (20, 10, 30, 20))
    anns = [
        dict(id=11, image_id=1, category_id=1, segmentation=rect_polygons((4, 3, 20, 15)),
             caption="a red box on the left", expressions=["left box", "the red one"]),
        dict(id=12, image_id=1, category_id=2, segmentation=rle(m12), caption=["cap A", "cap B"]),
        dict(id=21, image_id=2, category_id=2, segmentation=uncompressed_rle(m21),
             expressions=["the speckled thing"]),
        dict(id=22, image_id=2, category_id=1, segmentation=rect_polygons((2, 2, 8, 6), (20, 10, 30, 20)),
             caption="two boxes"),
        dict(id=31, image_id=3, category_id=2, segmentation=uncompressed_rle(m31), iscrowd=1),
        dict(id=32, image_id=3, category_id=2, segmentation=rle(m32), captions=["blob"]),
    ]
    data = {"images": [{"id": i, "file_name": f"images/{i:03d}.png", "height": h, "width": w}
                       for i, (h, w) in sizes.items()],
            "annotations": anns,
            "categories": [{"id": 1, "name": "box"}, {"id": 2, "name": "blob"}]}
    ann_file = os.path.join(root, "annotations.json")
    with open(ann_file, "w") as handle:
        json.dump(data, handle)
    expected = [
        Expected("coco/1#11", m11, ["a red box on the left"], ["left box", "the red one"], "box", (40, 30)),
        Expected("coco/1#12", m12, ["cap A", "cap B"], [], "blob", (40, 30)),
        Expected("coco/2#21", m21, [], ["the speckled thing"], "blob", (36, 24)),
        Expected("coco/2#22", m22, ["two boxes"], [], "box", (36, 24)),
        Expected("coco/3#32", m32, ["blob"], [], "blob", (32, 32)),
    ]
    crowd = Expected("coco/3#31", m31, [], [], "blob", (32, 32))
    return ann_file, expected + [crowd]


def make_bad_coco(root: str) -> tuple[str, list[Expected]]:
    """One annotation per bad-input case (plus one good one), each tagged with its problem kind."""
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    h, w = 20, 24
    good = blob_mask(7, h, w)
    rgb_image(1, h, w).save(os.path.join(root, "images", "ok.png"))
    rgb_image(2, h, w, "RGBA").save(os.path.join(root, "images", "rgba_opaque.png"))
    transparent = rgb_image(3, h, w, "RGBA")
    transparent.putalpha(PIL.Image.new("L", (w, h), 90))
    transparent.save(os.path.join(root, "images", "rgba.png"))
    with open(os.path.join(root, "images", "cut.png"), "wb") as handle:
        handle.write(image_bytes(rgb_image(4, h, w), "PNG")[:120])
    counts = rle(good)["counts"]
    cases = [  # (file, segmentation, problem, json size override)
        ("ok.png", {"size": [h, w], "counts": "zz!!"}, "corrupt_rle", None),
        ("ok.png", {"size": [h, w], "counts": counts[: len(counts) // 2]}, "corrupt_rle", None),
        ("ok.png", {"size": [h, w], "counts": [5, 3, 2]}, "corrupt_rle", None),
        ("ok.png", rle(np.zeros((h + 2, w), bool) | blob_mask(8, h + 2, w)), "rle_size_mismatch", None),
        ("missing.png", rle(good), "missing_image", None),
        ("ok.png", rle(np.zeros((h, w), bool)), "empty_mask", None),
        ("rgba.png", rle(good), "image_mode", None),
        ("cut.png", rle(good), "bad_image", None),
        ("ok.png", rect_polygons((1, 1, 5, 5)), "image_size_mismatch", (h + 1, w)),
        ("rgba_opaque.png", rle(good), None, None),
        ("ok.png", rle(good), None, None),
    ]
    images, anns, expected = [], [], []
    for k, (file_name, segm, problem, json_size) in enumerate(cases, start=1):
        jh, jw = json_size or (h, w)
        images.append({"id": k, "file_name": f"images/{file_name}", "height": jh, "width": jw})
        anns.append({"id": 100 + k, "image_id": k, "category_id": 1, "segmentation": segm,
                     "caption": f"case {k}"})
        expected.append(Expected(f"bad/{k}#{100 + k}", good, [f"case {k}"], [], "thing", (w, h), problem))
    ann_file = os.path.join(root, "bad_annotations.json")
    with open(ann_file, "w") as handle:
        json.dump({"images": images, "annotations": anns,
                   "categories": [{"id": 1, "name": "thing"}]}, handle)
    return ann_file, expected


def make_model_input_coco(root: str) -> tuple[str, list[Expected]]:
    """Samples that load as images and masks but that the model cannot take, plus a lone-surrogate caption.

    A 64x64 image holds one good region and a 3x3 region at rows/columns 1..3, which misses every point of a
    16x16 region grid (nearest sampling picks rows and columns 0, 4, 8, ...); a 1x1 image holds a 1-px region;
    a caption ends in the lone surrogate U+DCFF (what ``bytes.decode(errors='surrogateescape')`` leaves for a
    byte that is not UTF-8). ``Expected.problem`` is the bad-sample kind under ``InputCheck(16, 'raise')``.
    """
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    rgb_image(5, 64, 64).save(os.path.join(root, "images", "big.png"))
    rgb_image(6, 1, 1).save(os.path.join(root, "images", "dot.png"))
    good, off_grid = rect_mask(64, 64, (8, 8, 40, 30)), rect_mask(64, 64, (1, 1, 4, 4))
    dot = np.ones((1, 1), dtype=bool)
    cases = [  # (image id, mask, caption, problem)
        (1, good, "a big box", None),
        (1, off_grid, "a speck", "region_off_grid"),
        (2, dot, "one pixel", "image_too_small"),
        (1, good, "a grey \udcff box", "bad_text"),
    ]
    anns = [dict(id=10 + k, image_id=image_id, category_id=1, segmentation=rle(mask), caption=caption)
            for k, (image_id, mask, caption, _) in enumerate(cases)]
    data = {"images": [{"id": 1, "file_name": "images/big.png", "height": 64, "width": 64},
                       {"id": 2, "file_name": "images/dot.png", "height": 1, "width": 1}],
            "annotations": anns, "categories": [{"id": 1, "name": "thing"}]}
    ann_file = os.path.join(root, "model_input_annotations.json")
    with open(ann_file, "w") as handle:
        json.dump(data, handle)  # ensure_ascii (default) writes the surrogate as the escape \udcff
    return ann_file, [Expected(f"coco/{image_id}#{10 + k}", mask, [caption], [], "thing", mask.shape[::-1], problem)
                      for k, (image_id, mask, caption, problem) in enumerate(cases)]


# --------------------------------------------------------------------------- DLC
DLC_KEYS = ("000000000139", "000000000285", "000000000632", "000000000724")


def _tar_add(archive: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    archive.addfile(info, io.BytesIO(payload))


def make_dlc(root: str, subset: str = "COCOStuff", *, missing_key: bool = False,
             bad_rle: bool = False, truncate: bool = False) -> list[Expected]:
    """``<root>/<subset>/annotations.json`` + ``images/0000000{0,1}.tar``; keys 0-1 in shard 0,
    keys 2-3 in shard 1. Zero padding differs between the two files for two keys, as in some copies:
    key 2's tar members drop it (``632.jpg``), key 3's annotations.json entry drops it (``"724"``)."""
    image_dir = os.path.join(root, subset, "images")
    os.makedirs(image_dir, exist_ok=True)
    annotations, expected, shard_of = {}, [], []
    for k, tar_key in enumerate(DLC_KEYS):
        key = str(int(tar_key)) if k == 3 else tar_key  # the key annotations.json uses
        h, w = 28 + 4 * k, 36 - 2 * k
        shard = f"{k // 2:08d}.tar"
        regions = []
        for r in range(2 if k % 2 == 0 else 1):
            gt_mask = blob_mask(100 * k + r, h, w)
            ann_id = 1000 * (k + 1) + r
            region = {"img_id": int(key), "ann_id": ann_id, "image": f"train2017/{key}.jpg",
                      "category": ("person", "dog")[r], "caption": f"region {r} of image {key}",
                      "mask_rle": rle(gt_mask)}
            if bad_rle and k == 1:
                region["mask_rle"] = {"size": [h, w], "counts": region["mask_rle"]["counts"][:-3]}
            regions.append(region)
            expected.append(Expected(f"dlc/{subset}/{key}#{ann_id}", gt_mask, [region["caption"]], [],
                                     region["category"], (w, h),
                                     "corrupt_rle" if bad_rle and k == 1 else None))
            shard_of.append(k // 2)
        annotations[key] = [dict(region, tar_file=shard) for region in regions]
        member = str(int(tar_key)) if k == 2 else tar_key
        with tarfile.open(os.path.join(image_dir, shard), "a") as archive:
            _tar_add(archive, f"{member}.jpg", image_bytes(rgb_image(k, h, w), "JPEG"))
            _tar_add(archive, f"{member}.pickle", pickle.dumps(regions))
    if missing_key:
        annotations["000000999999"] = [{"ann_id": 9, "caption": "lost", "tar_file": "00000001.tar",
                                        "mask_rle": rle(blob_mask(9, 8, 8))}]
    with open(os.path.join(root, subset, "annotations.json"), "w") as handle:
        json.dump(annotations, handle)
    if truncate:  # cut shard 1 inside key 2's jpg: keys 2 and 3 are lost
        truncate_file(os.path.join(image_dir, "00000001.tar"), 700)
        for item, shard_index in zip(expected, shard_of):
            if shard_index == 1:
                item.problem = "truncated_shard"
    return expected


# --------------------------------------------------------------------------- GAR
def _gar_features(mask_list: bool, conversation_json: bool = False):
    from datasets import Features, Image, Value
    rle_feature = {"size": [Value("int64")], "counts": Value("string")}
    turns = Value("string") if conversation_json else [{"from": Value("string"), "value": Value("string")}]
    return Features({"image": Image(), "conversations": turns,
                     "mask_rle": [rle_feature] if mask_list else rle_feature,
                     "catagory": Value("string")})


def _conversation(*answers, refs=""):
    turns = []
    for k, answer in enumerate(answers):
        turns.append({"from": "human", "value": ("<image>\n" if k == 0 else "") + f"Describe {refs}".strip()})
        turns.append({"from": "gpt", "value": answer})
    return turns


def _save(rows: list[dict], features, folder: str, num_shards: int) -> None:
    from datasets import Dataset
    columns = {name: [row[name] for row in rows] for name in features}
    Dataset.from_dict(columns, features=features).save_to_disk(folder, num_shards=num_shards)


def make_gar(root: str, *, bad_conversation: bool = False) -> list[Expected]:
    """``Fine-Grained-Dataset-Part1`` (one mask per row, 2 shards) and ``Relation-Dataset``
    (mask lists: a ``<Prompt0>/<Prompt1>`` relation row, a 2-mask per-mask-caption row, a 1-mask row)."""
    expected, fine = [], []
    for r in range(5):
        h, w = 20 + r, 30 - r
        gt_mask = blob_mask(500 + r, h, w)
        answer = f"fine caption {r}"
        conversation = _conversation(answer)
        problem = None
        if bad_conversation and r == 1:
            conversation, problem = [conversation[0]], "bad_conversation"   # no gpt turn
        if bad_conversation and r == 3:
            conversation, problem = [{"from": "robot", "value": "?"}], "bad_conversation"
        fine.append({"image": {"bytes": image_bytes(rgb_image(r, h, w), "PNG"), "path": None},
                     "conversations": conversation, "mask_rle": rle(gt_mask), "catagory": f"cat{r}"})
        shard, row = (0, r) if r < 3 else (1, r - 3)  # save_to_disk splits 5 rows into 3 + 2
        sample_id = f"gar/Fine-Grained-Dataset-Part1/data-0000{shard}-of-00002:{row}#0"
        expected.append(Expected(sample_id, gt_mask, [answer], [], f"cat{r}", (w, h), problem))
    _save(fine, _gar_features(False), os.path.join(root, "Fine-Grained-Dataset-Part1"), 2)
    h, w = 26, 26
    masks = [blob_mask(600 + k, h, w) for k in range(4)]
    picture = {"bytes": image_bytes(rgb_image(9, h, w), "PNG"), "path": None}
    relation = [
        {"image": picture, "conversations": _conversation("<Prompt0> is left of <Prompt1>", refs="<Prompt0>"),
         "mask_rle": [rle(masks[0]), rle(masks[1])], "catagory": "pair"},
        {"image": picture, "conversations": _conversation("first thing", "second thing"),
         "mask_rle": [rle(masks[2]), rle(masks[3])], "catagory": "thing"},
        {"image": picture, "conversations": _conversation("only thing"),
         "mask_rle": [rle(masks[0])], "catagory": "thing"},
    ]
    _save(relation, _gar_features(True), os.path.join(root, "Relation-Dataset"), 1)
    stem = "gar/Relation-Dataset/data-00000-of-00001"
    expected += [Expected(f"{stem}:1#0", masks[2], ["first thing"], [], "thing", (w, h)),
                 Expected(f"{stem}:1#1", masks[3], ["second thing"], [], "thing", (w, h)),
                 Expected(f"{stem}:2#0", masks[0], ["only thing"], [], "thing", (w, h))]
    return expected


def make_gar_json_conversations(root: str) -> list[Expected]:
    """A subset whose ``conversations`` column is a JSON string; row 1 is not valid JSON."""
    h, w = 16, 16
    gt_mask = blob_mask(700, h, w)
    rows = [{"image": {"bytes": image_bytes(rgb_image(70 + k, h, w), "PNG"), "path": None},
             "conversations": text, "mask_rle": rle(gt_mask), "catagory": "json"}
            for k, text in enumerate([json.dumps(_conversation("json caption")), "[{'from': 'human'"])]
    _save(rows, _gar_features(False, conversation_json=True), os.path.join(root, "Json-Dataset"), 1)
    stem = "gar/Json-Dataset/data-00000-of-00001"
    return [Expected(f"{stem}:0#0", gt_mask, ["json caption"], [], "json", (w, h)),
            Expected(f"{stem}:1#0", gt_mask, [], [], "json", (w, h), "bad_conversation")]


# --------------------------------------------------------------------------- RefCOCO
def make_refcoco(root: str) -> tuple[str, str, dict[str, list[Expected]]]:
    """``refcoco/{instances.json, refs(unc).p}`` + ``refcocog/{instances.json, refs(umd).p}``
    sharing ``coco2014/train2014``. Returns data roots and the expected samples per (dataset, split)."""
    image_root = os.path.join(root, "coco2014", "train2014")
    os.makedirs(image_root, exist_ok=True)
    sizes = {9: (30, 40), 25: (36, 28)}
    images = []
    for image_id, (h, w) in sizes.items():
        file_name = f"COCO_train2014_{image_id:012d}.jpg"
        rgb_image(image_id, h, w).save(os.path.join(image_root, file_name), "JPEG")
        images.append({"id": image_id, "file_name": file_name, "height": h, "width": w})
    boxes = {501: (9, (2, 2, 12, 10)), 502: (9, (20, 5, 38, 25)), 503: (25, (3, 4, 20, 30))}
    anns = [{"id": a, "image_id": i, "category_id": 1 + a % 2, "segmentation": rect_polygons(box),
             "area": 0, "bbox": [0, 0, 0, 0], "iscrowd": 0} for a, (i, box) in boxes.items()]
    blob = blob_mask(504, 36, 28)
    anns.append({"id": 504, "image_id": 25, "category_id": 1, "segmentation": rle(blob), "iscrowd": 0})
    masks = {a: rect_mask(*sizes[i], box) for a, (i, box) in boxes.items()}
    masks[504] = blob
    instances = {"images": images, "annotations": anns,
                 "categories": [{"id": 1, "name": "person"}, {"id": 2, "name": "cup"}]}
    plan = {"refcoco": ("unc", [(0, 501, "train"), (1, 502, "val"), (2, 503, "val"), (3, 504, "testA"),
                                (4, 501, "testB")]),
            "refcocog": ("umd", [(0, 502, "train"), (1, 503, "val"), (2, 504, "test")])}
    expected = {}
    for dataset, (split_by, refs_plan) in plan.items():
        folder = os.path.join(root, dataset)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "instances.json"), "w") as handle:
            json.dump(instances, handle)
        refs = []
        for ref_id, ann_id, split in refs_plan:
            image_id = boxes[ann_id][0] if ann_id in boxes else 25
            sents = [f"{dataset} object {ref_id}", f"the thing number {ref_id}"]
            refs.append({"ref_id": ref_id, "ann_id": ann_id, "image_id": image_id, "split": split,
                         "category_id": 1, "file_name": f"COCO_train2014_{image_id:012d}_{ann_id}.jpg",
                         "sent_ids": [10 * ref_id, 10 * ref_id + 1],
                         "sentences": [{"sent_id": 10 * ref_id + k, "sent": s, "raw": s.upper() + ".",
                                        "tokens": s.split()} for k, s in enumerate(sents)]})
            h, w = sizes[image_id]
            category = "person" if ann_id % 2 == 0 else "cup"
            expected.setdefault((dataset, split), []).append(Expected(
                f"{dataset}_{split_by}_{split}/{image_id}#{ref_id}", masks[ann_id], [], sents,
                category, (w, h)))
        with open(os.path.join(folder, f"refs({split_by}).p"), "wb") as handle:
            pickle.dump(refs, handle)
    return root, image_root, expected
