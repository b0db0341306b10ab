"""Video object segmentation metrics for the held-out evaluation: J, F and J&F as DAVIS 2017 defines them.

The functions live in ``rewards.video_metrics`` (loop 1 on video is rewarded with them, and the rewards sit below the
evaluation); this module is the evaluation's name for them.
"""
from ..rewards.video_metrics import (  # noqa: F401
    BOUNDARY_TOLERANCE,
    DECAY_QUARTERS,
    RECALL_THRESHOLD,
    MaskletScores,
    SeriesStatistics,
    VideoSummary,
    boundary_map,
    boundary_measure,
    boundary_tolerance_pixels,
    dilate_by_disk,
    j_and_f,
    region_similarity,
    score_masklet,
    score_masklets,
    series_statistics,
    summarize_objects,
    tolerance_disk,
)
