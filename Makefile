# Sa2VA-RL developer entry points. Every target is idempotent: `make test` on a fresh clone
# creates .venv, installs the pinned stack, provisions offline WordNet and runs pytest.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.stack-installed
UV_VERSION := 0.13.9
# --python: the venv's interpreter, whatever VIRTUAL_ENV says; byte-compiled at install time as pip does
UV_INSTALL := $(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode
NLTK_DATA ?= $(CURDIR)/.cache/nltk_data
export NLTK_DATA
# torch >= 2.6 loads checkpoints weights-only by default; MMEngine/xtuner resume needs full pickles
# of our own checkpoints (docs/stack.md §2).
export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD := 1
# Two workers (one per core of the CI machine), each test file on one worker (module fixtures run once), handed out
# in collection order, which tests/conftest.py makes longest-first (without --no-loadscope-reorder, xdist sorts the
# files by test count and the slowest files, which hold few tests, start last); tests/conftest.py gives each worker
# one torch thread. The slowest tests are listed at the end.
PYTEST_ARGS ?= -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15

.PHONY: setup test demo clean-venv gpu-wheels gpu-check

setup: $(STAMP) $(NLTK_DATA)/corpora/wordnet/lexnames

$(STAMP): requirements/stack.txt requirements/transformers.txt setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# uv installs the same packages as pip (same resolution from the same registry), but links them from its cache
	# in parallel and resolves the stack with transformers' pin in one pass (docs/stack.md §15)
	$(BIN)/pip install -q --upgrade pip wheel setuptools uv==$(UV_VERSION)
	# xtuner 0.2.0 pins transformers 4.48.0; Qwen3 LLMs need >= 4.56 and the code is written for 4.57
	# (docs/stack.md §14): transformers.txt's transformers pin overrides xtuner's, its other pins are requirements
	grep -E '^transformers==' requirements/transformers.txt > $(VENV)/transformers-override.txt
	$(UV_INSTALL) -r requirements/stack.txt -r requirements/transformers.txt \
		--override $(VENV)/transformers-override.txt
	# xtuner pins bitsandbytes 0.45.0, which imports the removed triton.ops and breaks every peft
	# LoRA wrap (bitsandbytes#1492); nothing here uses 8-bit optimizers, so drop it.
	$(BIN)/uv pip uninstall --quiet --python $(BIN)/python bitsandbytes || true
	# sam2 is an sdist that needs torch at build time; CUDA ops are optional (hole filling only).
	SAM2_BUILD_CUDA=0 $(UV_INSTALL) --no-build-isolation sam2==1.1.0
	$(UV_INSTALL) --no-deps -e .
	touch $@

# Offline WordNet for nltk METEOR: from Debian's wordnet packages (no network beyond registries).
$(NLTK_DATA)/corpora/wordnet/lexnames: tools/setup/provision_wordnet.py | $(STAMP)
	$(BIN)/python tools/setup/provision_wordnet.py --target $(NLTK_DATA)

test: setup
	# yapf (imported by mmengine.config) writes its grammar pickles into its package on the first import; two
	# pytest workers doing that first import at once can read a half-written pickle (EOFError). Import it once here.
	$(BIN)/python -c "import yapf"
	$(BIN)/python -m pytest $(PYTEST_ARGS) -m "not demo" tests

# The embedded demo: shapes world + the committed pretrained tiny Sa2VA -> GRPO cycle RL -> held-out report.
demo: setup
	$(BIN)/sa2va-rl demo --work-dir work_dirs/demo
	# the demo's longer learning check (same-domain paired data, both loops; tests marked `demo`)
	$(BIN)/python -m pytest -q -m demo tests

# On a GPU host: every launch path (1 GPU, DDP, ZeRO-2), parity and exact resume, with a table and JSON (docs/gpu.md).
gpu-check: setup
	$(BIN)/sa2va-rl check gpu --work-dir work_dirs/gpu_check

# Wheels of the stack for a GPU machine without a package registry (docs/speed.md).
gpu-wheels: setup
	bash tools/setup/gpu_wheels.sh

clean-venv:
	rm -rf $(VENV)
