"""Load an upstream XTuner SFT checkpoint into ``Sa2VAModel``, and write our model back as one (docs/upstream.md).

Load (``load_upstream_sft``): every tensor of the HF Sa2VA layout comes from exactly one source, in this order:

1. the SFT checkpoint (``pretrained_pth``; key map in ``xtuner_keys``, codebase v1 or v2 layout told from its keys):
   a ``.pth`` holds the trained subset (LoRA, mlp1, SAM2 mask decoder, text_hidden_fcs, LM head, embeddings), a
   DeepSpeed directory usually everything;
1b. codebase v2 only: the weights the SFT run started from (``init_checkpoint``, the SFT config's own
   ``model.pretrained_pth``), minus adapter tensors (upstream loads it before the LoRA wrap);
2. the SAM2 checkpoint, for the other ``grounding_encoder.sam2_model.*`` tensors (all of them must be there, as
   upstream loads it strictly);
3. the base InternVL directory, for the other ``vision_model.*`` / ``language_model.*`` / ``mlp1.*`` tensors.

Vocabulary: V = len(base tokenizer + special tokens) when a token was new (upstream then resizes the LLM to V),
else the base embedding rows. Base embedding / head rows are copied and rows past the base vocabulary start at
the mean base row (differs from HF's ``resize_token_embeddings``, which samples them; the SFT checkpoint carries
the trained rows anyway). LoRA: ``lora_mode='merge'`` adds scaling · B A into the weights; ``'keep'`` wraps the
LLM with the SFT's LoRA config and loads A and B (RL continues the SFT adapter). An adapter on the LM head
(InternLM2's xtuner default) is always merged.

Write (``xtuner_state_dict``): the model in upstream training names, ``compact`` (what an XTuner SFT ``.pth``
holds: upstream's ``state_dict`` filter; needs the LLM's frozen weights to equal the base's and the adapter to
match the SFT's) or ``full`` (every tensor, LLM merged, LoRA-target weights under ``.base_layer.``, no LoRA
tensors: upstream's fresh adapter has B = 0, so its merge changes nothing).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers.modeling_utils import no_init_weights

from ..network.language import LanguageKeyMap
from ..network.sa2va import Sa2VAModel
from .dtypes import as_torch_dtype, default_dtype
from .hf_checkpoint import (_get_tensor, _open_safetensors, _weight_files, check_layout, checkpoint_layout,
                            checkpoint_state_dict, module_state_from_checkpoint, read_layout)
from .upstream_base import (UpstreamSFTSource, load_sft_tokenizer, read_base_config, read_sam2_checkpoint,
                            read_xtuner_checkpoint, sa2va_config_from_base)
from .xtuner_keys import (SAM, UpstreamState, default_lora_targets, is_upstream_checkpoint_key, lora_to_module,
                          module_lora_targets, parse_upstream_state, sam2_module_to_hf, upstream_key,
                          upstream_lora_keys)

LORA_MODES = ("keep", "merge")
LAYOUTS = ("compact", "full")
_LM = "language_model."
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)  # recomputed buffers some remote LLM classes save


@dataclass
class LoadReport:
    """What ``load_upstream_sft`` took from where (``summary()`` is one log line)."""

    lora_mode: str
    counts: dict[str, int] = field(default_factory=dict)  # tensors per source
    lora_layers: int = 0
    vocab: tuple[int, int] | None = None  # (base rows, V) when resized
    initialized_rows: list[str] = field(default_factory=list)  # tensors whose new rows got the mean row
    head_adapter_merged: bool = False
    lm_head_tied: bool = False
    layout: str = "v1"  # key layout of the SFT checkpoint (xtuner_keys.UpstreamState.layout)
    ignored_init_adapter: int = 0  # LoRA / modules_to_save tensors of a v2 init checkpoint (upstream ignores them)

    def summary(self) -> str:
        parts = [f"{src}: {n} tensors" for src, n in self.counts.items()]
        parts.append(f"LoRA {self.lora_mode} ({self.lora_layers} layers)")
        parts.append(f"checkpoint layout {self.layout}")
        if self.ignored_init_adapter:
            parts.append(f"{self.ignored_init_adapter} adapter tensors of the init checkpoint ignored (as upstream)")
        if self.vocab:
            parts.append(f"vocabulary {self.vocab[0]} -> {self.vocab[1]}")
        if self.initialized_rows:
            parts.append(f"new rows mean-initialised in {self.initialized_rows} (not in the checkpoint)")
        return "; ".join(parts)


# ---------------------------------------------------------------------------------------------- loading
def load_upstream_sft(source: UpstreamSFTSource, lora_mode: str = "keep",
                      torch_dtype: str | torch.dtype | None = None, attn_implementation: str = "sdpa"):
    """Build ``Sa2VAModel`` from an upstream SFT run; returns (model, tokenizer, LoadReport). The model is in
    train mode, LLM peft-wrapped in ``'keep'`` mode when the checkpoint has LoRA tensors."""
    if lora_mode not in LORA_MODES:
        raise ValueError(f"lora_mode={lora_mode!r}; use 'keep' (continue the SFT adapter) or 'merge' (fold it in)")
    tokenizer, added = load_sft_tokenizer(source)
    base = read_base_config(source.base_path)
    base_files = _weight_files(Path(source.base_path))
    base_layout, _, _ = read_layout(base_files)
    lm_map = LanguageKeyMap(_sub(base["llm_config"]))
    embed_key = _LM + ("model.tok_embeddings.weight" if lm_map.is_internlm2 else "model.embed_tokens.weight")
    if embed_key not in base_layout:
        raise ValueError(f"{source.base_path}: no {embed_key} in the weights; not an InternVL chat model directory")
    base_rows = base_layout[embed_key][0]
    vocab = len(tokenizer) if added else base_rows
    config = sa2va_config_from_base(base, vocab, source.template,
                                    source.grounding_config or base.get("grounding_config"))
    with default_dtype(as_torch_dtype(torch_dtype) or torch.float32), no_init_weights():
        model = Sa2VAModel(config, attn_implementation=attn_implementation)
    where = os.fspath(source.pretrained_pth) if source.pretrained_pth else "pretrained_pth"
    sft = parse_upstream_state(_drop_ignored(read_xtuner_checkpoint(source.pretrained_pth)), where) \
        if source.pretrained_pth else UpstreamState()
    report = LoadReport(lora_mode=lora_mode if sft.lora_A else "none", layout=sft.layout)
    if vocab != base_rows:
        report.vocab = (base_rows, vocab)
    expected = checkpoint_layout(model)
    _check_sft_weights(sft.weights, expected, where, base_rows, vocab)
    loaded = _load_weights(model, sft.weights, "checkpoint", report)
    loaded |= _load_init(model, source, expected, loaded, base_rows, vocab, report)
    loaded |= _load_sam2(model, source, expected, loaded, report)
    todo = [k for k in expected if k not in loaded and not k.startswith(SAM)]
    loaded |= _load_base(model, base_files, base_layout, todo, vocab, report)
    lm_head_key = _LM + lm_map.lm_head_key()
    missing = [k for k in expected if k not in loaded and k != lm_head_key]
    if missing:
        raise ValueError(f"{where}: {len(missing)} tensors are in neither the SFT checkpoint, the SAM2 checkpoint "
                         f"nor {source.base_path}: {missing[:20]} (text_hidden_fcs comes only from the SFT checkpoint: "
                         "is pretrained_pth a Sa2VA SFT checkpoint?)")
    if lm_head_key not in loaded:
        model.language_model.config.tie_word_embeddings = True
        model.language_model.tie_weights()
        model.lm_head_tied = report.lm_head_tied = True
    _apply_lora(model, sft, source, lora_mode, lm_map, report)
    return model.train(), tokenizer, report


def _sub(llm_config: dict):
    from ..network.configuration import SubConfig

    return SubConfig(llm_config, {}, "llm_config")


def _drop_ignored(state: dict) -> dict:
    return {k: v for k, v in state.items() if not k.endswith(_IGNORED_SUFFIXES)}


def _check_sft_weights(weights: dict, expected: dict, where: str, base_rows: int, vocab: int) -> None:
    unexpected = [k for k in weights if k not in expected]
    mismatched = [f"{k}: checkpoint {tuple(v.shape)} vs model {expected[k]}" for k, v in weights.items()
                  if k in expected and tuple(v.shape) != tuple(expected[k])]
    if mismatched and any("embed_tokens" in m or "tok_embeddings" in m or "lm_head" in m or "output." in m
                          for m in mismatched):
        mismatched.append(f"(the tokenizer gives V={vocab} from {base_rows} base rows plus the SFT config's "
                          "special_tokens; the run must have used other special_tokens or another base tokenizer)")
    if unexpected or mismatched:
        raise ValueError(f"{where}: tensors that do not fit the model built from the base config:\n  unexpected "
                         f"{unexpected[:20]}\n  shape mismatch {mismatched[:20]}")


def _load_weights(model: Sa2VAModel, weights: dict, source: str, report: LoadReport) -> set[str]:
    """Load HF-named ``weights`` into ``model`` (non-strict); returns the HF names loaded."""
    if not weights:
        return set()
    result = model.load_state_dict(module_state_from_checkpoint(model, weights), strict=False)
    if result.unexpected_keys:
        raise ValueError(f"{source}: keys not in the model: {result.unexpected_keys[:20]}")
    report.counts[source] = report.counts.get(source, 0) + len(weights)
    return set(weights)


def _load_init(model, source: UpstreamSFTSource, expected: dict, loaded: set[str], base_rows: int,
               vocab: int, report: LoadReport, parse=None) -> set[str]:
    """Codebase v2's SFT start weights (``UpstreamSFTSource.init_checkpoint``), for tensors the SFT checkpoint lacks.
    Upstream loads them into the model before wrapping the LLM with LoRA, non-strictly, so adapter tensors in
    that file (an earlier run's ``iter_*.pth``) never reached the run: they are skipped and counted here.
    ``parse`` reads the family's key layout (default: the InternVL family's ``parse_upstream_state``)."""
    if source.init_checkpoint is None:
        return set()
    where = os.fspath(source.init_checkpoint)
    state = _drop_ignored(read_xtuner_checkpoint(source.init_checkpoint))
    adapter = {k for k in state if ".lora_" in k or ".modules_to_save." in k or ".original_module." in k}
    report.ignored_init_adapter = len(adapter)
    init = (parse or parse_upstream_state)({k: v for k, v in state.items() if k not in adapter}, where)
    _check_sft_weights(init.weights, expected, where, base_rows, vocab)
    todo = {k: v for k, v in init.weights.items() if k not in loaded}
    return _load_weights(model, todo, "init", report)


def _load_sam2(model: Sa2VAModel, source: UpstreamSFTSource, expected: dict, loaded: set[str],
               report: LoadReport) -> set[str]:
    """The SAM2 tensors not in the SFT checkpoint, from the SAM2 checkpoint (which must hold the whole SAM2)."""
    todo = [k for k in expected if k.startswith(SAM) and k not in loaded]
    if not todo:
        return set()
    if source.sam2_checkpoint is None:
        raise ValueError(f"{todo[0]} is not in the SFT checkpoint and no SAM2 checkpoint was given; set the SFT "
                         "config's grounding_encoder ckpt_path (upstream default pretrained/sam2_hiera_large.pt)")
    sam = {sam2_module_to_hf(k): v for k, v in read_sam2_checkpoint(source.sam2_checkpoint).items()}
    wanted = {k: v for k, v in expected.items() if k.startswith(SAM)}
    check_layout(wanted, {k: tuple(v.shape) for k, v in sam.items()}, Path(source.sam2_checkpoint))
    return _load_weights(model, {k: sam[k] for k in todo}, "sam2", report)


def _load_base(model: Sa2VAModel, files: list[Path], layout: dict, keys: list[str], vocab: int,
               report: LoadReport) -> set[str]:
    """Base InternVL tensors for ``keys`` (skipping keys the base lacks, e.g. a tied LM head)."""
    loaded: set[str] = set()
    for file in files:
        with _open_safetensors(file) as handle:
            names = [k for k in keys if k in handle.keys()]
            chunk = {k: _fit_rows(k, _get_tensor(handle, k, file), vocab, report) for k in names}
        loaded |= _load_weights(model, chunk, "base", report)
    return loaded


def _fit_rows(key: str, tensor: torch.Tensor, vocab: int, report: LoadReport) -> torch.Tensor:
    """Embedding / LM-head rows resized to ``vocab``: copy the base rows, new rows = mean base row."""
    is_vocab = key.endswith(("embed_tokens.weight", "tok_embeddings.weight", "lm_head.weight", "output.weight"))
    if not is_vocab or tensor.shape[0] == vocab:
        return tensor
    rows = tensor.shape[0]
    out = tensor.new_empty((vocab, *tensor.shape[1:]))
    out[: min(rows, vocab)] = tensor[:vocab]
    if vocab > rows:
        out[rows:] = tensor.float().mean(dim=0).to(tensor.dtype)
        report.initialized_rows.append(key)
    return out


def check_lora_matches_config(sft: UpstreamState, source: UpstreamSFTSource) -> None:
    """A checkpoint's LoRA tensors need the SFT config's ``llm_lora`` (its alpha scales them) with the same rank."""
    if source.lora is None:
        raise ValueError(f"{source.pretrained_pth}: the checkpoint has LoRA tensors but the SFT config has no "
                         "llm_lora; its lora_alpha is needed to scale them (ΔW = lora_alpha / r · B A)")
    ranks = {a.shape[0] for a in sft.lora_A.values()}
    if ranks != {source.lora.r}:
        raise ValueError(f"{source.pretrained_pth}: LoRA rank(s) {sorted(ranks)} in the checkpoint, but llm_lora "
                         f"r={source.lora.r} in the SFT config")


def _apply_lora(model: Sa2VAModel, sft: UpstreamState, source: UpstreamSFTSource, lora_mode: str,
                lm_map: LanguageKeyMap, report: LoadReport) -> None:
    if not sft.lora_A:
        return
    check_lora_matches_config(sft, source)
    layers = lora_to_module(sft, lm_map)
    report.lora_layers = len(sft.lora_A)
    lm = model.language_model
    head = "lm_head"
    if lora_mode == "merge" or head in layers:
        for name in [n for n in layers if lora_mode == "merge" or n == head]:
            lora_a, lora_b = layers.pop(name)
            _merge_into(lm.get_submodule(name), lora_a, lora_b, source.lora.scaling)
        report.head_adapter_merged = lora_mode == "keep"
    if lora_mode == "keep":
        _keep_adapter(model, layers, source)


@torch.no_grad()
def _merge_into(linear: torch.nn.Module, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float) -> None:
    """W ← W + scaling · B A (computed in fp32)."""
    weight = linear.weight
    delta = scaling * (lora_b.float() @ lora_a.float())  # [out, in]
    weight.copy_((weight.float() + delta).to(weight.dtype))


@torch.no_grad()
def _keep_adapter(model: Sa2VAModel, layers: dict, source: UpstreamSFTSource) -> None:
    from ..network.lora import apply_lora

    arch = model.config.llm_architecture
    upstream_targets = source.lora.target_modules or default_lora_targets(arch)
    targets = module_lora_targets(arch, upstream_targets)
    model.language_model = apply_lora(model.language_model, r=source.lora.r, lora_alpha=source.lora.lora_alpha,
                                      lora_dropout=source.lora.lora_dropout, target_modules=list(targets))
    body = model.language_model.base_model.model
    wrapped = {name for name, module in body.named_modules() if hasattr(module, "lora_A")}
    stray, unset = sorted(set(layers) - wrapped), sorted(wrapped - set(layers))
    if stray or unset:
        raise ValueError(f"{source.pretrained_pth}: LoRA layers of the checkpoint {stray[:10]} are not targets of "
                         f"llm_lora, and targets {unset[:10]} have no LoRA in the checkpoint; make llm_lora "
                         "target_modules match the SFT run")
    for name, (lora_a, lora_b) in layers.items():
        module = body.get_submodule(name)
        module.lora_A["default"].weight.copy_(lora_a)
        module.lora_B["default"].weight.copy_(lora_b)
    if source.lora.use_rslora:
        raise NotImplementedError("keep mode with use_rslora: model.lora.apply_lora has no rslora switch; use "
                                  "lora_mode='merge'")


# ---------------------------------------------------------------------------------------------- writing
def xtuner_state_dict(model: Sa2VAModel, *, layout: str = "full", is_llm_wrapped: bool = True,
                      upstream_targets: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
    """``model`` in upstream training names (module docstring). ``is_llm_wrapped``: the SFT config has
    ``llm_lora`` (upstream's LLM is peft-wrapped); ``upstream_targets``: its target_modules (None: xtuner's
    default). ``compact`` requires an unmerged adapter of exactly those targets and an unchanged base LLM."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; use one of {LAYOUTS}")
    arch = model.config.llm_architecture
    targets = frozenset(upstream_targets or default_lora_targets(arch)) if is_llm_wrapped else frozenset()
    merged = checkpoint_state_dict(model)  # HF names, LoRA merged
    if layout == "full":
        return {upstream_key(k, is_llm_wrapped=is_llm_wrapped, lora_targets=targets): v for k, v in merged.items()}
    return _compact_state(model, merged, targets, is_llm_wrapped)


def compact_layout_problem(model: Sa2VAModel, *, is_llm_wrapped: bool = True,
                           upstream_targets: tuple[str, ...] | None = None,
                           is_adapter_from_sft: bool = True) -> str | None:
    """Why ``model`` cannot be written in the ``compact`` layout, or None when it can (``xtuner_state_dict`` args;
    ``is_adapter_from_sft``: the LLM's adapter is the SFT run's, so its base weights are still the base InternVL's).

    InternLM2 (Sa2VA-8B) cannot: upstream's adapter there is one fused ``wqkv`` LoRA (one A shared by q, k and v),
    loaded as three q/k/v adapters with equal A; once RL has trained them apart they have no fused form."""
    from peft import PeftModel

    arch = model.config.llm_architecture
    if not (is_llm_wrapped and isinstance(model.language_model, PeftModel)) or arch == "InternLM2ForCausalLM":
        adapter = "kept" if isinstance(model.language_model, PeftModel) else "merged"
        return (f"layout='compact' needs an unmerged LoRA adapter on a Qwen2/Phi3/Llama LLM and an SFT config with "
                f"llm_lora (this model: {arch}, adapter {adapter}); write layout='full' (every tensor, LoRA merged) "
                "instead")
    if not is_adapter_from_sft:
        return ("layout='compact' keeps the base LLM weights out, but the SFT adapter was merged into them "
                "(lora_mode='merge'); write layout='full'")
    targets = frozenset(upstream_targets or default_lora_targets(arch))
    leaves = {name.rsplit(".", 1)[-1] for name, module in model.language_model.base_model.model.named_modules()
              if hasattr(module, "lora_A")}
    if leaves != set(module_lora_targets(arch, tuple(targets))):
        return (f"layout='compact': the adapter wraps {sorted(leaves)} but the SFT config's LoRA targets are "
                f"{sorted(targets)}; write layout='full'")
    return None


def resolve_layout(layout: str, model: Sa2VAModel, *, is_llm_wrapped: bool = True,
                   upstream_targets: tuple[str, ...] | None = None,
                   is_adapter_from_sft: bool = True) -> tuple[str, str | None]:
    """(layout to write, why ``'auto'`` fell back to ``'full'`` or None): ``'auto'`` is ``'compact'`` when
    ``compact_layout_problem`` finds nothing, else ``'full'``; other layouts are returned as given."""
    if layout != "auto":
        return layout, None
    problem = compact_layout_problem(model, is_llm_wrapped=is_llm_wrapped, upstream_targets=upstream_targets,
                                     is_adapter_from_sft=is_adapter_from_sft)
    return ("full", problem) if problem else ("compact", None)


def _compact_state(model: Sa2VAModel, merged: dict, targets: frozenset, is_llm_wrapped: bool) -> dict:
    problem = compact_layout_problem(model, is_llm_wrapped=is_llm_wrapped, upstream_targets=tuple(targets))
    if problem is not None:
        raise ValueError(problem)
    body = model.language_model.base_model.model
    layers = {name: module for name, module in body.named_modules() if hasattr(module, "lora_A")}
    out = {}
    for hf_key, tensor in merged.items():
        key = upstream_key(hf_key, is_llm_wrapped=True, lora_targets=targets)
        if is_upstream_checkpoint_key(key) and not key.endswith(".base_layer.weight"):
            out[key] = tensor
    for name, module in layers.items():
        key_a, key_b = upstream_lora_keys(name)
        out[key_a] = module.lora_A["default"].weight.detach()
        out[key_b] = module.lora_B["default"].weight.detach()
    return out


def save_xtuner_checkpoint(state: dict[str, torch.Tensor], path: str | os.PathLike, meta: dict | None = None) -> None:
    """``torch.save({'state_dict': ..., 'meta': ...})``: what MMEngine's CheckpointHook writes and xtuner's
    ``guess_load_checkpoint`` reads."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cpu = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    torch.save({"state_dict": cpu, "meta": dict(meta or {})}, path)
