"""The run folder: the one owner of the files a run of train.py writes, and of how they are read.

Its layout (every file's name, and what the file is) is :mod:`vlprompt.run_layout`; paths come
from :class:`RunFolder` and nowhere else. In short::

    OUTPUT_DIR/
        log.txt (log.txt-YYYY-MM-DD-HH-MM-SS, log-rankR.txt)   the logs
        config.yaml                 the merged config of a training run, written when it starts
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

Every reader goes through :class:`RunFolder`: the evaluation-scope inference (which dataset a
model was trained on), the protocol runner (whether a run completed), the results tables,
and methods that start from another run (a PromptKD teacher, PromptAlign's source MaPLe).
Folders written by earlier versions of the project (no ``config.yaml``: the training dataset
then comes from a training run's ``results.json``) and CoOp-family folders (logs and
checkpoints only) read too; what a folder does not record reads as None.
"""
import json
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

import yaml

from vlprompt.config import ConfigError
from vlprompt.engine.run_lock import RunLock
from vlprompt.fileio import atomic_write
from vlprompt.run_layout import (
    BAD_IMAGES_FILENAME, BEST_CHECKPOINT, CMAT_FILENAME, CONFIG_FILENAME, CONSOLE_FILENAME, LOG_FILENAME,
    RESULTS_FILENAME, TENSORBOARD_DIRNAME, TEST_TIME_DIRNAME, WISEFT_SWEEP_FILENAME, checkpoint_position, describe, episode_record_names, epoch_checkpoint_name, log_start_time,
    mid_epoch_checkpoint_name,
)

__all__ = [
    "RunFolder", "RunFolderError", "log_start_time", "CONFIG_FILENAME", "RESULTS_FILENAME", "LOG_FILENAME",
    "TEST_TIME_DIRNAME", "BEST_CHECKPOINT",
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

    def write_config(self, cfg) -> Path:
        """Write the merged config of a training run (a CfgNode, or the YAML text of its ``dump()``)
        as ``config.yaml`` atomically, creating the folder."""
        self.path.mkdir(parents=True, exist_ok=True)
        with atomic_write(str(self.config_path), "w") as f:
            f.write(cfg if isinstance(cfg, str) else cfg.dump())
        return self.config_path

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

    def read_config_data(self) -> Optional[dict]:
        """``config.yaml`` as plain data, None without one.

        Raises:
            ConfigError: the file exists but is not a YAML mapping.
        """
        if not self.config_path.is_file():
            return None
        try:
            data = yaml.safe_load(self.config_path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as error:
            raise ConfigError(f'Cannot read "{self.config_path}" ({type(error).__name__}: '
                              f'{" ".join(str(error).split())}); fix or delete the file.') from None
        if not isinstance(data, dict):
            raise ConfigError(f'"{self.config_path}" is not a config (a YAML mapping); fix or delete the file.')
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
