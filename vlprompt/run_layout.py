"""The layout of a run folder: the one place where the names of its files are spelled.

:class:`vlprompt.engine.run_folder.RunFolder` is the API over this layout (paths, reading,
writing, the lock): the engine, the methods and the application get their paths from it. The
names live in this module, which imports nothing of the library, so that the helpers below the
engine that keep Dassl's defaults (``setup_logger(OUTPUT_DIR)`` opens ``log.txt``,
``save_checkpoint`` names ``model.pth.tar-N``, the evaluator saves ``OUTPUT_DIR/cmat.pt``,
``check_images`` reports to ``bad_images.txt``) take them from here as well. :data:`LAYOUT` lists every file a run
may leave in its folder (Dassl's names where Dassl has them)::

    OUTPUT_DIR/
        log.txt                     the log; a restarted run writes log.txt-YYYY-MM-DD-HH-MM-SS
                                    beside the earlier ones; the processes of rank R > 0 of a
                                    torchrun job write log-rankR.txt
        config.yaml                 the merged config of a training run (detectron2's name)
        eval_config.yaml            the merged config of an evaluation of a --model-dir (its folder
                                    is not a model, so not config.yaml)
        results.json                the record of the final evaluation, written last
        run.lock                    present while a process runs into the folder
        console.txt                 the console output of each attempt of the protocol runner
        cmat.pt                     the confusion matrix (TEST.COMPUTE_CMAT)
        bad_images.txt              the image files that cannot be read (DATASET.CHECK_IMAGES)
        wiseft_alphas.json          WiSE-FT's sweep of mixing coefficients
        tensorboard/                the tensorboard writer's event files
        test_time/<split>.json      a test-time method's header of per-image episode records,
        test_time/<split>.bin       and the records
        <model name>/model.pth.tar-N          checkpoint after N completed epochs
        <model name>/model.pth.tar-E-batchB   mid-epoch checkpoint (E epochs + B batches done)
        <model name>/model-best.pth.tar       checkpoint of the best val result (TEST.FINAL_MODEL best_val)
        <model name>/checkpoint               the pointer file: the name of the checkpoint written last
        replaced-YYYY-MM-DD-HH-MM-SS/         an earlier run's files, moved aside by a run started
                                              afresh (train.py --restart)
"""
import os
import re
from datetime import datetime
from typing import Optional, Tuple

__all__ = [
    "CONFIG_FILENAME", "EVAL_CONFIG_FILENAME", "RESULTS_FILENAME", "LOG_FILENAME", "LOCK_FILENAME", "CONSOLE_FILENAME", "CMAT_FILENAME",
    "BAD_IMAGES_FILENAME", "WISEFT_SWEEP_FILENAME", "TENSORBOARD_DIRNAME", "TEST_TIME_DIRNAME",
    "BEST_CHECKPOINT", "POINTER_FILENAME", "LAYOUT", "log_name", "timestamped_log_name", "log_start_time",
    "epoch_checkpoint_name", "mid_epoch_checkpoint_name", "checkpoint_position", "episode_record_names",
    "describe", "REPLACED_PREFIX", "replaced_folder_name", "is_replaced_folder",
]

CONFIG_FILENAME = "config.yaml"
EVAL_CONFIG_FILENAME = "eval_config.yaml"
REPLACED_PREFIX = "replaced-"
RESULTS_FILENAME = "results.json"
LOG_FILENAME = "log.txt"
LOCK_FILENAME = "run.lock"
CONSOLE_FILENAME = "console.txt"
CMAT_FILENAME = "cmat.pt"
BAD_IMAGES_FILENAME = "bad_images.txt"
WISEFT_SWEEP_FILENAME = "wiseft_alphas.json"
TENSORBOARD_DIRNAME = "tensorboard"
TEST_TIME_DIRNAME = "test_time"
BEST_CHECKPOINT = "model-best.pth.tar"
POINTER_FILENAME = "checkpoint"

_CHECKPOINT_PREFIX = "model.pth.tar-"
_RANK_LOG = "log-rank{rank}.txt"
_LOG_TIMESTAMP = "%Y-%m-%d-%H-%M-%S"
_BATCH_INFIX = "-batch"
_EPISODE_RECORDS = ("{split}.json", "{split}.bin")

_REPLACED = re.compile(r"^replaced-\d{4}-\d{2}-\d{2}-\d{2}-\d{2}-\d{2}(-\d+)?$")
_TIMESTAMPED_LOG = re.compile(r"^log(?:-rank\d+)?\.txt-(\d{4}-\d{2}-\d{2}-\d{2}-\d{2}-\d{2})$")
_EPOCH_CHECKPOINT = re.compile(r"^model\.pth\.tar-(\d+)$")
_MID_EPOCH_CHECKPOINT = re.compile(r"^model\.pth\.tar-(\d+)-batch(\d+)$")

LAYOUT = (
    (re.compile(r"^log\.txt$"), "the log"),
    (re.compile(r"^log-rank\d+\.txt$"), "the log of a torchrun process of rank > 0"),
    (_TIMESTAMPED_LOG, "the log of a restarted run"),
    (re.compile(r"^config\.yaml$"), "the merged config of a training run"),
    (re.compile(r"^eval_config\.yaml$"), "the merged config of an evaluation of a --model-dir"),
    (re.compile(r"^replaced-\d{4}-\d{2}-\d{2}-\d{2}-\d{2}-\d{2}(-\d+)?/.+$"), "an earlier run's file, moved aside"),
    (re.compile(r"^results\.json$"), "the record of the final evaluation"),
    (re.compile(r"^run\.lock$"), "the lock of the process running into the folder"),
    (re.compile(r"^console\.txt$"), "the console output of the protocol runner's attempts"),
    (re.compile(r"^cmat\.pt$"), "the confusion matrix"),
    (re.compile(r"^bad_images\.txt$"), "the unreadable image files"),
    (re.compile(r"^wiseft_alphas\.json$"), "WiSE-FT's sweep of mixing coefficients"),
    (re.compile(r"^tensorboard/[^/]+$"), "a tensorboard event file"),
    (re.compile(r"^test_time/[^/]+\.json$"), "the header of a split's test-time episode records"),
    (re.compile(r"^test_time/[^/]+\.bin$"), "a split's test-time episode records"),
    (re.compile(r"^[^/]+/model\.pth\.tar-\d+$"), "a checkpoint after an epoch"),
    (re.compile(r"^[^/]+/model\.pth\.tar-\d+-batch\d+$"), "a mid-epoch checkpoint"),
    (re.compile(r"^[^/]+/model-best\.pth\.tar$"), "the checkpoint of the best val result"),
    (re.compile(r"^[^/]+/checkpoint$"), "the pointer to the checkpoint written last"),
)
"""(pattern of a path relative to the run folder, in "/" form; what the file is) of every file a run
writes into its folder: the module docstring's table. tests/test_run_folder_owner.py checks that every
name this module makes has its entry."""


def log_name(rank: int = 0) -> str:
    """``log.txt``, or ``log-rank<R>.txt`` for the process of rank R > 0 of a torchrun job."""
    return LOG_FILENAME if rank == 0 else _RANK_LOG.format(rank=rank)


def timestamped_log_name(name: str, when: datetime) -> str:
    """``<name>-YYYY-MM-DD-HH-MM-SS``: the log of a run started at ``when`` beside an earlier ``name``."""
    return f"{name}-{when.strftime(_LOG_TIMESTAMP)}"


def log_start_time(path) -> Optional[datetime]:
    """The start time the name of the log ``path`` encodes (:func:`timestamped_log_name`; local time),
    else None."""
    match = _TIMESTAMPED_LOG.match(os.path.basename(os.fspath(path)))
    return datetime.strptime(match.group(1), _LOG_TIMESTAMP) if match else None


def replaced_folder_name(when: datetime, number: int = 1) -> str:
    """``replaced-YYYY-MM-DD-HH-MM-SS`` (``-N`` for the N-th of the same second): where a run started
    afresh moves an earlier run's files."""
    name = f"{REPLACED_PREFIX}{when.strftime(_LOG_TIMESTAMP)}"
    return name if number == 1 else f"{name}-{number}"


def is_replaced_folder(name: str) -> bool:
    """True for a name :func:`replaced_folder_name` makes."""
    return bool(_REPLACED.match(name))


def epoch_checkpoint_name(epochs_done: int) -> str:
    """``model.pth.tar-N``: the checkpoint after N completed epochs."""
    return f"{_CHECKPOINT_PREFIX}{epochs_done}"


def mid_epoch_checkpoint_name(epochs_done: int, batches_done: int) -> str:
    """``model.pth.tar-E-batchB``: E epochs and B batches of the next epoch done."""
    return f"{_CHECKPOINT_PREFIX}{epochs_done}{_BATCH_INFIX}{batches_done}"


def checkpoint_position(name: str) -> Optional[Tuple[int, int]]:
    """(epochs done, batches done) of an epoch checkpoint's name ((N, 0)) or a mid-epoch one's; None
    for any other name."""
    epoch, mid_epoch = _EPOCH_CHECKPOINT.match(name), _MID_EPOCH_CHECKPOINT.match(name)
    if epoch:
        return int(epoch.group(1)), 0
    if mid_epoch:
        return int(mid_epoch.group(1)), int(mid_epoch.group(2))
    return None


def episode_record_names(split: str) -> Tuple[str, str]:
    """(header, records) file names of a split's test-time episodes, in ``test_time/``."""
    return tuple(name.format(split=split) for name in _EPISODE_RECORDS)


def describe(relative_path: str) -> Optional[str]:
    """What the file at ``relative_path`` ("/"-separated, relative to the run folder) is in the
    layout, or None when the layout has no such file."""
    for pattern, what in LAYOUT:
        if pattern.match(relative_path):
            return what
    return None
