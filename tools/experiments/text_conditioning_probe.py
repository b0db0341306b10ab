"""Experiment (docs/demo.md, "What limits it"): which tiny-SFT recipe makes the [SEG] mask depend on the text?

Trains the tiny Sa2VA preset from random init with the upstream SFT loss (``sft_loss``) on the shapes world and
every EVERY steps prints, on 40 held-out scenes with 2+ objects where every object is named by its canonical caption:
``iou_own`` (IoU of the mask for object k's caption with object k), ``iou_other_text`` (IoU of the masks for the
other objects' captions with object k) and ``masks_differ`` (fraction of same-image caption pairs whose masks have
IoU < 0.5). A text-aware segmenter has iou_own >> iou_other_text; a text-blind one has them equal.

Knobs (environment variables): STEPS LR BS SEED; ENC=1 trains both encoders; LLM=lora|full|head|frozen; IOU=w adds
SAM's IoU-prediction loss; MINOBJ/MAXOBJ objects per scene; TASKS=caption,segment; ALLOBJ=1 makes every object of a
scene a sample; SAMPRE=n steps of SAM-style point-prompt pretraining of the tiny SAM2 first; FCS_MULT/DEC_MULT lr
multipliers; MASKW mask-loss weight; NPTS/IMP PointRend points and importance ratio; MLP1=0 freezes the projector;
INIT=std re-initialises the LLM's matrices; ONEQ=1 one question/answer template; CAPONLY=1 captions as the text;
CONST=1 constant lr; NOCLIP=1 no gradient clipping. Run one variant per process, e.g.

    INIT=0.1 ENC=1 IOU=1 ALLOBJ=1 STEPS=1200 OMP_NUM_THREADS=1 python -m tools.experiments.text_conditioning_probe

Run it from the repository root (``python -m`` puts the root on the import path).
"""
import os, time, json, math, types
import numpy as np, torch, torch.nn.functional as F
torch.set_num_threads(int(os.environ.get('THREADS', 1)))
from torch.utils.data import DataLoader
import PIL.Image
from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.data.shapes_scene import canonical_caption, referring_expressions
from projects.llava_sam2.rl_train.data.types import RegionSample
from projects.llava_sam2.rl_train.model.decoding.generation import completion_logprobs
from projects.llava_sam2.rl_train.model.network.lora import apply_lora, configure_trainable
from projects.llava_sam2.rl_train.model.network.presets import build_preset
from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel
from projects.llava_sam2.rl_train.model.sft.sft_data import RegionSFTDataset
from projects.llava_sam2.rl_train.model.sft.sft_loss import resize_gt_masks, sft_loss
from projects.llava_sam2.rl_train.model.sft.sft_loss import iou_head_loss
from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor, sft_collate
from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

E = os.environ
def env(k, d, t=str): return t(E.get(k, d))
STEPS, LR, BS, SEED = env('STEPS', 900, int), env('LR', 1e-3, float), env('BS', 8, int), env('SEED', 0, int)
ENC, LLM, IOU = env('ENC', 0, int), env('LLM', 'lora'), env('IOU', 0.0, float)
MINOBJ, MAXOBJ, IMG = env('MINOBJ', 1, int), env('MAXOBJ', 4, int), env('IMG', 224, int)
TASKS = tuple(env('TASKS', 'caption,segment').split(','))
ALLOBJ = env('ALLOBJ', 0, int)
SAMPRE, SAMPRE_LR = env('SAMPRE', 0, int), env('SAMPRE_LR', 2e-3, float)
FCS_MULT, DEC_MULT = env('FCS_MULT', 1.0, float), env('DEC_MULT', 1.0, float)
MASKW = env('MASKW', 1.0, float)
NPTS, IMP, MLP1 = env('NPTS', 784, int), env('IMP', 0.75, float), env('MLP1', 1, int)
EVERY = env('EVERY', 150, int)
NAME = env('NAME', 'run')

class ObjectWorld(ShapesWorld):
    """Every object of every scene is a sample (index -> scene index // 4, object index % 4, wrapped)."""
    def __len__(self): return self.num_samples * 4
    def load(self, index):
        scene, pixels = self.scene(index // 4)
        k = (scene.target + index % 4) % len(scene.objects)
        a = scene.attrs[k]
        return RegionSample(image=PIL.Image.fromarray(pixels), gt_mask=scene.visible[k].copy(),
                            captions=[canonical_caption(a)], expressions=referring_expressions(scene, k),
                            sample_id=f'o/{index}', source='o', category=a['shape'])

torch.manual_seed(SEED)
tok = load_tiny_tokenizer()
model = Sa2VAModel(build_preset('tiny', vocab_size=len(tok)))
model.bind_tokenizer(tok)
INIT = env('INIT', 0.0, float)
if INIT:
    for n_, p_ in model.language_model.named_parameters():
        if p_.dim() == 2: torch.nn.init.normal_(p_, std=INIT)
proc = Sa2VAProcessor.from_config(tok, model.config, empty_region='dilate_to_one_cell')
if ENC:
    model.encode_vision = types.MethodType(type(model).encode_vision.__wrapped__, model)
    g = model.grounding_encoder
    g.encode = types.MethodType(type(g).encode.__wrapped__, g)

t0 = time.time(); c0 = time.process_time()
# ---- optional SAM-style point-prompt pretraining of the tiny SAM2 (image encoder + decoder) -------------------
if SAMPRE:
    sam = model.grounding_encoder.sam2_model
    enc = type(model.grounding_encoder).encode.__wrapped__
    params = list(sam.image_encoder.parameters()) + list(sam.sam_mask_decoder.parameters()) + list(sam.sam_prompt_encoder.parameters())
    for p in params: p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=SAMPRE_LR, weight_decay=0)
    pw = ObjectWorld('train', 4000, SEED + 100, image_size=IMG, min_objects=MINOBJ, max_objects=MAXOBJ)
    rng = np.random.default_rng(SEED)
    S_ = sam.image_size
    for step in range(SAMPRE):
        idx = rng.integers(0, len(pw), 16)
        smp = [pw[int(i)] for i in idx]
        gpx = torch.stack([proc.preprocess_image(s.image).g_pixel_values for s in smp])
        feats = enc(model.grounding_encoder, gpx)
        pts = []
        for s in smp:
            ys, xs = np.nonzero(s.gt_mask); j = rng.integers(len(ys))
            pts.append([xs[j] * S_ / s.gt_mask.shape[1], ys[j] * S_ / s.gt_mask.shape[0]])
        coords = torch.tensor(pts, dtype=torch.float32)[:, None]
        labels = torch.ones(len(smp), 1, dtype=torch.int32)
        sparse, dense = sam.sam_prompt_encoder(points=(coords, labels), boxes=None, masks=None)
        dec = sam.sam_mask_decoder
        s0 = dec.conv_s0(feats.high_res_feats[0]); s1 = dec.conv_s1(feats.high_res_feats[1])
        logits, iou, _, _ = dec(image_embeddings=feats.image_embed, image_pe=sam.sam_prompt_encoder.get_dense_pe(),
                                sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense, multimask_output=True,
                                repeat_image=False, high_res_features=[s0, s1])
        gt = resize_gt_masks([torch.from_numpy(s.gt_mask)[None] for s in smp], tuple(logits.shape[-2:]))[:, None]
        pr = logits.sigmoid()
        dice = 1 - (2 * (pr * gt).flatten(2).sum(-1) + 1) / (pr.flatten(2).sum(-1) + gt.flatten(2).sum(-1) + 1)
        bce = F.binary_cross_entropy_with_logits(logits, gt.expand_as(logits), reduction='none').flatten(2).mean(-1)
        per = 20 * bce + dice  # SAM's 20:1 focal:dice ratio, BCE instead of focal
        loss = per.min(-1).values.mean()
        loss = loss + iou_head_loss(logits, iou, gt[:, 0])
        opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
        if (step + 1) % 100 == 0:
            print(json.dumps({'name': NAME, 'samplestep': step + 1, 'loss': round(loss.item(), 3),
                              'cpu': round(time.process_time() - c0)}), flush=True)
    for p in params: p.requires_grad_(False)

# ---- SFT ---------------------------------------------------------------------------------------------------------
model.language_model = apply_lora(model.language_model, r=32, lora_alpha=64, lora_dropout=0.0)
configure_trainable(model, train_embeddings=True)
if LLM == 'full':
    for n, p in model.language_model.named_parameters(): p.requires_grad_(True)
elif LLM == 'head':
    for n, p in model.language_model.named_parameters(): p.requires_grad_(False)
    model.get_output_embeddings().requires_grad_(True)
elif LLM == 'frozen':
    for n, p in model.language_model.named_parameters(): p.requires_grad_(False)
if not MLP1:
    model.mlp1.requires_grad_(False)
if ENC:
    model.vision_model.requires_grad_(True)
    model.grounding_encoder.sam2_model.image_encoder.requires_grad_(True)
W = (ObjectWorld if ALLOBJ else ShapesWorld)('train', 4000, SEED, image_size=IMG, min_objects=MINOBJ, max_objects=MAXOBJ)
extra = dict(seg_questions=("<image>\n Please segment {class_name} in this image.",), answers=("Sure, [SEG].",)) if env('ONEQ', 0, int) else {}
if env('CAPONLY', 0, int): extra['segment_text_sources'] = ('captions',)
ds = RegionSFTDataset(W, proc, tasks=TASKS, seed=SEED, max_length=512, **extra,
                      caption_questions=("<image>\nPlease give me a short description of the region in the picture marked by region1.",))
dl = DataLoader(ds, batch_size=BS, shuffle=True, collate_fn=sft_collate, drop_last=True, generator=torch.Generator().manual_seed(SEED))
named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
groups = [dict(params=[p for n, p in named if 'text_hidden_fcs' in n], lr=LR * FCS_MULT),
          dict(params=[p for n, p in named if 'sam_mask_decoder' in n], lr=LR * DEC_MULT),
          dict(params=[p for n, p in named if 'text_hidden_fcs' not in n and 'sam_mask_decoder' not in n], lr=LR)]
params = [p for _, p in named]
opt = torch.optim.AdamW(groups, weight_decay=0.0)
sched = torch.optim.lr_scheduler.LambdaLR(opt, (lambda s: 1.0) if env('CONST', 0, int) else (lambda s: min(1.0, (s + 1) / 30) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(s, STEPS) / STEPS)))))
pts_gen = torch.Generator().manual_seed(SEED)

# val: multi-object scenes, every object named by its canonical caption
VW = ShapesWorld('val', 60, SEED, image_size=IMG, min_objects=2, max_objects=MAXOBJ)
val_items = []
for i in range(len(VW)):
    scene, px = VW.scene(i)
    val_items.append((PIL.Image.fromarray(px), [(canonical_caption(a), scene.visible[k]) for k, a in enumerate(scene.attrs)]))
ANS = torch.tensor(tok.encode("Sure, [SEG].", add_special_tokens=False)); SP = int((ANS == model.seg_token_id).nonzero()[0, 0])

def iou(a, b):
    u = (a | b).sum(); return (a & b).sum() / u if u else 1.0

@torch.no_grad()
def evaluate(step):
    model.eval()
    own, cross, diff = [], [], []
    for img, objs in val_items[:40]:
        x = proc.preprocess_image(img)
        n = len(objs)
        ids, att = proc.tokenize_prompts([proc.segment_prompt(1, c) for c, _ in objs])
        tiles = model.project_vision(model.encode_vision(x.pixel_values))
        emb = model.embed_inputs(ids, [model.build_image_embeds(tiles, None)] * n)
        A = ANS[None].expand(n, -1)
        _, h = completion_logprobs(model.language_model, emb, att, A, torch.ones_like(A, dtype=torch.bool), return_hidden=True)
        f = model.encode_grounding(x.g_pixel_values[None])
        out = model.decode_masks(model.seg_hidden_to_prompt(h[:, SP]), f, torch.zeros(n, dtype=torch.long))
        mk = [m.numpy() for m in model.logits_to_masks(out.best_logits, [x.size] * n)]
        for k, (_, gt) in enumerate(objs):
            own.append(iou(mk[k], gt))
            for j in range(n):
                if j != k:
                    cross.append(iou(mk[j], gt)); diff.append(iou(mk[j], mk[k]) < 0.5)
    r = {'name': NAME, 'step': step, 'iou_own': round(float(np.mean(own)), 3), 'iou_other_text': round(float(np.mean(cross)), 3),
         'masks_differ': round(float(np.mean(diff)), 3), 'cpu': round(time.process_time() - c0), 'wall': round(time.time() - t0)}
    print(json.dumps(r), flush=True)
    model.train()
    return r

model.train(); step = 0; hist = []
while step < STEPS:
    for batch in dl:
        L = sft_loss(model, batch, num_points=NPTS, importance_sample_ratio=IMP, generator=pts_gen, iou_loss_weight=IOU)
        total = L['llm_loss'] + MASKW * (L['loss_mask'] + L['loss_dice']) + L.get('loss_iou', 0.0)
        opt.zero_grad(); total.backward(); env('NOCLIP', 0, int) or torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step(); sched.step(); step += 1
        if step % 50 == 0:
            print(json.dumps({'name': NAME, 'it': step, **{k: round(float(v), 3) for k, v in L.items()}}), flush=True)
        if step % EVERY == 0 or step == STEPS:
            hist.append(evaluate(step))
        if step >= STEPS: break
out = E.get('OUT')
if out:
    os.makedirs(out, exist_ok=True)
    json.dump(hist, open(os.path.join(out, NAME + '.json'), 'w'))
