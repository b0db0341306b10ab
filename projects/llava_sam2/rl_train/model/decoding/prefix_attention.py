"""One-query decode attention over a prompt cache shared by G rows: two Triton kernels.

In a GRPO rollout the N = B·G rows of a decode call are G samples of each of B prompts: their keys/values are the
prompt's ``L`` slots (the same for the G rows) followed by each row's own new tokens. A plain decode attention reads
``N · S`` key/value slots per layer and step (4b preset, N = 64, L = 1,850: 4.7 GB a step, ~1.9 ms of an H100). Here a
prompt's slots are read once for its G rows:

* ``prefix_partials`` — program (prompt b, KV head h, key split s): the G·r queries of b's rows on head h (r = H / Hkv
  query heads per KV head) against keys ``[s·K, (s+1)·K)`` of b's prompt, as one ``[G·r, hd] × [hd, K]`` product. It
  leaves, per query, the split's running maximum ``m_s``, sum ``l_s = Σ e^{x - m_s}`` and unnormalised output
  ``a_s = Σ e^{x - m_s} v`` (flash-decoding's split-K over the prompt: B·Hkv programs alone would leave most of the GPU
  idle).
* ``tail_and_merge`` — program (row n, KV head h): its r queries against the row's own slots (the tokens generated so
  far; blocks past the step's last written slot are skipped), then the prompt splits of its rows folded in:
  ``m = max(m_tail, m_s)``, ``out = (a_tail e^{m_tail - m} + Σ_s a_s e^{m_s - m}) / (l_tail e^{m_tail - m} + Σ_s l_s
  e^{m_s - m})``, the same softmax as one pass over all S slots.

Scores, maxima and sums are fp32; the weights are rounded to the value dtype before the value product (as a fused
attention kernel does, and as :class:`decode_plan.SplitPromptCache`'s torch path does). The additive attention bias
(0 visible, a large negative number hidden) is read per key, so left padding of the prompts and not-yet-written tail
slots are masked as in the full-cache path. Both kernels read only tensors allocated before a decode loop plus their
scratch outputs, so they can be captured into a CUDA graph.

On CPU tensors the same kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, numpy): that is how the tests
check them against the torch path without a GPU.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the CUDA torch wheels ship Triton; a CPU-only torch may not
    triton = tl = None

BLOCK_KEYS = 64  # keys per inner iteration of both kernels
MIN_DOT_ROWS = 16  # tl.dot needs sizes of at least 16: query rows and head dims are padded up to it
# prompt splits are chosen so that the prefix kernel has about this many programs per SM; with the launch options,
# the fastest of research/prefix_attention_tune.py's 36 settings on an H100 (19.2 us a call at the 4b shape; 2 per
# SM: 22.3, 4: 32.0; SDPA on the full rows: 47.5)
PROGRAMS_PER_SM = 1
LAUNCH = dict(prefix_warps=4, tail_warps=4, stages=3)


def _prefix_partials(query, keys, values, bias, out_acc, out_max, out_sum,
                     stride_qn, stride_qh, stride_kb, stride_kh, stride_kl, stride_vb, stride_vh, stride_vl,
                     stride_bias_b, stride_an, stride_am, stride_mn,
                     prompt_len, scale,
                     G: tl.constexpr, R: tl.constexpr, HKV: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCKS_PER_SPLIT: tl.constexpr):
    prompt_head = tl.program_id(0)
    split = tl.program_id(1)
    b = prompt_head // HKV
    h = prompt_head % HKV
    m = tl.arange(0, BLOCK_M)  # query index g·R + i: sample g of prompt b, query head h·R + i
    m_valid = m < G * R
    d = tl.arange(0, BLOCK_D)  # head dims, padded to a tl.dot size
    d_valid = d < HEAD_DIM
    q_rows = (b * G + m // R) * stride_qn + (h * R + m % R) * stride_qh
    q = tl.load(query + q_rows[:, None] + d[None, :], mask=m_valid[:, None] & d_valid[None, :], other=0.0)
    run_max = tl.full([BLOCK_M], -1.0e30, tl.float32)
    run_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    first = split * BLOCKS_PER_SPLIT * BLOCK_N
    for block in range(BLOCKS_PER_SPLIT):
        n = first + block * BLOCK_N + tl.arange(0, BLOCK_N)
        n_valid = n < prompt_len
        k = tl.load(keys + b * stride_kb + h * stride_kh + n[:, None] * stride_kl + d[None, :],
                    mask=n_valid[:, None] & d_valid[None, :], other=0.0)
        scores = tl.dot(q, tl.trans(k)) * scale  # [BLOCK_M, BLOCK_N] fp32
        key_bias = tl.load(bias + b * stride_bias_b + n, mask=n_valid, other=0.0).to(tl.float32)
        scores = tl.where(n_valid[None, :], scores + key_bias[None, :], float("-inf"))
        new_max = tl.maximum(run_max, tl.max(scores, 1))
        weights = tl.exp(scores - new_max[:, None])
        rescale = tl.exp(run_max - new_max)
        v = tl.load(values + b * stride_vb + h * stride_vh + n[:, None] * stride_vl + d[None, :],
                    mask=n_valid[:, None] & d_valid[None, :], other=0.0)
        run_sum = run_sum * rescale + tl.sum(weights, 1)
        acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v)
        run_max = new_max
    slot = prompt_head * stride_an + split * stride_am
    tl.store(out_acc + slot + m[:, None] * BLOCK_D + d[None, :], acc, mask=m_valid[:, None])
    stat = prompt_head * stride_mn + split * BLOCK_M + m
    tl.store(out_max + stat, run_max, mask=m_valid)
    tl.store(out_sum + stat, run_sum, mask=m_valid)


def _tail_and_merge(query, keys, values, bias, part_acc, part_max, part_sum, out,
                    stride_qn, stride_qh, stride_kn, stride_kh, stride_kl, stride_vn, stride_vh, stride_vl,
                    stride_bias_n, stride_an, stride_am, stride_mn, stride_on, stride_oh,
                    tail_len, visible_tail, num_splits, scale,
                    G: tl.constexpr, R: tl.constexpr, HKV: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    TAIL_BLOCKS: tl.constexpr, MAX_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr):
    row_head = tl.program_id(0)
    n = row_head // HKV
    h = row_head % HKV
    i = tl.arange(0, BLOCK_R)  # query head h·R + i of row n
    i_valid = i < R
    d = tl.arange(0, BLOCK_D)  # head dims, padded to a tl.dot size
    d_valid = d < HEAD_DIM
    q = tl.load(query + n * stride_qn + (h * R + i)[:, None] * stride_qh + d[None, :],
                mask=i_valid[:, None] & d_valid[None, :], other=0.0)
    run_max = tl.full([BLOCK_R], -1.0e30, tl.float32)
    run_sum = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    # blocks from the visible bound on hold only unwritten slots: they are skipped, not read and masked (a fixed loop
    # with a runtime test, not a runtime trip count: the CPU interpreter cannot run the latter)
    visible = tl.load(visible_tail)
    for block in range(TAIL_BLOCKS):
        if block * BLOCK_N < visible:
            j = block * BLOCK_N + tl.arange(0, BLOCK_N)
            j_valid = j < tail_len
            k = tl.load(keys + n * stride_kn + h * stride_kh + j[:, None] * stride_kl + d[None, :],
                        mask=j_valid[:, None] & d_valid[None, :], other=0.0)
            scores = tl.dot(q, tl.trans(k)) * scale
            key_bias = tl.load(bias + n * stride_bias_n + j, mask=j_valid, other=0.0).to(tl.float32)
            scores = tl.where(j_valid[None, :], scores + key_bias[None, :], float("-inf"))
            new_max = tl.maximum(run_max, tl.max(scores, 1))
            weights = tl.exp(scores - new_max[:, None])
            rescale = tl.exp(run_max - new_max)
            v = tl.load(values + n * stride_vn + h * stride_vh + j[:, None] * stride_vl + d[None, :],
                        mask=j_valid[:, None] & d_valid[None, :], other=0.0)
            run_sum = run_sum * rescale + tl.sum(weights, 1)
            acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v)
            run_max = new_max
    prompt_head = (n // G) * HKV + h
    m = (n % G) * R + i  # this row's queries in its prompt's partials
    # fold the prompt splits in: first their common maximum (one [splits, r] load), then every split scaled to it;
    # the unrolled loop's loads do not depend on each other, so they are all in flight at once
    split_ids = tl.arange(0, SPLITS_P2)
    stats = prompt_head * stride_mn + split_ids[:, None] * BLOCK_M + m[None, :]  # [SPLITS_P2, BLOCK_R]
    split_valid = (split_ids[:, None] < num_splits) & i_valid[None, :]
    split_max = tl.load(part_max + stats, mask=split_valid, other=-1.0e30)
    top = tl.maximum(run_max, tl.max(split_max, 0))
    keep = tl.exp(run_max - top)
    run_sum = run_sum * keep + tl.sum(tl.load(part_sum + stats, mask=split_valid, other=0.0)
                                      * tl.exp(split_max - top[None, :]), 0)
    acc = acc * keep[:, None]
    for split in tl.static_range(MAX_SPLITS):  # splits past num_splits are masked: they add nothing
        valid = i_valid & (split < num_splits)
        scale_s = tl.exp(tl.load(part_max + prompt_head * stride_mn + split * BLOCK_M + m, mask=valid,
                                 other=-1.0e30) - top)
        acc += tl.load(part_acc + prompt_head * stride_an + split * stride_am + m[:, None] * BLOCK_D + d[None, :],
                       mask=valid[:, None] & d_valid[None, :], other=0.0) * scale_s[:, None]
    result = acc / run_sum[:, None]
    tl.store(out + n * stride_on + (h * R + i)[:, None] * stride_oh + d[None, :], result.to(out.dtype.element_ty),
             mask=i_valid[:, None] & d_valid[None, :])


@functools.cache
def _kernels():
    """The two kernels (``triton.jit``; under ``TRITON_INTERPRET=1``, set before Triton is imported, Triton's
    interpreter runs them on CPU tensors)."""
    if triton is None:
        raise RuntimeError("shared-prefix decode attention needs Triton (shipped with torch's CUDA wheels).")
    return triton.jit(_prefix_partials), triton.jit(_tail_and_merge)


def interpreted() -> bool:
    """Whether Triton runs kernels in its CPU interpreter in this process."""
    return triton is not None and bool(triton.knobs.runtime.interpret)


@functools.cache
def _multiprocessors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def prompt_splits(prompt_len: int, prompt_heads: int, device: torch.device) -> tuple[int, int, int]:
    """``(blocks per split, splits, most splits)`` of the prompt keys: at most ``most`` splits (a fixed number per
    device and B·Hkv, so that B·Hkv·splits programs fill the GPU) of whole :data:`BLOCK_KEYS` blocks. The kernels are
    compiled per blocks-per-split value, so it is a power of 2: a run's many prompt lengths give a few compiles (each
    costs about a second of the step that first meets it), not one per length."""
    sms = _multiprocessors(device.index or 0) if device.type == "cuda" else 4
    most = max(1, -(-PROGRAMS_PER_SM * sms // prompt_heads))
    blocks = -(-prompt_len // BLOCK_KEYS)
    per_split = triton.next_power_of_2(-(-blocks // most))
    return per_split, -(-blocks // per_split), most


@torch.library.custom_op("sa2va_rl::shared_prefix_decode_attention", mutates_args=())
def shared_prefix_decode_attention(query: Tensor, prefix_key: Tensor, prefix_value: Tensor, prefix_bias: Tensor,
                                   tail_key: Tensor, tail_value: Tensor, tail_bias: Tensor, visible_tail: Tensor,
                                   scale: float) -> Tensor:
    """Softmax attention of one new query per row over its prompt's slots and its own slots (a torch custom op, so a
    compiled decode step calls the kernels as one opaque op instead of tracing their launch).

    Args:
        query: ``[N, H, hd]`` (any strides with a contiguous last dim), N = B·G rows, row ``b·G + g`` on prompt b.
        prefix_key, prefix_value: ``[B, Hkv, L, hd]`` the prompts' cache; prefix_bias: ``[B, L]`` additive (0: visible).
        tail_key, tail_value: ``[N, Hkv, T, hd]`` each row's own slots; tail_bias: ``[N, T]`` additive.
        visible_tail: one integer on the query's device, the tail slots that may be visible (the slots written so far):
            tail_bias must hide every slot from it on; their blocks of :data:`BLOCK_KEYS` slots are not read. A tensor
            read by the kernel, so a CUDA graph of decode steps replays with each step's value.
        scale: the score scale (``head_dim ** -0.5`` for these LMs).

    Returns:
        ``[N, H, hd]`` in the query's dtype: ``softmax([q·Kp, q·Kt] · scale + bias) [Vp; Vt]``.
    """
    N, H, hd = query.shape
    B, Hkv, L, _ = prefix_key.shape
    G, R, T = N // B, H // Hkv, tail_key.shape[2]
    if N != B * G or H != Hkv * R:
        raise ValueError(f"shared_prefix_decode_attention: query {tuple(query.shape)} does not fit prompts "
                         f"{tuple(prefix_key.shape)} (N = B·G rows, H = Hkv·r heads)")
    for name, t in (("query", query), ("prefix_key", prefix_key), ("prefix_value", prefix_value),
                    ("tail_key", tail_key), ("tail_value", tail_value), ("prefix_bias", prefix_bias),
                    ("tail_bias", tail_bias)):
        if t.stride(-1) != 1:
            raise ValueError(f"shared_prefix_decode_attention: {name} needs a contiguous last dimension")
    if visible_tail.numel() != 1 or visible_tail.is_floating_point() or visible_tail.device != query.device:
        raise ValueError(f"shared_prefix_decode_attention: visible_tail must be one integer on {query.device}, not "
                         f"{visible_tail.dtype} {tuple(visible_tail.shape)} on {visible_tail.device}")
    if query.device.type != "cuda" and not interpreted():
        raise ValueError("shared_prefix_decode_attention: CPU tensors need Triton's interpreter (TRITON_INTERPRET=1 "
                         "in the environment before Triton is imported); on CPU use the torch path.")
    prefix_kernel, tail_kernel = _kernels()
    block_m = max(MIN_DOT_ROWS, triton.next_power_of_2(G * R))
    blocks_per_split, splits, most_splits = prompt_splits(L, B * Hkv, query.device)
    block_d = max(MIN_DOT_ROWS, triton.next_power_of_2(hd))
    acc = torch.empty(B * Hkv, splits, block_m, block_d, dtype=torch.float32, device=query.device)
    maxima = torch.empty(B * Hkv, splits * block_m, dtype=torch.float32, device=query.device)
    sums = torch.empty_like(maxima)
    prefix_kernel[(B * Hkv, splits)](
        query, prefix_key, prefix_value, prefix_bias, acc, maxima, sums,
        query.stride(0), query.stride(1), *prefix_key.stride()[:3], *prefix_value.stride()[:3],
        prefix_bias.stride(0), acc.stride(0), acc.stride(1), maxima.stride(0),
        L, scale, G=G, R=R, HKV=Hkv, HEAD_DIM=hd, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=BLOCK_KEYS,
        BLOCKS_PER_SPLIT=blocks_per_split, num_warps=LAUNCH["prefix_warps"], num_stages=LAUNCH["stages"])
    out = torch.empty(N, H, hd, dtype=query.dtype, device=query.device)
    tail_kernel[(N * Hkv,)](
        query, tail_key, tail_value, tail_bias, acc, maxima, sums, out,
        query.stride(0), query.stride(1), *tail_key.stride()[:3], *tail_value.stride()[:3],
        tail_bias.stride(0), acc.stride(0), acc.stride(1), maxima.stride(0), out.stride(0), out.stride(1),
        T, visible_tail, splits, scale, G=G, R=R, HKV=Hkv, HEAD_DIM=hd, BLOCK_D=block_d,
        BLOCK_R=max(MIN_DOT_ROWS, triton.next_power_of_2(R)), BLOCK_M=block_m, BLOCK_N=BLOCK_KEYS,
        TAIL_BLOCKS=triton.next_power_of_2(-(-T // BLOCK_KEYS)), MAX_SPLITS=most_splits,
        SPLITS_P2=triton.next_power_of_2(most_splits), num_warps=LAUNCH["tail_warps"], num_stages=LAUNCH["stages"])
    return out


@shared_prefix_decode_attention.register_fake
def _(query, prefix_key, prefix_value, prefix_bias, tail_key, tail_value, tail_bias, visible_tail, scale):
    return query.new_empty(query.shape)
