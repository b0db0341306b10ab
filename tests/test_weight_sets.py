"""grpo/weights.py: fp32 EMA partner, exception-safe bit-exact swaps, LoRA-disabled reference, checkpoints, memory,
the background host update."""
import io
import threading

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

from projects.llava_sam2.rl_train.grpo import weights as weights_module
from projects.llava_sam2.rl_train.grpo.weights import WeightSets, is_lora_tensor, mmengine_momentum


class TinyVLM(nn.Module):
    """A peft-wrapped 2-layer Qwen2 (hidden 32) fed by a trainable ``mlp1`` projector, like Sa2VA's LLM side."""

    def __init__(self):
        super().__init__()
        self.mlp1 = nn.Linear(8, 32)
        lm = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2))
        self.language_model = get_peft_model(lm, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                            target_modules=["q_proj", "v_proj"]))

    def forward(self, feats):  # [B, S, 8] -> logits [B, S, 64]
        return self.language_model(inputs_embeds=self.mlp1(feats)).logits


class Toy(nn.Module):
    """Trainable ``head`` (optionally bf16) next to a frozen ``body``."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.body = nn.Linear(4, 4).requires_grad_(False)
        self.head = nn.Linear(4, 3).to(dtype)


@torch.no_grad()
def perturb(params, scale=0.1):
    for p in params:
        p.add_(torch.randn_like(p) * scale)


def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_bit_exact(model, saved):
    for name, p in model.named_parameters():
        assert torch.equal(p, saved[name]), f"{name} was not restored bit-exactly"


def test_ema_update_matches_the_manual_formula():
    model = Toy()
    sets = WeightSets.from_model(model, ema_decay=0.999)
    manual = {n: p.detach().double().clone() for n, p in model.named_parameters() if p.requires_grad}
    for _ in range(5):
        perturb(model.head.parameters(), scale=1.0)
        sets.update_partner(model)
        for n, p in model.named_parameters():
            if p.requires_grad:
                manual[n] = 0.999 * manual[n] + 0.001 * p.detach().double()
    state = sets.state_dict()
    assert set(state["partner"]) == {"head.weight", "head.bias"}  # trainable tensors only
    for n, value in state["partner"].items():
        assert value.dtype == torch.float32
        assert (value.double() - manual[n]).abs().max() < 1e-6, n
    assert sets.num_updates == 5 and mmengine_momentum(0.999) == pytest.approx(0.001)


def test_fp32_shadow_keeps_moving_for_bf16_params():
    # docs/stack.md §7: a bf16 EMA with momentum 1e-3 never leaves 1.0; the fp32 shadow reaches
    # 1 + (1 - 0.999^200) = 1.18143 after 200 steps towards 2.0.
    model = Toy(torch.bfloat16)
    with torch.no_grad():
        model.head.weight.fill_(1.0)
    sets = WeightSets.from_model(model)
    with torch.no_grad():
        model.head.weight.fill_(2.0)
    for _ in range(200):
        sets.update_partner(model)
    shadow = sets.state_dict()["partner"]["head.weight"]
    torch.testing.assert_close(shadow, torch.full_like(shadow, 2.0 - 0.999**200), rtol=0, atol=1e-5)


def test_partner_swap_holds_the_shadow_and_restores_bit_exactly():
    model = Toy(torch.bfloat16)
    sets = WeightSets.from_model(model)
    perturb(model.head.parameters())
    sets.update_partner(model)
    policy = snapshot(model)
    shadow = sets.state_dict()["partner"]
    with sets.partner(model):
        assert torch.equal(model.head.weight, shadow["head.weight"].to(torch.bfloat16))
        assert not torch.equal(model.head.weight, policy["head.weight"])
        assert torch.equal(model.body.weight, policy["body.weight"])  # frozen backbone untouched
    assert_bit_exact(model, policy)


@pytest.mark.parametrize("swap", ["partner", "reference"])
def test_swaps_restore_bit_exactly_when_the_body_raises(swap):
    model = Toy()
    sets = WeightSets.from_model(model)
    perturb(model.head.parameters())
    policy = snapshot(model)
    with pytest.raises(KeyError, match="judge exploded"):
        with getattr(sets, swap)(model):
            assert not torch.equal(model.head.weight, policy["head.weight"])
            raise KeyError("judge exploded")
    assert_bit_exact(model, policy)
    with sets.partner(model):  # the sets are usable again after the failure
        pass
    assert_bit_exact(model, policy)


def test_misuse_raises_and_leaves_the_policy_in_place():
    model = Toy()
    sets = WeightSets.from_model(model)
    perturb(model.head.parameters())
    policy = snapshot(model)
    with pytest.raises(RuntimeError, match="inside the partner swap"):
        with sets.partner(model):
            with sets.reference(model):
                pass
    with pytest.raises(RuntimeError, match="update after the `with` block"):
        with sets.partner(model):
            sets.update_partner(model)
    assert_bit_exact(model, policy)
    model.body.weight.requires_grad_(True)
    with pytest.raises(ValueError, match="unexpected \\['body.weight'\\]"):
        with sets.partner(model):
            pass
    with pytest.raises(RuntimeError, match="use_reference=False"):
        with WeightSets.from_model(Toy(), use_reference=False).reference(Toy()):
            pass


def test_reference_is_the_lora_disabled_base_plus_the_mlp1_snapshot():
    torch.manual_seed(0)
    model = TinyVLM().eval()
    feats = torch.randn(2, 5, 8)
    with torch.no_grad():
        start = model(feats)  # fresh LoRA (B = 0): the SFT / base outputs
    sets = WeightSets.from_model(model)
    assert sets.reference_names == ["mlp1.bias", "mlp1.weight"]  # LoRA needs no reference copy
    assert sets.adapter_names and all(is_lora_tensor(n) for n in sets.adapter_names)

    trainable = [p for p in model.parameters() if p.requires_grad]
    perturb(trainable, scale=0.5)  # stands in for training: LoRA B != 0, mlp1 moved
    policy = snapshot(model)
    with torch.no_grad():
        trained = model(feats)
        assert (trained - start).abs().max() > 1e-2
        with sets.reference(model):
            torch.testing.assert_close(model(feats), start, rtol=0, atol=1e-6)
        assert torch.equal(model(feats), trained)  # adapter re-enabled, mlp1 restored
    assert_bit_exact(model, policy)


def test_reference_with_lora_names_but_no_peft_model_says_how_to_fix():
    model = nn.Module()
    model.lora_A = nn.Linear(2, 2)  # looks like LoRA, but nothing can disable it
    with pytest.raises(TypeError, match="no peft.PeftModel"):
        with WeightSets.from_model(model).reference(model):
            pass
    with WeightSets.from_model(model, is_adapter=lambda name: False).reference(model):
        pass  # snapshotting it instead works


def test_state_dict_round_trip_and_mismatch():
    model = Toy()
    sets = WeightSets.from_model(model)
    perturb(model.head.parameters())
    sets.update_partner(model)
    state = sets.state_dict()
    perturb(model.head.parameters())  # the resumed run's live weights are the trained policy
    resumed = WeightSets.from_model(model)
    resumed.load_state_dict(state)
    assert resumed.num_updates == 1
    for key in ("partner", "reference"):
        for name, value in resumed.state_dict()[key].items():
            assert torch.equal(value, state[key][name]), (key, name)
    with pytest.raises(ValueError, match="partner names differ"):
        WeightSets.from_model(TinyVLM()).load_state_dict(state)
    with pytest.raises(ValueError, match="use_reference"):
        WeightSets.from_model(Toy(), use_reference=False).load_state_dict(state)


def test_memory_accounting():
    model = TinyVLM()
    sets = WeightSets.from_model(model)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    numel = sum(p.numel() for p in trainable.values())
    memory = sets.memory()
    assert memory.partner_bytes == 4 * numel  # fp32 shadow of every trainable tensor
    assert memory.reference_bytes == 4 * (8 * 32 + 32)  # mlp1 only: LoRA's reference is "adapter off"
    assert memory.swap_buffer_bytes == 4 * numel
    model_bytes = sum(4 * p.numel() for p in model.parameters())
    assert memory.fraction_of(model) == pytest.approx(memory.total_bytes / model_bytes)
    assert memory.fraction_of(model) < 0.5  # a small fraction of the model, not a second copy
    assert WeightSets.from_model(model, use_reference=False).memory().reference_bytes == 0


@pytest.mark.parametrize("storage_device", [None, "cpu"])
def test_both_storages_update_swap_and_restore_identically(storage_device):
    """Host storage (pinned on CUDA machines) is the same math: the same shadow after updates, the same partner
    values while swapped (the host keeps them in the parameter dtype), and a bit-exact restore, also on a raise."""
    torch.manual_seed(0)
    model, twin = TinyVLM(), TinyVLM()
    twin.load_state_dict(model.state_dict())
    model.to(torch.bfloat16), twin.to(torch.bfloat16)
    sets = WeightSets.from_model(model, ema_decay=0.9, storage_device=storage_device)
    plain = WeightSets.from_model(twin, ema_decay=0.9)
    for _ in range(3):
        for m, s in ((model, sets), (twin, plain)):
            torch.manual_seed(1)
            perturb([p for p in m.parameters() if p.requires_grad], scale=0.5)
            s.update_partner(m)
    for name, value in sets.state_dict()["partner"].items():
        assert torch.equal(value, plain.state_dict()["partner"][name]), name
    policy = snapshot(model)
    with sets.partner(model), plain.partner(twin):
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            assert torch.equal(p, q), f"{name} differs between storages inside the partner swap"
        assert not torch.equal(model.mlp1.weight, policy["mlp1.weight"])
    assert_bit_exact(model, policy)
    with pytest.raises(KeyError):
        with sets.reference(model):
            assert not torch.equal(model.mlp1.weight, policy["mlp1.weight"])
            raise KeyError("reward failed")
    assert_bit_exact(model, policy)
    resumed = WeightSets.from_model(model, ema_decay=0.9, storage_device=storage_device)
    resumed.load_state_dict(sets.state_dict())
    with resumed.partner(model), plain.partner(twin):  # the host cast buffers follow a loaded shadow
        assert torch.equal(model.mlp1.weight, twin.mlp1.weight)
    assert_bit_exact(model, policy)


def test_host_storage_takes_no_model_device_memory_and_rejects_unknown_storage():
    model = TinyVLM()
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    on_device = WeightSets.from_model(model).memory()
    on_host = WeightSets.from_model(model, storage_device="cpu").memory()
    assert on_device.device_bytes == on_device.total_bytes > 0
    assert on_host.device_bytes == 0 and on_host.device_fraction_of(model) == 0.0
    assert on_host.partner_cast_bytes == 4 * numel  # fp32 model: the cast copy has the parameter dtype
    assert on_host.total_bytes == on_device.total_bytes + on_host.partner_cast_bytes
    with pytest.raises(ValueError, match="storage_device='cuda:1'"):
        WeightSets.from_model(model, storage_device="cuda:1")


# ---- background (asynchronous) partner update on host storage --------------------------------------------------


class GatedLerp:
    """Stands in for the host lerp: blocks on ``gate`` (bounded, so a wrong implementation fails instead of hanging),
    records whether a call is running / has finished, then runs the real lerp or raises ``error``."""

    def __init__(self, real, error: Exception | None = None):
        self.real, self.error = real, error
        self.gate, self.started, self.finished = threading.Event(), threading.Event(), threading.Event()
        self.calls = 0

    def __call__(self, tensors, ends, weight):
        self.started.set()
        self.gate.wait(timeout=2.0)
        self.calls += 1
        if self.error is not None:
            raise self.error
        self.real(tensors, ends, weight)
        self.finished.set()


@pytest.fixture
def gated(monkeypatch):
    lerp = GatedLerp(weights_module.foreach_lerp_)
    monkeypatch.setattr(weights_module, "foreach_lerp_", lerp)
    return lerp


def bf16_vlm_pair():
    torch.manual_seed(0)
    model, twin = TinyVLM(), TinyVLM()
    twin.load_state_dict(model.state_dict())
    return model.to(torch.bfloat16), twin.to(torch.bfloat16)


def test_host_update_returns_before_its_lerp_and_the_partner_swap_waits_for_it(gated):
    """The default for host storage: update_partner leaves the lerp to a background thread (the synchronous update
    returned only after it); the next partner swap waits for it and swaps in the updated values."""
    model, twin = bf16_vlm_pair()
    sets = WeightSets.from_model(model, ema_decay=0.9, storage_device="cpu")
    plain = WeightSets.from_model(twin, ema_decay=0.9)  # on-device storage: the same values, updated in the call
    gated.gate.set()
    for m in (model, twin):
        torch.manual_seed(1)
        perturb([p for p in m.parameters() if p.requires_grad], scale=0.5)
    plain.update_partner(twin)
    gated.finished.clear()
    gated.gate.clear()
    sets.update_partner(model)
    assert not gated.finished.is_set(), "update_partner waited for the host lerp"
    assert sets.update_pending and sets.num_updates == 1
    threading.Timer(0.05, gated.gate.set).start()
    with sets.partner(model), plain.partner(twin):
        assert gated.finished.is_set() and not sets.update_pending
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            assert torch.equal(p, q), name


def test_background_updates_equal_the_synchronous_ones_bit_for_bit(gated):
    """K updates, each followed by an "optimizer step" (the policy moves) while the lerp is still held back: the
    shadow, its dtype copy (seen through the swap) and a checkpoint-then-resume equal the synchronous path exactly."""
    model, twin = bf16_vlm_pair()
    sets = WeightSets.from_model(model, ema_decay=0.9, storage_device="cpu")
    plain = WeightSets.from_model(twin, ema_decay=0.9, storage_device="cpu", async_update=False)
    assert sets.async_update and not plain.async_update
    gated.gate.set()
    for step in range(4):
        sets.wait_for_update()  # the previous lerp has passed its gate before the gate closes again
        plain.update_partner(twin)
        gated.gate.clear()
        sets.update_partner(model)
        for m in (model, twin):  # the next step changes the policy before the host lerp has run
            torch.manual_seed(step)
            perturb([p for p in m.parameters() if p.requires_grad], scale=0.5)
        gated.gate.set()
    buffer = io.BytesIO()
    torch.save(sets.state_dict(), buffer)  # a checkpoint right after an update holds the updated values
    expected = plain.state_dict()
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    assert saved["num_updates"] == expected["num_updates"] == 4
    for name, value in expected["partner"].items():
        assert torch.equal(saved["partner"][name], value), name
    with sets.partner(model), plain.partner(twin):
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            assert torch.equal(p, q), name
    resumed = WeightSets.from_model(model, ema_decay=0.9, storage_device="cpu")
    resumed.load_state_dict(saved)
    for s, m in ((resumed, model), (plain, twin)):
        s.update_partner(m)
    for name, value in plain.state_dict()["partner"].items():
        assert torch.equal(resumed.state_dict()["partner"][name], value), name


@pytest.mark.parametrize("consumer", ["partner", "reference", "state_dict", "update_partner", "load_state_dict"])
def test_every_consumer_waits_for_the_pending_update(gated, consumer):
    model = Toy(torch.bfloat16)
    sets = WeightSets.from_model(model, storage_device="cpu", is_adapter=lambda name: False)
    state = WeightSets.from_model(model, storage_device="cpu", async_update=False).state_dict()
    perturb(model.head.parameters())
    sets.update_partner(model)
    assert gated.started.wait(2.0) and not gated.finished.is_set()
    threading.Timer(0.05, gated.gate.set).start()
    if consumer in ("partner", "reference"):
        with getattr(sets, consumer)(model):
            assert gated.finished.is_set()
    elif consumer == "state_dict":
        sets.state_dict()
    elif consumer == "update_partner":
        sets.update_partner(model)
        assert gated.calls >= 1
    else:  # a pending update must not land on the loaded values
        sets.load_state_dict(state)
        assert torch.equal(sets.state_dict()["partner"]["head.weight"], state["partner"]["head.weight"])
    assert gated.finished.is_set()


def test_a_failed_background_update_surfaces_at_the_next_use_and_until_a_resume(monkeypatch):
    lerp = GatedLerp(weights_module.foreach_lerp_, error=MemoryError("host out of memory (injected)"))
    lerp.gate.set()
    monkeypatch.setattr(weights_module, "foreach_lerp_", lerp)
    model = Toy(torch.bfloat16)
    sets = WeightSets.from_model(model, storage_device="cpu")
    good = sets.state_dict()
    good = {**good, "partner": {n: v.clone() for n, v in good["partner"].items()}}
    perturb(model.head.parameters())
    policy = snapshot(model)
    sets.update_partner(model)  # the failure happens in the worker: nothing raises here
    with pytest.raises(RuntimeError, match="background EMA partner update failed") as raised:
        with sets.partner(model):
            pass
    assert isinstance(raised.value.__cause__, MemoryError)
    assert_bit_exact(model, policy)  # refused before any value was swapped in
    for use in (sets.state_dict, lambda: sets.update_partner(model), lambda: sets.reference(model).__enter__()):
        with pytest.raises(RuntimeError, match="partly updated"):  # not lost after the first report
            use()
    monkeypatch.setattr(weights_module, "foreach_lerp_", lerp.real)
    sets.load_state_dict(good)  # resuming replaces the shadow and clears the failure
    sets.update_partner(model)
    assert sets.state_dict()["num_updates"] == 1


def test_async_update_needs_host_storage():
    assert not WeightSets.from_model(Toy()).async_update
    assert not WeightSets.from_model(Toy(), storage_device="cpu", async_update=False).async_update
    with pytest.raises(ValueError, match="async_update=True needs storage_device='cpu'"):
        WeightSets.from_model(Toy(), async_update=True)
