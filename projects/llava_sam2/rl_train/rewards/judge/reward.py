"""The LLM-judge caption reward (DLC-Bench style) for loop 2.

Per rollout: questions for its ground-truth caption (from a qa.json keyed by sample id, else
generated from the caption through the judge, cached), then DLC-Bench judging of the predicted
caption. ``score ∈ [-1, 1]``; with ``score_range="unit"`` the reward is ``(score + 1) / 2`` so it
shares METEOR's [0, 1] scale (GRPO's group normalisation removes the affine map otherwise).

Failure policy: nothing raises out of a call. A rollout whose judging fails (timeout, HTTP error,
unparsable reply, deadline, missing endpoint) gets ``None`` and its cause is counted; the composer
then applies the configured fallback (default: the remaining rewards, weights re-normalised).
Question-generation failures are counted as ``questions/<cause>``.
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ..base import RewardInputs, RewardResult, check_weight, register_reward
from .client import JudgeClient, JudgeConfig, JudgeError
from .dlc_judge import JUDGE_MODES, DLCJudge
from .questions import QAEntry, QuestionGenerator, load_qa

logger = logging.getLogger(__name__)

SCORE_RANGES = ("unit", "raw")
UNPARSED_POLICIES = ("zero", "fallback")


@register_reward("dlc_judge")
class DLCJudgeReward:
    """LLM-judge reward.

    Args:
        name, weight: composer identity (default weight 0.75 of the caption reward).
        judge: :class:`JudgeConfig` or its dict (endpoint, model, concurrency, timeout, cache).
        mode: ``"batched"`` (one request per caption, default for training) or ``"per_question"``.
        qa_path, class_names_path: optional DLC-Bench-layout files keyed by sample id; samples
            not in them get generated questions.
        score_range: ``"unit"`` maps the DLC score to ``(s + 1) / 2``; ``"raw"`` keeps [-1, 1].
        on_unparsed_answer: ``"zero"`` scores an unparsed answer 0 as DLC-Bench does;
            ``"fallback"`` turns the rollout's value into None (cause ``unparsed_answer``).
        deadline_s: wall-clock limit for one rollout's judging (None: only per-request timeouts).
        question_max_tokens: reply budget for question generation.
    """

    def __init__(
        self,
        name: str = "dlc_judge",
        weight: float = 0.75,
        judge: JudgeConfig | Mapping[str, Any] | None = None,
        mode: str = "batched",
        qa_path: str | None = None,
        class_names_path: str | None = None,
        score_range: str = "unit",
        on_unparsed_answer: str = "zero",
        deadline_s: float | None = None,
        question_max_tokens: int = 1024,
    ) -> None:
        if score_range not in SCORE_RANGES:
            raise ValueError(f"{name}: score_range must be one of {SCORE_RANGES}, got {score_range!r}")
        if on_unparsed_answer not in UNPARSED_POLICIES:
            raise ValueError(f"{name}: on_unparsed_answer must be one of {UNPARSED_POLICIES}, got {on_unparsed_answer!r}")
        if (qa_path is None) != (class_names_path is None):
            raise ValueError(f"{name}: give qa_path and class_names_path together (DLC-Bench layout)")
        self.name = name
        self.weight = check_weight(name, weight)
        self.client = JudgeClient(judge)
        self.judge = DLCJudge(self.client, mode)  # validates mode
        self.generator = QuestionGenerator(self.client, max_tokens=question_max_tokens)
        self.qa_by_id: dict[str, QAEntry] = load_qa(qa_path, class_names_path) if qa_path else {}
        self.score_range = score_range
        self.on_unparsed_answer = on_unparsed_answer
        self.deadline_s = deadline_s
        self._logged_errors: set[str] = set()
        if not self.client.endpoint_configured:
            logger.warning(
                "reward %r: no judge endpoint (set judge.base_url or $%s); every rollout gets None "
                "and the composer's fallback (cause 'no_endpoint')",
                name, self.client.config.base_url_env,
            )
        else:
            logger.info("reward %r: judge %s, mode=%s", name, self.client, mode)

    def __repr__(self) -> str:
        return f"DLCJudgeReward(name={self.name!r}, weight={self.weight}, mode={self.judge.mode!r}, client={self.client!r})"

    async def aclose(self) -> None:
        """Close the judge's HTTP connections on the running loop (the composer calls this)."""
        await self.client.aclose()

    async def _entry(self, sample_id: str, gt_caption: str) -> QAEntry:
        if sample_id in self.qa_by_id:
            return self.qa_by_id[sample_id]
        try:
            return await self.generator.generate(gt_caption)
        except JudgeError as error:
            raise JudgeError(f"questions/{error.cause}", str(error)) from None

    async def _one(self, sample_id: str, pred: str, gt_caption: str) -> tuple[float, int]:
        """(reward, unparsed answers) of one rollout; raises JudgeError with the failure cause."""
        entry = await self._entry(sample_id, gt_caption)
        score = await self.judge.judge(pred, entry)
        if score.n_unparsed and self.on_unparsed_answer == "fallback":
            raise JudgeError("unparsed_answer", f"{score.n_unparsed} answers matched no choice")
        value = (score.score + 1.0) / 2.0 if self.score_range == "unit" else score.score
        return value, score.n_unparsed

    async def _guarded(self, sample_id: str, pred: Any, gt: Any) -> tuple[float | None, str | None, int]:
        """(value, failure cause, unparsed answers) — never raises."""
        refs = [gt] if isinstance(gt, str) else [r for r in (gt or []) if isinstance(r, str)]
        refs = [r for r in refs if r.strip()]
        if not isinstance(pred, str):
            return None, "no_prediction", 0
        if not refs:
            return None, "no_reference", 0
        try:
            coro = self._one(sample_id, pred, refs[0])  # questions come from the first reference
            value, n_unparsed = await (asyncio.wait_for(coro, self.deadline_s) if self.deadline_s else coro)
            return value, None, n_unparsed
        except JudgeError as error:
            return None, error.cause, 0
        except asyncio.TimeoutError:
            return None, "deadline", 0
        except Exception as error:  # a judge bug must not stop training: count it, log it once
            cause = f"error/{type(error).__name__}"
            if cause not in self._logged_errors:
                self._logged_errors.add(cause)
                logger.exception("reward %r: unexpected error on sample %s", self.name, sample_id)
            return None, cause, 0

    async def __call__(self, inputs: RewardInputs) -> RewardResult:
        preds = inputs.require("pred_captions", self.name)
        gts = inputs.require("gt_captions", self.name)
        n = len(inputs)
        if not self.client.endpoint_configured:
            return RewardResult(values=[None] * n, failures={"no_endpoint": n})
        before = Counter(self.client.counters)
        outcomes = await asyncio.gather(
            *(self._guarded(sid, p, g) for sid, p, g in zip(inputs.sample_ids, preds, gts))
        )
        failures = Counter(cause for _, cause, _ in outcomes if cause is not None)
        delta = Counter(self.client.counters)
        delta.subtract(before)
        stats = {k: float(v) for k, v in delta.items() if v and not k.startswith("errors/")}
        stats["unparsed_answers"] = float(sum(u for _, _, u in outcomes))
        return RewardResult(values=[v for v, _, _ in outcomes], failures=dict(failures), stats=stats)
