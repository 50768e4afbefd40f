"""The run folder: the one owner of the files a run of train.py writes, and of how they are read.

Layout (Dassl's names where Dassl has them)::

    OUTPUT_DIR/
        log.txt                     Dassl's log; a restarted run keeps earlier ones as
                                    log.txt-YYYY-MM-DD-HH-MM-SS siblings
        config.yaml                 the merged config of a training run (detectron2's name),
                                    written when it starts
        results.json                the record of the final evaluation (metrics at full
                                    precision, evaluation scope, "completed": true), written last
        <model name>/model.pth.tar-N    checkpoints by completed epoch (learned tensors only),
                                    model-best.pth.tar with TEST.FINAL_MODEL best_val
        test_time/<split>.json|.bin     a test-time method's per-image episode records
        run.lock                    present while a process runs into the folder (its pid, host
                                    and start time; see vlprompt/engine/run_lock.py)

Every reader goes through :class:`RunFolder`: the evaluation-scope inference (which dataset a
model was trained on), the protocol runner (whether a run completed), the results tables,
and methods that start from another run (a PromptKD teacher, PromptAlign's source MaPLe).
Folders written by earlier versions of the project (no ``config.yaml``: the training dataset
then comes from a training run's ``results.json``) and CoOp-family folders (logs and
checkpoints only) read too; what a folder does not record reads as None.
"""
import json
import re
from datetime import datetime
from pathlib import Path
from typing import List, Mapping, Optional

import yaml

from vlprompt.config import ConfigError
from vlprompt.config.merge import load_yaml
from vlprompt.engine.run_lock import RunLock
from vlprompt.fileio import atomic_write

CONFIG_FILENAME = "config.yaml"
RESULTS_FILENAME = "results.json"
LOG_FILENAME = "log.txt"
TEST_TIME_DIRNAME = "test_time"
CHECKPOINT_PREFIX = "model.pth.tar-"
BEST_CHECKPOINT = "model-best.pth.tar"

_TIMESTAMP_FORMAT = "%Y-%m-%d-%H-%M-%S"
_TIMESTAMPED_LOG = re.compile(r"^log\.txt-(\d{4}-\d{2}-\d{2}-\d{2}-\d{2}-\d{2})$")


class RunFolderError(ValueError):
    """A run-folder file that cannot be read as what it should be."""


def log_start_time(path: Path) -> Optional[datetime]:
    """Start time encoded in a ``log.txt-YYYY-MM-DD-HH-MM-SS`` name (local time), else None."""
    match = _TIMESTAMPED_LOG.match(Path(path).name)
    return datetime.strptime(match.group(1), _TIMESTAMP_FORMAT) if match else None


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
    def test_time_dir(self) -> Path:
        return self.path / TEST_TIME_DIRNAME

    def logs(self) -> List[Path]:
        """The folder's logs, oldest first: ``log.txt``, then the timestamped ones by name."""
        if not self.path.is_dir():
            return []
        plain = [self.path / LOG_FILENAME] if (self.path / LOG_FILENAME).is_file() else []
        stamped = [p for p in self.path.iterdir() if p.is_file() and _TIMESTAMPED_LOG.match(p.name)]
        return plain + sorted(stamped, key=lambda p: p.name)

    def checkpoint_path(self, model_name: str, epoch: Optional[int] = None) -> Path:
        """``<model name>/model.pth.tar-<epoch>`` (the weights after ``epoch`` completed epochs), or
        ``<model name>/model-best.pth.tar`` when ``epoch`` is None."""
        return self.path / model_name / (BEST_CHECKPOINT if epoch is None else f"{CHECKPOINT_PREFIX}{epoch}")

    # ---------------------------------------------------------------- writing

    def lock(self) -> RunLock:
        """The folder's lock, a context manager: ``with RunFolder(path).lock(): ...`` holds the
        folder for this process (creating it), takes over a stale lock with a line saying so,
        and raises :class:`~vlprompt.engine.run_lock.RunFolderBusyError` naming the holder's pid,
        host and start time while another process holds it."""
        return RunLock(self.path)

    def write_config(self, cfg) -> Path:
        """Write the merged config of a training run as ``config.yaml`` atomically."""
        with atomic_write(str(self.config_path), "w") as f:
            f.write(cfg.dump())
        return self.config_path

    def write_results(self, record: Mapping) -> Path:
        """Write an evaluation's record as ``results.json`` atomically (4-space indent)."""
        with atomic_write(str(self.results_path), "w") as f:
            json.dump(record, f, indent=4)
            f.write("\n")
        return self.results_path

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
            data = load_yaml(self.config_path.read_text(encoding="utf-8"))
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
