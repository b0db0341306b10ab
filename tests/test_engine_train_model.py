"""Sa2VATrainModel on the tiny preset: trainable-only checkpoints, SFT and GRPO forwards, loss parsing."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.engine.builders import region_sft_dataset
from projects.llava_sam2.rl_train.engine.train_model import Sa2VATrainModel
from projects.llava_sam2.rl_train.model.text.processor import sft_collate

TINY = dict(preset="tiny", lora=dict(r=4, lora_alpha=8, lora_dropout=0.0),
            processor_cfg=dict(empty_region="dilate_to_one_cell"), sft_loss_cfg=dict(num_points=64))

# one tensor of each trainable group: LoRA, projector, [SEG] projection, SAM2 mask decoder
GROUPS = ("lora_B", "sa2va.mlp1.", "sa2va.text_hidden_fcs.", "sam_mask_decoder.")


def perturb_lora_b(model: Sa2VATrainModel) -> None:
    """LoRA B starts at 0, where lora_A gets no gradient; give B values so every LoRA tensor is on a path."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.02)


@pytest.fixture(scope="module")
def sft_batch():
    world = ShapesWorld("train", num_samples=1, seed=0, image_size=64)
    dataset = region_sft_dataset(world, preset="tiny", processor_cfg=dict(empty_region="dilate_to_one_cell"),
                                 max_length=512)  # item 0: caption task, item 1: segment task
    return sft_collate([dataset[0], dataset[1]])


def test_state_dict_holds_only_trainable_tensors_and_loads_strictly():
    model = Sa2VATrainModel(**TINY)
    state = model.state_dict()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(state) == trainable
    assert any("lora_A" in k for k in state) and any("sam_mask_decoder" in k for k in state)
    assert not any("vision_model" in k or "image_encoder" in k for k in state)
    # loading the trainable-only dict strictly reports no missing frozen keys ...
    other = Sa2VATrainModel(**TINY)
    assert not other.load_state_dict(state, strict=True).missing_keys
    # ... but a missing trainable tensor still fails
    state.pop(next(iter(state)))
    with pytest.raises(RuntimeError, match="Missing key"):
        other.load_state_dict(state, strict=True)


def test_sft_forward_reaches_every_trainable_group(sft_batch):
    model = Sa2VATrainModel(**TINY)
    perturb_lora_b(model)
    losses = model(**sft_batch, mode="loss")
    assert set(losses) == {"llm_loss", "loss_mask", "loss_dice"}
    loss, log_vars = model.parse_losses(losses)
    assert loss.item() == pytest.approx(sum(v.item() for v in losses.values()), rel=1e-6)
    loss.backward()
    for group in GROUPS:
        grads = [p.grad for n, p in model.named_parameters() if group in n and p.grad is not None]
        assert grads and max(g.abs().max().item() for g in grads) > 0, f"no gradient reaches {group}"


def test_grpo_forward_returns_the_algorithm_loss_and_mixes_weighted_sft(sft_batch):
    model = Sa2VATrainModel(**TINY)
    seen = {}

    def policy_loss(policy, minibatch):
        seen["policy"] = policy
        head = policy.text_hidden_fcs[0].weight
        return {"loss": head.sum() * 0 + 2.0, "mask_to_caption/pg_loss": torch.tensor(5.0),
                "mask_to_caption/kl": torch.tensor(0.1)}

    minibatch = SimpleNamespace()
    losses = model(grpo_batch=minibatch, algorithm=SimpleNamespace(policy_loss=policy_loss), **sft_batch,
                   sft_loss_weight=0.5)
    assert seen["policy"] is model.sa2va
    sft_only = model(**sft_batch)  # the LM loss is deterministic (the mask losses sample points at random)
    assert losses["llm_loss"].item() == pytest.approx(0.5 * sft_only["llm_loss"].item(), rel=1e-5)
    loss, log_vars = model.parse_losses(losses)
    # namespaced diagnostics are logged, never summed (MMEngine's default would add mask_to_caption/pg_loss)
    expected = 2.0 + sum(losses[k].item() for k in ("llm_loss", "loss_mask", "loss_dice"))
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert log_vars["mask_to_caption/pg_loss"].item() == 5.0 and log_vars["grpo_loss"].item() == 2.0


def test_missing_pretrained_path_is_reported_as_such(tmp_path):
    # not as a missing tokenizer directory (the tokenizer is read from the checkpoint first)
    with pytest.raises(FileNotFoundError, match=r"pretrained_path '.*Sa2VA-missing' does not exist") as info:
        Sa2VATrainModel(pretrained_path=str(tmp_path / "Sa2VA-missing"))
    assert "tokenizer directory" not in str(info.value)
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        Sa2VATrainModel(pretrained_path=str(tmp_path))


def test_bad_arguments_are_rejected_with_the_fix():
    with pytest.raises(ValueError, match="exactly one of pretrained_path"):
        Sa2VATrainModel(pretrained_path="./pretrained/Sa2VA-4B", preset="tiny")
    with pytest.raises(ValueError, match="torch_dtype"):
        Sa2VATrainModel(**{**TINY, "torch_dtype": "float99"})
    model = Sa2VATrainModel(**TINY)
    with pytest.raises(NotImplementedError, match="only training"):
        model(mode="predict")
    with pytest.raises(ValueError, match="neither an SFT batch"):
        model()
    with pytest.raises(ValueError, match="grpo_batch= and algorithm= go together"):
        model(grpo_batch=object())


@pytest.mark.parametrize("storage, async_update, expect_async", [(None, None, False), ("cpu", None, True),
                                                                  ("cpu", False, False)])
def test_weights_storage_device_reaches_the_weight_sets(storage, async_update, expect_async):
    """Storage and the background EMA update reach the weight sets; host storage updates in the background unless
    the config turns it off."""
    from projects.llava_sam2.rl_train.grpo.trainer import CycleGRPO

    model = Sa2VATrainModel(**TINY, weights_storage_device=storage, weights_async_update=async_update)
    algorithm = model.build_algorithm(dict(type=CycleGRPO, config=dict(num_generations=2, beta=0.04)))
    assert algorithm.weights.async_update is expect_async
    memory = algorithm.weights.memory()
    assert memory.storage_device == storage
    # host storage: the partner and reference hold no bytes beside the parameters
    assert (memory.device_bytes == 0) == (storage == "cpu")


def test_gpu_base_config_trains_fp32_master_weights_under_bf16_autocast(sft_batch, monkeypatch):
    """With the GPU configs' choice (torch_dtype bf16, AmpOptimWrapper bf16) the trained tensors are
    fp32 masters: their gradients are fp32 (CUDA's AMP unscale has no bf16 kernel: the crash at the first optimizer
    step on one GPU and DDP), no loss scaling is applied, and an lr-1e-5 AdamW step moves every trained tensor (in bf16
    the step is below the weights' resolution and rounds away). The model's frozen weights stay bf16 and the forward
    runs in the wrapper's bf16 autocast; without an autocast the mixed model says what to change."""
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    from mmengine.optim.optimizer import amp_optimizer_wrapper

    base = Config.fromfile("projects/llava_sam2/configs/rl/_base_/sa2va_grpo_base.py")
    assert base.model.torch_dtype == "bfloat16" and base.optim_wrapper.dtype == "bfloat16"
    model = Sa2VATrainModel(**{**TINY, "torch_dtype": base.model.torch_dtype})
    perturb_lora_b(model)
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert {p.dtype for p in trained.values()} == {torch.float32}
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}
    with pytest.raises(RuntimeError, match="autocast"):
        model(**sft_batch, mode="loss")

    monkeypatch.setattr(amp_optimizer_wrapper, "is_cuda_available", lambda: True)  # AmpOptimWrapper asserts a GPU
    optim_cfg = base.optim_wrapper.copy()
    optim_cfg.optimizer = dict(optim_cfg.optimizer, lr=1e-5)
    optim_wrapper = build_optim_wrapper(model, optim_cfg)
    assert not optim_wrapper.loss_scaler.is_enabled()  # bf16: no loss scaling
    before = {n: p.detach().clone() for n, p in trained.items()}
    with optim_wrapper.optim_context(model):
        losses = model(**sft_batch, mode="loss")
    loss, _ = model.parse_losses(losses)
    optim_wrapper.backward(loss)
    assert {p.grad.dtype for p in trained.values() if p.grad is not None} == {torch.float32}
    optim_wrapper.step()
    moved = [n for n, p in trained.items() if not torch.equal(p, before[n])]
    assert len(moved) == len(trained), sorted(set(trained) - set(moved))[:5]


def test_export_records_the_written_dtype_and_a_generation_config(tmp_path):
    """A model whose config says bfloat16 (as an upstream base config does) but whose tensors are fp32 is exported
    with torch_dtype float32; generation_config.json stops on the template's <|im_end|> (both were missing)."""
    import json

    from safetensors import safe_open
    from transformers import GenerationConfig

    torch.manual_seed(0)
    model = Sa2VATrainModel(preset="tiny", lora=dict(r=2, lora_alpha=4))
    model.sa2va.config.extra["torch_dtype"] = "bfloat16"
    model.export_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as handle:
        dtypes = {handle.get_slice(key).get_dtype() for key in handle.keys()}
    assert dtypes == {"F32"}
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "float32"
    generation = GenerationConfig.from_pretrained(tmp_path)
    tokenizer = model.processor.tokenizer
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in generation.eos_token_id
    assert tokenizer.eos_token_id in generation.eos_token_id
    assert generation.pad_token_id == model.processor.pad_token_id


def test_grpo_from_random_weights_says_why_its_rewards_are_zero(monkeypatch):
    """README's first train command (tiny preset, random weights) logged all-zero loss and rewards with no word why;
    the reason (no [SEG] from the partner, METEOR 0, equal rewards per group) was measured on tiny_grpo_cycle_cpu.py."""
    from projects.llava_sam2.rl_train.engine import train_model
    from projects.llava_sam2.rl_train.engine.registry import ALGORITHMS

    class RecordingAlgorithm:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    if "RecordingAlgorithm" not in ALGORITHMS:
        ALGORITHMS.register_module(module=RecordingAlgorithm)
    logged = []
    monkeypatch.setattr(train_model, "print_log", lambda message, **kwargs: logged.append(message))
    model = Sa2VATrainModel(**TINY)
    model.build_algorithm(dict(type="RecordingAlgorithm", config=dict(num_generations=2)))
    assert logged == [train_model.RANDOM_WEIGHTS_NOTE] and "no [SEG]" in logged[0]


def test_the_train_model_gives_the_loop_its_precision(monkeypatch):
    """GRPOLoop enters the contexts the train model gives it. AmpOptimWrapper: the rollout runs in the wrapper's bf16
    autocast with peft's adapter-input upcast off; the update keeps the upcast off and leaves autocast to train_step.
    OptimWrapper: nothing changes. Every LoRA layer gets its setting back on exit."""
    from mmengine.optim import AmpOptimWrapper, OptimWrapper
    from mmengine.optim.optimizer import amp_optimizer_wrapper
    from peft.tuners.tuners_utils import BaseTunerLayer

    model = Sa2VATrainModel(**TINY)
    lora_layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    assert lora_layers and all(m.cast_input_dtype_enabled for m in lora_layers)

    def state():
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        casting = {m.cast_input_dtype_enabled for m in lora_layers}
        return dtype, casting

    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    plain = OptimWrapper(optimizer)
    with model.rollout_context(plain):
        assert state() == (None, {True})
    with model.update_context(plain):
        assert state() == (None, {True})
    monkeypatch.setattr(amp_optimizer_wrapper, "is_cuda_available", lambda: True)  # AmpOptimWrapper asserts a GPU
    amp = AmpOptimWrapper(optimizer=optimizer, dtype="bfloat16")
    with model.rollout_context(amp):
        assert state() == (torch.bfloat16, {False})
    with model.update_context(amp):
        assert state() == (None, {False})
    assert state() == (None, {True})
