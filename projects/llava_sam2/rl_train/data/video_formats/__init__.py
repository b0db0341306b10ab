"""Video datasets over the real on-disk formats (docs/data.md, "Video datasets")."""
from .mevis import MeViSDataset, ReVOSDataset
from .sav import SAVMaskletDataset
from .ytvos import RefYouTubeVOSDataset

__all__ = ["MeViSDataset", "ReVOSDataset", "RefYouTubeVOSDataset", "SAVMaskletDataset"]
