"""A tiny upstream-style Sa2VA SFT run, built with our own code from the tiny preset (tests, README walkthrough).

It lays out, under ``root``, what an upstream checkout holds after ``bash tools/dist.sh train <sft config>``:

    pretrained/InternVL2_5-tiny/     base "InternVL" dir: config.json (InternVL layout, plus our ``grounding_config``
                                     sizing the tiny SAM2), model.safetensors, the tiny tokenizer *without* the Sa2VA
                                     tokens (so loading resizes the vocabulary, as upstream does)
    pretrained/sam2_tiny.pt          {'model': SAM2Base state}, sam2 names (``gamma``)
    work_dirs/sa2va_tiny_sft/iter_2.pth
                                     {'state_dict': ...}: upstream's trainable subset in training names, LoRA unmerged
    work_dirs/sa2va_tiny_sft/iter_2_zero2.pth/
                                     (``deepspeed=True``) the same model saved by DeepSpeed ZeRO-2 itself, as
                                     MMEngine's DeepSpeedStrategy does with ``save_optimizer=True``

``codebase='v2'`` lays out a codebase-v2 run instead (``projects/sa2va``: ``Sa2VAModel`` + ``InternVLMLLM``):

    pretrained/InternVL3-tiny/       base dir, template qwen_chat, Qwen2 LLM (the InternVL3 family's)
    pretrained/sam2/sam2_tiny.pt     v2's SAM2TrainRunner reads pretrained/sam2/<ckpt_path>
    work_dirs/sa2va_in30_tiny_sft/iter_2.pth, iter_2_zero2.pth/
                                     LoRA with ``modules_to_save=["embed_tokens", "lm_head"]`` (v2's LoraConfig), so
                                     peft wraps those two modules; the .pth keeps v2's ``Sa2VAModel.state_dict``
                                     subset (``xtuner_keys.is_v2_checkpoint_key``)

The "SFT" is emulated: the upstream module tree (``mllm.model.{vision_model, language_model, mlp1}``,
``grounding_encoder.sam2_model``, ``text_hidden_fcs``) is assembled from a seeded tiny ``Sa2VAModel``, the LLM is
resized with transformers' ``resize_token_embeddings`` and wrapped by ``peft.get_peft_model`` with xtuner's target
rule (every Linear leaf but the head), and the trained tensors get seeded noise (LoRA B ≠ 0). Names therefore come
from peft and the sam2 package, not from our key map. ``projects/llava_sam2/configs/rl/upstream_sft/
sa2va_tiny_sft.py`` is the matching SFT config (paths relative to ``root``, as upstream's ``./pretrained``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from ..network.presets import build_preset
from ..network.sa2va import Sa2VAModel
from ..text.constants import SA2VA_SPECIAL_TOKENS
from ..text.tokenizer import TINY_TOKENIZER_DIR, load_tiny_tokenizer
from .deepspeed_zero import without_shm_comm_op
from .hf_checkpoint import checkpoint_state_dict
from .xtuner_keys import is_upstream_checkpoint_key, is_v2_checkpoint_key

BASE_DIR = "pretrained/InternVL2_5-tiny"
SAM2_PT = "pretrained/sam2_tiny.pt"
SFT_PTH = "work_dirs/sa2va_tiny_sft/iter_2.pth"
SFT_DS_DIR = "work_dirs/sa2va_tiny_sft/iter_2_zero2.pth"
TINY_SFT_LORA = dict(r=8, lora_alpha=16, lora_dropout=0.05)
CODEBASES = ("v1", "v2")
V2_BASE_DIR = "pretrained/InternVL3-tiny"
V2_SAM2_PT = "pretrained/sam2/sam2_tiny.pt"
V2_SFT_PTH = "work_dirs/sa2va_in30_tiny_sft/iter_2.pth"
V2_SFT_DS_DIR = "work_dirs/sa2va_in30_tiny_sft/iter_2_zero2.pth"
V2_MODULES_TO_SAVE = ["embed_tokens", "lm_head"]  # codebase v2's llm_lora
# where each codebase's run keeps its files: base dir, SAM2 weights, SFT .pth, DeepSpeed dir
RUN_PATHS = {"v1": (BASE_DIR, SAM2_PT, SFT_PTH, SFT_DS_DIR),
             "v2": (V2_BASE_DIR, V2_SAM2_PT, V2_SFT_PTH, V2_SFT_DS_DIR)}
_MODULE = "projects.llava_sam2.rl_train.model.checkpoints.tiny_upstream_run"


@dataclass
class TinySFTRun:
    root: Path
    model: Sa2VAModel  # the emulated SFT result (LLM peft-wrapped), the reference for outputs
    tokenizer: object  # base tokenizer + Sa2VA tokens, ids as the run's

    def path(self, relative: str) -> Path:
        return self.root / relative


def xtuner_linear_targets(language_model: nn.Module) -> list[str]:
    """xtuner ``find_all_linear_names``: leaf names of every nn.Linear, except ``lm_head`` / ``output_layer``."""
    names = {name.rsplit(".", 1)[-1] for name, m in language_model.named_modules() if isinstance(m, nn.Linear)}
    return sorted(names - {"lm_head", "output_layer"})


def _write_base_tokenizer(out: Path) -> int:
    """The tiny tokenizer minus the Sa2VA tokens (its last ids); returns the base vocabulary size."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(TINY_TOKENIZER_DIR / name, out / name)
    tok = json.loads((out / "tokenizer.json").read_text())
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] not in SA2VA_SPECIAL_TOKENS]
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"] = {i: t for i, t in cfg["added_tokens_decoder"].items()
                                   if t["content"] not in SA2VA_SPECIAL_TOKENS}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False))
    return len(load_tiny_tokenizer()) - len(SA2VA_SPECIAL_TOKENS)


def _internvl_config(model: Sa2VAModel, base_vocab: int, codebase: str = "v1") -> dict:
    """The base dir's config.json in InternVL's layout (an InternVL2.5 ``config.json`` has these top-level keys)."""
    data = model.config.to_dict()
    data["llm_config"]["vocab_size"] = base_vocab
    data.update(architectures=["InternVLChatModel"], model_type="internvl_chat", template="internvl2_5",
                system_message=None, auto_map={"AutoConfig": "configuration_internvl_chat.InternVLChatConfig",
                                               "AutoModel": "modeling_internvl_chat.InternVLChatModel"})
    if codebase == "v2":  # InternVL3 checkpoints ship the Qwen2 LLM's name under llm_config, as here
        data["llm_config"]["_name_or_path"] = "./pretrained/Qwen2.5-tiny-Instruct"
    return data


def build_sft_tree(seed: int = 0, base_vocab: int | None = None,
                   codebase: str = "v1") -> tuple[nn.Module, Sa2VAModel, dict, dict]:
    """(upstream module tree, the Sa2VAModel sharing its modules, base HF state, base SAM2 state), seeded.
    ``codebase='v2'`` adds v2's ``modules_to_save`` to the LoRA config (peft then trains copies of the embeddings
    and LM head instead of the modules themselves)."""
    if codebase not in CODEBASES:
        raise ValueError(f"codebase={codebase!r}; use one of {CODEBASES}")
    torch.manual_seed(seed)
    base_vocab = base_vocab or len(load_tiny_tokenizer()) - len(SA2VA_SPECIAL_TOKENS)
    model = Sa2VAModel(build_preset("tiny", vocab_size=base_vocab))
    base = {k: v.clone() for k, v in checkpoint_state_dict(model).items()
            if k.startswith(("vision_model.", "language_model.", "mlp1."))}
    sam2 = {k: v.clone() for k, v in model.grounding_encoder.sam2_model.state_dict().items()}
    from peft import LoraConfig, get_peft_model

    lm = model.language_model
    lm.resize_token_embeddings(base_vocab + len(SA2VA_SPECIAL_TOKENS))  # InternVL_Slowfast._add_special_tokens
    model.config.llm_config.vocab_size = lm.get_input_embeddings().weight.shape[0]
    saved = V2_MODULES_TO_SAVE if codebase == "v2" else None
    lora = LoraConfig(**TINY_SFT_LORA, bias="none", task_type="CAUSAL_LM", target_modules=xtuner_linear_targets(lm),
                      modules_to_save=saved)
    model.language_model = get_peft_model(lm, lora)
    tree = nn.Module()
    tree.mllm = nn.Module()
    tree.mllm.model = nn.Module()
    tree.mllm.model.vision_model = model.vision_model
    tree.mllm.model.language_model = model.language_model
    tree.mllm.model.mlp1 = model.mlp1
    tree.grounding_encoder = nn.Module()
    tree.grounding_encoder.sam2_model = model.grounding_encoder.sam2_model
    tree.text_hidden_fcs = model.text_hidden_fcs
    _set_upstream_trainable(tree, codebase)
    with torch.no_grad():  # "SFT": seeded noise on every trained tensor
        for name, param in tree.named_parameters():
            if param.requires_grad:
                param.add_(torch.randn_like(param) * (0.05 if "lora_B" in name else 0.01))
    return tree, model, base, sam2


def _set_upstream_trainable(tree: nn.Module, codebase: str = "v1") -> None:
    """Upstream SFT's trainable set: LoRA, embeddings, LM head (v2: their modules_to_save copies), mlp1, SAM2 mask
    decoder, text_hidden_fcs."""
    tree.requires_grad_(False)
    lm = tree.mllm.model.language_model
    for name, param in lm.named_parameters():
        param.requires_grad_("lora_" in name or ".modules_to_save." in name)
    if codebase == "v1":
        lm.get_input_embeddings().requires_grad_(True)
        lm.get_output_embeddings().requires_grad_(True)
    tree.mllm.model.mlp1.requires_grad_(True)
    tree.grounding_encoder.sam2_model.sam_mask_decoder.requires_grad_(True)
    tree.text_hidden_fcs.requires_grad_(True)


def make_tiny_sft_run(root: str | os.PathLike, seed: int = 0, deepspeed: bool = False,
                      world_size: int = 1, codebase: str = "v1") -> TinySFTRun:
    """Write the layout of the module docstring under ``root`` (``codebase``: whose run); ``deepspeed`` also
    writes the ZeRO-2 directory (in ``world_size`` subprocesses, so no process group is left in this process)."""
    root = Path(root)
    base_dir, sam2_pt, sft_pth, _ = RUN_PATHS[codebase]
    base_vocab = _write_base_tokenizer(root / base_dir)
    tree, model, base, sam2 = build_sft_tree(seed, base_vocab, codebase)
    (root / base_dir / "config.json").write_text(json.dumps(_internvl_config(model, base_vocab, codebase), indent=2,
                                                            sort_keys=True) + "\n")
    save_file({k: v.contiguous() for k, v in base.items()}, str(root / base_dir / "model.safetensors"),
              metadata={"format": "pt"})
    (root / sam2_pt).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": sam2}, root / sam2_pt)
    keep = is_v2_checkpoint_key if codebase == "v2" else is_upstream_checkpoint_key
    state = {k: v.detach().clone() for k, v in tree.state_dict().items() if keep(k)}
    (root / sft_pth).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": state, "meta": {"seed": seed, "note": f"tiny upstream-style {codebase} SFT (emulated)"}},
               root / sft_pth)
    if deepspeed:
        command = [sys.executable, "-m", _MODULE, "--root", str(root), "--seed", str(seed),
                   "--deepspeed-world-size", str(world_size), "--deepspeed-only", "--codebase", codebase]
        checkout = str(Path(__file__).resolve().parents[5])  # the folder holding projects/
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [checkout, os.environ.get("PYTHONPATH")])))
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise RuntimeError(f"DeepSpeed checkpoint writer failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    tokenizer = load_tiny_tokenizer()
    model.bind_tokenizer(tokenizer)
    return TinySFTRun(root=root, model=model, tokenizer=tokenizer)


# ---------------------------------------------------------------------------------------------- DeepSpeed
def _deepspeed_worker(rank: int, world_size: int, root: str, seed: int, port: int, codebase: str = "v1") -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    import deepspeed

    tree, _, _, _ = build_sft_tree(seed, codebase=codebase)
    with without_shm_comm_op():  # the op plays no part in the checkpoint; its first build is a ~40 s compile
        deepspeed.init_distributed(dist_backend="gloo")
    optimizer = torch.optim.AdamW([p for p in tree.parameters() if p.requires_grad], lr=1e-4)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}, "bf16": {"enabled": False}}
    engine, *_ = deepspeed.initialize(model=tree, optimizer=optimizer, config=config)
    directory = Path(root) / RUN_PATHS[codebase][3]
    engine.save_checkpoint(str(directory.parent), tag=directory.name, save_latest=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write a tiny upstream-style Sa2VA SFT run (base dir, SAM2 "
                                                 "weights, XTuner .pth, optional DeepSpeed dir) under --root")
    parser.add_argument("--root", required=True, help="folder to write into (it plays the Sa2VA checkout root)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the tiny weights")
    parser.add_argument("--deepspeed-world-size", type=int, default=0,
                        help="also write the DeepSpeed ZeRO-2 directory with this many ranks (0: no)")
    parser.add_argument("--codebase", choices=CODEBASES, default="v1",
                        help="whose run: v1 (projects/llava_sam2) or v2 (projects/sa2va, LoRA with modules_to_save)")
    parser.add_argument("--deepspeed-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.deepspeed_only:
        import torch.multiprocessing as mp

        port = 29500 + os.getpid() % 1000
        # fork: the ranks inherit this process's imports (the model stack, ~9 s per cold interpreter under spawn);
        # nothing has run a torch op or started a thread here yet
        mp.start_processes(_deepspeed_worker, args=(args.deepspeed_world_size, args.root, args.seed, port,
                                                    args.codebase),
                           nprocs=args.deepspeed_world_size, join=True, start_method="fork")
        return 0
    make_tiny_sft_run(args.root, seed=args.seed, deepspeed=args.deepspeed_world_size > 0,
                      world_size=max(args.deepspeed_world_size, 1), codebase=args.codebase)
    base_dir, sam2_pt, sft_pth, ds_dir = RUN_PATHS[args.codebase]
    print(f"wrote {base_dir}, {sam2_pt}, {sft_pth}" + (f", {ds_dir}" if args.deepspeed_world_size else "")
          + f" under {args.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
