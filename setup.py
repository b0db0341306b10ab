"""Install the Sa2VA-RL plugin as the namespace package ``projects.llava_sam2.rl_train``.

The heavy stack is pinned in ``requirements/stack.txt`` and installed by ``make setup`` in a fixed
order (torch first, then xtuner, then ``sam2`` without build isolation); ``install_requires`` only
names what the package imports, with the pins that matter.
"""
from setuptools import find_namespace_packages, setup

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
        "torchvision==0.26.0",
        "transformers==4.48.0",
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
    ],
    entry_points={"console_scripts": ["sa2va-rl=projects.llava_sam2.rl_train.cli.main:main"]},
)
