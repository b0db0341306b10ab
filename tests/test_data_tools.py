"""`sa2va-rl inspect` (cli/inspect_dataset.py) and `sa2va-rl bench loader` (benchmarks/loader.py) run end to end on
tiny inputs."""
import os

import PIL.Image

from data_fixtures import make_bad_coco
from projects.llava_sam2.rl_train.benchmarks import loader as bench_loader
from projects.llava_sam2.rl_train.cli import inspect_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_inspect_dataset_counts_bad_samples_and_draws_a_grid(tmp_path, capsys):
    ann_file, expected = make_bad_coco(str(tmp_path))
    out = tmp_path / "grid.png"
    config = os.path.join(ROOT, "projects/llava_sam2/configs/rl/_base_/datasets/coco_regions.py")
    rc = inspect_dataset.main([
        config, "--cfg-options", f"dataset.ann_file={ann_file}", f"dataset.image_root={tmp_path}",
        "dataset.name=bad", "--out", str(out), "--num", "4"])
    printed = capsys.readouterr().out
    assert rc == 0
    n_good = sum(e.problem is None for e in expected)
    assert f"{len(expected)} samples indexed, {len(expected)} scanned, {n_good} good" in printed
    assert f"{len(expected) - n_good} bad sample(s) skipped" in printed
    for problem in {e.problem for e in expected if e.problem}:
        assert f"  {problem}: " in printed
    with PIL.Image.open(out) as grid:
        assert grid.size[0] > 200 and grid.size[1] > 200


def test_inspect_dataset_on_the_shapes_world(tmp_path, capsys):
    config = os.path.join(ROOT, "projects/llava_sam2/configs/rl/_base_/datasets/shapes_regions.py")
    out = tmp_path / "shapes.png"
    inspect_dataset.main([config, "--cfg-options", "dataset.num_samples=6",
                          "--out", str(out), "--num", "6"])
    printed = capsys.readouterr().out
    assert "6 samples indexed, 6 scanned, 6 good" in printed and "no bad samples" in printed
    assert out.exists()


def test_inspect_dataset_on_a_video_dataset_draws_a_strip_per_sample(tmp_path, capsys):
    """A video dataset config (MeViS layout written by the shapes video world) with one masklet cut down to a pixel
    between the region-grid points on its key frame: the scan judges the key frame, counts that sample, and draws the
    others as strips."""
    import json

    import numpy as np

    from projects.llava_sam2.rl_train.data import ShapesVideoWorld
    from projects.llava_sam2.rl_train.data.rle import encode_mask

    world = ShapesVideoWorld("val", 3, seed=1, image_size=32, num_frames=4)
    paths = world.write_mevis(str(tmp_path / "mevis"))
    with open(paths["mask_file"]) as handle:
        masks = json.load(handle)
    dot = np.zeros((32, 32), dtype=bool)
    dot[1, 1] = True  # the 16 x 16 grid samples even rows and columns of a 32-pixel frame
    masks["1"] = [encode_mask(dot)] * 4
    with open(paths["mask_file"], "w") as handle:
        json.dump(masks, handle)
    config = os.path.join(ROOT, "projects/llava_sam2/configs/rl/_base_/datasets/video_mevis.py")
    out = tmp_path / "strips" / "mevis.png"
    rc = inspect_dataset.main([config, "--cfg-options", *[f"dataset.{k}={v}" for k, v in paths.items()],
                               f"dataset.name={world.name}", "--out", str(out), "--num", "4"])
    printed = capsys.readouterr().out
    assert rc == 0
    assert "3 samples indexed, 3 scanned, 2 good, 2 videos" in printed and "frames per sample: mean 5.00" in printed
    assert "  region_off_grid: 1" in printed and "key frame 0" in printed
    strips = sorted(p.name for p in out.parent.iterdir())
    assert strips == ["mevis_00.png", "mevis_01.png"]
    with PIL.Image.open(out.parent / strips[0]) as strip:
        assert strip.size[0] > 4 * 100  # five frames side by side


def test_bench_loader_reports_throughput(tmp_path, capsys):
    rc = bench_loader.main(["--num-samples", "12", "--image-size", "64", "--workers", "0",
                            "--repeats", "1", "--out-dir", str(tmp_path)])
    printed = capsys.readouterr().out
    assert rc == 0 and "num_workers=0 batch_size=8: 12 samples in" in printed and "samples/s" in printed
    assert (tmp_path / "annotations.json").exists()
