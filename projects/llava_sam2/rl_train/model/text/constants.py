"""Token strings and index constants shared by the processor, the model and the data code.

The strings are data: they must match the released Sa2VA / InternVL2.5 tokenizers byte for byte
(reference/sa2va.md §3.3). ``IGNORE_INDEX``, ``DEFAULT_PAD_TOKEN_INDEX`` and the ``<image>``
placeholder come from xtuner, which the upstream training code uses.
"""
from __future__ import annotations

from xtuner.utils import DEFAULT_IMAGE_TOKEN, DEFAULT_PAD_TOKEN_INDEX, IGNORE_INDEX

# InternVL image block: '<img>' + '<IMG_CONTEXT>' * n_image_tokens + '</img>'.
IMG_START_TOKEN = "<img>"
IMG_END_TOKEN = "</img>"
IMG_CONTEXT_TOKEN = "<IMG_CONTEXT>"

# Tokens Sa2VA adds to the InternVL tokenizer, in the order it adds them (they are the last ids).
SEG_TOKEN = "[SEG]"
PHRASE_START_TOKEN = "<p>"
PHRASE_END_TOKEN = "</p>"
VP_START_TOKEN = "<vp>"
VP_END_TOKEN = "</vp>"
SA2VA_SPECIAL_TOKENS = (SEG_TOKEN, PHRASE_START_TOKEN, PHRASE_END_TOKEN, VP_START_TOKEN, VP_END_TOKEN)

# Already present in the InternVL2.5 tokenizers (Qwen flavour: ids 151665..151673, this order).
INTERNVL_SPECIAL_TOKENS = (
    IMG_START_TOKEN,
    IMG_END_TOKEN,
    IMG_CONTEXT_TOKEN,
    "<quad>",
    "</quad>",
    "<ref>",
    "</ref>",
    "<box>",
    "</box>",
)

# Qwen chat control tokens (ids 151643..151645 in Qwen2.5). EOS is <|im_end|>, pad <|endoftext|>.
QWEN_ENDOFTEXT_TOKEN = "<|endoftext|>"
QWEN_IM_START_TOKEN = "<|im_start|>"
QWEN_IM_END_TOKEN = "<|im_end|>"
QWEN_CHAT_SPECIAL_TOKENS = (QWEN_ENDOFTEXT_TOKEN, QWEN_IM_START_TOKEN, QWEN_IM_END_TOKEN)

IMAGE_PLACEHOLDER = DEFAULT_IMAGE_TOKEN  # '<image>' in user text, replaced by the image block

# torchvision ImageNet statistics used by InternViT tiles and by SAM2's own normalisation.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

__all__ = [
    "DEFAULT_PAD_TOKEN_INDEX",
    "IGNORE_INDEX",
    "IMAGE_PLACEHOLDER",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IMG_CONTEXT_TOKEN",
    "IMG_END_TOKEN",
    "IMG_START_TOKEN",
    "INTERNVL_SPECIAL_TOKENS",
    "PHRASE_END_TOKEN",
    "PHRASE_START_TOKEN",
    "QWEN_CHAT_SPECIAL_TOKENS",
    "QWEN_ENDOFTEXT_TOKEN",
    "QWEN_IM_END_TOKEN",
    "QWEN_IM_START_TOKEN",
    "SA2VA_SPECIAL_TOKENS",
    "SEG_TOKEN",
    "VP_END_TOKEN",
    "VP_START_TOKEN",
]
