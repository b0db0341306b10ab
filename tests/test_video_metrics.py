"""J, F and J&F equal DAVIS 2017's reference evaluation on seeded fixtures.

tests/data/davis_reference_jf.json holds each fixture's recipe (tests/davis_fixtures.py rebuilds its masks) and the
numbers davisvideochallenge/davis2017-evaluation computed on it (its commit is in the file's ``reference``). Per-frame J
and F are compared with tolerance 0: each is a ratio of pixel counts (F: 2·p·r/(p + r) of two such ratios) computed
with the same float64 operations, so any difference is a formula difference. Means, Recall, Decay and the split
summaries are compared within 1e-12: they sum up to hundreds of floats, and the order numpy sums them in may differ
between builds (measured difference on the machine that made the file: 0).
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import ndimage
from scipy.spatial import cKDTree

from projects.llava_sam2.rl_train.rewards import video_metrics
from projects.llava_sam2.rl_train.rewards.video_metrics import (
    MaskletScores,
    boundary_tolerance_pixels,
    dilate_by_disk,
    score_masklet,
    score_masklets,
    series_statistics,
    summarize_objects,
    tolerance_disk,
)

from davis_fixtures import build_case, label_map, perturbed, random_blob

REFERENCE = json.loads((Path(__file__).parent / "data" / "davis_reference_jf.json").read_text())
AGGREGATE_TOLERANCE = 1e-12


def per_frame_mismatches() -> list[str]:
    """Fixture cases whose per-frame J or F differ from DAVIS's, with both series."""
    mismatches = []
    for case in REFERENCE["cases"]:
        gt, pred = build_case(case)
        assert [int(gt.sum()), int(pred.sum())] == case["pixels"], f"{case['name']}: the fixture recipe changed"
        scores = score_masklet(gt, pred, bound_th=case.get("bound_th", video_metrics.BOUNDARY_TOLERANCE))
        for name, ours, theirs in (("J", scores.j, case["J"]), ("F", scores.f, case["F"])):
            if not np.array_equal(ours, np.asarray(theirs)):
                mismatches.append(f"{case['name']} {name}: ours {ours.tolist()} DAVIS {theirs}")
    return mismatches


def statistics_mismatches() -> list[str]:
    mismatches = []
    for case in REFERENCE["cases"]:
        gt, pred = build_case(case)
        scores = score_masklet(gt, pred, bound_th=case.get("bound_th", video_metrics.BOUNDARY_TOLERANCE))
        for name, values, theirs in (("J", scores.j, case["J_stats"]), ("F", scores.f, case["F_stats"])):
            ours = video_metrics.series_statistics(values)
            if not np.allclose([ours.mean, ours.recall, ours.decay], theirs, rtol=0, atol=AGGREGATE_TOLERANCE):
                mismatches.append(f"{case['name']} {name}: ours {ours} DAVIS {theirs}")
    for series in REFERENCE["statistics"]:
        values = np.random.default_rng(series["seed"]).random(series["frames"])
        ours = video_metrics.series_statistics(values)
        if not np.allclose([ours.mean, ours.recall, ours.decay], series["stats"], rtol=0, atol=AGGREGATE_TOLERANCE):
            mismatches.append(f"random series T={series['frames']}: ours {ours} DAVIS {series['stats']}")
    return mismatches


def semi_supervised_summary():
    """The DAVIS-layout split of the reference, scored as DAVIS's semi-supervised evaluation reads it."""
    split = REFERENCE["semi_supervised"]
    scores = {}
    for sequence, recipes in split["sequences"].items():
        built = [build_case(recipe) for recipe in recipes]
        # DAVIS stores the objects of a frame as one label map, so overlapping objects lose their covered pixels
        gt_labels, pred_labels = label_map([gt for gt, _ in built]), label_map([pred for _, pred in built])
        dropped = split["drop_pred"].get(sequence)
        if dropped is not None:
            pred_labels[pred_labels == dropped] = 0
        for label in range(1, len(recipes) + 1):
            scores[f"{sequence}_{label}"] = score_masklet(gt_labels == label, pred_labels == label,
                                                          semi_supervised=True)
    return summarize_objects(scores)


def test_per_frame_j_and_f_equal_davis():
    assert len(REFERENCE["cases"]) > 100
    assert per_frame_mismatches() == []


def test_statistics_equal_davis():
    assert statistics_mismatches() == []


def test_semi_supervised_split_equals_davis_evaluation():
    summary = semi_supervised_summary()
    expected = REFERENCE["semi_supervised"]
    assert summary.metrics.keys() == expected["metrics"].keys()
    for key, value in expected["metrics"].items():
        assert summary.metrics[key] == pytest.approx(value, rel=0, abs=AGGREGATE_TOLERANCE), key
    assert summary.per_object.keys() == expected["per_object"].keys()
    for name, value in expected["per_object"].items():
        assert summary.per_object[name] == pytest.approx(value, rel=0, abs=AGGREGATE_TOLERANCE), name


def test_referring_split_equals_sa2va_protocol():
    """MeViS / ReVOS as Sa2VA scores them: every frame, one object per expression, J&F = (mean J + mean F) / 2."""
    expected = REFERENCE["rvos"]
    cases = {case["name"]: case for case in REFERENCE["cases"]}
    summary = summarize_objects({name: score_masklet(*build_case(cases[name])) for name in expected["objects"]})
    assert summary.metrics["J-Mean"] == pytest.approx(expected["J"], rel=0, abs=AGGREGATE_TOLERANCE)
    assert summary.metrics["F-Mean"] == pytest.approx(expected["F"], rel=0, abs=AGGREGATE_TOLERANCE)
    assert summary.metrics["J&F-Mean"] == pytest.approx(expected["JF"], rel=0, abs=AGGREGATE_TOLERANCE)


def _four_neighbour_boundary(masks):
    """A common alternative boundary: mask pixels with a 4-neighbour outside the mask."""
    masks = torch.as_tensor(masks).bool()
    padded = torch.nn.functional.pad(masks, (1, 1, 1, 1))
    interior = padded[..., :-2, 1:-1] & padded[..., 2:, 1:-1] & padded[..., 1:-1, :-2] & padded[..., 1:-1, 2:]
    return masks & ~interior


def _empty_pair_scores_zero(intersection, union):
    return intersection / np.maximum(union, 1)
PLAUSIBLE_BUGS = {
    "F without the distance tolerance": ("boundary_tolerance_pixels", lambda height, width, bound_th=0.008: 0),
    "tolerance from the longer side, not the diagonal":
        ("boundary_tolerance_pixels",
         lambda height, width, bound_th=0.008: int(np.ceil(bound_th * max(height, width)))),
    "boundary from a 4-neighbour erosion": ("boundary_map", _four_neighbour_boundary),
    "J of two empty masks is 0": ("_region_similarity", _empty_pair_scores_zero),
}


@pytest.mark.parametrize("bug", sorted(PLAUSIBLE_BUGS))
def test_reference_catches_a_plausible_bug(bug, monkeypatch):
    """The pinned comparison is not vacuous: each mutation of the module makes it fail."""
    attribute, replacement = PLAUSIBLE_BUGS[bug]
    monkeypatch.setattr(video_metrics, attribute, replacement)
    assert per_frame_mismatches(), f"the fixtures do not detect: {bug}"


def test_decay_bins_without_shared_edges_are_caught(monkeypatch):
    def disjoint_quarters(values):
        scores = np.asarray(values, dtype=np.float64)
        quarters = np.array_split(scores, 4)  # fewer than 4 frames leave empty quarters: a NaN Decay, also a mismatch
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            decay = float(quarters[0].mean() - quarters[-1].mean())
        return video_metrics.SeriesStatistics(float(scores.mean()), float(np.mean(scores > 0.5)), decay)

    monkeypatch.setattr(video_metrics, "series_statistics", disjoint_quarters)
    assert statistics_mismatches(), "the fixtures do not detect Decay over disjoint quarters"


@pytest.mark.parametrize("radius", [0, 1, 2, 3, 5, 8, 32])
def test_dilation_equals_scipy_dilation_by_davis_disk(radius):
    """F's matching region, frame by frame, equals scipy's binary dilation by DAVIS's disk (scikit-image's ``disk``),
    set pixels on every border included and a radius beyond the frame; no dilation crosses frames."""
    maps = torch.from_numpy(np.random.default_rng(radius).random((3, 23, 31)) < 0.03)
    maps[1] = False  # an empty frame
    maps[2, [0, 0, -1, -1], [0, -1, 0, -1]] = True  # the four corners
    dilated = dilate_by_disk(maps, radius)
    expected = [ndimage.binary_dilation(frame, structure=tolerance_disk(radius)) for frame in maps.numpy()]
    assert np.array_equal(dilated.numpy(), np.stack(expected))
    assert dilated[0].any() and not dilated[1].any()
    skimage_morphology = pytest.importorskip("skimage.morphology")
    assert np.array_equal(tolerance_disk(radius), skimage_morphology.disk(radius).astype(bool))


# ---- the k-d tree implementation this module replaced, kept as an independent oracle --------------------------------

def _kd_tree_boundary_map(mask: np.ndarray) -> np.ndarray:
    edge = np.zeros_like(mask)
    inner = mask[..., :-1, :-1]
    edge[..., :-1, :-1] = (inner != mask[..., :-1, 1:]) | (inner != mask[..., 1:, :-1]) | (inner != mask[..., 1:, 1:])
    edge[..., -1, :-1] = mask[..., -1, :-1] != mask[..., -1, 1:]
    edge[..., :-1, -1] = mask[..., :-1, -1] != mask[..., 1:, -1]
    return edge


def _kd_tree_matched(points: np.ndarray, targets: np.ndarray, radius: int) -> int:
    """How many ``points`` [n, 2] have a ``targets`` pixel within ``radius`` (exact integer distance test)."""
    if len(points) == 0 or len(targets) == 0:
        return 0
    _, nearest = cKDTree(targets).query(points, k=1, distance_upper_bound=radius + 0.5)
    found = nearest < len(targets)
    offsets = points[found] - targets[nearest[found]]
    return int(np.count_nonzero(np.einsum("ij,ij->i", offsets, offsets) <= radius * radius))


def kd_tree_scores(gt: np.ndarray, pred: np.ndarray, bound_th: float) -> tuple[list[float], list[float]]:
    """Per-frame J and F of masklets ``[T, H, W]`` as the k-d tree implementation computed them."""
    radius = boundary_tolerance_pixels(*gt.shape[-2:], bound_th=bound_th)
    j_values, f_values = [], []
    for g, p in zip(gt, pred):
        union = np.count_nonzero(g | p)
        j_values.append(1.0 if union == 0 else np.count_nonzero(g & p) / union)
        g_points, p_points = np.argwhere(_kd_tree_boundary_map(g)), np.argwhere(_kd_tree_boundary_map(p))
        if len(g_points) == 0 or len(p_points) == 0:
            f_values.append(1.0 if len(g_points) == len(p_points) else 0.0)
            continue
        precision = _kd_tree_matched(p_points, g_points, radius) / float(len(p_points))
        recall = _kd_tree_matched(g_points, p_points, radius) / float(len(g_points))
        f_values.append(0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall))
    return j_values, f_values


ORACLE_SIZES = [(1, 1), (1, 9), (9, 1), (2, 2), (5, 3), (17, 31), (64, 48), (45, 100)]
ORACLE_TOLERANCES = [0.008, 0.02, 3, 12]  # 12 px exceeds the small frames


def oracle_masklets(seed: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """A masklet pair of one frame size whose frames cover the edge cases: blobs and their shifted noisy copies,
    pixel noise, empty, full, one-pixel masks anywhere and in the bottom-right corner (an empty boundary map)."""
    rng = np.random.default_rng(seed)
    empty, full = np.zeros((height, width), dtype=bool), np.ones((height, width), dtype=bool)

    def pixel(row: int, col: int) -> np.ndarray:
        mask = empty.copy()
        mask[row, col] = True
        return mask

    def anywhere() -> np.ndarray:
        return pixel(int(rng.integers(height)), int(rng.integers(width)))

    blobs = [random_blob(rng, height, width, n_shapes=2, noise=0.0) for _ in range(3)]
    frames = [(blob, perturbed(rng, blob, max_shift=4, noise=0.01)) for blob in blobs]
    frames += [(rng.random((height, width)) < 0.3, rng.random((height, width)) < 0.3), (empty, blobs[0]),
               (blobs[1], empty), (empty, empty), (full, full), (full, empty), (full, blobs[2]),
               (anywhere(), anywhere()), (pixel(height - 1, width - 1), pixel(height - 1, width - 1)),
               (pixel(height - 1, width - 1), anywhere()), (anywhere(), pixel(0, 0))]
    return np.stack([g for g, _ in frames]), np.stack([p for _, p in frames])


def oracle_mismatches(bound_th: float) -> list[str]:
    """Frame sizes whose per-frame J or F (one batched call over all sizes) differ from the k-d tree oracle's."""
    pairs = [oracle_masklets(seed, *size) for seed, size in enumerate(ORACLE_SIZES)]
    scores = score_masklets([g for g, _ in pairs], [p for _, p in pairs], bound_th=bound_th)
    mismatches = []
    for size, (gt, pred), ours in zip(ORACLE_SIZES, pairs, scores):
        j_values, f_values = kd_tree_scores(gt, pred, bound_th)
        if not (np.array_equal(ours.j, j_values) and np.array_equal(ours.f, f_values)):
            mismatches.append(f"{size}: J {ours.j.tolist()} vs {j_values}, F {ours.f.tolist()} vs {f_values}")
    return mismatches


@pytest.mark.parametrize("bound_th", ORACLE_TOLERANCES)
def test_scores_equal_the_kd_tree_implementation(bound_th):
    assert oracle_mismatches(bound_th) == []


def _square_dilation(maps, radius):
    if maps.numel() == 0:  # a chunk without boundary pixels
        return maps
    return torch.nn.functional.max_pool2d(maps[:, None].float(), 2 * radius + 1, stride=1, padding=radius)[:, 0] > 0


ORACLE_BUGS = {"a square instead of the disk": _square_dilation,
               "a radius one pixel short": lambda maps, radius: dilate_by_disk(maps, max(radius - 1, 0))}


@pytest.mark.parametrize("bug", sorted(ORACLE_BUGS))
def test_oracle_comparison_catches_a_wrong_matching_region(bug, monkeypatch):
    monkeypatch.setattr(video_metrics, "dilate_by_disk", ORACLE_BUGS[bug])
    assert oracle_mismatches(0.008), f"the oracle cases do not detect {bug}"


@pytest.mark.parametrize("chunk_pixels", [1, 2 ** 30])
def test_batched_forms_and_frame_chunks_give_the_same_scores(chunk_pixels, monkeypatch):
    """One frame per chunk or all at once; a list or an array [N, T, H, W] of objects, bool or uint8 (a recurring gt
    masklet is converted once, so a converted one must not be mistaken for another); score_masklet alone: the same
    scores."""
    monkeypatch.setattr(video_metrics, "CPU_CHUNK_PIXELS", chunk_pixels)
    pairs = [oracle_masklets(seed, 17, 31) for seed in range(4)]
    gts, preds = np.stack([g for g, _ in pairs]), np.stack([p for _, p in pairs])  # [N, T, H, W]
    alone = [score_masklet(g, p) for g, p in pairs]
    for scores in (score_masklets(gts, preds), score_masklets(gts.astype(np.uint8), preds),
                   score_masklets([torch.from_numpy(g) for g in gts], list(preds)),
                   score_masklets(torch.from_numpy(gts), torch.from_numpy(preds))):
        assert [(s.j.tolist(), s.f.tolist()) for s in scores] == [(s.j.tolist(), s.f.tolist()) for s in alone]
    assert [(s.j.tolist(), s.f.tolist()) for s in alone] == [kd_tree_scores(g, p, 0.008) for g, p in pairs]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_counting_on_cuda_gives_the_cpu_scores():
    pairs = [oracle_masklets(seed, *size) for seed, size in enumerate(ORACLE_SIZES)]
    on_cpu = score_masklets([g for g, _ in pairs], [p for _, p in pairs])
    on_cuda = score_masklets([g for g, _ in pairs], [torch.from_numpy(p).cuda() for _, p in pairs])
    assert [(s.j.tolist(), s.f.tolist()) for s in on_cuda] == [(s.j.tolist(), s.f.tolist()) for s in on_cpu]


def test_tolerance_radius():
    assert boundary_tolerance_pixels(480, 854) == 8  # ceil(0.008 · 979.6)
    assert boundary_tolerance_pixels(240, 427) == 4  # ceil(0.008 · 489.8)
    assert boundary_tolerance_pixels(10, 10) == 1
    assert boundary_tolerance_pixels(10, 10, bound_th=3) == 3
    with pytest.raises(ValueError, match="whole number"):
        boundary_tolerance_pixels(10, 10, bound_th=2.5)


def test_j_and_f_of_a_worked_example():
    """Two 4×4 squares on a 10×10 frame, shifted by one column: J = 12/20; F = 1 (every boundary pixel of one is
    within r = 1 of the other's)."""
    gt = np.zeros((1, 10, 10), dtype=bool)
    gt[0, 2:6, 2:6] = True
    pred = np.roll(gt, 1, axis=2)
    scores = score_masklet(gt, pred)
    assert scores.j.tolist() == [12 / 20]
    assert scores.f.tolist() == [1.0]
    assert video_metrics.j_and_f(gt, pred) == (0.6 + 1.0) / 2
    assert isinstance(scores, MaskletScores)


def test_bad_inputs_are_named():
    frames = np.zeros((2, 4, 5), dtype=bool)
    with pytest.raises(ValueError, match="differ in shape"):
        score_masklet(frames, frames[:, :, :4])
    with pytest.raises(ValueError, match="T >= 3"):
        score_masklet(frames, frames, semi_supervised=True)
    with pytest.raises(ValueError, match=r"\[T, H, W\]"):
        score_masklet(frames[0], frames[0])
    with pytest.raises(ValueError, match="masklet 1: gt_masks"):
        score_masklets([frames, frames], [frames, frames[:, :, :4]])
    with pytest.raises(ValueError, match="clip b: expected at least one frame"):
        score_masklets([frames, frames[:0]], [frames, frames[:0]], names=["clip a", "clip b"])
    with pytest.raises(ValueError, match="T >= 1"):
        series_statistics([])
    with pytest.raises(ValueError, match="no objects"):
        summarize_objects({})
