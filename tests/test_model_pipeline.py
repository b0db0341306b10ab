"""model/pipeline/shared.py + model/decoding/text_decoding.py on the tiny random Sa2VA: images encoded once, image and region tokens in
the prompt, greedy answers and their [SEG] masks (rules, decoder states vs the teacher-forced recompute, chunking,
fast == reference), teacher-forced [SEG] prompts, and the text helpers (stop words, prompt-ready text)."""
from __future__ import annotations

import re

import pytest
import torch

from grpo_tiny import build_tiny, one_thread
from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.model.decoding import fast_generation
from projects.llava_sam2.rl_train.model.pipeline import shared
from projects.llava_sam2.rl_train.model.decoding.generation import Completions, position_ids_from_attention
from projects.llava_sam2.rl_train.model.decoding.text_decoding import (
    TextDecoding, answer_texts, clean_text, completion_texts, cut_at_stop_words, fed_back_seg_positions)
from projects.llava_sam2.rl_train.model.pipeline.shared import (
    PromptRow, describe_masks, encode_images, forced_answer_masks, forced_seg_prompts, greedy_answers, prompt_embeds,
    seg_answer_ids, segment_texts)

_one_thread = pytest.fixture(autouse=True)(one_thread)


@pytest.fixture(scope="module")
def tiny():
    model, processor = build_tiny()  # LoRA-wrapped LM, as in training
    return model.eval(), processor


@pytest.fixture(scope="module")
def world():
    return ShapesWorld("val", 3, seed=1, image_size=64)


def rows_of(proc, encoded, world):
    """RES rows for images 0 and 1, a region-caption row for image 2."""
    cells = proc.region_cells(world[2].gt_mask, size=encoded.image_sizes[2])  # [g, g]
    return [PromptRow(0, proc.segment_prompt(encoded.n_tiles(0), "the star")),
            PromptRow(1, proc.segment_prompt(encoded.n_tiles(1), "a long blue x")),
            PromptRow(2, proc.caption_prompt(encoded.n_tiles(2), cells), cells)]


def scripted(answers, is_truncated, seen=None):
    """A decoder stand-in that answers every call with the given token rows (no decoder states)."""
    def decode(lm, embeds, attention, **kwargs):
        if seen is not None:
            seen.append((embeds, attention, kwargs))
        T = max(map(len, answers))
        ids = torch.zeros(len(answers), T, dtype=torch.long)
        completion_mask = torch.zeros(len(answers), T, dtype=torch.bool)
        for i, row in enumerate(answers):
            ids[i, :len(row)], completion_mask[i, :len(row)] = torch.tensor(row), True
        return Completions(ids, completion_mask, torch.tensor(is_truncated), torch.zeros(len(answers), T))
    return decode


def seg_bias(model, delta: float):
    """Raise the [SEG] logit by ``delta`` (so that a random model emits it); returns the hook handle."""
    seg = model.seg_token_id

    def hook(module, args, logits):
        bias = torch.zeros(logits.shape[-1], dtype=logits.dtype)
        bias[seg] = delta
        return logits + bias

    return model.language_model.get_output_embeddings().register_forward_hook(hook)


def test_encode_images_runs_each_encoder_once_and_indexes_tiles(tiny, world, monkeypatch):
    model, proc = tiny
    calls = []
    encode_vision, encode_grounding = model.encode_vision, model.encode_grounding
    monkeypatch.setattr(model, "encode_vision", lambda x: calls.append(("vit", len(x))) or encode_vision(x))
    monkeypatch.setattr(model, "encode_grounding", lambda x: calls.append(("sam", len(x))) or encode_grounding(x))
    encoded = encode_images(model, proc, [world[i].image for i in range(3)], ["a", "b", "c"])
    assert calls == [("vit", 3), ("sam", 3)]  # one batched call each (one tile per 64x64 image)
    assert encoded.num_images == 3 and encoded.tile_start == [0, 1, 2, 3] and encoded.image_sizes == [(64, 64)] * 3
    tiles = torch.arange(3.0)[:, None, None].expand(3, 2, 2)
    assert encoded.tiles(tiles, 1).unique().tolist() == [1.0] and encoded.n_tiles(2) == 1
    with pytest.raises(ValueError, match="one name"):
        encode_images(model, proc, [world[0].image], ["a", "b"])


def test_prompt_embeds_fill_image_then_region_tokens(tiny, world):
    model, proc = tiny
    encoded = encode_images(model, proc, [world[0].image], ["a"])
    tiles = model.project_vision(encoded.vit_tokens)  # [1, t, D]
    cells = torch.zeros(2, 8, 8, dtype=torch.bool)
    cells[0, 0, 1] = cells[1, 3, 3] = cells[1, 3, 4] = True  # two regions: 1 and 2 cells
    texts = [proc.template_user_turn(proc.expand_image("<image>x", 1, c)) for c in (None, cells[0], cells)]
    ids, _ = proc.tokenize_prompts(texts)
    embeds = prompt_embeds(model, encoded, tiles, ids, [0, 0, 0], [None, cells[0], cells])  # [g, g] or [N, g, g]
    context = ids == model.img_context_token_id  # [3, L]
    thumb = tiles[0]  # [t, D]
    torch.testing.assert_close(embeds[0][context[0]], thumb, rtol=0, atol=0)
    torch.testing.assert_close(embeds[1][context[1]], torch.cat([thumb, thumb[[1]]]), rtol=0, atol=0)
    torch.testing.assert_close(embeds[2][context[2]], torch.cat([thumb, thumb[[1, 3 * 8 + 3, 3 * 8 + 4]]]),
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match="IMG_CONTEXT"):
        prompt_embeds(model, encoded, tiles, ids[:1], [0], [cells[0]])  # region tokens the prompt has no slots for


def test_greedy_answers_keep_the_fed_back_seg_masks_of_each_rule(tiny, world, monkeypatch):
    """Scripted answers: a [SEG] is masked only when it was fed back; 'first' keeps the first, 'all' every one; the
    mask is h([SEG] input position) of a plain HF forward -> text_hidden_fcs -> SAM2 -> image size."""
    model, proc = tiny
    tok = proc.tokenizer
    seg, eos = model.seg_token_id, tok.eos_token_id
    answers = [tok.encode("It is", add_special_tokens=False) + [seg, 13, seg, eos],  # two fed-back [SEG]
               tok.encode("Sure,", add_special_tokens=False) + [seg],  # [SEG] last: no mask (upstream)
               tok.encode("a red", add_special_tokens=False) + [eos]]  # no [SEG]
    seen = []
    monkeypatch.setitem(fast_generation.DECODE_BACKENDS, "fast", scripted(answers, [False, True, False], seen))
    encoded = encode_images(model, proc, [world[i].image for i in range(3)], ["a", "b", "c"])
    rows = rows_of(proc, encoded, world)
    got = {rule: greedy_answers(model, proc, encoded, rows, max_new_tokens=6, seg_masks=rule)
           for rule in (None, "first", "all")}
    assert [len(a.seg_masks) for a in got["all"]] == [2, 0, 0] and [len(a.seg_masks) for a in got["first"]] == [1, 0, 0]
    assert all(a.seg_masks == [] for a in got[None])
    assert [a.num_seg for a in got[None]] == [2, 0, 0] and [a.is_truncated for a in got[None]] == [False, True, False]
    assert got[None][0].text == tok.decode(answers[0], skip_special_tokens=False).strip()
    assert got[None][0].text.endswith("[SEG]<|im_end|>") and got[None][0].plain.startswith("It is")
    assert "[SEG]" not in got[None][0].plain and got[None][2].plain == "a red"
    assert [a.num_tokens for a in got[None]] == [len(a) for a in answers]
    assert torch.equal(got["first"][0].seg_masks[0], got["all"][0].seg_masks[0])

    embeds, attention = seen[0][2]["prefix"].full_prompts(seen[0][0], seen[0][1])  # [image block | rest] per row
    embeds, attention = embeds[:1], attention[:1]  # row 0's prompt as the decoder received it
    ids = torch.tensor([answers[0]])
    full = torch.cat([attention, torch.ones_like(ids)], 1)
    with torch.no_grad():
        h = model.language_model(inputs_embeds=torch.cat([embeds, model.get_input_embeddings()(ids)], 1),
                                 attention_mask=full, position_ids=position_ids_from_attention(full),
                                 output_hidden_states=True).hidden_states[-1][0]  # [L + T, D]
        L = embeds.shape[1]
        prompt = model.seg_hidden_to_prompt(h[[L + t for t, token in enumerate(answers[0][:-1]) if token == seg]])
        best = model.decode_masks(prompt, encoded.grounding, torch.zeros(2, dtype=torch.long)).best_logits
    for ours, theirs in zip(got["all"][0].seg_masks, model.logits_to_masks(best, [(64, 64)] * 2)):
        assert ours.dtype == torch.bool and torch.equal(ours, theirs)
    with pytest.raises(ValueError, match="seg_masks='union'"):
        greedy_answers(model, proc, encoded, rows, max_new_tokens=2, seg_masks="union")


def test_seg_states_come_from_the_decode_and_equal_the_teacher_forced_ones(tiny, world, monkeypatch):
    """The [SEG] states are the decoder's own (no second pass over prompt + answer), and give the masks of the
    teacher-forced recompute (``use_decoder_states=False``, and the fallback of a decoder without states)."""
    model, proc = tiny
    handle = seg_bias(model, 1e4)  # every answer is [SEG] [SEG] ...: the first one is fed back
    try:
        encoded = encode_images(model, proc, [world[i].image for i in range(3)], ["a", "b", "c"])
        rows = rows_of(proc, encoded, world)

        def answer(**kwargs):
            return greedy_answers(model, proc, encoded, rows, max_new_tokens=3, seg_masks="first", **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(shared, "completion_hidden", lambda *a, **k: (_ for _ in ()).throw(AssertionError("re-ran")))
            from_decode = answer()
        recomputed = answer(use_decoder_states=False)
    finally:
        handle.remove()
    assert all(a.num_seg == 2 and len(a.seg_masks) == 1 for a in from_decode)
    for a, b in zip(from_decode, recomputed):
        assert torch.equal(a.seg_masks[0], b.seg_masks[0])


def test_chunked_answers_equal_one_call(tiny, world):
    model, proc = tiny
    handle = seg_bias(model, 0.6)  # some answers hold [SEG], some do not
    try:
        encoded = encode_images(model, proc, [world[i].image for i in range(3)], ["a", "b", "c"])
        rows = rows_of(proc, encoded, world)
        whole, chunked = (greedy_answers(model, proc, encoded, rows, max_new_tokens=6, seg_masks="all",
                                         chunk_size=size) for size in (None, 2))
    finally:
        handle.remove()
    assert [a.text for a in whole] == [a.text for a in chunked] and sum(a.num_seg for a in whole) > 0
    for a, b in zip(whole, chunked):
        assert len(a.seg_masks) == len(b.seg_masks) and all(torch.equal(x, y) for x, y in zip(a.seg_masks, b.seg_masks))


def test_greedy_answers_fast_backend_equals_reference(tiny, world):
    model, proc = tiny
    encoded = encode_images(model, proc, [world[i].image for i in range(3)], ["a", "b", "c"])
    rows = rows_of(proc, encoded, world)
    got = {backend: greedy_answers(model, proc, encoded, rows, max_new_tokens=5, seg_masks="first",
                                   decoding=TextDecoding.from_processor(proc, backend))
           for backend in ("fast", "reference")}
    assert [a.text for a in got["fast"]] == [a.text for a in got["reference"]]
    assert [a.num_tokens for a in got["fast"]] == [a.num_tokens for a in got["reference"]] != [0, 0, 0]
    with pytest.raises(ValueError, match="decode_backend='hf'"):
        TextDecoding.from_processor(proc, "hf")


@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_rows_about_one_image_share_its_prefilled_image_block(tiny, world, backend):
    """prefill_by_image: each image's block (template header, <img>, image tokens) is prefilled once for all its rows
    and each row's rest (</img>, region tokens, question) continues from it; same greedy answers and masks as
    prefilling every row whole."""
    model, proc = tiny
    handle = seg_bias(model, 0.6)  # some answers hold [SEG], some do not
    seen = []
    hook = model.language_model.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(tuple(kwargs["inputs_embeds"].shape[:2])), with_kwargs=True)
    try:
        encoded = encode_images(model, proc, [world[i].image for i in range(3)], ["a", "b", "c"])
        cells = proc.region_cells(world[1].gt_mask, size=encoded.image_sizes[1])
        rows = rows_of(proc, encoded, world) + [
            PromptRow(0, proc.segment_prompt(encoded.n_tiles(0), "a red thing")),
            PromptRow(2, proc.segment_prompt(encoded.n_tiles(2), "the dot")),
            PromptRow(1, proc.caption_prompt(encoded.n_tiles(1), cells), cells)]  # images 0, 1, 2, 0, 2, 1
        got, prefills = {}, {}
        for by_image in (False, True):
            seen.clear()
            got[by_image] = greedy_answers(model, proc, encoded, rows, max_new_tokens=6, seg_masks="all",
                                           decoding=TextDecoding.from_processor(proc, backend),
                                           prefill_by_image=by_image)
            prefills[by_image] = list(seen)
    finally:
        handle.remove()
        hook.remove()
    whole, shared = got[False], got[True]
    assert [a.text for a in shared] == [a.text for a in whole] and sum(a.num_seg for a in whole) > 0
    for a, b in zip(whole, shared):
        assert len(a.seg_masks) == len(b.seg_masks) and all(torch.equal(x, y) for x, y in zip(a.seg_masks, b.seg_masks))
    (n, L) = prefills[False][0]
    image_tokens = encoded.n_tiles(0) * model.num_image_token
    if backend == "fast":  # 3 image blocks, then the 6 rows' rests
        (U, P), (n_rest, S) = prefills[True][:2]
        assert (n, U, n_rest) == (6, 3, 6) and image_tokens < P < L and P + S == L
    else:  # the reference decoder is given the joined prompts
        assert prefills[True][0] == (6, L)


def test_forced_seg_prompts_equal_a_plain_forward_and_carry_grad(tiny, world):
    model, proc = tiny
    encoded = encode_images(model, proc, [world[0].image, world[1].image], ["a", "b"])
    answer_ids, seg_index = seg_answer_ids(proc.tokenizer, "Sure, [SEG].", model.seg_token_id)
    ids, attention = proc.tokenize_prompts([proc.segment_prompt(1, "the star"), proc.segment_prompt(1, "x y z")])
    tiles = model.project_vision(encoded.vit_tokens)  # with grad through mlp1
    embeds = prompt_embeds(model, encoded, tiles, ids, [0, 1])
    forced = answer_ids[None].expand(2, -1)  # [2, A]
    seg_prompt = forced_seg_prompts(model, embeds, attention, forced, torch.full((2,), seg_index))  # [2, C_sam]
    full = torch.cat([attention.long(), torch.ones_like(forced)], 1)
    h = model.language_model(inputs_embeds=torch.cat([embeds, model.get_input_embeddings()(forced)], 1),
                             attention_mask=full, position_ids=position_ids_from_attention(full),
                             output_hidden_states=True).hidden_states[-1]  # [2, L + A, D]
    torch.testing.assert_close(seg_prompt, model.seg_hidden_to_prompt(h[:, ids.shape[1] + seg_index]))
    seg_prompt.sum().backward()
    assert model.mlp1[1].weight.grad.abs().sum() > 0 and model.text_hidden_fcs[0].weight.grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)
    for bad, count in (("Sure.", 0), ("[SEG] and [SEG].", 2)):
        with pytest.raises(ValueError, match=re.escape(f"seg_answer={bad!r} holds {count}")):
            seg_answer_ids(proc.tokenizer, bad, model.seg_token_id)


def test_forced_answer_masks_are_the_forced_seg_prompts_decoded(tiny, world):
    """The one "forced answer → SAM2 mask" composition (the GRPO loops' dense loss and prompt_rl both run it) equals
    prompt_embeds → forced_seg_prompts → decode_masks written out, bit for bit."""
    model, proc = tiny
    encoded = encode_images(model, proc, [world[0].image, world[1].image], ["a", "b"])
    answer_ids, seg_index = seg_answer_ids(proc.tokenizer, "Sure, [SEG].", model.seg_token_id)
    ids, attention = proc.tokenize_prompts([proc.segment_prompt(1, "the star"), proc.segment_prompt(1, "x y z"),
                                            proc.segment_prompt(1, "a b")])
    with torch.no_grad():
        tiles = model.project_vision(encoded.vit_tokens)
        out = forced_answer_masks(model, encoded, tiles, ids, attention, [1, 0, 1], answer_ids, seg_index)
        embeds = prompt_embeds(model, encoded, tiles, ids, [1, 0, 1])
        prompts = forced_seg_prompts(model, embeds, attention, answer_ids[None].expand(3, -1),
                                     torch.full((3,), seg_index))
        expected = model.decode_masks(prompts, encoded.grounding, torch.tensor([1, 0, 1]))
    for name in ("low_res_logits", "iou_scores", "best_index", "best_logits"):
        assert torch.equal(getattr(out, name), getattr(expected, name)), name


def test_partner_tasks_equal_greedy_answers_of_their_prompt_rows(tiny, world):
    """segment_texts / describe_masks (the GRPO partner and the evaluation's cycle tasks both run them) are the greedy
    answers of the RES / region-caption rows of their non-empty inputs, in order, with None for an empty text or
    mask."""
    model, proc = tiny
    encoded = encode_images(model, proc, [world[i].image for i in range(3)], ["a", "b", "c"])
    handle = seg_bias(model, 30.0)  # a random model emits [SEG] only when pushed
    try:
        texts = ["the star", "", "a long blue x"]
        answers = segment_texts(model, proc, encoded, texts, [2, 0, 1], max_new_tokens=4, seg_masks="all",
                                question="Where is {class_name}?")
        rows = [PromptRow(2, proc.segment_prompt(encoded.n_tiles(2), "the star", "Where is {class_name}?")),
                PromptRow(1, proc.segment_prompt(encoded.n_tiles(1), "a long blue x", "Where is {class_name}?"))]
        expected = greedy_answers(model, proc, encoded, rows, max_new_tokens=4, seg_masks="all")
    finally:
        handle.remove()
    assert answers[1] is None and [a.text for a in (answers[0], answers[2])] == [a.text for a in expected]
    assert any(a.seg_masks for a in expected)
    for ours, theirs in zip((answers[0], answers[2]), expected):
        assert len(ours.seg_masks) == len(theirs.seg_masks)
        assert all(torch.equal(x, y) for x, y in zip(ours.seg_masks, theirs.seg_masks))
    masks = [world[0].gt_mask, None, torch.zeros(64, 64, dtype=torch.bool), world[2].gt_mask]
    described = describe_masks(model, proc, encoded, masks, [0, 1, 1, 2], ["s0", "s1", "s2", "s3"], max_new_tokens=5,
                               empty_region="dilate_to_one_cell")
    cells = [proc.region_cells(world[i].gt_mask, size=encoded.image_sizes[i], empty_region="dilate_to_one_cell")
             for i in (0, 2)]
    expected = greedy_answers(model, proc, encoded, [PromptRow(i, proc.caption_prompt(encoded.n_tiles(i), c), c)
                                                     for i, c in zip((0, 2), cells)], max_new_tokens=5)
    assert described[1] is None and described[2] is None
    assert [d.answer.text for d in (described[0], described[3])] == [a.text for a in expected]
    assert all(torch.equal(d.region_cells, c) for d, c in zip((described[0], described[3]), cells))


def test_text_helpers_cut_stop_words_and_clean_answers(tiny):
    """A multi-token stop word cuts the answer; the prompt-ready text drops it (and tags), the upstream prediction
    keeps it; only [SEG] tokens followed by another token count as fed back."""
    _, proc = tiny
    tok = proc.tokenizer
    decoding = TextDecoding(tok, (tok.eos_token_id,), ("<|end|>",), tok.pad_token_id)
    row0 = tok.encode("It is red.<|end|>\nmore words", add_special_tokens=False)
    row1 = tok.encode("no stop here", add_special_tokens=False)
    T = max(len(row0), len(row1))
    ids = torch.full((2, T), tok.pad_token_id)
    completion_mask = torch.zeros(2, T, dtype=torch.bool)
    for i, row in enumerate([row0, row1]):
        ids[i, :len(row)], completion_mask[i, :len(row)] = torch.tensor(row), True
    out = cut_at_stop_words(Completions(ids, completion_mask, torch.tensor([True, True]), torch.zeros(2, T)),
                            decoding)
    kept = out.completion_mask.sum(-1).tolist()
    assert tok.decode(ids[0, :kept[0]]).replace("\n", "").endswith("<|end|>") and kept[1] == len(row1)
    assert not tok.decode(ids[0, :kept[0] - 1]).replace("\n", "").endswith("<|end|>")
    assert out.is_truncated.tolist() == [False, True]  # the stop word ended row 0; row 1 ran out of tokens
    assert out.completion_mask[0, kept[0]:].any().item() is False
    assert completion_texts(out, decoding) == ["It is red.", "no stop here"]  # the stop word is not caption text
    assert answer_texts(out, decoding)[0].endswith("It is red.<|end|>")
    assert clean_text("a [SEG] <image>\n b<IMG_CONTEXT>  c</img>") == "a b c"
    seg = tok.convert_tokens_to_ids("[SEG]")
    positions = fed_back_seg_positions(Completions(torch.tensor([[5, seg, seg, 7], [seg, 5, 5, 5]]),
                                                   torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]).bool(),
                                                   torch.zeros(2, dtype=torch.bool), torch.zeros(2, 4)), seg)
    assert positions == [[1], []]  # row 0's second [SEG] is its last token; row 1 has one token
