"""evaluation/listener.py: a caption counts when the frozen listener's mask finds its object (IoU > 0.5) and no
other object better; per-scene counts compare two systems on the same scenes."""
from __future__ import annotations

import numpy as np
import pytest

from projects.llava_sam2.rl_train.evaluation import listener
from projects.llava_sam2.rl_train.evaluation.text_dependence import held_out_scenes


def test_found_needs_iou_above_half_and_above_every_other_object():
    a = np.zeros((8, 8), bool)
    a[:4, :4] = True
    b = np.zeros((8, 8), bool)
    b[4:, 4:] = True
    assert listener.object_is_found(a, [a, b], 0)
    assert not listener.object_is_found(a, [a, b], 1)          # the other object's mask: wrong object
    half = a.copy()
    half[:4, :2] = False                                         # IoU 0.5 exactly: not above the threshold
    assert not listener.object_is_found(half, [a, b], 0)
    assert not listener.object_is_found(None, [a, b], 0)
    both = a | b                                                 # IoU 0.5 with each: a tie is not found
    assert not listener.object_is_found(both, [a, b], 0)


def test_accuracy_scores_the_listeners_reading_of_each_caption():
    scenes = held_out_scenes(6, seed=0, image_size=64, split="test", domain="target")
    truth = {id(s.image): s for s in scenes}

    def captions_of(images, masks):  # "right" captions name their object; one system swaps the first two
        return [[f"object {k}" for k in range(len(m))] for m in masks]

    def swapped(images, masks):
        return [[f"object {1 if k == 0 else 0 if k == 1 else k}" for k in range(len(m))] for m in masks]

    def segment(images, texts):  # an exact listener: returns the named object's GT mask
        return [[truth[id(im)].gt_masks[int(t.split()[1])] for t in row] for im, row in zip(images, texts)]

    right = listener.score(captions_of, segment, scenes, batch_size=4)
    wrong = listener.score(swapped, segment, scenes, batch_size=4)
    objects = sum(len(s.gt_masks) for s in scenes)
    assert right.accuracy.value == pytest.approx(1.0)
    assert wrong.accuracy.value == pytest.approx((objects - 2 * len(scenes)) / objects)
    change = listener.compare(right.to_dict(), wrong.to_dict())
    assert change.value == pytest.approx(-2 * len(scenes) / objects) and change.high < 0
