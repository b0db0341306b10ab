"""The RGB policy: which modes convert, which raise, and the alpha knob (data/images.py)."""
import numpy as np
import PIL.Image
import pytest

from data_fixtures import image_bytes, rgb_image
from projects.llava_sam2.rl_train.data.bad_samples import BadSampleError
from projects.llava_sam2.rl_train.data.images import check_alpha_policy, load_rgb, to_rgb

WHERE = dict(file="img.png", sample_id="set/1#2")


def rgba(alpha_value: int) -> PIL.Image.Image:
    image = rgb_image(0, 6, 8, "RGBA")
    image.putalpha(PIL.Image.new("L", (8, 6), alpha_value))
    return image


@pytest.mark.parametrize("mode", ["L", "1", "CMYK", "YCbCr", "P"])
def test_opaque_modes_convert_like_pil(mode):
    source = rgb_image(1, 6, 8).convert(mode)
    out = to_rgb(source, **WHERE)
    assert out.mode == "RGB" and out.size == (8, 6)
    assert np.array_equal(np.asarray(out), np.asarray(source.convert("RGB")))


def test_grey_replicates_the_channel():
    grey = rgb_image(2, 5, 5, "L")
    out = np.asarray(to_rgb(grey, **WHERE))
    assert all(np.array_equal(out[..., c], np.asarray(grey)) for c in range(3))


def test_cmyk_jpeg_from_bytes_is_deterministic():
    payload = image_bytes(rgb_image(3, 16, 16, "CMYK"), "JPEG")
    first, second = (np.asarray(load_rgb(payload, **WHERE)) for _ in range(2))
    assert first.shape == (16, 16, 3) and np.array_equal(first, second)


def test_fully_opaque_alpha_is_dropped_losslessly():
    out = to_rgb(rgba(255), **WHERE)
    assert np.array_equal(np.asarray(out), np.asarray(rgb_image(0, 6, 8)))


@pytest.mark.parametrize("image", [rgba(90), rgba(90).convert("LA")])
def test_transparent_raises_by_default(image):
    with pytest.raises(BadSampleError) as info:
        to_rgb(image, **WHERE)
    assert info.value.problem == "image_mode" and "alpha" in str(info.value)


def test_palette_with_transparency_counts_as_alpha():
    palette = PIL.Image.fromarray(np.array([[0, 1], [1, 1]], dtype=np.uint8), mode="P")
    palette.putpalette([10, 20, 30, 200, 100, 50] + [0] * 762)
    palette.info["transparency"] = 0  # palette entry 0 is fully transparent
    with pytest.raises(BadSampleError, match="transparent"):
        to_rgb(palette, **WHERE)
    composited = np.asarray(to_rgb(palette, alpha="white", **WHERE))
    assert composited[0, 0].tolist() == [255, 255, 255] and composited[1, 1].tolist() == [200, 100, 50]


def test_alpha_policies_composite():
    rgb = np.asarray(rgb_image(0, 6, 8)).astype(np.float64)
    white = np.asarray(to_rgb(rgba(90), alpha="white", **WHERE)).astype(np.float64)
    black = np.asarray(to_rgb(rgba(90), alpha="black", **WHERE)).astype(np.float64)
    dropped = np.asarray(to_rgb(rgba(90), alpha="drop", **WHERE))
    a = 90 / 255
    assert np.abs(white - (a * rgb + (1 - a) * 255)).max() <= 1.0
    assert np.abs(black - a * rgb).max() <= 1.0
    assert np.array_equal(dropped, rgb.astype(np.uint8))


@pytest.mark.parametrize("mode", ["I;16", "I", "F"])
def test_high_bit_depth_is_rejected(mode):
    image = PIL.Image.fromarray(np.arange(12, dtype=np.uint16).reshape(3, 4)).convert(mode)
    with pytest.raises(BadSampleError, match="not supported") as info:
        to_rgb(image, **WHERE)
    assert info.value.problem == "image_mode"


def test_truncated_and_missing_files(tmp_path):
    payload = image_bytes(rgb_image(5, 32, 32), "JPEG")
    with pytest.raises(BadSampleError) as info:
        load_rgb(payload[: len(payload) // 2], **WHERE)
    assert info.value.problem == "bad_image"
    with pytest.raises(BadSampleError) as info:
        load_rgb(str(tmp_path / "nope.jpg"), **WHERE)
    assert info.value.problem == "missing_image" and "nope.jpg" in str(info.value)


def test_alpha_knob_is_validated():
    with pytest.raises(ValueError, match="alpha='grey'"):
        check_alpha_policy("grey", "MyDataset")
    assert check_alpha_policy("white", "MyDataset") == "white"


def test_loaded_image_does_not_keep_the_file_open(tmp_path):
    path = tmp_path / "a.png"
    rgb_image(6, 4, 4).save(path)
    image = load_rgb(str(path), **WHERE)
    path.unlink()  # the returned image is fully decoded
    assert np.array_equal(np.asarray(image), np.asarray(rgb_image(6, 4, 4)))
