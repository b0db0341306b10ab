"""Every shipped config under projects/llava_sam2/configs loads, and every runnable one builds.

CPU configs build the way `sa2va-rl train` builds them (MMEngine Runner: model, hooks by name, train loop with its
dataloader and one batch, optimizer wrapper, schedulers, and for GRPO the algorithm with its rewards), on the tiny
model and files written here. The released-size configs (1B/4B/8B, InternVL3 2B/8B) build their model and algorithm on
the meta device (no weights: a preset of the same size stands in for the local checkpoint) plus every hook.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import HOOKS, MODELS, RUNNERS

from projects.llava_sam2.rl_train.cli.setup_checkpoint import make_tiny_checkpoint
from projects.llava_sam2.rl_train.data import CocoRegionDataset
from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.data.shapes_video import ShapesVideoWorld
from projects.llava_sam2.rl_train.engine.checkpointing import unwrap_model
from projects.llava_sam2.rl_train.engine.loop import GRPOLoop
from projects.llava_sam2.rl_train.engine.prompt_filter import FORMAT as PREFILTER_FORMAT
from projects.llava_sam2.rl_train.model.text.tokenizer import TINY_TOKENIZER_DIR
from projects.llava_sam2.rl_train.prompt_rl.reward_net import RewardNet, RewardNetConfig, save_reward_net

CONFIG_ROOT = Path(__file__).resolve().parents[1] / "projects/llava_sam2/configs"
ALL_CONFIGS = sorted(CONFIG_ROOT.rglob("*.py"))
# upstream_sft/ holds a config in upstream Sa2VA's schema: it builds only inside an upstream checkout (its classes), so
# here it is loaded (test_config_loads) and read by engine/upstream_sft.py (test_upstream_sft.py), not built.
RUNNABLE = [p for p in ALL_CONFIGS if "_base_" not in p.parts and "upstream_sft" not in p.parts]
# sa2va_<preset>_*.py: released sizes (1b, 4b, 8b) and the InternVL3 family (in3_2b, in3_8b)
SIZED = {p: m.group(1) for p in RUNNABLE if (m := re.fullmatch(r"sa2va_((?:in3_)?\d+b)_.*\.py", p.name))}
# gpu_smoke_<preset>[_<variant>].py: `sa2va-rl check gpu`'s configs (a variant switches one setting of its preset's)
GPU_SMOKE = {p: m.group(1) for p in RUNNABLE if (m := re.fullmatch(r"gpu_smoke_(\d+b)(?:_[a-z_]+)?\.py", p.name))}
# check_tiny_cpu.py is tiny_grpo_cycle_cpu.py plus one reward; tests/test_check_gpu.py trains it end to end
CPU = [p for p in RUNNABLE if p not in SIZED and p not in GPU_SMOKE and p.name != "check_tiny_cpu.py"]
# GRPO hooks by their default_hooks name; registered in this order (class priority, then config order), the order
# they had as custom_hooks
GRPO_HOOKS = {"ema_partner": "EMAPartnerHook", "reward_failures": "RewardFailureHook",
              "skipped_samples": "SkippedSampleHook", "rollout_logging": "RolloutLoggingHook",
              "train_state": "TrainStateHook"}


def rel(path: Path) -> str:
    return str(path.relative_to(CONFIG_ROOT))


@pytest.fixture(scope="module")
def local_files(tmp_path_factory) -> dict[str, str]:
    """What the CPU configs point at under work_dirs/: an HF checkpoint, a reward network, COCO-style shapes."""
    root = tmp_path_factory.mktemp("config_inputs")
    torch.manual_seed(0)
    save_reward_net(RewardNet(RewardNetConfig(side=64, width=8)), root / "reward_net")
    annotations = ShapesWorld("train", 4, 0, image_size=64).write_coco(str(root / "shapes"))
    regions = CocoRegionDataset(annotations)
    prompts = root / "prompts.json"  # a pre-filter file that keeps every prompt
    prompts.write_text(json.dumps({"format": PREFILTER_FORMAT,
                                   "keep_ids": [regions.sample_id(i) for i in range(len(regions))]}))
    world = ShapesWorld("train", 4, 0, image_size=64, domain="target")
    clips = ShapesVideoWorld("train", 2, 0, image_size=64, num_frames=3, domain="target")
    return {"sav": clips.write_sav(str(root / "sav")), "mevis": clips.write_mevis(str(root / "mevis")),"checkpoint": str(make_tiny_checkpoint(root / "tiny", seed=0)), "reward_net": str(root / "reward_net"),
            "annotations": annotations, "prompts": str(prompts),
            "target": str(root / "target"), "regions": world.write_coco(str(root / "target"), keep="regions"),
            "texts": world.write_coco(str(root / "target_texts"), keep="texts", write_images=False)}


def local_options(name: str, files: dict[str, str]) -> dict:
    """--cfg-options that point a config's local paths (work_dirs/...) at ``files``."""
    ckpt, ann = files["checkpoint"], files["annotations"]
    return {
        "rl/demo/sft_shapes_cpu.py": {"train_dataloader.dataset.region_dataset.ann_file": ann},
        "rl/demo/sft_continue_shapes_cpu.py": {"model.pretrained_path": ckpt,
                                               "train_dataloader.dataset.pretrained_path": ckpt,
                                               "train_dataloader.dataset.region_dataset.ann_file": ann},
        "rl/demo/grpo_shapes_cpu.py": {"model.pretrained_path": ckpt, "train_dataloader.dataset.ann_file": ann},
        "rl/demo/grpo_shapes_unpaired_cpu.py": {
            "model.pretrained_path": ckpt, "train_dataloader.dataset.regions.ann_file": files["regions"],
            "train_dataloader.dataset.regions.image_root": files["target"],
            "train_dataloader.dataset.texts.ann_file": files["texts"],
            "train_dataloader.dataset.texts.image_root": files["target"]},
        "rl/demo/grpo_shapes_cycle_only_cpu.py": {"model.pretrained_path": ckpt,
                                                   "train_dataloader.dataset.ann_file": ann},
        **{f"rl/demo/grpo_shapes_{variant}_cpu.py": {"model.pretrained_path": ckpt,
                                                      "train_dataloader.dataset.ann_file": ann}
           for variant in ("dense", "dense_light", "deterministic", "field")},
        "rl/demo/grpo_shapes_video_cpu.py": {
            "model.pretrained_path": ckpt,
            **{f"train_dataloader.dataset.regions.{k}": v for k, v in files["sav"].items()},
            **{f"train_dataloader.dataset.texts.{k}": v for k, v in files["mevis"].items()}},
        "rl/tiny_grpo_prefiltered_cpu.py": {"train_dataloader.dataset.dataset.ann_file": ann,
                                             "train_dataloader.dataset.keep_ids_file": files["prompts"]},
        "rl/demo/grpo_shapes_oracle_iou_cpu.py": {"model.pretrained_path": ckpt,
                                                  "train_dataloader.dataset.ann_file": ann},
        "rl/demo/grpo_shapes_reward_net_cpu.py": {
            "model.pretrained_path": ckpt, "train_dataloader.dataset.ann_file": ann,
            "train_cfg.algorithm.rewards.caption_to_mask.1.checkpoint": files["reward_net"]},
        "rl/tiny_grpo_reward_net_cpu.py": {
            "model.pretrained_path": ckpt,
            "train_cfg.algorithm.rewards.caption_to_mask.0.checkpoint": files["reward_net"]},
    }.get(name, {})


@pytest.mark.parametrize("path", ALL_CONFIGS, ids=rel)
def test_config_loads(path):
    cfg = Config.fromfile(str(path))
    if cfg.get("train_cfg", {}).get("type") is GRPOLoop:
        named = {name: cfg.default_hooks[name]["type"].__name__ for name in GRPO_HOOKS if name in cfg.default_hooks}
        assert named == GRPO_HOOKS, f"{rel(path)}: GRPO hooks by name in default_hooks, got {named}"
        assert not cfg.custom_hooks, f"{rel(path)}: the GRPO hooks are addressed by name, not in custom_hooks"


@pytest.mark.parametrize("path", CPU, ids=rel)
def test_cpu_config_builds_like_the_trainer(path, local_files, tmp_path, monkeypatch):
    codebase = {"rl/tiny_grpo_from_upstream_sft_cpu.py": "v1", "rl/tiny_grpo_from_upstream_v2_sft_cpu.py": "v2"}
    if rel(path) in codebase:
        # its paths are those of an upstream checkout after the SFT run (./pretrained/..., ./work_dirs/...)
        from projects.llava_sam2.rl_train.model.checkpoints.tiny_upstream_run import make_tiny_sft_run
        make_tiny_sft_run(tmp_path / "checkout", seed=0, codebase=codebase[rel(path)])
        monkeypatch.chdir(tmp_path / "checkout")
    if rel(path) == "rl/tiny_grpo_from_upstream_v2_qwen_sft_cpu.py":  # a v2 Qwen-VL checkout after its SFT run
        from qwen_sft_fixtures import make_tiny_qwen_sft_run
        make_tiny_qwen_sft_run(tmp_path / "checkout", seed=0)
        monkeypatch.chdir(tmp_path / "checkout")
    cfg = Config.fromfile(str(path))
    cfg.work_dir, cfg.log_level = str(tmp_path), "WARNING"
    cfg.merge_from_dict(local_options(rel(path), local_files))
    runner = RUNNERS.build(cfg)
    loop = runner.train_loop  # built on first access: the loop, its dataloader, dataset, sampler and collate
    assert next(iter(loop.dataloader)), f"{rel(path)}: empty first batch"
    runner.optim_wrapper = runner.build_optim_wrapper(runner.optim_wrapper)
    runner.param_schedulers = runner.build_param_scheduler(runner.param_schedulers)
    assert any(p.requires_grad for p in runner.model.parameters()), f"{rel(path)}: nothing to train"
    if isinstance(loop, GRPOLoop):
        algorithm = unwrap_model(runner.model).build_algorithm(cfg.train_cfg.algorithm)
        assert algorithm.loops, f"{rel(path)}: the algorithm has no loop switched on"
        registered = [type(h).__name__ for h in runner.hooks if type(h).__name__ in GRPO_HOOKS.values()]
        assert registered == list(GRPO_HOOKS.values())


@pytest.mark.parametrize("path", sorted(SIZED), ids=rel)
def test_released_size_config_builds_on_the_meta_device(path):
    cfg = Config.fromfile(str(path))
    model_cfg = cfg.model.copy()
    # no checkpoint here: the preset of the same size, the tiny tokenizer, weight sets on the (meta) model's device
    model_cfg.update(pretrained_path=None, preset=SIZED[path], tokenizer=str(TINY_TOKENIZER_DIR),
                     weights_storage_device=None)
    with torch.device("meta"):
        model = MODELS.build(model_cfg)
        algorithm = model.build_algorithm(cfg.train_cfg.algorithm)
    assert [loop.name for loop in algorithm.loops] == ["mask_to_caption", "caption_to_mask"]
    assert model.sa2va.language_model.peft_config["default"].r == cfg.model.lora.r
    hooks = {name: HOOKS.build(dict(hook)) for name, hook in cfg.default_hooks.items()}
    assert {name: type(hooks[name]).__name__ for name in GRPO_HOOKS} == GRPO_HOOKS
    dataset = cfg.train_dataloader.dataset  # data paths: local defaults to edit
    if "video" in path.name:  # loop 1 on SA-V masklets, loop 2 on MeViS expressions, unpaired
        kinds = (dataset.type.__name__, dataset.regions.type.__name__, dataset.texts.type.__name__)
        assert kinds == ("unpaired_region_dataset", "SAVMaskletDataset", "MeViSDataset")
        assert [r["type"].__name__ for r in cfg.train_cfg.algorithm.rewards.mask_to_caption] == ["VideoJFReward"]
    else:
        assert dataset.type.__name__ == "DLCRegionDataset"


@pytest.mark.parametrize("path", sorted(GPU_SMOKE), ids=rel)
def test_gpu_smoke_config_builds_on_the_meta_device_in_the_gpu_precision(path):
    """`sa2va-rl check gpu`'s configs: the preset of their size with the tiny tokenizer, bf16 frozen weights and fp32
    trained tensors (the AMP path), both loops with the judge on each, every GRPO hook; nothing to download."""
    cfg = Config.fromfile(str(path))
    assert cfg.model.preset == GPU_SMOKE[path] and cfg.model.pretrained_path is None
    assert cfg.optim_wrapper.type.__name__ == "AmpOptimWrapper" and cfg.optim_wrapper.dtype == "bfloat16"
    with torch.device("meta"):
        model = MODELS.build(cfg.model.copy())
        algorithm = model.build_algorithm(cfg.train_cfg.algorithm)
    assert [loop.name for loop in algorithm.loops] == ["mask_to_caption", "caption_to_mask"]
    assert {r.name for loop in algorithm.loops for r in loop.composer.rewards} == {"iou", "meteor", "dlc_judge"}
    trained = {p.dtype for p in model.parameters() if p.requires_grad}
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    assert trained == {torch.float32} and frozen == {torch.bfloat16}
    hooks = {name: HOOKS.build(dict(hook)) for name, hook in cfg.default_hooks.items()}
    assert {name: type(hooks[name]).__name__ for name in GRPO_HOOKS} == GRPO_HOOKS


VIDEO_DATASETS = sorted((CONFIG_ROOT / "rl/_base_/datasets").glob("video_*.py"))


@pytest.fixture(scope="module")
def video_files(tmp_path_factory) -> dict[str, dict]:
    """Per video dataset config, the --cfg-options pointing it at tiny files in its format (the shapes video world
    written as MeViS and SA-V, the Ref-YouTube-VOS fixture), and the sample ids expected back."""
    from projects.llava_sam2.rl_train.data import ShapesVideoWorld
    from video_fixtures import make_ref_youtube_vos

    root = tmp_path_factory.mktemp("video_inputs")
    world = ShapesVideoWorld("train", 2, seed=0, image_size=32, num_frames=4)
    mevis = world.write_mevis(str(root / "mevis"))
    sav = world.write_sav(str(root / "sav"))
    ytvos, expected = make_ref_youtube_vos(str(root / "ytvos"))
    mine = [f"{world.name}/{i}#{i}" for i in range(2)]
    return {
        "video_mevis.py": ({**mevis, "name": world.name}, mine),
        "video_revos.py": ({**mevis, "name": world.name}, mine),
        "video_sav.py": ({**sav, "name": world.name}, mine),
        "video_ref_youtube_vos.py": (ytvos, [e.sample_id for e in expected]),
        "video_shapes.py": ({"num_samples": 2, "image_size": 32, "num_frames": 4}, mine),
    }


@pytest.mark.parametrize("path", VIDEO_DATASETS, ids=rel)
def test_video_dataset_config_builds_and_loads(path, video_files):
    """Each video dataset config builds from the registry as the trainer's dataloader builds it, takes the model's
    input check, and yields video samples that region_collate batches."""
    from mmengine.registry import DATASETS

    from projects.llava_sam2.rl_train.data import VideoRegionSample, region_collate
    from projects.llava_sam2.rl_train.model.text.input_check import UPSTREAM_REGION_GRID_SIZE, InputCheck

    options, sample_ids = video_files[path.name]
    cfg = Config.fromfile(str(path))
    dataset_cfg = cfg.dataset
    dataset_cfg.update(options)
    dataset = DATASETS.build(dataset_cfg)
    dataset.set_input_check(InputCheck(UPSTREAM_REGION_GRID_SIZE, "raise"))
    assert [dataset[i].sample_id for i in range(len(dataset))] == sample_ids
    batch = cfg.region_collate_fn["type"]([dataset[i] for i in range(len(dataset))])
    assert cfg.region_collate_fn["type"] is region_collate and len(batch) == len(sample_ids)
    expected_frames = dataset_cfg.get("num_frames", 5)
    assert all(isinstance(s, VideoRegionSample) and len(s.frames) == expected_frames for s in batch)


def test_every_video_format_has_a_dataset_config():
    assert [p.name for p in VIDEO_DATASETS] == ["video_mevis.py", "video_ref_youtube_vos.py", "video_revos.py",
                                                "video_sav.py", "video_shapes.py"]
