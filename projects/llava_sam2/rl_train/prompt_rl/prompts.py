"""Candidate text prompts for prompt selection: RES question templates x a sample's expression paraphrases.

A candidate is a ``PromptSpec(template, slot)``: question template ``RES_TEMPLATES[template]`` filled with the
sample's expression ``expressions[min(slot, n - 1)]`` (normalised as in SFT: '<'/'>' removed, lower-case, one
final '.' dropped). ``RES_TEMPLATES[0]`` is the RefCOCO RES eval prompt (``<image>\\n Please segment {sent} in
this image.``), the rest are the 16 SEG_QUESTIONS of Sa2VA's RES training. Action k of the prompt policy is the
same spec on every image, so slot indices are positions in the expression list (a shapes-world list starts with
the shortest identifying phrase and ends with three full descriptions); a sample with fewer paraphrases than
``slot + 1`` uses its last one (documented clipping, not an error).

``DEFAULT_PROMPT_SPECS[0]`` (eval prompt, first expression) is the "default prompt" every comparison starts from.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..model.text.prompts import RES_EVAL_PROMPT, SEG_QUESTIONS, normalize_expression, strip_angle_brackets

RES_TEMPLATES: tuple[str | None, ...] = (None,) + tuple(SEG_QUESTIONS)  # None = RES_EVAL_PROMPT
MIN_PROMPTS = 2  # a selection problem needs at least two candidates


@dataclass(frozen=True)
class PromptSpec:
    """One candidate prompt: a template index into RES_TEMPLATES and an expression slot."""

    template: int
    slot: int

    def __post_init__(self) -> None:
        if not 0 <= self.template < len(RES_TEMPLATES):
            raise ValueError(f"PromptSpec.template={self.template}: expected 0..{len(RES_TEMPLATES) - 1} "
                             "(0 = RES eval prompt, 1.. = SEG_QUESTIONS)")
        if self.slot < 0:
            raise ValueError(f"PromptSpec.slot={self.slot}: expected an expression index >= 0")

    @property
    def question(self) -> str | None:
        """The question template (None: the RES eval prompt, ``Sa2VAProcessor.segment_text``'s default)."""
        return RES_TEMPLATES[self.template]

    @property
    def label(self) -> str:
        """Short name used in reports: ``t<template>/e<slot>``."""
        return f"t{self.template}/e{self.slot}"

    def template_text(self) -> str:
        return RES_EVAL_PROMPT.replace("{sent}", "{}") if self.question is None else \
            self.question.replace("{class_name}", "{}")


# Ordered so that any prefix mixes phrasings and paraphrase slots; K=11 is the project default.
DEFAULT_PROMPT_SPECS: tuple[PromptSpec, ...] = tuple(PromptSpec(t, s) for t, s in (
    (0, 0), (0, 1), (0, 2), (1, 0), (1, 2), (2, 1), (3, 0), (9, 0), (10, 1), (11, 2), (12, 4),
    (0, 3), (0, 4), (2, 0), (2, 2), (4, 1), (5, 3), (6, 0), (7, 2), (8, 4), (13, 0), (14, 1), (15, 3), (16, 2),
))
DEFAULT_NUM_PROMPTS = 11


def check_prompt_specs(specs: Sequence[PromptSpec], where: str = "prompt list") -> tuple[PromptSpec, ...]:
    """Validate a candidate list: at least MIN_PROMPTS distinct ``PromptSpec``."""
    specs = tuple(specs)
    if len(specs) < MIN_PROMPTS:
        raise ValueError(f"{where}: got {len(specs)} candidate prompt(s); prompt selection needs K >= {MIN_PROMPTS} "
                         "(pass more specs or a larger num_prompts)")
    if not all(isinstance(s, PromptSpec) for s in specs):
        raise TypeError(f"{where}: every entry must be a PromptSpec, got {[type(s).__name__ for s in specs]}")
    if len(set(specs)) != len(specs):
        raise ValueError(f"{where}: duplicate prompt specs {[s.label for s in specs]}; each candidate must differ")
    return specs


def default_prompt_specs(num_prompts: int = DEFAULT_NUM_PROMPTS) -> tuple[PromptSpec, ...]:
    """The first ``num_prompts`` entries of DEFAULT_PROMPT_SPECS (K in [2, 24])."""
    if not MIN_PROMPTS <= num_prompts <= len(DEFAULT_PROMPT_SPECS):
        raise ValueError(f"num_prompts={num_prompts}: prompt selection needs K >= {MIN_PROMPTS}, and the default list "
                         f"holds {len(DEFAULT_PROMPT_SPECS)} (expected 2..{len(DEFAULT_PROMPT_SPECS)}); pass explicit "
                         "specs ('template:slot,...') for other sets")
    return DEFAULT_PROMPT_SPECS[:num_prompts]


def parse_prompt_specs(text: str) -> tuple[PromptSpec, ...]:
    """``"0:0,1:2,9:0"`` -> PromptSpecs (validated, K >= 2)."""
    specs = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        template, sep, slot = item.partition(":")
        if not sep or not template.strip().isdigit() or not slot.strip().isdigit():
            raise ValueError(f"prompt spec {item!r}: expected 'template:slot' with two integers, e.g. '0:0,1:2'")
        specs.append(PromptSpec(int(template), int(slot)))
    return check_prompt_specs(specs, where=f"prompt specs {text!r}")


def candidate_expressions(expressions: Sequence[str], specs: Sequence[PromptSpec], sample_id: str) -> list[str]:
    """The normalised expression each spec uses for one sample (slot clipped to the last paraphrase)."""
    usable = [e for e in expressions if isinstance(e, str) and strip_angle_brackets(e).strip(" .")]
    if not usable:
        raise ValueError(f"sample {sample_id!r}: no referring expression to build prompts from; prompt selection "
                         "needs samples with expressions (e.g. ShapesWorld, RefCOCO)")
    return [normalize_expression(strip_angle_brackets(usable[min(s.slot, len(usable) - 1)]), where=f"sample "
                                 f"{sample_id!r}") for s in specs]
