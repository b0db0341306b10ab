"""Timing and realism helpers of ``sa2va-rl bench rl-step`` (rl_step.py).

* :class:`PhaseClock`: seconds per phase, synchronising the GPU at every boundary; each phase is also a profiler range,
  and the phases open right now are readable (``open_phases``), which is how :class:`ForcedAnswers` knows which pass is
  decoding.
* :class:`ForcedAnswers`: with random weights the partner never emits ``[SEG]`` (loop 1 then skips the SAM2 decode
  and its IoU is 0) and no caption ever stops (every row runs to ``--max-new-tokens``). This scripts the decoders'
  choices inside chosen phases, without changing what a step computes around them: in the partner's loop-1 RES
  answers the tokens of a teacher answer (``Sure, [SEG].``) then a stop token are forced, so every rollout runs the
  ``[SEG]`` path (decoder state → ``text_hidden_fcs`` → SAM2 → mask → IoU); policy captions and partner captions
  stop at a length drawn uniformly from ``caption_lengths`` (seeded). Forcing = every logit but the forced token's
  set to -inf before the choice (the stop rule, caches and timing stay the decoder's own). It hooks our fast decoder
  (``fast_decode_step.TokenChooser``, eager and outside the CUDA graph), the reference decoder
  (``generation.sample_completions``) and HF ``generate`` (a logits processor; for the Qwen-VL family's passes, which
  call ``generate`` with ``input_ids``, :meth:`ForcedAnswers.installed_in_generate`).
* :func:`token_counts`, :func:`summarize`: generated tokens and throughput of one iteration.
* :func:`profile_iteration`: one iteration under ``torch.profiler`` → the top operators/kernels and phase ranges.
"""
from __future__ import annotations

import json
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers import LogitsProcessorList

from projects.llava_sam2.rl_train.model.decoding import fast_decode_step, generation
from projects.llava_sam2.rl_train.model.pipeline import qwen_vl_prompts

# phase name fragment -> the pass decoding inside it (ForcedAnswers' modes)
FORCED_PASSES = {"policy_sampling": "caption", "partner_describe": "caption", "partner_segment": "seg_answer"}


class PhaseClock:
    """Seconds per phase, synchronising the GPU at every boundary (each phase is also a profiler range)."""

    def __init__(self, device: torch.device):
        self.device, self.seconds, self.active = device, defaultdict(float), True
        self.loop = "loop"  # the loop whose rollout is running (set by ``wrap_loop``)
        self.open_phases: list[str] = []  # innermost last

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def take(self) -> dict[str, float]:
        """The seconds gathered so far, and a fresh start."""
        seconds, self.seconds = dict(self.seconds), defaultdict(float)
        return seconds

    @contextmanager
    def __call__(self, phase: str):
        self.sync()
        start = time.perf_counter()
        self.open_phases.append(phase)
        try:
            with torch.profiler.record_function(phase):
                yield
        finally:
            self.open_phases.pop()
            self.sync()
            if self.active:
                self.seconds[phase] += time.perf_counter() - start

    def wrap(self, fn, phase: str):
        def timed(*args, **kwargs):
            with self(phase):
                return fn(*args, **kwargs)
        return timed

    def wrap_context(self, cm_fn, phase: str):
        """Time the body of a context manager under ``rollout/<current loop>_<phase>``."""
        @contextmanager
        def timed(*args, **kwargs):
            with self(f"rollout/{self.loop}_{phase}"), cm_fn(*args, **kwargs):
                yield
        return timed

    def wrap_loop(self, loop) -> None:
        rollout = loop.rollout

        def timed(*args, **kwargs):
            self.loop = loop.name
            with self(f"rollout/{loop.name}_total"):
                return rollout(*args, **kwargs)
        loop.rollout = timed

    def wrap_algorithm(self, algo) -> None:
        """Time each loop's rollout (:meth:`wrap_loop`) and, under ``rollout/joint_reference_scoring``, the reference
        pass that scores both loops at once after their rollouts (``CycleGRPO.joint_reference``)."""
        for loop in algo.loops:
            self.wrap_loop(loop)
        joint_reference = algo.joint_reference

        def timed(*args, **kwargs):
            self.loop = "joint"
            return joint_reference(*args, **kwargs)
        algo.joint_reference = timed


@dataclass
class ForcedAnswers:
    """Scripted decoder choices in the bench's random-weight model (module docstring).

    Attributes:
        clock: the bench's clock (its open phases say which pass decodes).
        stop_id: the stop token forced at the end of an answer.
        seg_answer: token ids forced as the partner's loop-1 answer (then ``stop_id``); None leaves it free.
        caption_lengths: ``(lo, hi)``: each caption row stops at a length drawn uniformly from [lo, hi]; None: free.
        seed: seed of the length draws.
    """

    clock: PhaseClock
    stop_id: int
    seg_answer: list[int] | None = None
    caption_lengths: tuple[int, int] | None = None
    seed: int = 0
    _generator: torch.Generator = field(init=False, repr=False)
    _call: tuple[object, Tensor | None, list[int]] | None = field(default=None, init=False, repr=False)
    _reference: tuple[Tensor | None, list[int]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        self._generator = torch.Generator().manual_seed(self.seed)

    def table(self, rows: int, device: torch.device) -> Tensor | None:
        """Forced token per row and column ``[rows, W]`` (-1: free) for the pass decoding now, or None."""
        mode = next((m for phase in reversed(self.clock.open_phases) for key, m in FORCED_PASSES.items()
                     if key in phase), None)
        if mode == "seg_answer" and self.seg_answer is not None:
            return torch.tensor(self.seg_answer + [self.stop_id], device=device)[None].repeat(rows, 1)  # [rows, A + 1]
        if mode == "caption" and self.caption_lengths is not None:
            lo, hi = self.caption_lengths
            lengths = torch.randint(lo, hi + 1, (rows,), generator=self._generator)  # [rows]
            table = torch.full((rows, hi), -1, dtype=torch.long)
            table[torch.arange(rows), lengths - 1] = self.stop_id
            return table.to(device)  # [rows, hi]
        return None

    @staticmethod
    def force(logits: Tensor, table: Tensor | None, t: int) -> Tensor:
        """``logits [N, V]`` with every entry but the forced token's set to -inf in rows forced at column t."""
        if table is None or t >= table.shape[1]:
            return logits
        forced = table[:, t]  # [N], -1 = free
        only = torch.full_like(logits, float("-inf")).scatter_(1, forced.clamp_min(0)[:, None], 0.0)  # [N, V]
        return torch.where((forced >= 0)[:, None], only, logits)

    def processor(self, prompt_length: int = 0):
        """A transformers logits processor doing the same inside ``generate`` (column t = tokens generated so far:
        the ids it sees less ``prompt_length``, the prompt's ids when ``generate`` was given ``input_ids``)."""
        forced = self

        class Forced:
            table = None

            def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
                t = input_ids.shape[1] - prompt_length
                if t == 0:
                    self.table = forced.table(scores.shape[0], scores.device)
                return forced.force(scores, self.table, t)

        return Forced()

    @contextmanager
    def installed(self):
        """Our decoders' token choices go through :meth:`force` inside the block: the fast decoder's
        (``TokenChooser.__call__``) and the reference decoder's (``generation._next_token``, a fresh table per
        ``sample_completions`` call: the Qwen-VL family's policy sampling runs on it)."""
        original = fast_decode_step.TokenChooser.__call__
        forced = self
        next_token = generation._next_token
        holders = [m for m in (generation, qwen_vl_prompts) if hasattr(m, "sample_completions")]
        decoders = {m: m.sample_completions for m in holders}

        def reference_call(decode):
            def call(lm, inputs_embeds, *args, **kwargs):
                forced._reference = (forced.table(inputs_embeds.shape[0], inputs_embeds.device), [0])
                try:
                    return decode(lm, inputs_embeds, *args, **kwargs)
                finally:
                    forced._reference = None
            return call

        def choose_next(logits: Tensor, **kwargs) -> Tensor:
            if forced._reference is not None:
                table, column = forced._reference
                logits = forced.force(logits, table, column[0])
                column[0] += 1
            return next_token(logits, **kwargs)

        def choose(chooser, logits: Tensor, state) -> None:
            if forced._call is None or forced._call[0] is not state:  # a new decode call: fresh table, column 0
                forced._call = (state, forced.table(logits.shape[0], logits.device), [0])
            _, table, column = forced._call
            original(chooser, forced.force(logits, table, column[0]), state)
            column[0] += 1

        fast_decode_step.TokenChooser.__call__ = choose
        generation._next_token = choose_next
        for module, decode in decoders.items():
            module.sample_completions = reference_call(decode)
        try:
            yield self
        finally:
            fast_decode_step.TokenChooser.__call__ = original
            generation._next_token = next_token
            for module, decode in decoders.items():
                module.sample_completions = decode
            self._call = self._reference = None

    @contextmanager
    def installed_in_generate(self, module):
        """Inside the block, ``module.generate`` (transformers, called with ``input_ids``) runs with this scripting
        appended to its logits processors, a fresh processor per call (the Qwen-VL family's decoders)."""
        original = module.generate

        def generate(*args, **kwargs):
            ids = kwargs.get("input_ids")
            processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
            processors.append(self.processor(prompt_length=0 if ids is None else ids.shape[1]))
            return original(*args, logits_processor=processors, **kwargs)

        module.generate = generate  # an instance attribute: shadows the class's method until deleted
        try:
            yield self
        finally:
            del module.generate


def token_counts(rollouts) -> dict:
    """Generated tokens of one iteration: policy captions (loop 1), partner answers (loop 1), partner captions
    (loop 2), and the partner's no-[SEG] count."""
    counts = defaultdict(float)
    for rollout in rollouts:
        stats, N = rollout.reward_stats, rollout.num_rollouts
        if "partner/no_seg" in stats:
            counts["policy_caption_tokens"] += float(rollout.action_mask.sum())
            counts["partner_answer_tokens"] += stats["partner/answer_tokens"] * (N - stats["partner/empty_caption"])
            counts["partner_no_seg"] += stats["partner/no_seg"]
        if "partner/caption_tokens" in stats:
            counts["partner_caption_tokens"] += stats["partner/caption_tokens"] * (N - stats["partner/empty_mask"])
    return counts


def step_seconds(seconds: dict) -> float:
    """The whole step: the sum of the top-level phases (names without ``/``; the others are nested in them)."""
    return sum(v for k, v in seconds.items() if "/" not in k)


def summarize(seconds: dict, tokens: dict, num_rollouts: int, peak_gib: float) -> dict:
    """Per-phase seconds of one iteration → throughput: ``num_rollouts`` rollouts (both loops) per step."""
    seconds = dict(sorted(seconds.items()))
    for name in ("mask_to_caption", "caption_to_mask"):
        total = seconds.get(f"rollout/{name}_total")
        if total is not None:
            parts = [v for k, v in seconds.items() if k.startswith(f"rollout/{name}_") and not k.endswith("_total")]
            seconds[f"rollout/{name}_policy_rest"] = total - sum(parts)  # prompts, old_logp, mask sampling
    step = step_seconds(seconds)
    generated = sum(v for k, v in tokens.items() if k.endswith("_tokens"))
    return {
        "seconds_per_iteration": step, "seconds": seconds, "tokens_per_iteration": tokens,
        "rollout_tokens_per_s": generated / max(seconds.get("rollout", 0.0), 1e-9),
        "policy_caption_tokens_per_s": tokens.get("policy_caption_tokens", 0.0) / max(
            seconds.get("rollout/mask_to_caption_policy_sampling", 0.0), 1e-9),
        "rollouts_per_s": num_rollouts / step,
        "peak_gib": peak_gib,
    }


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def profile_iteration(path: str, top: int, run) -> None:
    """One iteration of ``run()`` under torch.profiler → JSON: top ops/kernels by self device (else CPU) time, top
    ops by self host time (``top_host``: where a host-bound phase spends its time), and the phase ranges (host wall time of each ``PhaseClock`` range, device time of the kernels inside)."""
    from torch.profiler import ProfilerActivity, profile

    on_cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        phases = run()
    events = prof.key_averages()
    key = (lambda e: e.self_device_time_total) if on_cuda else (lambda e: e.self_cpu_time_total)

    def row(e) -> dict:
        return {"name": e.key[:160], "count": e.count, "self_device_ms": e.self_device_time_total / 1e3,
                "device_ms": e.device_time_total / 1e3, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                "cpu_ms": e.cpu_time_total / 1e3}

    table = {"sorted_by": "self_device_ms" if on_cuda else "self_cpu_ms",
             "top": [row(e) for e in sorted(events, key=key, reverse=True) if e.key not in phases][:top],
             "top_host": [row(e) for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
                          if e.key not in phases][:top],
             "phases": [row(e) for e in events if e.key in phases],
             "kernel_launches": sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA)}
    with open(path, "w") as f:
        json.dump(table, f, indent=2)
