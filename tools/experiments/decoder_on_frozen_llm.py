"""Experiment (docs/demo.md, "What limits it"): can text_hidden_fcs + the SAM2 mask decoder learn to pick the named
object from the [SEG] state of a *frozen, random* tiny LLM, and how does that compare with an oracle prompt (a
learned embedding of the object's colour, shape and grid cell)?

[SEG] states of N training scenes (2-3 objects, every object named by its canonical caption) are computed once; then
only the decoder and the prompt head train (dense BCE + Dice + SAM's IoU-prediction loss, or PR=ratio for the SFT
loss's PointRend points). Prints own vs other-object-text IoU on 60 held-out scenes every 100 steps.

    MODE=seg|oracle INIT=0.1 N=600 STEPS=1500 python -m tools.experiments.decoder_on_frozen_llm

Run it from the repository root (``python -m`` puts the root on the import path).
"""
import os, time, json
import numpy as np, torch, torch.nn.functional as F; torch.set_num_threads(1)
import PIL.Image
from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.data.shapes_scene import canonical_caption, COLOURS, SHAPES, CELL_PHRASES
from projects.llava_sam2.rl_train.model.decoding.generation import completion_logprobs
from projects.llava_sam2.rl_train.model.network.presets import build_preset
from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel
from projects.llava_sam2.rl_train.model.sft.sft_loss import resize_gt_masks
from projects.llava_sam2.rl_train.model.sft.sft_loss import iou_head_loss
from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor
from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer
MODE = os.environ.get('MODE', 'seg'); N = int(os.environ.get('N', 600)); STEPS = int(os.environ.get('STEPS', 800))
torch.manual_seed(0)
tok = load_tiny_tokenizer(); model = Sa2VAModel(build_preset('tiny', vocab_size=len(tok))); model.bind_tokenizer(tok); model.eval()
proc = Sa2VAProcessor.from_config(tok, model.config)
ANS = torch.tensor(tok.encode("Sure, [SEG].", add_special_tokens=False)); SP = int((ANS == model.seg_token_id).nonzero()[0, 0])
CELLS = [v[0] for v in CELL_PHRASES.values()]
def build(split, n):
    W = ShapesWorld(split, n, 0, min_objects=2, max_objects=3); H, ATT, G, IMG, IDX = [], [], [], [], []
    with torch.no_grad():
        for i in range(n):
            scene, px = W.scene(i); x = proc.preprocess_image(PIL.Image.fromarray(px))
            caps = [canonical_caption(a) for a in scene.attrs]; k = len(caps)
            ids, att = proc.tokenize_prompts([proc.segment_prompt(1, c) for c in caps])
            tiles = model.project_vision(model.encode_vision(x.pixel_values))
            emb = model.embed_inputs(ids, [model.build_image_embeds(tiles, None)] * k)
            A = ANS[None].expand(k, -1)
            _, h = completion_logprobs(model.language_model, emb, att, A, torch.ones_like(A, dtype=torch.bool), return_hidden=True)
            H.append(h[:, SP])
            for a, m in zip(scene.attrs, scene.visible):
                v = torch.zeros(20); v[list(COLOURS).index(a['colour'])] = 1; v[6 + SHAPES.index(a['shape'])] = 1; v[11 + CELLS.index(a['cell'])] = 1
                ATT.append(v); G.append(torch.from_numpy(m)[None].float()); IDX.append(i)
            IMG.append(x.g_pixel_values)
        f = model.encode_grounding(torch.stack(IMG))
    return torch.cat(H), torch.stack(ATT), G, f, torch.tensor(IDX)
t0 = time.time()
INIT = float(os.environ.get('INIT', 0))
if INIT:
    torch.manual_seed(0)
    for n_, p_ in model.language_model.named_parameters():
        if p_.dim() == 2: torch.nn.init.normal_(p_, std=INIT)
tr = build('train', N); va = build('val', 60)
if os.environ.get('STD') == '1':
    mu, sd = tr[0].mean(0), tr[0].std(0) + 1e-6
    tr = ((tr[0] - mu) / sd, *tr[1:]); va = ((va[0] - mu) / sd, *va[1:])
print('relstd', (tr[0].std(0).mean() / tr[0].mean(0).abs().mean()).item())
print('built', time.time() - t0, flush=True)
sam = model.grounding_encoder.sam2_model
dec = sam.sam_mask_decoder; dec.requires_grad_(True)
if MODE == 'seg':
    head = model.text_hidden_fcs; feat_i = 0
else:
    head = torch.nn.Linear(20, 32); feat_i = 1
head.requires_grad_(True)
opt = torch.optim.AdamW(list(dec.parameters()) + list(head.parameters()), lr=float(os.environ.get('LR', 1e-3)), weight_decay=0)
def sel(fe, idx): 
    from projects.llava_sam2.rl_train.model.network.grounding import GroundingFeatures
    return GroundingFeatures(image_embed=fe.image_embed[idx], high_res_feats=[h[idx] for h in fe.high_res_feats])
rng = np.random.default_rng(0)
M = tr[0].shape[0]
for step in range(1, STEPS + 1):
    j = torch.tensor(rng.integers(0, M, 8))
    fe = sel(tr[3], tr[4][j])
    out = model.decode_masks(head(tr[feat_i][j]), fe, torch.arange(8))
    lo = out.best_logits; gt = resize_gt_masks([tr[2][int(k)] for k in j], tuple(lo.shape[-2:]))
    pr = lo.sigmoid()
    if os.environ.get('PR'):
        from projects.llava_sam2.rl_train.model.sft.sft_loss import mask_losses
        a_, b_ = mask_losses(lo, gt, num_points=int(os.environ.get('NP', 784)), oversample_ratio=3.0, importance_sample_ratio=float(os.environ['PR']))
        loss = a_ + b_
    else:
        loss = float(os.environ.get('WB', 1)) * F.binary_cross_entropy_with_logits(lo, gt) + float(os.environ.get('WD', 1)) * (1 - (2 * (pr * gt).sum((1, 2)) + 1) / (pr.sum((1, 2)) + gt.sum((1, 2)) + 1)).mean()
    loss = loss + iou_head_loss(out.low_res_logits, out.iou_scores, gt)
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 100 == 0:
        with torch.no_grad():
            Mv = va[0].shape[0]; fe = sel(va[3], va[4])
            lo = model.decode_masks(head(va[feat_i]), fe, torch.arange(Mv)).best_logits
            gt = resize_gt_masks(va[2], tuple(lo.shape[-2:])) > 0.5; p = lo > 0
            own = ((p & gt).sum((1, 2)) / (p | gt).sum((1, 2)).clamp_min(1)).float()
            # same-image other object's prompt
            other = []
            for a in range(Mv):
                for b in range(Mv):
                    if a != b and va[4][a] == va[4][b]:
                        other.append(((p[b] & gt[a]).sum() / (p[b] | gt[a]).sum().clamp_min(1)).item())
        print(json.dumps({'mode': MODE, 'step': step, 'loss': round(loss.item(), 3), 'own': round(own.mean().item(), 3), 'other': round(float(np.mean(other)), 3), 't': round(time.time() - t0)}), flush=True)
