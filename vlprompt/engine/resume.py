"""Which checkpoint a run resumes from, and the files of mid-epoch checkpoints.

Every registered model has its folder ``DIR/<name>/`` holding

* epoch checkpoints ``model.pth.tar-N`` (Dassl's names): N epochs done;
* mid-epoch checkpoints ``model.pth.tar-E-batchB`` (ours, TRAIN.CHECKPOINT_ITERS > 0):
  E epochs and B batches of epoch E + 1 done;
* possibly ``model-best.pth.tar`` and the ``checkpoint`` pointer file (not resume points,
  except that the pointer is the fallback when no numbered file exists, as in Dassl).

A resume point is a position (epochs done, batches done) for which every model has a file;
the newest one whose files all load is used. A file that does not load (truncated by a
copy, corrupted on disk) is skipped with a message naming it and the reason, and the
previous position is tried. Files are written with ``atomic_write``, so a save killed
midway leaves only a hidden temporary file, which is removed here.

After a mid-epoch checkpoint, :func:`continue_epoch` gives the batches the interrupted epoch
had not run yet (the loader's sampler must be resumable: those of :mod:`vlprompt.data.samplers`);
:func:`resume_banner` is the message that tells the user a run resumes and from where.
"""
import os
import os.path as osp
from dataclasses import dataclass, field

from vlprompt.run_layout import (
    POINTER_FILENAME, checkpoint_position, epoch_checkpoint_name, mid_epoch_checkpoint_name,
)
from vlprompt.utils import CheckpointError, check_checkpoint_content, load_checkpoint, set_rng_state

__all__ = [
    "MID_EPOCH_KEEP",
    "ResumePoint",
    "checkpoint_files",
    "continue_epoch",
    "find_resume_point",
    "prune_mid_epoch_checkpoints",
    "resumable_sampler",
    "resume_banner",
]

MID_EPOCH_KEEP = 2
"""Mid-epoch checkpoints kept per model folder: the newest, and one to fall back to."""


def checkpoint_files(folder):
    """{(epochs done, batches done): file name} of the epoch and mid-epoch checkpoints in ``folder``.

    Epoch checkpoints ``model.pth.tar-N`` are at (N, 0). A missing folder gives {}.
    """
    if not osp.isdir(folder):
        return {}
    positions = {name: checkpoint_position(name) for name in os.listdir(folder)}
    return {position: name for name, position in positions.items() if position is not None}


def prune_mid_epoch_checkpoints(folder, keep=MID_EPOCH_KEEP):
    """Delete the mid-epoch checkpoints of ``folder`` except the ``keep`` newest."""
    mid_epoch = sorted(position for position in checkpoint_files(folder) if position[1] > 0)
    for epochs_done, batches_done in mid_epoch[: max(len(mid_epoch) - keep, 0)]:
        os.remove(osp.join(folder, mid_epoch_checkpoint_name(epochs_done, batches_done)))


def _remove_interrupted_writes(folder):
    """Delete the hidden temporary files that ``atomic_write`` leaves when a save is killed."""
    leftovers = [name for name in os.listdir(folder) if name.startswith(".") and name.endswith(".tmp")]
    for name in leftovers:
        os.remove(osp.join(folder, name))
    if leftovers:
        print(f'Removed {len(leftovers)} temporary file(s) left in "{folder}" by an interrupted save')


@dataclass
class ResumePoint:
    """The checkpoints a run resumes from.

    Attributes:
        epochs_done: completed epochs.
        batches_done: completed batches of the next epoch (0 for an epoch checkpoint).
        paths: {model name: checkpoint path}.
        checkpoints: {model name: loaded checkpoint dict}.
    """

    epochs_done: int
    batches_done: int
    paths: dict = field(default_factory=dict)
    checkpoints: dict = field(default_factory=dict)

    @property
    def mid_epoch(self):
        return self.batches_done > 0


def _pointer_candidate(folders):
    """{name: path} of the files the pointer files name, if every folder has one; else None."""
    paths = {}
    for name, folder in folders.items():
        pointer = osp.join(folder, POINTER_FILENAME)
        if not osp.isfile(pointer):
            return None
        with open(pointer, "r", encoding="utf-8") as f:
            paths[name] = osp.join(folder, f.readline().strip())
    print(
        f"Note: no {epoch_checkpoint_name('N')} found; resuming from the files named by the pointer files "
        f"({', '.join(sorted(set(map(osp.basename, paths.values()))))}), after their epoch"
    )
    return paths


def _load_all(paths):
    """{name: checkpoint} for {name: path}; CheckpointError names the first file that fails."""
    checkpoints = {}
    for name, path in paths.items():
        try:
            checkpoint = load_checkpoint(path)
        except FileNotFoundError as error:
            raise CheckpointError(str(error)) from error
        check_checkpoint_content(checkpoint, path)
        checkpoints[name] = checkpoint
    return checkpoints


def find_resume_point(directory, names):
    """The newest position with a loadable checkpoint for every model in ``names``.

    Args:
        directory: the run folder (holds one sub-folder per model name).
        names: registered model names.

    Returns:
        ResumePoint, or None when some model has no folder or no folder holds a checkpoint.

    Raises:
        CheckpointError: checkpoints exist but none of them loads (each failure is listed).
    """
    folders = {name: osp.join(directory, name) for name in names}
    if not names or any(not osp.isdir(folder) for folder in folders.values()):
        return None
    for folder in folders.values():
        _remove_interrupted_writes(folder)
    files = {name: checkpoint_files(folder) for name, folder in folders.items()}
    common = set.intersection(*(set(positions) for positions in files.values()))
    partial = sorted(set.union(*(set(positions) for positions in files.values())) - common)
    if partial:
        print(
            "Note: ignoring checkpoints that exist for only some of the models (a save was interrupted): "
            + ", ".join(f"{epochs} epoch(s) + {batches} batch(es)" for epochs, batches in partial)
        )
    candidates = [
        (position, {name: osp.join(folders[name], files[name][position]) for name in names})
        for position in sorted(common, reverse=True)
    ]
    if not candidates:
        pointed = _pointer_candidate(folders)
        candidates = [] if pointed is None else [(None, pointed)]
    failures = []
    for position, paths in candidates:
        try:
            checkpoints = _load_all(paths)
        except CheckpointError as error:
            print(f"Skipping a checkpoint that cannot be used, trying the previous one: {error}")
            failures.append(str(error))
            continue
        if position is None:
            position = (checkpoints[names[0]]["epoch"], 0)
        return ResumePoint(position[0], position[1], paths, checkpoints)
    if failures:
        raise CheckpointError(
            f'None of the checkpoints in "{directory}" can be used:\n' + "\n".join(failures)
            + "\nDelete them to train from scratch, or use another --output-dir."
        )
    return None


def resume_banner(directory, start_epoch, max_epoch, batches_done=0):
    """The framed message saying that the run in ``directory`` resumes, and where it goes on."""
    if batches_done:
        plan = (
            f"** Training resumes in epoch {start_epoch + 1}/{max_epoch} after batch {batches_done} "
            "(weights, optimizer, scheduler, RNG states and data order restored)."
        )
    elif start_epoch >= max_epoch:
        plan = (
            f"** All {max_epoch} epochs are already done (checkpoint of epoch {start_epoch}): "
            "training is skipped and the final model is evaluated again."
        )
    else:
        plan = (
            f"** Training resumes after epoch {start_epoch}: the next epoch is "
            f"{start_epoch + 1}/{max_epoch} (weights, optimizer, scheduler and RNG states restored)."
        )
    line = "*" * 78
    return "\n".join(
        [
            line,
            f'** RESUMING: "{directory}" already holds checkpoints of an earlier run.',
            plan,
            "** To start a fresh run instead, use another --output-dir or add --restart (which moves the old files aside).",
            line,
        ]
    )


def resumable_sampler(loader):
    """The sampler of ``loader`` if it can resume mid-epoch (has ``resume_epoch`` and the loader
    batches), else None (e.g. a trainer's own loader)."""
    sampler = getattr(loader, "sampler", None)
    return sampler if hasattr(sampler, "resume_epoch") and loader.batch_size else None


def continue_epoch(loader, pending, num_batches, checkpoint_path):
    """(iterator over the batches an interrupted epoch had not run, index of the first of them).

    Args:
        loader: the training loader.
        pending: the checkpoint's "mid_epoch" entry ("num_batches", "sampler", "batches_done")
            plus "rng_state" (the checkpoint's RNG states, or None).
        num_batches: batches per epoch of ``loader`` now.
        checkpoint_path: the mid-epoch checkpoint (for the error message).

    The RNG states are restored after the loader's iterator is created, since creating it
    draws from torch's generator.

    Raises:
        CheckpointError: the loader cannot resume mid-epoch, or has another number of batches.
    """
    sampler = resumable_sampler(loader)
    if sampler is None or pending["num_batches"] != num_batches:
        raise CheckpointError(
            f"The mid-epoch checkpoint \"{checkpoint_path}\" cannot continue this epoch: "
            + ("the training loader cannot resume mid-epoch (its sampler is not resumable)" if sampler is None
               else f"it was written for {pending['num_batches']} batches per epoch, the loader now has "
               f"{num_batches} (did the training data or the batch size change?)")
            + f". Delete the mid-epoch checkpoints ({mid_epoch_checkpoint_name('E', 'B')}) to resume from the last "
            "epoch."
        )
    sampler.resume_epoch(pending["sampler"], pending["batches_done"] * loader.batch_size)
    batches = iter(loader)
    if pending["rng_state"] is not None:
        set_rng_state(pending["rng_state"])
    return batches, pending["batches_done"]
