# Dual-loop GRPO that starts from an upstream codebase-v2 Sa2VA SFT run (projects/sa2va, the InternVL3 family), on
# CPU (README "From your Sa2VA SFT run to RL", docs/upstream.md "Codebase v2 SFT runs").
#
# The model comes from the SFT config (upstream_sft/sa2va_in30_tiny_sft.py stands for yours): its LoRA, freeze flags,
# template, special tokens, base InternVL path and SAM2 weights, plus `pretrained_pth`, the SFT checkpoint RL starts
# from (an XTuner iter_*.pth or a DeepSpeed checkpoint directory). The loop, hooks, data and RL settings are
# tiny_grpo_from_upstream_sft_cpu.py's (the v1 path's); only the SFT run differs. Paths are relative to the working directory, as upstream's ./pretrained:
#
#   python -m projects.llava_sam2.rl_train.model.checkpoints.tiny_upstream_run --root . --codebase v2  # tiny "SFT"
#   python tools/train.py projects/llava_sam2/configs/rl/tiny_grpo_from_upstream_v2_sft_cpu.py --work-dir work_dirs/rl
from mmengine.config import read_base

with read_base():
    from .tiny_grpo_from_upstream_sft_cpu import *  # noqa: F401,F403
    # your SFT config: its model dict and template (yours: e.g. a v2 checkout's projects/sa2va/configs/sa2va_in30_8b.py)
    from .upstream_sft.sa2va_in30_tiny_sft import model as v2_sft_model
    from .upstream_sft.sa2va_in30_tiny_sft import template as v2_sft_template

# the SFT result RL starts from (.pth file or DeepSpeed directory); the SFT config's own pretrained_pth, if set, is
# the weights that SFT started from and is read as well
pretrained_pth = './work_dirs/sa2va_in30_tiny_sft/iter_2.pth'
# assigned, not updated: an update would merge the v1 SFT model's keys into the v2 one
model["upstream_sft"]["sft_model"] = v2_sft_model  # noqa: F405
model["upstream_sft"]["template"] = v2_sft_template  # noqa: F405
model["upstream_sft"]["pretrained_pth"] = pretrained_pth  # noqa: F405
