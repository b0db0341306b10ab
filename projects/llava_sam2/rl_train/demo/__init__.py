"""Demo pipeline internals and the tiny pretraining recipe (``demo/pretrain_tiny.py``)."""
