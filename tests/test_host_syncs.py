"""benchmarks/host_syncs.py: the CPU counter of calls that make the host wait for the accelerator, and the step's
hot paths that no longer make such calls (per-sample image rows, the dapo token counts, the image-token fill)."""
from __future__ import annotations

import os
import sys

import pytest
import torch

from grpo_tiny import build_tiny, make_algo, one_thread, run_rollout, shapes_batch, step_loss
from projects.llava_sam2.rl_train.benchmarks.host_syncs import HostSyncCounter, mark_host

_one_thread = pytest.fixture(autouse=True)(one_thread)


def kinds(syncs: HostSyncCounter) -> dict[str, int]:
    out: dict[str, int] = {}
    for (_, kind, _), n in syncs.counts.items():
        out[kind] = out.get(kind, 0) + n
    return out


def test_counter_sees_each_host_read_with_its_location_and_phase():
    x, mask = torch.arange(6.0), torch.tensor([True, False] * 3)
    phase = ["a"]
    with HostSyncCounter(phase=lambda: phase[0]) as syncs:
        line = sys._getframe().f_lineno + 1
        x.sum().item(), x.tolist(), int(x[1]), float(x[2]), [0, 1, 2][torch.tensor(1, device=x.device)], f"{x[0]:.1f}"
        if mask.any():  # a tensor in a Python condition
            pass
        x[mask], torch.nonzero(mask), x.masked_select(mask), torch.unique(x), torch.equal(x, x)
        torch.repeat_interleave(x, torch.full((6,), 2))
        phase[0] = "b"
        x.cpu(), x.numpy(), x.to("cpu"), torch.tensor([1, 2], device=x.device)
        y = x.clone()
        y[mask] = 0.0
        # none of these reads a device value on the host
        torch.where(mask, x, 0.0), x * mask, x.sum(), x[1:3], x[torch.tensor([0, 2])]
        torch.repeat_interleave(x, torch.full((6,), 2), output_size=12), torch.repeat_interleave(x, 2)
        x.new_zeros(3).masked_scatter(mask[:3], x)
        # host-side tensors (made on the host inside the block, moved there, or marked) wait for nothing; moving
        # x there is a read of the device (cpu: 2), copying one to the device blocks (to_device)
        host, moved, marked = torch.arange(4), x.cpu(), torch.ones(2)
        mark_host(marked)
        host.tolist(), bool(host[moved[:4] > 1].sum()), marked.sum().item()
        host.to(x.device, non_blocking=True), host.to(x.device)  # an asynchronous copy; a blocking one counts
    assert kinds(syncs) == {"item": 1, "tolist": 1, "int": 1, "float": 1, "index": 1, "format": 1, "bool": 1,
                            "mask_index": 1, "nonzero": 1, "masked_select": 1, "unique": 1, "equal": 1,
                            "repeat_interleave": 1, "cpu": 2, "numpy": 1, "to_cpu": 1, "new_tensor_on_device": 2,
                            "mask_assign": 1, "to_device": 1}
    assert syncs.by_phase() == {"a": 14, "b": 7}
    with HostSyncCounter(kinds={"to_device"}) as copies:
        torch.arange(3).to(x.device), torch.arange(3).to(x.device, non_blocking=True), x.to(x.device)
    assert copies.total() == 1
    assert all(loc.startswith("tests/test_host_syncs.py:") and loc.endswith(" test_counter_sees_each_host_read_"
                                                                           "with_its_location_and_phase")
               for _, _, loc in syncs.counts)
    assert syncs.total(where=f"test_host_syncs.py:{line} ") == 7  # one line, seven waits
    assert "TOTAL" in syncs.table()


@pytest.fixture(scope="module")
def step():
    """A tiny two-loop step (encode, rollout, scoring, advantages) and its algo."""
    torch.manual_seed(0)
    model, processor = build_tiny()
    algo, _ = make_algo(model, processor, {"mask_to_caption": [dict(type="iou")],
                                           "caption_to_mask": [dict(type="iou")]})
    return model, algo, run_rollout(algo, shapes_batch(3))


def test_image_rows_are_read_on_the_host(step):
    """Per-sample image rows come from the host copy made at encode time: no device read per lookup, in a loop's
    share (``select``) either."""
    _, _, advantaged = step
    features = advantaged.features
    with HostSyncCounter() as syncs:
        rows = [features.image_of(b) for b in range(features.num_samples)]
        share = features.select([2, 0])
        share_rows = [share.image_of(b) for b in range(share.num_samples)]
    assert rows == features.image_index.tolist() and share_rows == share.image_index.tolist() == [rows[2], rows[0]]
    assert syncs.total() == 0, syncs.table()


def test_minibatches_read_the_token_counts_once(step):
    """dapo's normaliser: the active-element counts of every loop come to the host in one read, not one per loop."""
    _, algo, advantaged = step
    with HostSyncCounter() as syncs:
        minibatches = list(algo.minibatches(advantaged))
    assert syncs.total() == 1, syncs.table()
    (minibatch,) = minibatches  # one chunk per loop: the normaliser is the loop's active-element count
    for part in minibatch.parts:
        assert part.num_active_tokens == float(part.rollout.action_mask.sum())


def test_loss_pass_makes_no_avoidable_host_reads(step):
    """The loss pass (minibatches, re-scoring, backward) reads no image rows and fills the image tokens without a
    boolean-mask assignment."""
    model, algo, advantaged = step
    with HostSyncCounter() as syncs:
        step_loss(algo, model, advantaged)
    assert syncs.total(where="image_of") == 0 and syncs.total(where="_active_tokens") == 0, syncs.table()
    assert kinds(syncs).get("mask_assign", 0) == 0, syncs.table()


def test_embed_inputs_fill_matches_mask_assignment_and_reads_once(step):
    """The image-token fill (a masked scatter) gives the values and gradients of the boolean-mask assignment; its
    one host read is the count check (which raises on a mismatch)."""
    model = step[0]
    ctx = model.img_context_token_id
    ids = torch.tensor([[5, ctx, ctx, 7, ctx], [ctx, 9, 9, 9, 9]])
    D = model.get_input_embeddings().weight.shape[1]
    fills = [torch.randn(3, D, requires_grad=True), torch.randn(1, D, requires_grad=True)]
    with HostSyncCounter() as syncs:
        embeds = model.embed_inputs(ids, fills)
    assert syncs.total() == 1 and kinds(syncs) == {"tolist": 1}, syncs.table()
    expected = model.get_input_embeddings()(ids).clone()
    expected[ids == ctx] = torch.cat(fills)
    assert torch.equal(embeds, expected)
    weights = torch.randn_like(embeds)
    got = torch.autograd.grad((embeds * weights).sum(), fills)
    want = torch.autograd.grad((expected * weights).sum(), fills)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_region_tokens_gather_once_from_host_cells(step):
    """Region tokens: one gather at positions found on the host cells (no boolean-mask read of the device per
    region). Values equal the per-region masked rows; gradients too for one
    region (a loop-1 prompt's case), and up to the summation order where several regions share cells."""
    model = step[0]
    g, t, D = model.config.region_grid_size, model.num_image_token, model.get_input_embeddings().weight.shape[1]
    tiles = torch.randn(2, t, D, requires_grad=True)
    generator = torch.Generator().manual_seed(0)
    for n, exact in ((1, True), (3, False)):
        cells = torch.rand(n, g, g, generator=generator) < 0.5  # overlapping regions when n > 1
        mark_host(cells)  # as the step's region cells
        with HostSyncCounter() as syncs:
            embeds = model.build_image_embeds(tiles, cells)
        assert syncs.total() == 0, syncs.table()
        expected = torch.cat([tiles.reshape(-1, D), *(tiles[-1][row] for row in cells.reshape(n, g * g))])
        assert torch.equal(embeds, expected)
        weights = torch.randn_like(embeds)
        (got,) = torch.autograd.grad((embeds * weights).sum(), tiles)
        (want,) = torch.autograd.grad((expected * weights).sum(), tiles)
        assert torch.equal(got, want) if exact else torch.allclose(got, want, rtol=0, atol=1e-5)


# every function of the tiny rollout that still waits for the device, each one needed or outside this project
# (docs/speed.md, "Host synchronisations of the step"), as "file function"; a wait elsewhere fails the test below
ROLLOUT_WAITS = {
    "sa2va.py embed_inputs",  # the image-token count check
    "generation.py _check_prompt", "masking_utils.py _ignore_causal_mask_sdpa",  # left-padding checks
    "grounding.py decode",  # the SAM2 row range check
    "cycle.py grouped_mask_head",  # the rows' image sizes for the mask chain
    "text_decoding.py host_completions", "shared.py to_host",  # sampled ids and masks to the host, one read each
    "fast_generation.py fast_sample_completions", "fast_generation.py _completions",  # the stop check, the length
    "shared.py image_prefix_prompts",  # a small tensor made on the device
    "cache_utils.py lazy_initialization",  # empty tensors: no copy
    "trainer.py _with_caption_prefix",  # both loops' prompt ids, once, for the joint scoring pass
}


def test_rollout_reads_the_device_only_where_needed(step):
    """Both loops' rollout: per-sample image rows, caption texts, answer lengths, ``[SEG]`` positions and masks
    cost no read each, and the host-built prompts go to the device without a blocking copy; what remains is
    :data:`ROLLOUT_WAITS`."""
    _, algo, advantaged = step
    features = advantaged.features
    mark_host(features.region_cells, *features.gt_masks)  # host tensors in a real step too
    with HostSyncCounter() as syncs:
        algo.rollout(features)
    functions = {f"{os.path.basename(place.split(':')[0])} {place.rsplit(' ', 1)[1]}" for _, _, place in syncs.counts}
    assert functions <= ROLLOUT_WAITS, syncs.table()
    assert syncs.total(where="host_completions") <= 3 and syncs.total(where="to_host") <= 1, syncs.table()


def test_grounding_decode_checks_the_rows_in_one_read(step):
    model = step[0]
    features = model.encode_grounding(torch.rand(2, 3, 256, 256) * 255)
    prompt, rows = torch.randn(3, features.image_embed.shape[1]), torch.tensor([0, 1, 1])  # [M, C]
    with HostSyncCounter() as syncs:
        model.decode_masks(prompt, features, rows)
    assert syncs.total() == 1, syncs.table()
    with pytest.raises(ValueError, match=r"image_index \[0, 2\] out of range for 2 images"):
        model.decode_masks(prompt[:2], features, torch.tensor([0, 2]))
