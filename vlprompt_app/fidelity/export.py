"""Exporting the official trees (``git archive HEAD`` of a clone or a bare git directory)."""
import os
import shutil
import subprocess

from vlprompt.fileio import atomic_write


EXPORTED_COMMIT_FILE = ".commit"  # in a tree exported earlier (tools/gpu_acceptance.py prepare): its commit


def export(git_dir, target, exclude=()):
    """``git archive HEAD`` of ``git_dir`` into ``target`` without the paths in ``exclude``; return the commit.

    ``git_dir`` may also be a tree exported earlier (a folder with ``EXPORTED_COMMIT_FILE``, for a
    machine without git or the clones): it is copied as it is.
    """
    recorded = os.path.join(git_dir, EXPORTED_COMMIT_FILE)
    if os.path.isfile(recorded):
        shutil.copytree(git_dir, target)
        with open(recorded, encoding="utf-8") as f:
            return f.read().strip()
    found = subprocess.run(["git", "-C", git_dir, "rev-parse", "HEAD"], capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit(f"'{git_dir}' is not a git repository with a commit ({found.stderr.strip()}); "
                         "give a clone (or the git directory) of the official repository.")
    commit = found.stdout.strip()
    os.makedirs(target)
    pathspecs = ["--", "."] + [f":(exclude){path}" for path in exclude] if exclude else []
    archive = subprocess.run(["git", "-C", git_dir, "archive", "HEAD", *pathspecs], capture_output=True)
    if archive.returncode == 0:
        subprocess.run(["tar", "-x", "-C", target], input=archive.stdout, check=True)
    else:
        _export_present_files(git_dir, target)
    return commit


def _export_present_files(git_dir, target):
    """Write HEAD's files one by one into ``target``, leaving out (and naming) those whose content
    the repository lacks, e.g. the large files of a snapshot that ``git archive`` refuses."""
    listing = subprocess.run(["git", "-C", git_dir, "ls-tree", "-r", "-z", "HEAD"], check=True, capture_output=True)
    missing = []
    for entry in listing.stdout.decode().split("\0"):
        if not entry:
            continue
        meta, path = entry.split("\t", 1)
        kind, blob = meta.split()[1:]
        content = subprocess.run(["git", "-C", git_dir, "cat-file", "blob", blob], capture_output=True) \
            if kind == "blob" else None
        if content is None or content.returncode != 0:
            missing.append(path)
            continue
        with atomic_write(os.path.join(target, path), "wb") as f:
            f.write(content.stdout)
    print(f"git archive failed on {git_dir}; exported HEAD file by file, leaving out the files it lacks "
          f"({len(missing)}): {', '.join(missing)}")


def export_trees(spec, official_git, dassl_git, folder):
    """Export the official repository of ``spec`` and, unless it holds its own fork or runs without
    Dassl, the Dassl clone into ``folder`` (``official``, ``dassl``).

    Returns:
        (official commit, Dassl commit or None, [the official code folder, the Dassl folder]):
        the folders go first on the official side's ``PYTHONPATH``.
    """
    for label, path in (("--official-git", official_git), ("--dassl-git", dassl_git)):
        if path is not None and not os.path.isdir(path):
            raise SystemExit(f"{label} '{path}' is not a folder; "
                             "give a clone (or the git directory) of the repository.")
    official_commit = export(official_git, os.path.join(folder, "official"), spec.archive_exclude)
    code_path = os.path.join(folder, "official", spec.code_dir)
    if not spec.needs_dassl:
        dassl = [os.path.join(folder, "official", spec.dassl_dir)] if spec.dassl_dir is not None else []
        return official_commit, (official_commit if dassl else None), [code_path] + dassl
    dassl_path = os.path.join(folder, "dassl")
    return official_commit, export(dassl_git, dassl_path), [code_path, dassl_path]
