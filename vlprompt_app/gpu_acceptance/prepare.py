"""``tools/gpu_acceptance.py prepare``: what the GPU machine needs and cannot download, in one folder.

    FOLDER/wheels/       the wheels of the packages it lacks (``CARRIED``, at this environment's
                         versions, for CPython 3.12 on x86-64 Linux)
    FOLDER/official/     the official trees (``OWNER+NAME/``, each with the commit in ``.commit``)
                         and Dassl.pytorch (``dassl/``)
    FOLDER/commit        the commit of this checkout

The folder is git-ignored (``.gpu/`` by default) and travels as a carried path.
"""
import os
import subprocess
import sys
from importlib import metadata

from vlprompt.fileio import write_text
from vlprompt_app.benchmarking.report import git_commit
from vlprompt_app.fidelity.export import EXPORTED_COMMIT_FILE, export

from .run import DASSL_FOLDER

# what the GPU image lacks of the project's needs and the official code's (its torch, torchvision,
# timm, regex, tqdm, huggingface_hub, safetensors, numpy, pillow and tabulate are there)
CARRIED = ("open_clip_torch", "ftfy", "wcwidth", "yacs")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def download_wheels(folder):
    """pip-download the CARRIED packages (this environment's versions) as CPython 3.12 wheels."""
    pins = [f"{name}=={metadata.version(name)}" for name in CARRIED]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
               "--implementation", "cp", *(item for platform in PLATFORMS for item in ("--platform", platform)),
               "-d", folder, *pins]
    subprocess.run(command, check=True)
    return pins


def export_official(folder, official_git, dassl_git):
    """Export each ``OWNER/NAME=PATH`` of ``official_git`` into ``folder/OWNER+NAME`` and Dassl into
    ``folder/dassl``; returns {name: commit}."""
    commits = {}
    for item in official_git:
        name, separator, path = item.partition("=")
        if not separator or "/" not in name:
            raise SystemExit(f"error: --official-git takes OWNER/NAME=PATH, got '{item}'")
        commits[name] = _export_once(path, os.path.join(folder, name.replace("/", "+")))
    if dassl_git:
        commits["Dassl.pytorch"] = _export_once(dassl_git, os.path.join(folder, DASSL_FOLDER))
    return commits


def _export_once(git_dir, target):
    if os.path.exists(target):
        with open(os.path.join(target, EXPORTED_COMMIT_FILE), encoding="utf-8") as f:
            return f.read().strip()
    commit = export(git_dir, target)
    write_text(commit + "\n", os.path.join(target, EXPORTED_COMMIT_FILE))
    return commit


def prepare(folder, official_git, dassl_git, wheels=True):
    """Fill ``folder`` (see the module docstring); returns a summary dict."""
    os.makedirs(folder, exist_ok=True)
    summary = {"commits": export_official(os.path.join(folder, "official"), official_git, dassl_git)}
    if wheels:
        summary["wheels"] = download_wheels(os.path.join(folder, "wheels"))
    write_text(git_commit() + "\n", os.path.join(folder, "commit"))
    return summary
