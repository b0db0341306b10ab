"""model/pipeline/inference.py (predict / predict_batch) and the decoding helpers of model/decoding/text_decoding.py on the tiny Sa2VA."""
import numpy as np
import pytest
import torch
from PIL import Image

from projects.llava_sam2.rl_train.model.decoding import fast_generation
from projects.llava_sam2.rl_train.model.decoding.generation import Completions, position_ids_from_attention
from projects.llava_sam2.rl_train.model.decoding.text_decoding import eval_mode, stop_criteria, textual_stop_length
from projects.llava_sam2.rl_train.model.pipeline.inference import predict, predict_batch


@pytest.fixture(scope="module")
def tiny():
    from projects.llava_sam2.rl_train.model.network.presets import build_preset
    from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel
    from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor
    from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

    tok = load_tiny_tokenizer()
    torch.manual_seed(0)
    model = Sa2VAModel(build_preset("tiny", vocab_size=len(tok)))
    model.bind_tokenizer(tok)
    return model, Sa2VAProcessor.from_config(tok, model.config)


def _image(seed, size=(36, 50)):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8))


def test_stop_criteria_split_single_and_multi_token_words(tiny):
    _, proc = tiny
    tok = proc.tokenizer
    ids, words = stop_criteria(tok, ["<|im_end|>", "<|endoftext|>"])
    assert ids == sorted({tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")}) and words == []
    ids, words = stop_criteria(tok, ["<|end|>"])  # phi3_chat's stop word is plain text for Qwen
    assert ids == [tok.eos_token_id] and words == ["<|end|>"]
    seq = tok.encode("It is [SEG].<|end|>\nmore words", add_special_tokens=False)
    n = textual_stop_length(tok, seq, words)
    def text(k):  # upstream compares the decoded tail with '\r' and '\n' removed
        return tok.decode(seq[:k]).replace("\n", "")

    assert text(n).endswith("<|end|>") and not text(n - 1).endswith("<|end|>")
    assert textual_stop_length(tok, seq[:3], words) == 3  # no stop word: keep everything


def test_eval_mode_restores_each_module_flag(tiny):
    model, _ = tiny
    model.train()
    model.vision_model.eval()
    with pytest.raises(RuntimeError):
        with eval_mode(model):
            assert not model.training and not model.language_model.training
            raise RuntimeError("boom")
    assert model.training and model.language_model.training and not model.vision_model.training
    model.eval()


def test_scripted_answer_gives_one_mask_per_fed_back_seg(tiny, monkeypatch):
    model, proc = tiny
    tok = proc.tokenizer
    seg, eos = model.seg_token_id, tok.eos_token_id
    row0 = tok.encode("It is", add_special_tokens=False) + [seg, 13, seg, eos]  # two [SEG], then EOS
    row1 = tok.encode("Sure,", add_special_tokens=False) + [seg]  # truncated with [SEG] as last token
    T = max(len(row0), len(row1))
    ids = torch.zeros(2, T, dtype=torch.long)
    completion_mask = torch.zeros(2, T, dtype=torch.bool)
    for i, row in enumerate([row0, row1]):
        ids[i, :len(row)] = torch.tensor(row)
        completion_mask[i, :len(row)] = True
    seen = {}

    def scripted(lm, embeds, attention, **kwargs):
        seen.update(embeds=embeds, attention=attention, kwargs=kwargs)
        return Completions(ids, completion_mask, torch.tensor([False, True]), torch.zeros(2, T))

    monkeypatch.setitem(fast_generation.DECODE_BACKENDS, "reference", scripted)
    images = [_image(1), _image(2, (30, 30))]
    texts = ["<image>\nPlease segment the cat.", "<image>\nWhere?"]
    out = predict_batch(model, proc, images, texts, max_new_tokens=7)
    assert seen["kwargs"]["do_sample"] is False and eos in seen["kwargs"]["stop_token_ids"]
    assert out[0]["prediction"] == tok.decode(row0, skip_special_tokens=False).strip()
    assert out[0]["prediction"].endswith("[SEG]<|im_end|>")
    assert len(out[0]["prediction_masks"]) == 2 and out[1]["prediction_masks"] == []
    for m in out[0]["prediction_masks"]:
        assert m.dtype == bool and m.shape == (36, 50)

    # reference: HF forward over prompt + answer, hidden at the [SEG] input positions; the decoder got each row's
    # image block as a shared prefix and the rest of the prompt as its rows
    embeds, attention = seen["kwargs"]["prefix"].full_prompts(seen["embeds"], seen["attention"])
    L = embeds.shape[1]
    with torch.no_grad():
        full_attention = torch.cat([attention[:1], completion_mask[:1].long()], 1)
        h = model.language_model(
            inputs_embeds=torch.cat([embeds[:1], model.get_input_embeddings()(ids[:1])], 1),
            attention_mask=full_attention, position_ids=position_ids_from_attention(full_attention),
            output_hidden_states=True).hidden_states[-1][0]
        positions = [L + t for t, token in enumerate(row0[:-1]) if token == seg]
        features = model.encode_grounding(torch.stack([proc.preprocess_image(images[0]).g_pixel_values]))
        best = model.decode_masks(model.seg_hidden_to_prompt(h[positions]), features, torch.zeros(2)).best_logits
        expected = model.logits_to_masks(best, [(36, 50)] * 2)
    for got, want in zip(out[0]["prediction_masks"], expected):
        assert np.array_equal(got, want.numpy())


def test_real_greedy_predict_and_batch_agree(tiny):
    model, proc = tiny
    image = _image(3)
    region = np.zeros((36, 50), dtype=bool)
    region[4:30, 6:40] = True
    single = predict(model, proc, image, "<image>\nPlease describe region1.", region_mask=region, max_new_tokens=6)
    plain = predict(model, proc, _image(4), "<image>\nPlease segment the dog.", max_new_tokens=6)
    batch = predict_batch(model, proc, [image, _image(4)],
                          ["<image>\nPlease describe region1.", "<image>\nPlease segment the dog."],
                          [region, None], max_new_tokens=6)
    assert isinstance(single["prediction"], str) and single["prediction"]
    assert batch[0]["prediction"] == single["prediction"] and batch[1]["prediction"] == plain["prediction"]
    assert len(batch[1]["prediction_masks"]) == len(plain["prediction_masks"])


def test_bad_inputs_name_the_problem(tiny):
    model, proc = tiny
    with pytest.raises(ValueError, match="<image>"):
        predict(model, proc, _image(5), "no placeholder here", max_new_tokens=2)
    with pytest.raises(ValueError, match="one per sample"):
        predict_batch(model, proc, [_image(5)], ["<image>a", "<image>b"], max_new_tokens=2)
    with pytest.raises(ValueError, match="region_mask must be"):
        predict(model, proc, _image(5), "<image>x", region_mask=np.zeros((1, 1, 36, 50), bool), max_new_tokens=2)
