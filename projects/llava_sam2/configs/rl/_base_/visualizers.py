# Logging backends of MMEngine's visualizer. LoggerHook sends every logged scalar (loss, KL, clip fractions, the
# reward of each loop and reward, phase timings, failure counts) and RolloutLoggingHook its rollout PNGs to each
# backend of the visualizer. The base configs keep MMEngine's default (files under <work_dir>/<time>/vis_data);
# choose another in a config with one line:
#
#     with read_base():
#         from ._base_.sa2va_grpo_base import *
#         from ._base_.visualizers import tensorboard_visualizer as visualizer  # or wandb_visualizer
#
# TensorBoard needs the `tensorboard` package (`pip install -e .[logging]`; `make setup` installs it):
# `tensorboard --logdir work_dirs/<run>`. W&B needs `wandb` and a login (WANDB_API_KEY from the environment).
from mmengine.visualization import LocalVisBackend, TensorboardVisBackend, Visualizer, WandbVisBackend

tensorboard_visualizer = dict(type=Visualizer, vis_backends=[dict(type=LocalVisBackend),
                                                            dict(type=TensorboardVisBackend)])
wandb_visualizer = dict(type=Visualizer, vis_backends=[dict(type=LocalVisBackend),
                                                       dict(type=WandbVisBackend, init_kwargs=dict(project="sa2va-rl"))])
