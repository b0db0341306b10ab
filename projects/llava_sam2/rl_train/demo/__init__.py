"""The embedded CPU demo: shapes world -> SFT -> dual-loop GRPO -> held-out evaluation and report."""
