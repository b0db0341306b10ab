"""Sa2VA prompt strings (data, byte-for-byte as upstream) and the pure-string builders around them.

Sources (reference/sa2va.md §3.2-§3.5): the InternVL image block, the Osprey region string
``There are N part regions in the picture: region1<vp>…</vp>, ….\\n`` (HF ``predict_forward`` and the
Osprey datasets build the same text), the RefCOCOg region-caption eval question, the 30 Osprey
detailed-description questions, the Osprey short-answer suffix, the 16 referring-segmentation
questions, the 5 ``[SEG]`` answers and the RefCOCO RES eval prompt.
"""
from __future__ import annotations

from collections.abc import Sequence

from .constants import (
    IMG_CONTEXT_TOKEN,
    IMG_END_TOKEN,
    IMG_START_TOKEN,
    VP_END_TOKEN,
    VP_START_TOKEN,
)

# RefCOCOg region-caption eval text (region_cap_refcocog_eval.py), given to predict_forward as is.
REGION_CAPTION_EVAL_PROMPT = (
    "<image>\nPlease give me a short description of the region in the picture marked by region1."
)

# Suffix OspreyShortDescriptionDataset appends to every human turn.
SHORT_ANSWER_SUFFIX = " Answer the question using a single word or phrase."

# Placeholder in DETAILED_QUESTIONS, replaced by 'region{i}' (1-based).
REGION_PLACEHOLDER = "<region>"

# OspreyDescriptionDataset questions (detailed region description).
DETAILED_QUESTIONS = (
    'Can you provide me with a detailed description of the region in the picture marked by <region>?',
    "I'm curious about the region represented by <region> in the picture. Could you describe it in detail?",
    'What can you tell me about the region indicated by <region> in the image?',
    "I'd like to know more about the area in the photo labeled <region>. Can you give me a detailed description?",
    'Could you describe the region shown as <region> in the picture in great detail?',
    'What details can you give me about the region outlined by <region> in the photo?',
    'Please provide me with a comprehensive description of the region marked with <region> in the image.',
    'Can you give me a detailed account of the region labeled as <region> in the picture?',
    "I'm interested in learning more about the region represented by <region> in the photo. Can you describe it in detail?",
    'What is the region outlined by <region> in the picture like? Could you give me a detailed description?',
    'Can you provide me with a detailed description of the region in the picture marked by <region>, please?',
    "I'm curious about the region represented by <region> in the picture. Could you describe it in detail, please?",
    'What can you tell me about the region indicated by <region> in the image, exactly?',
    "I'd like to know more about the area in the photo labeled <region>, please. Can you give me a detailed description?",
    'Could you describe the region shown as <region> in the picture in great detail, please?',
    'What details can you give me about the region outlined by <region> in the photo, please?',
    'Please provide me with a comprehensive description of the region marked with <region> in the image, please.',
    'Can you give me a detailed account of the region labeled as <region> in the picture, please?',
    "I'm interested in learning more about the region represented by <region> in the photo. Can you describe it in detail, please?",
    'What is the region outlined by <region> in the picture like, please? Could you give me a detailed description?',
    'Please describe the region <region> in the image in detail.',
    'Can you offer a thorough analysis of the region <region> in the image?',
    'Could you elaborate on the region highlighted by <region> in the picture provided?',
    'Please share more information about the zone emphasized with <region> in the photo.',
    'What insights can you give about the area denoted by <region> in the image presented?',
    'Can you share a comprehensive rundown of the region denoted by <region> in the presented image?',
    "I'd like to know more about the region highlighted by <region> in the picture provided.",
    'Work through the important details of the area <region> in the image.',
    'Illustrate the area represented by <region> through a descriptive explanation.',
    'Examine the region <region> closely and share its details.',
)

# Referring-segmentation questions (RefCOCO/+/g and video RES training): 8 forms, each with and
# without final punctuation. '{class_name}' is the normalised expression (normalize_expression).
SEG_QUESTIONS = (
    "Can you segment the {class_name} in this image?",
    "Please segment {class_name} in this image.",
    "What is {class_name} in this image? Please respond with segmentation mask.",
    "What is {class_name} in this image? Please output segmentation mask.",
    "Can you segment the {class_name} in this image",
    "Please segment {class_name} in this image",
    "What is {class_name} in this image? Please respond with segmentation mask",
    "What is {class_name} in this image? Please output segmentation mask",
    "Could you provide a segmentation mask for the {class_name} in this image?",
    "Please identify and segment the {class_name} in this image.",
    "Where is the {class_name} in this picture? Please respond with a segmentation mask.",
    "Can you highlight the {class_name} in this image with a segmentation mask?",
    "Could you provide a segmentation mask for the {class_name} in this image",
    "Please identify and segment the {class_name} in this image",
    "Where is the {class_name} in this picture? Please respond with a segmentation mask",
    "Can you highlight the {class_name} in this image with a segmentation mask",
)

# Answers to SEG_QUESTIONS (uniform choice upstream).
ANSWER_LIST = (
    "It is [SEG].",
    "Sure, [SEG].",
    "Sure, it is [SEG].",
    "Sure, the segmentation result is [SEG].",
    "[SEG].",
)

# RefCOCO/+/g RES eval text (evaluation/dataset/RES.py); note the space after '\n'. '{sent}' is the
# raw expression.
RES_EVAL_PROMPT = "<image>\n Please segment {sent} in this image."


def image_block(n_image_tokens: int) -> str:
    """``<img>`` + ``<IMG_CONTEXT>``·n + ``</img>``: one block for all tiles of one image."""
    if n_image_tokens < 1:
        raise ValueError(f"image block with n_image_tokens={n_image_tokens}: expected >= 1")
    return IMG_START_TOKEN + IMG_CONTEXT_TOKEN * n_image_tokens + IMG_END_TOKEN


def region_string(cell_counts: Sequence[int]) -> str:
    """``There are N part regions in the picture: region1<vp>…</vp>, …, regionN<vp>…</vp>.\\n``.

    Region i carries ``<IMG_CONTEXT>``·k_i between ``<vp>`` and ``</vp>``, k_i = its true grid cells
    (0 gives an empty ``<vp></vp>``, as upstream). Grammar is upstream's ("1 part regions").
    """
    if len(cell_counts) == 0:
        raise ValueError("region_string: expected at least one region, got none")
    parts = []
    for index, count in enumerate(cell_counts):
        if int(count) < 0:
            raise ValueError(f"region_string: region{index + 1} has {count} cells, expected >= 0")
        parts.append(f"region{index + 1}{VP_START_TOKEN}{IMG_CONTEXT_TOKEN * int(count)}{VP_END_TOKEN}")
    return f"There are {len(cell_counts)} part regions in the picture: " + ", ".join(parts) + ".\n"


def detailed_question(template: str, region_index: int = 1) -> str:
    """Fill a DETAILED_QUESTIONS entry for ``region{region_index}`` (upstream strips it first)."""
    return template.strip().replace(REGION_PLACEHOLDER, f"region{region_index}")


def normalize_expression(expression: str, where: str = "expression") -> str:
    """RefCOCO training normalisation of a referring expression: lower-case, drop one final '.'."""
    phrase = expression.lower()
    if phrase.endswith("."):
        phrase = phrase[:-1]
    if not phrase.strip():
        raise ValueError(f"{where}: empty referring expression {expression!r}; drop this expression")
    return phrase


def strip_angle_brackets(text: str) -> str:
    """Osprey cleaning of answer text: remove every '<' and '>' so no tag can reach the targets."""
    return text.replace("<", "").replace(">", "")
