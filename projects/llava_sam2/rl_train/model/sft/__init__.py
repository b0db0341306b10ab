"""Supervised fine-tuning as upstream Sa2VA does it: examples and loss.

* ``sft_data``: region-caption and referring-segmentation examples from ``RegionSample``s;
* ``sft_loss``: the upstream SFT loss (token CE + mask BCE + Dice) as plain functions, plus two opt-in terms.

Imports: ``text``, ``network`` and ``decoding`` (the same body/head split as the RL scoring forward).
"""
