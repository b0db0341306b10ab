"""The model's inputs as data: token strings, prompts, the tokenizer, image tiling and the processor.

Everything that turns an (image, region, text) sample into what the network reads, with no network in sight:

* ``constants``: special-token strings and index constants (byte for byte as the released tokenizers);
* ``prompts``: Sa2VA's prompt strings and the pure-string builders around them;
* ``tokenizer``: the tiny test tokenizer and the Sa2VA-token check of any tokenizer;
* ``tiling``: dynamic tiling, ImageNet normalisation and the SAM2 resize;
* ``input_check``: which samples the model can take (image size, region on the region grid);
* ``processor``: ``Sa2VAProcessor`` (images → tiles, masks → region cells, text → templated token ids) and
  ``sft_collate``.

Imports: nothing else of ``model/`` (the lowest sub-package). This file imports nothing, so importing a module
here loads only what that module needs.
"""
