"""Install the Sa2VA-RL plugin as the namespace package ``projects.llava_sam2.rl_train``.

The heavy stack is pinned in ``requirements/stack.txt`` and installed by ``make setup`` in a fixed
order (torch first, then xtuner, then ``requirements/transformers.txt`` over the transformers 4.48 that xtuner
pins, then ``sam2`` without build isolation). xtuner 0.2.0's metadata pins ``transformers==4.48.0`` while this
package needs 4.57 (docs/stack.md §14), so no resolver can satisfy both: install the plugin with ``--no-deps`` into
an environment that has the stack (``make setup`` does). ``install_requires`` names
every distribution the package imports (tests/test_install_checkout.py checks it against the
sources), with the pins that matter. Optional lines are extras: ``prompt_rl`` (prompt-selection
policy: gymnasium, stable-baselines3), ``meteor_jar`` (official METEOR 1.5 for paper numbers:
pycocoevalcap's jar, needs Java), ``deepspeed`` (ZeRO training; reading DeepSpeed checkpoints does
not need it), ``logging`` (MMEngine's TensorBoard backend, configs/rl/_base_/visualizers.py).
``pip install -e ".[all]"`` takes all of them.

Inside a Sa2VA checkout: ``projects/`` and ``projects/llava_sam2/`` have no ``__init__.py`` here or
upstream (PEP 420 namespace packages), so ``projects.llava_sam2.rl_train`` installs beside upstream's
``projects.llava_sam2.models`` / ``datasets`` and both import.
"""
from setuptools import find_namespace_packages, setup

EXTRAS = {
    "prompt_rl": ["gymnasium", "stable-baselines3"],
    "meteor_jar": ["pycocoevalcap==1.2"],
    "deepspeed": ["deepspeed==0.16.2"],
    "logging": ["tensorboard"],
}
EXTRAS["all"] = sorted({req for reqs in EXTRAS.values() for req in reqs})

setup(
    name="sa2va-rl",
    version="0.1.0",
    description="GRPO post-training (dual-loop cycle RL) for Sa2VA, as an XTuner/MMEngine plugin",
    python_requires=">=3.10",
    packages=find_namespace_packages(include=["projects.llava_sam2.rl_train*"]),
    package_data={"projects.llava_sam2.rl_train": ["assets/**/*", "assets/*"]},
    include_package_data=True,
    install_requires=[
        "torch==2.11.0",
        "triton; platform_system == 'Linux'",  # the decode's attention kernels (torch's Linux wheels pin it)
        "torchvision==0.26.0",
        "transformers==4.57.6",
        "mmengine==0.10.6",
        "xtuner==0.2.0",
        "peft>=0.14",
        "sam2==1.1.0",
        "pycocotools",
        "nltk",
        "openai",
        "aiohttp",
        "inflect==7.5.0",
        "safetensors",
        "datasets",
        "tokenizers==0.22.2",
        "numpy",
        "Pillow",
        "pyarrow",
        "matplotlib",
        "scipy",
        "opencv-python",  # mp4 frames of SA-V videos (data/video.py); MMEngine installs it too
        "tqdm",
        "packaging",  # the Qwen-VL family checks the transformers release it needs (model/network/qwen_vl.py)
    ],
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["sa2va-rl=projects.llava_sam2.rl_train.cli.main:main"]},
)
