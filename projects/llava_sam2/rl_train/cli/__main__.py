"""``python -m projects.llava_sam2.rl_train.cli COMMAND ...``: ``sa2va-rl`` without the console script."""
import sys

from projects.llava_sam2.rl_train.cli.main import main

sys.exit(main())
