"""Short environment report printed at the start of every run."""
import platform
from importlib import metadata

import torch

__all__ = ["collect_env_info"]


def _package_version(distribution):
    """Installed version of a distribution, or "not installed"."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def _gpu_lines():
    """One line per visible GPU, or a single line saying none is usable."""
    try:
        if not torch.cuda.is_available():
            return ["GPUs: none (CUDA not available)"]
        return [
            f"GPU {index}: {torch.cuda.get_device_name(index)}"
            for index in range(torch.cuda.device_count())
        ]
    except RuntimeError as error:  # a broken driver must not stop the run
        return [f"GPUs: unknown ({error})"]


def collect_env_info():
    """Return a multi-line report: Python, platform, torch (+ its CUDA/cuDNN builds),
    torchvision, open_clip, CUDA availability and GPU names, Pillow.

    Versions are read from package metadata (nothing heavy is imported), and no probe
    needs a GPU, so the call neither fails nor hangs on a machine without one.
    """
    cudnn_version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    lines = [
        f"Python: {platform.python_version()} ({platform.python_implementation()})",
        f"Platform: {platform.platform()}",
        f"PyTorch: {torch.__version__} (CUDA build: {torch.version.cuda}, cuDNN: {cudnn_version})",
        f"torchvision: {_package_version('torchvision')}",
        f"open_clip: {_package_version('open_clip_torch')}",
        f"CUDA available: {torch.cuda.is_available()}",
        *_gpu_lines(),
        f"Pillow: {_package_version('Pillow')}",
    ]
    return "\n".join(lines)
