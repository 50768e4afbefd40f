"""Where a dataset's generated files go: its split file (when the pipeline makes one) and its
few-shot caches (``split_fewshot/``).

They go into the dataset folder itself, as in CoOp, unless that folder cannot be written (a
read-only mount, a shared copy without write permission) or ``DATASET.CACHE_DIR`` names
another place. Then they go to a folder keyed by the dataset folder,
``<base>/<folder name>-<first 12 hex digits of the SHA-256 of its real path>``, where ``<base>``
is ``DATASET.CACHE_DIR``, or by default ``$XDG_CACHE_HOME/vlprompt/datasets`` (``XDG_CACHE_HOME``
defaults to ``~/.cache``); a line in the log says where. Files the pipeline reads are looked for
in the dataset folder first, then in that folder (see :func:`generated_file`).
"""
import hashlib
import os
import tempfile

__all__ = ["DEFAULT_CACHE_BASE", "folder_is_writable", "generated_file", "generated_files_dir"]

# Below $XDG_CACHE_HOME (default ~/.cache): the default base of the keyed folders.
DEFAULT_CACHE_BASE = os.path.join("vlprompt", "datasets")


def folder_is_writable(folder):
    """Whether a file can be created in ``folder``, found by creating (and removing) one: permission
    bits do not tell it for root or on network file systems."""
    try:
        descriptor, probe = tempfile.mkstemp(dir=folder, prefix=".vlprompt-write-probe-")
    except OSError:
        return False
    os.close(descriptor)
    os.remove(probe)
    return True


def _keyed_folder(base, dataset_dir):
    real = os.path.realpath(dataset_dir)
    digest = hashlib.sha256(real.encode("utf-8")).hexdigest()[:12]
    return os.path.join(base, f"{os.path.basename(real) or 'root'}-{digest}")


def generated_files_dir(cfg, dataset_dir):
    """The folder that receives ``dataset_dir``'s generated files (module docstring); prints a
    line when it is not the dataset folder."""
    if cfg.DATASET.CACHE_DIR:
        folder = _keyed_folder(os.path.expanduser(cfg.DATASET.CACHE_DIR), dataset_dir)
        print(f"Generated split and few-shot files of {dataset_dir} are kept in {folder} (DATASET.CACHE_DIR)")
        return folder
    if not os.path.isdir(dataset_dir) or folder_is_writable(dataset_dir):
        return dataset_dir  # a folder not made yet is made where it is, as before
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = _keyed_folder(os.path.join(cache_home, DEFAULT_CACHE_BASE), dataset_dir)
    print(f"{dataset_dir} cannot be written (a read-only folder): its generated split and few-shot files are "
          f"kept in {folder} (set DATASET.CACHE_DIR to choose another place)")
    return folder


def generated_file(path, dataset_dir, store):
    """Where to read or write the generated file ``path`` (a path below ``dataset_dir``, or any other).

    ``path`` itself when it exists, or lies outside ``dataset_dir``, or ``store`` is the dataset
    folder; otherwise the same relative path below ``store``.
    """
    relative = os.path.relpath(path, dataset_dir)
    if store == dataset_dir or os.path.exists(path) or relative.startswith(os.pardir):
        return path
    return os.path.join(store, relative)
