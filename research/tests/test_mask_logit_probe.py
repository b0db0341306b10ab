"""research/mask_logit_probe.py (research/LOG.md "Session 7"): a checkpoint against itself changes nothing."""
import json

from research import mask_logit_probe

CHECKPOINT = "projects/llava_sam2/rl_train/assets/tiny_shapes_pretrained"


def test_probe_of_a_checkpoint_against_itself_reports_no_change(capsys):
    mask_logit_probe.main([CHECKPOINT, CHECKPOINT, "--num-samples", "4"])
    report = json.loads(capsys.readouterr().out)
    assert report["start"] == report["rl"]
    assert report["start"]["with_seg"] == 4 and report["start"]["mean_abs_logit"] > 0
    assert 0.0 <= report["start"]["share_cells_abs_logit_below_2"] <= 1.0
    assert report["greedy_masks_changed"] == 0.0 and report["mean_share_of_pixels_changed"] == 0.0
