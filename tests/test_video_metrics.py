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
from scipy import ndimage

from projects.llava_sam2.rl_train.rewards import video_metrics
from projects.llava_sam2.rl_train.rewards.video_metrics import (
    MaskletScores,
    boundary_tolerance_pixels,
    score_masklet,
    series_statistics,
    summarize_objects,
    tolerance_disk,
)

from davis_fixtures import build_case, label_map

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
    masks = np.asarray(masks, dtype=bool)
    structure = np.zeros((1,) * (masks.ndim - 2) + (3, 3), dtype=bool)
    structure[..., 1, :] = structure[..., :, 1] = True
    return masks & ~ndimage.binary_erosion(masks, structure=structure, border_value=0)


def _empty_pair_scores_zero(gt_masks, pred_masks):
    gt, pred = np.asarray(gt_masks, bool), np.asarray(pred_masks, bool)
    union = np.count_nonzero(gt | pred, axis=(-2, -1))
    return np.count_nonzero(gt & pred, axis=(-2, -1)) / np.maximum(union, 1)


PLAUSIBLE_BUGS = {
    "F without the distance tolerance": ("boundary_tolerance_pixels", lambda height, width, bound_th=0.008: 0),
    "tolerance from the longer side, not the diagonal":
        ("boundary_tolerance_pixels",
         lambda height, width, bound_th=0.008: int(np.ceil(bound_th * max(height, width)))),
    "boundary from a 4-neighbour erosion": ("boundary_map", _four_neighbour_boundary),
    "J of two empty masks is 0": ("region_similarity", _empty_pair_scores_zero),
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


@pytest.mark.parametrize("radius", [1, 2, 3, 5, 8])
def test_matching_equals_disk_dilation(radius):
    """F's k-d tree count equals, frame by frame, counting inside a dilation by DAVIS's disk (skimage's ``disk``);
    no match crosses frames."""
    rng = np.random.default_rng(radius)
    targets, points = rng.random((2, 3, 37, 53)) < 0.02  # two boundary maps of 3 frames
    points[1] = False  # a frame with no points
    targets[2] = False  # a frame with no targets
    counted = video_metrics._matched_per_frame(np.argwhere(points), np.argwhere(targets), radius, n_frames=3)
    dilated = [ndimage.binary_dilation(frame, structure=tolerance_disk(radius)) for frame in targets]
    assert counted.tolist() == [np.count_nonzero(p & d) for p, d in zip(points, dilated)]
    assert counted[0] > 0 and counted[1] == counted[2] == 0
    skimage_morphology = pytest.importorskip("skimage.morphology")
    assert np.array_equal(tolerance_disk(radius), skimage_morphology.disk(radius).astype(bool))


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
    with pytest.raises(ValueError, match="T >= 1"):
        series_statistics([])
    with pytest.raises(ValueError, match="no objects"):
        summarize_objects({})
