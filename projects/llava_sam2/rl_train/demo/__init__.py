"""The embedded CPU demo (shapes world -> GRPO -> held-out report), its controls, and the tiny pretraining recipe."""
