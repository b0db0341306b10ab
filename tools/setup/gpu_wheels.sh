#!/usr/bin/env bash
# tools/setup/gpu_wheels.sh: download the py3.12 wheels our stack needs on the lent GPU machines (torch 2.11 + cu130 and
# transformers 5.x are preinstalled there, with no package registry). Install there with:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
# (docs/gpu.md, docs/benchmarks.md: the command every GPU figure was measured with)
# docs/stack.md §13 says how the wheels are installed there.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.whl
mkdir -p "$dest"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
pkgs=(addict==2.4.0 annotated_types==0.8.0 antlr4-python3-runtime==4.9.3 datasets==3.2.0 deepspeed==0.16.2
      dill==0.3.8 et_xmlfile==2.0.0 hjson==3.1.0 huggingface_hub==0.36.0 hydra-core==1.3.2 iopath==0.1.10
      loguru==0.7.3 mmengine==0.10.6 multiprocess==0.70.16 nltk==3.10.4 omegaconf==2.3.0 openpyxl==3.1.5
      platformdirs==4.14.5 py-cpuinfo==9.0.0 pycocotools==2.0.11 pydantic==2.11.9 pydantic_core==2.33.2
      termcolor==3.3.0 tokenizers==0.22.2 transformers==4.57.6 transformers_stream_generator==0.0.5
      typing_inspection==0.4.5 xtuner==0.2.0 yapf==0.43.0 peft==0.21.2
      openai==3.52.0 httpx2==2.16.2 httpcore2==2.16.2 jiter==0.19.0 sniffio==1.3.1 truststore==0.10.5
      inflect==7.5.0 more_itertools==11.2.1 typeguard==4.6.0)
# matplotlib, pytest, tensorboard, aiohttp, opencv and mpi4py are in the GPU image already; leaving them out keeps the
# wheels plus WordNet under the 64 MiB a call can carry.
for p in "${pkgs[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d "$dest" "$p" 2>/dev/null \
  || python3 -m pip wheel -q --no-deps --no-build-isolation -w "$dest" "$p"
done
# sam2 is an sdist: build a pure-python wheel without CUDA ops (hole filling is not used).
ls "$dest"/sam2-*.whl >/dev/null 2>&1 || SAM2_BUILD_CUDA=0 .venv/bin/pip wheel -q --no-deps --no-build-isolation -w "$dest" sam2==1.1.0
ls "$dest" | wc -l; du -sh "$dest"
# WordNet for METEOR, zipped (11 MB): carry .devrun and unzip it there before a run that scores METEOR:
#   (cd .devrun/nltk_data/corpora && python3 -m zipfile -e wordnet.zip .) && export NLTK_DATA=$PWD/.devrun/nltk_data
mkdir -p .devrun/nltk_data/corpora
(cd "${NLTK_DATA:-.cache/nltk_data}/corpora" && python3 -m zipfile -c "$OLDPWD/.devrun/nltk_data/corpora/wordnet.zip" wordnet)
du -sh .devrun
