"""The prompt-selection pipeline as steps, each a module with ``main(argv)``: ``sa2va-rl prompt-rl --help``."""
