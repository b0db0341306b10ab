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
