"""The one sample type every region dataset yields (docs/architecture.md, "data/ → everyone")."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import PIL.Image


@dataclass
class RegionSample:
    """One region of one image, with its text.

    Attributes:
        image: RGB image, converted at load time (see ``data/images.py`` for the mode policy).
        gt_mask: bool ``[H, W]`` pixel mask of the region, same size as ``image``; None for a text-only sample of
            unpaired data (a caption or referring expression about the image without its mask).
        captions: region descriptions (may be empty for pure referring-segmentation data and for region-only
            samples of unpaired data).
        expressions: referring expressions (may be empty for pure caption data).
        sample_id: ``"<dataset>/<image key>#<ann id>"``; every error message names it.
        source: dataset name (the ``<dataset>`` part of ``sample_id``).
        category: class name of the region when the data has one.
    """

    image: PIL.Image.Image
    gt_mask: np.ndarray | None
    captions: list[str]
    expressions: list[str]
    sample_id: str
    source: str
    category: str | None = None


@dataclass
class VideoRegionSample:
    """One object of one clip (its masklet), with its text: the video counterpart of :class:`RegionSample`.

    Attributes:
        frames: RGB frames in time order, all of one size (converted at load time like ``RegionSample.image``).
        gt_masks: bool ``[T, H, W]`` masklet, one mask per frame (all False where the object is absent or hidden);
            None for a text-only sample of unpaired data.
        captions: descriptions of the object (may be empty, e.g. for referring-segmentation data).
        expressions: referring expressions of the object (may be empty, e.g. for masklets without text).
        sample_id: ``"<dataset>/<video id>#<object or expression id>"``; every error message names it.
        source: dataset name (the ``<dataset>`` part of ``sample_id``).
        frame_names: each frame's name in the source (file stem or index), for error messages and per-frame output.
        category: class name of the object when the data has one.
    """

    frames: list[PIL.Image.Image]
    gt_masks: np.ndarray | None
    captions: list[str]
    expressions: list[str]
    sample_id: str
    source: str
    frame_names: list[str]
    category: str | None = None
