"""Image decoding and the RGB policy shared by every loader.

Policy (one table, ``_OPAQUE_MODES`` / ``_ALPHA_MODES``):

* ``RGB`` is kept; ``L``, ``1``, ``P`` without transparency, ``CMYK`` and ``YCbCr`` are converted with
  PIL's fixed conversion (deterministic; CMYK uses PIL's plain formula, not an ICC profile).
* Modes with transparency (``RGBA``, ``LA``, ``PA``, ``La``, ``RGBa``, ``P`` with a transparency
  entry) are converted losslessly when every alpha value is 255. Otherwise the ``alpha`` knob
  decides: ``'raise'`` (default: a silent choice of background would change what the region looks
  like), ``'white'`` / ``'black'`` (composite over that colour) or ``'drop'`` (ignore alpha).
* Anything else (16-bit ``I;16``, ``I``, ``F``, ``LAB``, ``HSV``, ...) is rejected: converting it to
  8-bit RGB needs a scaling choice only the user can make.

EXIF orientation is not applied: COCO-style masks are drawn on the stored pixel grid.
"""
from __future__ import annotations

import io
import os

import numpy as np
import PIL.Image

from .bad_samples import BadSampleError

ALPHA_POLICIES = ("raise", "white", "black", "drop")
_OPAQUE_MODES = ("RGB", "L", "1", "P", "CMYK", "YCbCr")
_ALPHA_MODES = ("RGBA", "LA", "PA", "La", "RGBa")


def check_alpha_policy(value: str, owner: str) -> str:
    """Validate the ``alpha`` knob of dataset ``owner``."""
    if value not in ALPHA_POLICIES:
        raise ValueError(f"{owner}: alpha={value!r} is not one of {ALPHA_POLICIES}; 'raise' rejects "
                         "transparent images, 'white'/'black' composite them, 'drop' ignores alpha")
    return value


def load_rgb(source: bytes | str | os.PathLike, *, alpha: str = "raise", file: str,
             sample_id: str) -> PIL.Image.Image:
    """Decode ``source`` (encoded bytes or a path) fully and apply the RGB policy."""
    if not isinstance(source, (bytes, bytearray, memoryview)) and not os.path.isfile(source):
        raise BadSampleError("missing_image", f"image file {source} does not exist", file=file,
                             sample_id=sample_id)
    try:
        handle = io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview)) else source
        with PIL.Image.open(handle) as image:
            image.load()  # decode now: a truncated file must fail here, not inside the model
            return to_rgb(image, alpha=alpha, file=file, sample_id=sample_id)
    except (OSError, SyntaxError, ValueError, PIL.Image.DecompressionBombError) as err:
        if isinstance(err, BadSampleError):
            raise
        raise BadSampleError("bad_image", f"cannot decode image ({type(err).__name__}: {err})",
                             file=file, sample_id=sample_id) from None


def to_rgb(image: PIL.Image.Image, *, alpha: str = "raise", file: str,
           sample_id: str) -> PIL.Image.Image:
    """Apply the module's RGB policy to a decoded image."""
    mode = image.mode
    if mode == "P" and "transparency" in image.info:
        image, mode = image.convert("RGBA"), "RGBA"
    if mode in _OPAQUE_MODES:
        return image.copy() if mode == "RGB" else image.convert("RGB")
    if mode not in _ALPHA_MODES:
        raise BadSampleError("image_mode", f"image mode {mode!r} is not supported (supported: "
                             f"{_OPAQUE_MODES + _ALPHA_MODES})", file=file, sample_id=sample_id)
    rgba = image.convert("RGBA")
    opacity = np.asarray(rgba.getchannel("A"))
    if alpha == "drop" or bool((opacity == 255).all()):
        return rgba.convert("RGB")
    if alpha == "raise":
        raise BadSampleError("image_mode", f"image mode {mode!r} has transparent pixels "
                             f"({int((opacity < 255).sum())} with alpha < 255) and alpha='raise'",
                             file=file, sample_id=sample_id)
    background = PIL.Image.new("RGBA", rgba.size, (255, 255, 255, 255) if alpha == "white"
                               else (0, 0, 0, 255))
    return PIL.Image.alpha_composite(background, rgba).convert("RGB")
