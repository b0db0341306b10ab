"""Region and video datasets over real on-disk formats, the procedural shapes worlds (images and video), RLE
utilities, collate.

Every dataset is a ``torch.utils.data.Dataset`` of ``RegionSample`` (the video datasets and ``ShapesVideoWorld``:
``VideoRegionSample``) with ``on_bad_sample`` and ``bad_sample_counts`` (docs/architecture.md, docs/data.md).
"""
from .bad_samples import BadSampleError, BadSampleLog, SkippedSample, count_skipped
from .base import RegionDataset
from .coco import CocoRegionDataset
from .collate import PreprocessingCollate, RegionBatch, region_collate
from .dlc import DLCRegionDataset
from .gar import GARRegionDataset
from .refcoco import RefCocoRegionDataset
from .rle import decode_rle, decode_segmentation, encode_mask
from .shapes import ShapesWorld
from .shapes_video import ShapesVideoWorld
from .types import RegionSample, VideoRegionSample
from .video import VideoRegionDataset, key_frame
from .video_formats import MeViSDataset, RefYouTubeVOSDataset, ReVOSDataset, SAVMaskletDataset

__all__ = [
    "BadSampleError", "BadSampleLog", "CocoRegionDataset", "DLCRegionDataset", "GARRegionDataset", "MeViSDataset",
    "PreprocessingCollate", "ReVOSDataset", "RefCocoRegionDataset", "RefYouTubeVOSDataset", "RegionBatch",
    "RegionDataset", "RegionSample",
    "SAVMaskletDataset", "ShapesVideoWorld", "ShapesWorld", "SkippedSample", "VideoRegionDataset",
    "VideoRegionSample", "count_skipped", "decode_rle", "decode_segmentation", "encode_mask", "key_frame",
    "region_collate",
]
