"""Measurement (docs/upstream.md, "Parity with upstream's HF code"): upstream's codebase-v2 HF Sa2VA code against ours
on the tiny InternVL3 replica of tests/internvl3_fixtures.py, both directions, and the test data it pins.

Direction A: our save_pretrained -> upstream's Sa2VAChatConfig.from_pretrained + Sa2VAChatModel + strict load -> its
forward. Direction B: upstream's save_pretrained -> our load_pretrained -> our forward. Prints max |ours - upstream|
and writes ``internvl3_upstream_reference.safetensors`` and ``internvl3_upstream_saved.json`` (tests/data/); with
``--llm qwen3`` (``qwen3_tied``: with tied embeddings) the replica has a Qwen3 LLM and the files are
``internvl3_qwen3_upstream_*`` (``internvl3_qwen3_tied_upstream_*``).

Upstream's code is never part of this repository: pass a checkout of bytedance/Sa2VA (codebase v2), e.g. fetched to
/tmp; its ``projects/sa2va/hf/models`` is copied into a temporary package and left as it is. What running it here on a
CPU takes is set up in ``load_upstream``, each piece with its reason.

    python -m research.upstream_v2_parity /tmp/Sa2VA --out /tmp/parity [--llm qwen3]   # from the repository root
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import types
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[1]
# an InternViT DropPath is all upstream imports from timm (not installed here); the run is in eval mode, where the
# stand-in, the identity, is exact
DROP_PATH_STAND_IN = '''import torch.nn as nn


class DropPath(nn.Module):
    def __init__(self, drop_prob=0.0, scale_by_keep=True):
        super().__init__()

    def forward(self, x):
        assert not self.training, "stand-in DropPath is eval-only"
        return x
'''


def load_upstream(checkout: Path, grounding: dict) -> types.SimpleNamespace:
    """Upstream's v2 HF classes, importable and runnable here, with its SAM2 sized as ``grounding``."""
    staging = Path(tempfile.mkdtemp(prefix="sa2va_v2_hf_"))
    shutil.copytree(checkout / "projects/sa2va/hf/models", staging / "sa2va_hf_v2")
    (staging / "sa2va_hf_v2/__init__.py").touch()
    (staging / "timm/models").mkdir(parents=True)
    for init in ("timm/__init__.py", "timm/models/__init__.py"):
        (staging / init).touch()
    (staging / "timm/models/layers.py").write_text(DROP_PATH_STAND_IN)
    sys.path.insert(0, str(staging))

    # Upstream's config module imports the Qwen2.5-VL config classes (transformers >= 4.49) for its Qwen-VL family,
    # and transformers serialises a config by diffing it with a default instance of its class (to_diff_dict), which
    # for upstream's Sa2VAChatConfig is a Qwen2.5-VL one: under an older transformers an empty config class stands in
    # for both.
    if not hasattr(transformers, "Qwen2_5_VLConfig"):
        class QwenVLStandIn(transformers.PretrainedConfig):
            model_type = "qwen2_5_vl_stand_in"

        qwen_vl = types.ModuleType("transformers.models.qwen2_5_vl.configuration_qwen2_5_vl")
        qwen_vl.Qwen2_5_VLConfig = qwen_vl.Qwen2_5_VLVisionConfig = QwenVLStandIn
        sys.modules["transformers.models.qwen2_5_vl"] = types.ModuleType("transformers.models.qwen2_5_vl")
        sys.modules[qwen_vl.__name__] = qwen_vl
    # upstream's SAM2 video predictor moves frames and memories to CUDA; this run is on the CPU
    torch.Tensor.cuda = lambda self, *args, **kwargs: self

    import sa2va_hf_v2.sam2 as sam2
    from sa2va_hf_v2.configuration_sa2va_chat import Sa2VAChatConfig
    from sa2va_hf_v2.modeling_sa2va_chat import Sa2VAChatModel

    _size_sam2(sam2, grounding)
    return types.SimpleNamespace(Sa2VAChatConfig=Sa2VAChatConfig, Sa2VAChatModel=Sa2VAChatModel)


def _size_sam2(sam2, g: dict) -> None:
    """Upstream's SAM2 builders hold Hiera-L at 1024 px as literals: give them the replica's sizes, with upstream's own
    classes and the arguments it passes for Hiera-L."""
    hidden, feat, trunk_cfg = g["hidden_dim"], g["image_size"] // g["backbone_stride"], g["trunk"]

    def sine(n):
        return sam2.PositionEmbeddingSine(num_pos_feats=n, normalize=True, scale=None, temperature=10000)

    def build_image_encoder(self):
        trunk = sam2.Hiera(embed_dim=trunk_cfg["embed_dim"], num_heads=trunk_cfg["num_heads"],
                           stages=trunk_cfg["stages"], global_att_blocks=trunk_cfg["global_att_blocks"],
                           window_pos_embed_bkg_spatial_size=trunk_cfg["window_pos_embed_bkg_spatial_size"],
                           window_spec=trunk_cfg["window_spec"])
        neck = sam2.FpnNeck(d_model=hidden, position_encoding=sine(hidden), backbone_channel_list=trunk.channel_list,
                            fpn_top_down_levels=[2, 3], fpn_interp_model="nearest")
        return sam2.ImageEncoder(scalp=1, trunk=trunk, neck=neck)

    def build_memory_attention(self):
        def rope(**extra):
            return sam2.RoPEAttention(rope_theta=10000.0, feat_sizes=[feat, feat], embedding_dim=hidden, num_heads=1,
                                      downsample_rate=1, dropout=0.1, **extra)

        layer = sam2.MemoryAttentionLayer(
            activation="relu", dim_feedforward=g["memory_attention"]["dim_feedforward"], dropout=0.1,
            pos_enc_at_attn=False, d_model=hidden, pos_enc_at_cross_attn_queries=False,
            pos_enc_at_cross_attn_keys=True, self_attention=rope(),
            cross_attention=rope(rope_k_repeat=True, kv_in_dim=g["mem_dim"]))
        return sam2.MemoryAttention(d_model=hidden, pos_enc_at_input=True,
                                    num_layers=g["memory_attention"]["num_layers"], layer=layer)

    def build_memory_encoder(self):
        block = sam2.CXBlock(dim=hidden, kernel_size=7, padding=3, layer_scale_init_value=1e-6, use_dwconv=True)
        return sam2.MemoryEncoder(
            out_dim=g["mem_dim"], position_encoding=sine(g["mem_dim"]), in_dim=hidden,
            mask_downsampler=sam2.MaskDownSampler(embed_dim=hidden, kernel_size=3, stride=2, padding=1),
            fuser=sam2.Fuser(layer=block, num_layers=g["memory_encoder"]["fuser_layers"]))

    class SizedPredictor(sam2.SAM2VideoPredictor):
        def __init__(self, *args, **kwargs):
            kwargs["image_size"] = g["image_size"]
            super().__init__(*args, **kwargs)

    sam2.SAM2.build_image_encoder = build_image_encoder
    sam2.SAM2.build_memory_attention = build_memory_attention
    sam2.SAM2.build_memory_encoder = build_memory_encoder
    sam2.SAM2VideoPredictor = SizedPredictor


@torch.no_grad()
def upstream_outputs(model, tokenizer, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What upstream's predict_forward computes, teacher-forced: its _llm_forward, the final hidden state at the
    [SEG] input position through text_hidden_fcs, and its SAM2 video predictor's mask for that prompt."""
    ids = inputs["input_ids"]
    model.img_context_token_id = tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>")
    model._count = 0  # _llm_forward counts calls on an attribute its constructor does not create
    out = model._llm_forward(pixel_values=inputs["pixel_values"], input_ids=ids,
                             attention_mask=torch.ones_like(ids, dtype=torch.bool), position_ids=None,
                             image_flags=torch.ones(len(inputs["pixel_values"]), dtype=torch.long),
                             output_hidden_states=True, return_dict=True, use_cache=False)
    rows = (ids[0] == tokenizer.convert_tokens_to_ids("[SEG]")).nonzero()[:, 0]
    prompt = model.text_hidden_fcs(out.hidden_states[-1][0, rows])
    images = torch.stack([model.grounding_encoder.preprocess_image(p.clone(), dtype=torch.float32)
                          for p in inputs["g_pixel_values"]])
    state = model.grounding_encoder.get_sam2_embeddings(images)
    state["device"] = state["storage_device"] = torch.device("cpu")
    masks = model.grounding_encoder.language_embd_inference(state, [prompt])  # [frames, objects, S_sam, S_sam]
    return {"logits": out.logits[0], "seg_prompt": prompt, "mask_logits": masks[:, 0]}


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    return {k: float((a[k].float() - b[k].float()).abs().max()) for k in a}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("upstream", type=Path, help="a checkout of bytedance/Sa2VA holding projects/sa2va/hf/models")
    parser.add_argument("--out", type=Path, required=True, help="folder for the saved checkpoints and the test data")
    parser.add_argument("--llm", choices=("qwen2", "qwen3", "qwen3_tied"), default="qwen2",
                        help="the replica's LLM: qwen2 (Qwen2.5, as released), qwen3, or qwen3 with tied embeddings")
    args = parser.parse_args(argv)
    stem = "internvl3_upstream" if args.llm == "qwen2" else f"internvl3_{args.llm}_upstream"
    sys.path.insert(0, str(REPO / "tests"))  # the replica
    from internvl3_fixtures import our_outputs, pinned_outputs, reference_inputs, tiny_internvl3_model

    from projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint import load_pretrained, save_pretrained
    from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer()
    ours = tiny_internvl3_model(llm=args.llm)
    upstream = load_upstream(args.upstream, ours.config.grounding)
    inputs = reference_inputs(tokenizer, ours.config)
    mine = our_outputs(ours, tokenizer, inputs)

    save_pretrained(ours, args.out / "ours_saved")  # direction A
    config = upstream.Sa2VAChatConfig.from_pretrained(str(args.out / "ours_saved"))
    theirs = upstream.Sa2VAChatModel(config, use_flash_attn=False)
    print("upstream strict load:", theirs.load_state_dict(load_file(str(args.out / "ours_saved/model.safetensors")),
                                                          strict=True))
    theirs = theirs.float().eval()
    reference = upstream_outputs(theirs, tokenizer, inputs)
    diff_a = max_abs_diff(mine, reference)

    theirs.save_pretrained(str(args.out / "upstream_saved"), safe_serialization=True)  # direction B
    back = load_pretrained(args.out / "upstream_saved")
    diff_b = max_abs_diff(our_outputs(back, tokenizer, inputs), reference)
    print("max |ours - upstream|, our save -> upstream:", diff_a)
    print("max |ours - upstream|, upstream save -> ours:", diff_b)

    with safe_open(str(args.out / "upstream_saved/model.safetensors"), framework="pt") as handle:
        layout = {key: list(handle.get_slice(key).get_shape()) for key in handle.keys()}
    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "upstream": "bytedance/Sa2VA codebase v2, projects/sa2va/hf/models",
            "max_abs_diff_our_save": json.dumps(diff_a), "max_abs_diff_upstream_save": json.dumps(diff_b)}
    save_file(pinned_outputs(reference, tokenizer, inputs), str(args.out / f"{stem}_reference.safetensors"),
              metadata=meta)
    saved_config = json.loads((args.out / "upstream_saved/config.json").read_text())
    (args.out / f"{stem}_saved.json").write_text(
        json.dumps({"config": saved_config, "layout": layout}, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
