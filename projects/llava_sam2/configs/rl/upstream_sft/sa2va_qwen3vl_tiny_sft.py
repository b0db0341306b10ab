# A codebase-v2 Sa2VA SFT config of the Qwen-VL family in upstream's schema (bytedance/Sa2VA
# projects/sa2va/configs/sa2va_qwenvl3/sa2va_qwen3_4b.py: the same variables, model dict with arch_type='qwen' and a
# Qwen3VL mllm, and runtime, one RefCOCO dataset), sized for the tiny Qwen3-VL-like model that the tests write under
# ./pretrained and ./work_dirs (tests/qwen_sft_fixtures.py). It stands for *your* Qwen-VL SFT config: RL configs read
# its model settings (LoRA with modules_to_save, freeze flags, template, special tokens, paths) through read_base(),
# see ../tiny_grpo_from_upstream_v2_qwen_sft_cpu.py. It only parses here; training it needs a Sa2VA codebase-v2
# checkout (projects.sa2va.models / datasets, third_parts). For Qwen2.5-VL, upstream's sa2va_qwenvl25/ configs differ
# only in `path`, the mllm type (Qwen2_5_VL) and the processor (Qwen2_5_VLProcessor).
from mmengine.hooks import (CheckpointHook, DistSamplerSeedHook, IterTimerHook, LoggerHook,
                            ParamSchedulerHook)
from mmengine.optim import AmpOptimWrapper, CosineAnnealingLR, LinearLR
from peft import LoraConfig
from torch.optim import AdamW
from transformers import AutoTokenizer, Qwen3VLProcessor
from xtuner.dataset.samplers import LengthGroupedSampler
from xtuner.engine.runner import TrainLoop
from xtuner.utils import PROMPT_TEMPLATE

from projects.sa2va.datasets import Sa2VA01RefSeg, sa2va_collect_fn
from projects.sa2va.datasets.data_utils import ConcatDatasetSa2VA
from projects.sa2va.models import DirectResize, SAM2TrainRunner, Sa2VAModel
from projects.sa2va.models.mllm.qwen3vl import Qwen3VL
from third_parts.mmdet.models.losses import CrossEntropyLoss, DiceLoss

#######################################################################
#                          PART 1  Settings                           #
#######################################################################
# Model
path = './pretrained/Qwen3-VL-tiny'
pretrained_pth = None  # v2: the weights the SFT starts from (tools/convert_to_pth.py output), not its result

# Data
template = "qwen_chat"
prompt_template = PROMPT_TEMPLATE.qwen_chat
max_length = 2048

# Scheduler & Optimizer
batch_size = 2  # per_device
accumulative_counts = 1
dataloader_num_workers = 0
max_epochs = 1
optim_type = AdamW
lr = 4e-5
betas = (0.9, 0.999)
weight_decay = 0.05
max_norm = 1  # grad clip
warmup_ratio = 0.05

# Save
save_steps = 2
save_total_limit = 2

special_tokens = ['[SEG]', '<p>', '</p>', '<vp>', '</vp>']

tokenizer = dict(
    type=AutoTokenizer.from_pretrained,
    pretrained_model_name_or_path=path,
    trust_remote_code=True,
    padding_side='right')

extra_image_processor = dict(type=DirectResize, target_length=256)

#######################################################################
#            PART 2  Model & Tokenizer & Image Processor              #
#######################################################################
model = dict(
    type=Sa2VAModel,
    training_bs=batch_size,
    special_tokens=special_tokens,
    pretrained_pth=pretrained_pth,
    loss_sample_points=True,
    frozen_sam2_decoder=False,
    arch_type='qwen',
    mllm=dict(
        type=Qwen3VL,
        model_path=path,
        freeze_llm=True,
        freeze_visual_encoder=True,
        llm_lora=dict(
            type=LoraConfig,
            r=8,
            lora_alpha=16,
            lora_dropout=0.05,
            bias='none',
            task_type='CAUSAL_LM',
            modules_to_save=['lm_head', 'embed_tokens'],
            target_modules=None),  # upstream's Qwen-VL rule: every nn.Linear of the text decoder
    ),
    tokenizer=tokenizer,
    # v2's SAM2TrainRunner reads pretrained/sam2/<ckpt_path>; the tiny SAM2's sizes are in the base config.json
    grounding_encoder=dict(type=SAM2TrainRunner, ckpt_path='sam2_tiny.pt'),
    loss_mask=dict(type=CrossEntropyLoss, use_sigmoid=True, reduction='mean', loss_weight=2.0),
    loss_dice=dict(type=DiceLoss, use_sigmoid=True, activate=True, reduction='mean', naive_dice=True, eps=1.0,
                   loss_weight=0.5),
)

#######################################################################
#                      PART 3  Dataset & Dataloader                   #
#######################################################################
sa2va_default_dataset_configs = dict(
    tokenizer=tokenizer,
    special_tokens=special_tokens,
    extra_image_processor=extra_image_processor,
    prompt_template=prompt_template,
    max_length=max_length,
    arch_type='qwen',
    preprocessor=dict(type=Qwen3VLProcessor.from_pretrained, pretrained_model_name_or_path=path,
                      trust_remote_code=True),
)
refcoco_dataset = dict(
    type=Sa2VA01RefSeg,
    name='RefCOCO',
    data_root='./data/ref_seg/refcoco',
    data_prefix=dict(img_path='coco2014/train2014/'),
    ann_file='instances.json',
    split_file='refs(unc).p',
    num_classes_per_sample=5,
    repeats=1,
    **sa2va_default_dataset_configs,
)
train_dataset = dict(type=ConcatDatasetSa2VA, datasets=[refcoco_dataset])
train_dataloader = dict(
    batch_size=batch_size,
    num_workers=dataloader_num_workers,
    dataset=train_dataset,
    sampler=dict(type=LengthGroupedSampler, length_property='modality_length',
                 per_device_batch_size=batch_size * accumulative_counts),
    collate_fn=dict(type=sa2va_collect_fn))

#######################################################################
#                    PART 4  Scheduler & Optimizer                    #
#######################################################################
optim_wrapper = dict(
    type=AmpOptimWrapper,
    optimizer=dict(type=optim_type, lr=lr, betas=betas, weight_decay=weight_decay),
    clip_grad=dict(max_norm=max_norm, error_if_nonfinite=False),
    accumulative_counts=accumulative_counts,
    loss_scale='dynamic',
    dtype='bfloat16')
param_scheduler = [
    dict(type=LinearLR, start_factor=1e-5, by_epoch=True, begin=0, end=warmup_ratio * max_epochs,
         convert_to_iter_based=True),
    dict(type=CosineAnnealingLR, eta_min=0.0, by_epoch=True, begin=warmup_ratio * max_epochs, end=max_epochs,
         convert_to_iter_based=True),
]
train_cfg = dict(type=TrainLoop, max_epochs=max_epochs)

#######################################################################
#                           PART 5  Runtime                           #
#######################################################################
custom_hooks = []
default_hooks = dict(
    timer=dict(type=IterTimerHook),
    logger=dict(type=LoggerHook, log_metric_by_epoch=False, interval=10),
    param_scheduler=dict(type=ParamSchedulerHook),
    checkpoint=dict(type=CheckpointHook, save_optimizer=False, by_epoch=False, interval=save_steps,
                    max_keep_ckpts=save_total_limit),
    sampler_seed=dict(type=DistSamplerSeedHook),
)
env_cfg = dict(cudnn_benchmark=False, mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
               dist_cfg=dict(backend='nccl'))
