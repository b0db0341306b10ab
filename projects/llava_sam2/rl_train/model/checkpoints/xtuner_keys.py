"""Key names of upstream Sa2VA's XTuner training model ↔ the HF Sa2VA checkpoint names (docs/upstream.md).

An upstream SFT run trains ``VideoLLaVASAMModel`` (``projects/llava_sam2/models/llava_sam2.py``): ``mllm``
(``InternVL_Slowfast``, whose ``.model`` is the InternVL chat model with ``vision_model``, ``language_model``,
``mlp1``), ``grounding_encoder`` (``SAM2TrainRunner``, holding ``.sam2_model``) and ``text_hidden_fcs``. With
``llm_lora`` set, XTuner wraps the LLM with ``peft.get_peft_model``, so its tensors gain ``base_model.model.``,
every LoRA-wrapped Linear keeps its weight under ``.base_layer.`` and adds ``.lora_A.default.weight`` [r, in] and
``.lora_B.default.weight`` [out, r]. The renames, all of them (upstream ``convert_to_hf.py`` applies the first and
the last, after merging LoRA):

    mllm.model.<part>.                          ↔ <part>.      (vision_model, mlp1)
    mllm.model.language_model.[base_model.model.]<X>[.base_layer].<p>  ↔ language_model.<X>.<p>
    mllm.model.language_model.base_model.model.<X>.lora_{A,B}.default.weight  → LoRA of layer <X>
    grounding_encoder.sam2_model.<...>.gamma    ↔ grounding_encoder.sam2_model.<...>.g_weight
    text_hidden_fcs.<...>                       ↔ text_hidden_fcs.<...>

HF names of the LLM are the checkpoint names (InternLM2 keeps ``wqkv``/``output``; ``language.LanguageKeyMap``
maps them to our modules). Anything else (``text_exist_fcs``, visual-encoder LoRA) does not map and is reported.

Codebase v2 (``projects/sa2va``, ``Sa2VAModel`` + ``InternVLMLLM``) keeps the same module tree and prefixes; its
``llm_lora`` adds ``modules_to_save=["embed_tokens", "lm_head"]``, so peft wraps those two modules: the trained copy
is ``<X>.modules_to_save.default.<p>`` and the frozen base copy ``<X>.original_module.<p>`` (only a DeepSpeed
directory holds the latter). The trained copy is the module's weight (what peft's ``merge_and_unload`` keeps); the
base copy is dropped. The layout is told from the keys: any ``modules_to_save`` / ``original_module`` key is v2.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from ..network.language import LanguageKeyMap
from .hf_checkpoint import SAM2_CHECKPOINT_RENAMES

MLLM = "mllm.model."
UPSTREAM_LLM = MLLM + "language_model."
PEFT_PREFIX = "base_model.model."
SAM = "grounding_encoder.sam2_model."
FCS = "text_hidden_fcs."
ADAPTER = "default"  # peft's adapter name; xtuner saves only this one
SAVED_COPY = f".modules_to_save.{ADAPTER}."  # peft ModulesToSaveWrapper: the trained copy of a wrapped module
BASE_COPY = ".original_module."  # ... and its frozen original
LAYOUT_V1, LAYOUT_V2 = "v1", "v2"

# xtuner's default LoRA targets (``find_all_linear_names``: every nn.Linear leaf name of the LLM except
# ``lm_head`` / ``output_layer``), written out per architecture. InternLM2's head is ``output``, so it is a target.
XTUNER_DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    "Qwen2ForCausalLM": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "Qwen3ForCausalLM": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "LlamaForCausalLM": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "Phi3ForCausalLM": ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
    "InternLM2ForCausalLM": ("wqkv", "wo", "w1", "w2", "w3", "output"),
}
# Upstream LoRA target leaf name -> our module leaf names (InternLM2 is built as Llama; identity elsewhere).
# The LM head is never a LoRA target here: an adapter on it is merged at load.
INTERNLM2_TARGET_MODULES = {"wqkv": ("q_proj", "k_proj", "v_proj"), "wo": ("o_proj",), "w1": ("gate_proj",),
                            "w3": ("up_proj",), "w2": ("down_proj",), "output": ()}

_LORA = re.compile(r"^(?P<layer>.+)\.lora_(?P<ab>[AB])\.(?P<adapter>[^.]+)\.weight$")
_PARTS = {"vision_model.": MLLM + "vision_model.", "mlp1.": MLLM + "mlp1."}


@dataclass
class UpstreamState:
    """An upstream state dict split by meaning.

    weights: HF checkpoint name -> tensor (LoRA-wrapped weights under their plain name).
    lora_A / lora_B: LLM layer (HF name relative to ``language_model.``, e.g. ``model.layers.0.self_attn.q_proj``)
        -> A [r, in] / B [out, r].
    is_llm_wrapped: the LLM keys carried peft's ``base_model.model.`` prefix.
    layout: ``'v2'`` when peft ``modules_to_save`` wrappers appear (codebase v2's LoRA config), else ``'v1'``.
    saved_modules: LLM modules (HF names relative to ``language_model.``) read from a ``modules_to_save`` copy.
    dropped_base_copies: number of ``original_module`` tensors dropped (the frozen copies of those modules).
    """

    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    lora_A: dict[str, torch.Tensor] = field(default_factory=dict)
    lora_B: dict[str, torch.Tensor] = field(default_factory=dict)
    is_llm_wrapped: bool = False
    layout: str = LAYOUT_V1
    saved_modules: set[str] = field(default_factory=set)
    dropped_base_copies: int = 0


def sam2_module_to_hf(key: str) -> str:
    """sam2 module name (``memory_encoder.fuser.layers.0.gamma``) → HF name (``grounding_encoder.sam2_model.``
    prefix, ``g_weight``)."""
    return SAM + _sam_to_hf(key)


def _sam_to_hf(rest: str) -> str:
    for module_suffix, ckpt_suffix in SAM2_CHECKPOINT_RENAMES:
        if rest.endswith(module_suffix):
            rest = rest[: -len(module_suffix)] + ckpt_suffix
    return rest


def _sam_to_upstream(rest: str) -> str:
    for module_suffix, ckpt_suffix in SAM2_CHECKPOINT_RENAMES:
        if rest.endswith(ckpt_suffix):
            rest = rest[: -len(ckpt_suffix)] + module_suffix
    return rest


def parse_upstream_state(state: dict[str, torch.Tensor], where: str = "checkpoint") -> UpstreamState:
    """Split an upstream training state dict (see the module docstring); unmappable keys raise ValueError."""
    out, unmapped, conflicts, base_copies = UpstreamState(), [], [], []
    plain_keys: dict[str, str] = {}  # HF name -> the checkpoint key it came from
    for key, tensor in state.items():
        key = key.removeprefix("module.")  # DeepSpeed/DDP wrappers, if any
        if key.startswith(UPSTREAM_LLM):
            rest = key[len(UPSTREAM_LLM):]
            if rest.startswith(PEFT_PREFIX):
                out.is_llm_wrapped, rest = True, rest[len(PEFT_PREFIX):]
            lora = _LORA.match(rest)
            if lora and lora["adapter"] == ADAPTER:
                (out.lora_A if lora["ab"] == "A" else out.lora_B)[lora["layer"]] = tensor
            elif SAVED_COPY in rest and ".lora_" not in rest:
                module, param = rest.split(SAVED_COPY)
                out.saved_modules.add(module)
                _put_llm_weight(out.weights, f"language_model.{module}.{param}", tensor, key, plain_keys, conflicts)
            elif BASE_COPY in rest and ".lora_" not in rest:
                out.dropped_base_copies += 1
                base_copies.append(rest.split(BASE_COPY)[0])
            elif ".lora_" in rest or ".modules_to_save." in rest or lora:
                unmapped.append(key)  # other adapters, DoRA, LoRA bias/embedding variants
            else:
                _put_llm_weight(out.weights, "language_model." + rest.replace(".base_layer.", "."), tensor, key,
                                plain_keys, conflicts)
        elif key.startswith(MLLM + "vision_model.base_model.") or (key.startswith(MLLM + "vision_model.")
                                                                   and ".lora_" in key):
            unmapped.append(key)  # visual-encoder LoRA: upstream's own state_dict raises NotImplementedError
        elif any(key.startswith(p) for p in _PARTS.values()):
            out.weights[key[len(MLLM):]] = tensor
        elif key.startswith(SAM):
            out.weights[SAM + _sam_to_hf(key[len(SAM):])] = tensor
        elif key.startswith(FCS):
            out.weights[key] = tensor
        else:
            unmapped.append(key)
    orphans = sorted(set(base_copies) - out.saved_modules)
    if orphans:
        unmapped += [f"{UPSTREAM_LLM}{PEFT_PREFIX}{m}{BASE_COPY}* (no {SAVED_COPY.strip('.')} copy)" for m in orphans]
    if out.saved_modules or base_copies:
        out.layout = LAYOUT_V2
    check_parsed_state(
        out, where, conflicts, unmapped,
        conflict_note="once plain (codebase v1 layout) and once as a peft modules_to_save copy (v2 layout); the "
                      "checkpoint mixes the two layouts",
        layout_note=f"do not map onto Sa2VA: they match neither the codebase v1 nor the v2 layout of an upstream "
                    f"Sa2VA checkpoint (expected prefixes {MLLM}{{vision_model,mlp1,language_model}}., {SAM}, {FCS}; "
                    f"LoRA only on the LLM with peft adapter {ADAPTER!r}; v2 also peft modules_to_save copies)",
        hint="Visual-encoder LoRA and the optional text_exist_fcs head have no place in the HF Sa2VA layout; drop "
             "those keys from the checkpoint (docs/upstream.md).")
    return out


def check_parsed_state(state: UpstreamState, where: str, conflicts: list[str], unmapped: list[str], *,
                       conflict_note: str, layout_note: str, hint: str) -> None:
    """The checks every upstream layout's parser ends with: no tensor given twice, LoRA in A/B pairs, no key left
    unmapped; each error names ``where`` and the keys (the first 10 / 30)."""
    if conflicts:
        raise ValueError(f"{where}: tensors given twice, {conflict_note}: {conflicts[:10]}")
    missing_pairs = sorted(set(state.lora_A) ^ set(state.lora_B))
    if missing_pairs:
        raise ValueError(f"{where}: LoRA layers with only one of lora_A / lora_B: {missing_pairs[:10]}; the "
                         "checkpoint is incomplete.")
    if unmapped:
        more = f"\n    ... and {len(unmapped) - 30} more" if len(unmapped) > 30 else ""
        shown = "\n    ".join(unmapped[:30]) + more
        raise ValueError(f"{where}: {len(unmapped)} keys {layout_note}:\n    {shown}\n{hint}")


def _put_llm_weight(weights: dict, hf_key: str, tensor: torch.Tensor, key: str, plain_keys: dict,
                    conflicts: list) -> None:
    """One LLM tensor under its HF name; a second source for the same name (a plain weight beside a
    modules_to_save copy) is a conflict, not an override."""
    if hf_key in plain_keys:
        conflicts.append(f"{plain_keys[hf_key]} and {key}")
        return
    plain_keys[hf_key] = key
    weights[hf_key] = tensor


# ---------------------------------------------------------------------------------------------- HF -> upstream
def upstream_key(hf_key: str, *, is_llm_wrapped: bool, lora_targets: frozenset[str] | set[str] = frozenset()) -> str:
    """Upstream training name of an HF checkpoint tensor; weights of LoRA-target Linears go under ``.base_layer.``
    (the place ``load_state_dict`` of upstream's LoRA-wrapped model expects them)."""
    if hf_key.startswith("language_model."):
        rest = hf_key[len("language_model."):]
        module, _, param = rest.rpartition(".")
        if is_llm_wrapped and module.rsplit(".", 1)[-1] in lora_targets:
            rest = f"{module}.base_layer.{param}"
        return UPSTREAM_LLM + (PEFT_PREFIX if is_llm_wrapped else "") + rest
    for hf_prefix, up_prefix in _PARTS.items():
        if hf_key.startswith(hf_prefix):
            return up_prefix + hf_key[len(hf_prefix):]
    if hf_key.startswith(SAM):
        return SAM + _sam_to_upstream(hf_key[len(SAM):])
    if hf_key.startswith(FCS):
        return hf_key
    raise ValueError(f"{hf_key!r} is not a Sa2VA HF checkpoint key")


def upstream_lora_keys(layer: str) -> tuple[str, str]:
    """(lora_A key, lora_B key) of LLM layer ``layer`` (HF name relative to ``language_model.``)."""
    base = f"{UPSTREAM_LLM}{PEFT_PREFIX}{layer}"
    return f"{base}.lora_A.{ADAPTER}.weight", f"{base}.lora_B.{ADAPTER}.weight"


def is_upstream_checkpoint_key(key: str) -> bool:
    """The name filter of upstream ``VideoLLaVASAMModel.state_dict`` (llava_sam2.py, "Step 2" to "Step 5"): what an
    XTuner SFT ``.pth`` keeps — LoRA tensors, mlp1, the SAM2 mask decoder, text_hidden_fcs, LM head, embeddings."""
    if key.startswith(UPSTREAM_LLM) and "lora_" in key:
        return True
    return ("mlp1." in key or "mask_decoder" in key or "text_hidden_fcs." in key or "lm_head.weight" in key
            or ("output" in key and "sam2_model" not in key) or "embed_tokens.weight" in key
            or "tok_embeddings" in key)


def is_v2_checkpoint_key(key: str) -> bool:
    """The name filter of codebase v2's ``Sa2VAModel.state_dict`` (``projects/sa2va/models/sa2va.py``) over the
    ``InternVLMLLM`` one (xtuner ``InternVL_V1_5.state_dict`` with a frozen ViT and LoRA on the LLM): what a v2
    ``iter_*.pth`` keeps — LoRA tensors of the adapter, the ``modules_to_save`` copies, ``mlp1``, the SAM2 mask
    decoder and ``text_hidden_fcs``."""
    if key.startswith(UPSTREAM_LLM):
        return ("lora_" in key and ADAPTER in key) or SAVED_COPY in key
    return key.startswith(MLLM + "mlp1.") or key.startswith(SAM + "sam_mask_decoder") or key.startswith(FCS)


# ---------------------------------------------------------------------------------------------- LoRA layers
def default_lora_targets(llm_architecture: str) -> tuple[str, ...]:
    if llm_architecture not in XTUNER_DEFAULT_TARGETS:
        raise ValueError(f"no xtuner default LoRA targets known for {llm_architecture!r}; set target_modules in the "
                         f"SFT config's llm_lora (known: {sorted(XTUNER_DEFAULT_TARGETS)})")
    return XTUNER_DEFAULT_TARGETS[llm_architecture]


def module_lora_targets(llm_architecture: str, upstream_targets: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Our module leaf names for upstream LoRA targets (InternLM2 renamed, its LM-head target dropped)."""
    if llm_architecture != "InternLM2ForCausalLM":
        return tuple(t for t in upstream_targets if t != "lm_head")
    return tuple(m for t in upstream_targets for m in INTERNLM2_TARGET_MODULES.get(t, (t,)))


def lora_to_module(state: UpstreamState, lm_map: LanguageKeyMap) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{our LLM module layer: (A, B)}. InternLM2's fused ``wqkv`` adapter becomes q/k/v adapters sharing A with B
    split by rows like the weight (exact: ΔW_q = B_q A are the q rows of B A)."""
    out = {}
    for layer, lora_a in state.lora_A.items():
        parts = lm_map.to_module({f"{layer}.weight": state.lora_B[layer]})
        for name, lora_b in parts.items():
            out[name[: -len(".weight")]] = (lora_a, lora_b)
    return out
