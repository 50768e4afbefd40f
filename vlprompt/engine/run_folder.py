"""The run folder: the one owner of the files a run of train.py writes, and of how they are read.

Its layout (every file's name, and what the file is) is :mod:`vlprompt.run_layout`; paths come
from :class:`RunFolder` and nowhere else. In short::

    OUTPUT_DIR/
        log.txt (log.txt-YYYY-MM-DD-HH-MM-SS, log-rankR.txt)   the logs
        config.yaml                 the merged config of a training run, written when it starts
        eval_config.yaml            the merged config of an evaluation of a --model-dir
        classes.json                the classes the model scores, by label ({"classnames",
                                    "template", "dataset"}), written when its dataset is built:
                                    predicting from the folder needs no dataset
        results.json                the record of the final evaluation (metrics at full
                                    precision, evaluation scope, "completed": true), written last
        run.lock                    present while a process runs into the folder (its pid, host
                                    and start time; see vlprompt/engine/run_lock.py)
        console.txt                 the protocol runner's record of each attempt's console output
        cmat.pt, bad_images.txt, wiseft_alphas.json, tensorboard/    when asked for or needed
        test_time/<split>.json|.bin     a test-time method's per-image episode records
        <model name>/model.pth.tar-N    checkpoints by completed epoch (learned tensors only),
                                    model.pth.tar-E-batchB mid-epoch, model-best.pth.tar with
                                    TEST.FINAL_MODEL best_val, and the ``checkpoint`` pointer file
        replaced-YYYY-MM-DD-HH-MM-SS/   the files of an earlier run, moved aside by a rerun
                                    started afresh (train.py --restart; see vlprompt/engine/rerun.py)

A rerun reuses the checkpoints and test-time records only when it asks for the run the folder
records (vlprompt/engine/rerun.py compares the merged configs).

Every reader goes through :class:`RunFolder`: the evaluation-scope inference (which dataset a
model was trained on), the protocol runner (whether a run completed), the results tables,
and methods that start from another run (a PromptKD teacher, PromptAlign's source MaPLe).
Folders written by earlier versions of the project (no ``config.yaml``: the training dataset
then comes from a training run's ``results.json``) and CoOp-family folders (logs and
checkpoints only) read too; what a folder does not record reads as None.
"""
import json
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

import yaml

from vlprompt.config import ConfigError, dump_cfg
from vlprompt.config.merge import load_yaml
from vlprompt.engine.run_lock import RunLock
from vlprompt.fileio import atomic_write
from vlprompt.run_layout import (
    BAD_IMAGES_FILENAME, BEST_CHECKPOINT, CLASSES_FILENAME, CMAT_FILENAME, CONFIG_FILENAME, CONSOLE_FILENAME, EVAL_CONFIG_FILENAME,
    LOCK_FILENAME, LOG_FILENAME, REPLACED_PREFIX, RESULTS_FILENAME, TENSORBOARD_DIRNAME, TEST_TIME_DIRNAME, WISEFT_SWEEP_FILENAME,
    checkpoint_position, describe, episode_record_names, epoch_checkpoint_name, is_replaced_folder, log_start_time,
    mid_epoch_checkpoint_name, replaced_folder_name,
)

__all__ = [
    "RunFolder", "RunFolderError", "is_replaced_folder", "log_start_time", "CONFIG_FILENAME", "RESULTS_FILENAME",
    "LOG_FILENAME", "TEST_TIME_DIRNAME", "BEST_CHECKPOINT", "REPLACED_PREFIX",
]


class RunFolderError(ValueError):
    """A run-folder file that cannot be read as what it should be."""


class RunFolder:
    """One run's output folder (it need not exist yet).

    Args:
        path: the folder (``OUTPUT_DIR`` of the run, or ``--model-dir`` of a later one).
    """

    def __init__(self, path):
        self.path = Path(path)

    def __repr__(self):
        return f"RunFolder({str(self.path)!r})"

    # ------------------------------------------------------------------ files

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILENAME

    @property
    def results_path(self) -> Path:
        return self.path / RESULTS_FILENAME

    @property
    def console_path(self) -> Path:
        """``console.txt``: the protocol runner appends each attempt's console output."""
        return self.path / CONSOLE_FILENAME

    @property
    def cmat_path(self) -> Path:
        """``cmat.pt``: the evaluator's confusion matrix (TEST.COMPUTE_CMAT)."""
        return self.path / CMAT_FILENAME

    @property
    def bad_images_path(self) -> Path:
        """``bad_images.txt``: the image files of the run that cannot be read."""
        return self.path / BAD_IMAGES_FILENAME

    @property
    def wiseft_sweep_path(self) -> Path:
        """``wiseft_alphas.json``: WiSE-FT's results over its mixing coefficients."""
        return self.path / WISEFT_SWEEP_FILENAME

    @property
    def tensorboard_dir(self) -> Path:
        """``tensorboard/``: the folder of the tensorboard writer."""
        return self.path / TENSORBOARD_DIRNAME

    @property
    def classes_path(self) -> Path:
        """``classes.json``: the classes the model scores, by label."""
        return self.path / CLASSES_FILENAME

    @property
    def test_time_dir(self) -> Path:
        return self.path / TEST_TIME_DIRNAME

    def episode_record_paths(self, split: str) -> Tuple[Path, Path]:
        """(``test_time/<split>.json``, ``test_time/<split>.bin``): the header and the records of a
        test-time method's per-image episodes on ``split``."""
        header, records = episode_record_names(split)
        return self.test_time_dir / header, self.test_time_dir / records

    def logs(self) -> List[Path]:
        """The folder's logs, oldest first: ``log.txt``, then the timestamped ones by name."""
        if not self.path.is_dir():
            return []
        plain = [self.path / LOG_FILENAME] if (self.path / LOG_FILENAME).is_file() else []
        stamped = [p for p in self.path.iterdir()
                   if p.is_file() and p.name.startswith(LOG_FILENAME) and log_start_time(p.name) is not None]
        return plain + sorted(stamped, key=lambda p: p.name)

    def model_dir(self, model_name: str) -> Path:
        """``<model name>/``: the checkpoints of one registered model."""
        return self.path / model_name

    def checkpoint_path(self, model_name: str, epoch: Optional[int] = None) -> Path:
        """``<model name>/model.pth.tar-<epoch>`` (the weights after ``epoch`` completed epochs), or
        ``<model name>/model-best.pth.tar`` when ``epoch`` is None."""
        return self.model_dir(model_name) / (BEST_CHECKPOINT if epoch is None else epoch_checkpoint_name(epoch))

    def mid_epoch_checkpoint_path(self, model_name: str, epochs_done: int, batches_done: int) -> Path:
        """``<model name>/model.pth.tar-E-batchB``: E epochs and B batches of the next epoch done."""
        return self.model_dir(model_name) / mid_epoch_checkpoint_name(epochs_done, batches_done)

    def checkpoints(self, model_name: str) -> Dict[Tuple[int, int], Path]:
        """{(epochs done, batches done): path} of the epoch checkpoints (at (N, 0)) and mid-epoch
        checkpoints of one model; {} without its folder."""
        folder = self.model_dir(model_name)
        if not folder.is_dir():
            return {}
        positions = {path: checkpoint_position(path.name) for path in folder.iterdir()}
        return {position: path for path, position in positions.items() if position is not None}

    def unknown_files(self) -> List[str]:
        """The files under the folder ("/"-separated paths relative to it) that its layout does not
        name, sorted: [] for a folder that only runs of this project wrote into."""
        if not self.path.is_dir():
            return []
        files = (path.relative_to(self.path).as_posix() for path in self.path.rglob("*") if path.is_file())
        return sorted(name for name in files if describe(name) is None)

    # ---------------------------------------------------------------- writing

    def lock(self) -> RunLock:
        """The folder's lock, a context manager: ``with RunFolder(path).lock(): ...`` holds the
        folder for this process (creating it), takes over a stale lock with a line saying so,
        and raises :class:`~vlprompt.engine.run_lock.RunFolderBusyError` naming the holder's pid,
        host and start time while another process holds it."""
        return RunLock(self.path)

    def settings_path(self, evaluation: bool = False) -> Path:
        """Where a run records the merged config it runs with: ``config.yaml`` (a training run, or an
        evaluation of the whole model, zero-shot CLIP: a run that tools/predict.py reads), or
        ``eval_config.yaml`` for an ``evaluation`` of a --model-dir."""
        return self.path / (EVAL_CONFIG_FILENAME if evaluation else CONFIG_FILENAME)

    def write_config(self, cfg, evaluation: bool = False) -> Path:
        """Write the merged config of a run (a CfgNode, or the YAML text of its ``dump()``)
        atomically to :meth:`settings_path` (``evaluation``: an evaluation of a --model-dir),
        creating the folder."""
        path = self.settings_path(evaluation)
        self.path.mkdir(parents=True, exist_ok=True)
        with atomic_write(str(path), "w") as f:
            f.write(cfg if isinstance(cfg, str) else dump_cfg(cfg))
        return path

    def move_aside(self) -> Optional[Path]:
        """Move what the folder holds into a new ``replaced-YYYY-MM-DD-HH-MM-SS`` folder inside it, so
        that a run starts afresh there (train.py --restart); the caller holds the folder's lock.

        Left in place: the lock, ``console.txt`` (the protocol runner appends every attempt to it) and
        the folders of earlier replacements. Returns the new folder, or None when nothing was moved.
        """
        if not self.path.is_dir():
            return None
        keep = {LOCK_FILENAME, CONSOLE_FILENAME}
        entries = sorted(p for p in self.path.iterdir() if p.name not in keep and not is_replaced_folder(p.name))
        if not entries:
            return None
        now, number = datetime.now(), 1
        aside = self.path / replaced_folder_name(now)
        while aside.exists():
            number += 1
            aside = self.path / replaced_folder_name(now, number)
        aside.mkdir()
        for entry in entries:
            entry.rename(aside / entry.name)
        return aside

    def write_classes(self, classnames, template: str, dataset: str) -> Path:
        """Write ``classes.json`` atomically: the class names by label, the class sentence and the dataset."""
        record = {"classnames": list(classnames), "template": template, "dataset": dataset}
        with atomic_write(str(self.classes_path), "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
        return self.classes_path

    def write_results(self, record: Mapping) -> Path:
        """Write an evaluation's record as ``results.json`` atomically (4-space indent)."""
        return _write_json(self.results_path, record)

    def write_wiseft_sweep(self, record: Mapping) -> Path:
        """Write WiSE-FT's record of an evaluation over its mixing coefficients as
        ``wiseft_alphas.json`` atomically (4-space indent)."""
        return _write_json(self.wiseft_sweep_path, record)

    # ---------------------------------------------------------------- reading

    def load_results(self) -> dict:
        """The ``results.json`` record.

        Raises:
            RunFolderError: the file is missing, is not readable JSON or is not an object; the
                message says which.
        """
        try:
            record = json.loads(self.results_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise RunFolderError(f"{RESULTS_FILENAME} is not readable JSON ({error})") from None
        if not isinstance(record, dict):
            raise RunFolderError(f"{RESULTS_FILENAME} is not a JSON object")
        return record

    def read_results(self) -> Optional[dict]:
        """The ``results.json`` record, or None when :meth:`load_results` fails (a half-written or
        foreign file says nothing about the run)."""
        try:
            return self.load_results()
        except RunFolderError:
            return None

    @property
    def completed(self) -> bool:
        """True when ``results.json`` is a record with ``"completed": true`` (the run's last write)."""
        record = self.read_results()
        return record is not None and record.get("completed") is True

    def training_record(self) -> Optional[dict]:
        """``results.json`` when it comes from a training run (``"eval_only": false``), else None."""
        record = self.read_results()
        return record if record is not None and record.get("eval_only") is False else None

    def holds_checkpoints(self) -> bool:
        """True when a model folder ``<name>/`` holds an epoch or mid-epoch checkpoint (a resume point)."""
        if not self.path.is_dir():
            return False
        return any(child.is_dir() and any(checkpoint_position(p.name) is not None for p in child.iterdir())
                   for child in self.path.iterdir() if not is_replaced_folder(child.name))

    def holds_test_time_records(self) -> bool:
        """True when ``test_time/`` holds a test-time method's per-image records."""
        return self.test_time_dir.is_dir() and any(self.test_time_dir.iterdir())

    def read_settings(self, evaluation: bool = False) -> Optional[dict]:
        """The merged config recorded at :meth:`settings_path` as plain data, None without one.

        Raises:
            ConfigError: the file exists but is not a YAML mapping.
        """
        return self._read_yaml(self.settings_path(evaluation))

    def read_classes(self) -> Optional[dict]:
        """``classes.json`` ({"classnames": [str], "template": str, "dataset": str}), or None without one
        (a folder of an earlier version, or a run on a dataset scored through another's classes).

        Raises:
            RunFolderError: the file exists but is not such a record.
        """
        if not self.classes_path.is_file():
            return None
        try:
            record = json.loads(self.classes_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise RunFolderError(f'"{self.classes_path}" is not readable JSON ({error}); delete it to read the '
                                 "classes from the run's dataset.") from None
        valid = (isinstance(record, dict) and isinstance(record.get("classnames"), list)
                 and all(isinstance(name, str) for name in record["classnames"])
                 and isinstance(record.get("template"), str) and isinstance(record.get("dataset"), str))
        if not valid:
            raise RunFolderError(f'"{self.classes_path}" is not a record {{"classnames": [...], "template": ..., '
                                 "\"dataset\": ...}; delete it to read the classes from the run's dataset.")
        return record

    def read_config_data(self) -> Optional[dict]:
        """``config.yaml`` as plain data, None without one.

        Raises:
            ConfigError: the file exists but is not a YAML mapping.
        """
        return self._read_yaml(self.config_path)

    @staticmethod
    def _read_yaml(path: Path) -> Optional[dict]:
        if not path.is_file():
            return None
        try:
            data = load_yaml(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as error:
            raise ConfigError(f'Cannot read "{path}" ({type(error).__name__}: '
                              f'{" ".join(str(error).split())}); fix or delete the file.') from None
        if not isinstance(data, dict):
            raise ConfigError(f'"{path}" is not a config (a YAML mapping); fix or delete the file.')
        return data

    def read_config(self):
        """The run's merged config as a CfgNode: the defaults with every registered trainer node,
        then ``config.yaml`` merged in.

        Raises:
            ConfigError: no ``config.yaml`` (not a training run of this project: train.py writes it
                when it trains), or the file does not merge.
        """
        from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file

        if not self.config_path.is_file():
            raise ConfigError(f'"{self.path}" holds no {CONFIG_FILENAME}: it is not the folder of a training '
                              "run of this project (train.py writes it when it trains).")
        cfg = get_cfg_default()
        extend_cfg(cfg)
        merge_from_file(cfg, str(self.config_path))
        return cfg

    def trained_dataset(self) -> Optional[Mapping[str, str]]:
        """The dataset the run trained on: {"name": DATASET.NAME, "record": the file it was read from},
        or None when the folder records none.

        Read from ``config.yaml``, else from a training run's ``results.json`` (folders of earlier
        versions of the project).

        Raises:
            ConfigError: ``config.yaml`` exists but does not name a dataset.
        """
        try:
            data = self.read_config_data()
            if data is not None:
                return {"name": data["DATASET"]["NAME"], "record": str(self.config_path)}
        except (ConfigError, KeyError, TypeError) as error:
            why = str(error) if isinstance(error, ConfigError) else "it names no DATASET.NAME"
            raise ConfigError(f'Cannot read the training dataset from "{self.config_path}": {why}') from None
        record = self.training_record()
        if record is not None and record.get("dataset"):
            return {"name": record["dataset"], "record": str(self.results_path)}
        return None

    def trained_class_count(self) -> Optional[int]:
        """``num_classes`` of a training run's ``results.json``; None without one."""
        record = self.training_record()
        return None if record is None else record.get("num_classes")


def _write_json(path: Path, record: Mapping) -> Path:
    """Write ``record`` to ``path`` as JSON atomically (4-space indent, a final newline)."""
    with atomic_write(str(path), "w") as f:
        json.dump(record, f, indent=4)
        f.write("\n")
    return path
