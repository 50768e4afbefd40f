"""Where the library finds the checkout's resource folders (``configs/``, ``weights/``)."""
from pathlib import Path


def repository_root() -> Path:
    """The folder that holds the imported ``vlprompt`` package (the repository root).

    ``configs/`` and ``weights/`` are resolved against it, so that relative resource paths in
    configs work from any working directory.
    """
    return Path(__file__).resolve().parents[1]
