"""``sa2va-rl convert``: move checkpoints between an upstream Sa2VA (XTuner) run and this project, without
upstream code (docs/upstream.md).

    convert to-hf SFT_CONFIG PTH --save-path DIR
        an upstream SFT checkpoint (XTuner iter_*.pth file or DeepSpeed directory) -> HF Sa2VA layout, as upstream's
        projects/llava_sam2/hf/convert_to_hf.py writes it (same arguments)
    convert to-xtuner --config RL_CONFIG --checkpoint CKPT --save-path OUT.pth
    convert to-xtuner --hf HF_DIR --sft-config SFT_CONFIG --save-path OUT.pth
        an RL result (or any HF Sa2VA directory) -> an XTuner .pth that upstream's SFT model loads
        (pretrained_pth=, convert_to_hf.py, evaluation after conversion)
    convert make-tiny-sft --root DIR [--codebase v2]
        write a tiny upstream-style SFT run (base dir, SAM2 weights, .pth, optional DeepSpeed dir) to try the above
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

DEFAULT_REMOTE_CODE_DIR = "projects/llava_sam2/hf/models"  # upstream converter copies these files (checkout-relative)
# codebase v2's converter (tools/convert_to_hf.py) copies its InternVL-family remote code from here instead
REMOTE_CODE_DIRS = {"v1": DEFAULT_REMOTE_CODE_DIR, "v2": "projects/sa2va/hf/models"}


def _parser() -> argparse.ArgumentParser:
    from mmengine.config import DictAction

    parser = argparse.ArgumentParser(prog="sa2va-rl convert", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    hf = sub.add_parser("to-hf", help="upstream SFT checkpoint -> HF Sa2VA layout (as upstream convert_to_hf.py)")
    hf.add_argument("config", help="the upstream SFT config of the run (e.g. projects/llava_sam2/configs/sa2va_4b.py)")
    hf.add_argument("pth_model", help="its checkpoint: an XTuner iter_*.pth file or a DeepSpeed checkpoint directory")
    hf.add_argument("--save-path", default="./work_dirs/hf_model", help="output folder (upstream's default)")
    hf.add_argument("--dtype", default="auto", help="'auto' as upstream (InternVL part in the base dtype, SAM2 and "
                    "text_hidden_fcs in float32) or one dtype for all: bfloat16, float16, float32")
    hf.add_argument("--remote-code-dir", default=None, help="folder of upstream's HF remote code to copy next to the "
                    f"weights (default: {DEFAULT_REMOTE_CODE_DIR}, for a codebase-v2 SFT config "
                    f"{REMOTE_CODE_DIRS['v2']}, when it exists under the working directory)")
    hf.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard, e.g. 5GB")
    hf.add_argument("--cfg-options", nargs="+", action=DictAction, help="key=value overrides of the SFT config")
    xt = sub.add_parser("to-xtuner", help="RL result or HF Sa2VA dir -> XTuner .pth for upstream's SFT model")
    xt.add_argument("--config", help="the RL config that trained the model (with --checkpoint)")
    xt.add_argument("--checkpoint", help="its checkpoint: iter_*.pth file or DeepSpeed directory")
    xt.add_argument("--hf", help="or: an HF Sa2VA directory (e.g. the output of export); written in the full layout")
    xt.add_argument("--sft-config", help="the upstream SFT config the .pth is for (its llm_lora decides the names); "
                    "default: the RL config's upstream_sft, else an llm_lora with xtuner's default targets")
    xt.add_argument("--save-path", required=True, help="output .pth file")
    xt.add_argument("--layout", default="auto", choices=("auto", "compact", "full"),
                    help="compact: what an XTuner SFT .pth holds (LoRA unmerged + trained tensors), possible when RL "
                    "continued the SFT adapter (lora_mode='keep', Qwen2/Qwen3/Phi3/Llama); full: every tensor, LoRA "
                    "merged; auto: compact when possible, else full (InternLM2, a merged adapter)")
    xt.add_argument("--cfg-options", nargs="+", action=DictAction, help="key=value overrides of the RL config")
    tiny = sub.add_parser("make-tiny-sft", help="write a tiny upstream-style SFT run under --root")
    tiny.add_argument("--root", default=".", help="folder that plays the Sa2VA checkout root")
    tiny.add_argument("--seed", type=int, default=0, help="seed of the tiny weights")
    tiny.add_argument("--deepspeed-world-size", type=int, default=0, help="also write a DeepSpeed ZeRO-2 directory")
    tiny.add_argument("--codebase", choices=("v1", "v2"), default="v1",
                      help="whose run: v1 (projects/llava_sam2) or v2 (projects/sa2va, InternVL3-style)")
    return parser


def _to_hf(args) -> int:
    from ..engine.upstream_sft import load_sft_config
    from ..model.checkpoints.upstream_convert import sft_to_hf

    source, _ = load_sft_config(args.config, args.cfg_options)
    source = type(source)(**{**source.__dict__, "pretrained_pth": args.pth_model})
    remote, default_remote = args.remote_code_dir, REMOTE_CODE_DIRS[source.codebase]
    if remote is None and Path(default_remote).is_dir():
        remote = default_remote
    report = sft_to_hf(source, args.save_path, dtype=args.dtype, max_shard_size=args.max_shard_size,
                       remote_code_dir=remote)
    print(f"loaded {args.pth_model}: {report.summary()}")
    print(f"wrote the HF Sa2VA model and tokenizer to {args.save_path}"
          + ("" if remote else f" (no remote code copied: {default_remote} not found; use "
             "--remote-code-dir for trust_remote_code loading)"))
    return 0


def _rl_model(config: str, checkpoint: str, cfg_options):
    """(Sa2VATrainModel built from ``config`` with ``checkpoint``'s trained tensors, the config)."""
    from mmengine.config import Config
    from mmengine.registry import MODELS
    from mmengine.runner import set_random_seed

    from ..engine.registry import build_component
    from ..model.checkpoints.upstream_base import read_xtuner_checkpoint

    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    seed = cfg.get("randomness", {}).get("seed")
    if seed is not None:  # a preset model's frozen weights are random: rebuild them as the run did
        set_random_seed(seed)
    model = build_component(MODELS, cfg.model)
    state = {k.removeprefix("module."): v for k, v in read_xtuner_checkpoint(checkpoint).items()}
    model.load_state_dict(state, strict=True)
    return model, cfg


def _to_xtuner(args) -> int:
    from ..engine.upstream_sft import load_sft_config, sft_source
    from ..model.checkpoints.hf_checkpoint import load_pretrained
    from ..model.checkpoints.xtuner_checkpoint import resolve_layout, save_xtuner_checkpoint, xtuner_state_dict

    if bool(args.hf) == bool(args.config or args.checkpoint) or (args.config is None) != (args.checkpoint is None):
        raise SystemExit("convert to-xtuner: give either --hf DIR, or --config RL_CONFIG with --checkpoint CKPT")
    lora = None
    if args.sft_config:
        lora = load_sft_config(args.sft_config)[0].lora
    if args.hf:
        model, layout, origin = load_pretrained(args.hf), "full", args.hf
        if args.layout == "compact":
            raise SystemExit("convert to-xtuner: an HF directory holds merged weights; use --layout full or auto")
    else:
        train_model, cfg = _rl_model(args.config, args.checkpoint, args.cfg_options)
        model, origin = train_model.sa2va, args.checkpoint
        if getattr(model, "family", None) == "qwen_vl":
            raise SystemExit("convert to-xtuner: the Qwen-VL family has no XTuner layout writer here; export the RL "
                             "result with `sa2va-rl export` (the HF layout upstream's Sa2VAChatModelQwen reads)")
        spec = cfg.model.get("upstream_sft")
        if lora is None and spec is not None:
            lora = sft_source(spec["sft_model"], spec["template"])[0].lora
        layout, fallback = resolve_layout(args.layout, model, is_llm_wrapped=lora is not None or not args.sft_config,
                                          upstream_targets=lora.target_modules if lora is not None else None,
                                          is_adapter_from_sft=train_model.is_lora_from_sft)
        if fallback and train_model.is_lora_from_sft:
            print(f"--layout auto: writing the full layout ({fallback.split(';')[0]})")
        if spec is not None:  # the checkpoint holds trained tensors only: the config must rebuild the run's base
            print(f"rebuilt the model as the run did: upstream SFT {spec.get('pretrained_pth')}, lora_mode="
                  f"{spec.get('lora_mode', 'keep')} (pass the run's --cfg-options too)")
    has_lora = lora is not None or not args.sft_config
    targets = lora.target_modules if lora is not None else None
    state = xtuner_state_dict(model, layout=layout, is_llm_wrapped=has_lora, upstream_targets=targets)
    save_xtuner_checkpoint(state, args.save_path, meta={"converted_from": os.fspath(origin), "layout": layout})
    print(f"wrote {len(state)} tensors ({layout} layout, upstream training names) to {args.save_path}; load it with "
          "pretrained_pth= in the SFT config, or write its HF layout: sa2va-rl convert to-hf <SFT config> "
          f"{args.save_path} --save-path <dir> (upstream's convert_to_hf.py fails under transformers 4.48)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "to-hf":
        return _to_hf(args)
    if args.command == "to-xtuner":
        return _to_xtuner(args)
    from ..model.checkpoints.tiny_upstream_run import main as tiny_main

    return tiny_main(["--root", args.root, "--seed", str(args.seed),
                      "--deepspeed-world-size", str(args.deepspeed_world_size), "--codebase", args.codebase])


if __name__ == "__main__":
    import sys

    sys.exit(main())
