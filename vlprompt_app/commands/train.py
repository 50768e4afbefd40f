"""Train or evaluate a method: the CoOp-family command line.

    python train.py --root DATA --trainer CoOp \
        --dataset-config-file configs/datasets/oxford_pets.yaml \
        --config-file configs/trainers/CoOp/vit_b16_ep50.yaml \
        --output-dir output/oxford_pets/CoOp/seed1 --seed 1 DATASET.NUM_SHOTS 16

Trailing KEY VALUE pairs override the config (merged last, so ``SEED 1`` beats ``--seed 2``);
options come first, and an option given after the first KEY is an error that shows the reordered
command. Every run knows its evaluation scope (base, new, source or target; see
vlprompt/engine/eval_scope.py): ``--eval-role`` / ``TEST.ROLE`` gives it, otherwise it is inferred
(an ``--eval-only`` run compares its dataset with the one recorded in ``--model-dir``); the log
prints it and results.json records it. A training run writes its merged config to
``OUTPUT_DIR/config.yaml`` (an evaluation of a ``--model-dir`` to ``eval_config.yaml``). A folder
that holds checkpoints resumes, if the command asks for the run it records (the rerun rule,
vlprompt/engine/rerun.py): otherwise the run stops, listing the keys that differ, unless
``--restart`` moves the folder's files into ``OUTPUT_DIR/replaced-<date-time>/`` first. Bad input
(unknown trainer, dataset or config key, wrong value type or value, incompatible settings, missing
config file or dataset folder, unusable CLIP weights, unreadable images, inconsistent labels,
corrupt checkpoints or caches, a missing or wrong ``--model-dir``, missing or malformed class
descriptions, unreadable run-folder files, an ``OUTPUT_DIR`` another live run holds or that holds a
run with other settings, a file that cannot be written for lack of room: a full disk or the
file-size limit) ends with one paragraph on stderr and exit status 2, before any data is loaded
where possible (the backbone's preprocessing and tokenizer, then the trainer's ``preflight`` checks,
run before it is built; the log lists each INPUT preprocessing value with where it came from). A run that stops on bad
input in an empty ``OUTPUT_DIR`` leaves nothing there (:data:`SETUP_FILES`). A non-finite loss
stops training with exit status 3 (see TRAIN.NONFINITE_LOSS).
"""

import argparse
import contextlib
import difflib
import os
import re
import shlex
import sys

from vlprompt.config import ConfigError
from vlprompt.config.merge import looks_like_option
from vlprompt.run_layout import (
    CLASSES_FILENAME, CONFIG_FILENAME, EVAL_CONFIG_FILENAME, LOG_FILENAME, TENSORBOARD_DIRNAME,
)
from vlprompt_app.project import import_project, registered_trainer_names


def user_errors():
    """The exceptions that mean bad input: one paragraph on stderr and exit status 2, no traceback."""
    from vlprompt.clip import CLIPLoadError, PromptTooLongError, UnsupportedBackboneError
    from vlprompt.data.datasets import DatasetLayoutError
    from vlprompt.data.descriptions import DescriptionsError
    from vlprompt.data.splits import UnsafePickleError
    from vlprompt.engine.run_folder import RunFolderError
    from vlprompt.engine.run_lock import RunFolderBusyError
    from vlprompt.utils import CheckpointError, CorruptFileError, WriteFailedError

    return (
        ConfigError, CLIPLoadError, DatasetLayoutError, PromptTooLongError, UnsupportedBackboneError,
        CheckpointError, CorruptFileError, UnsafePickleError, RunFolderBusyError, RunFolderError, DescriptionsError,
        WriteFailedError,
    )


def error_exit_status(error: BaseException):
    """2 for bad input, 3 for a non-finite loss, None for anything else (a bug: its traceback shows).

    A ConfigError is recognised without importing torch, so that bad arguments answer at once.
    """
    if isinstance(error, ConfigError):
        return 2
    from vlprompt.engine import NonFiniteLossError

    if isinstance(error, NonFiniteLossError):
        return 3
    return 2 if isinstance(error, user_errors()) else None


def run_reporting_bad_input(call):
    """``call()``'s exit status; bad input (a missing file too) prints one "Error:" paragraph and
    gives its status (error_exit_status), anything else propagates with its traceback."""
    try:
        return call()
    except Exception as error:  # noqa: BLE001  (re-raised unless it is bad input)
        status = 2 if isinstance(error, FileNotFoundError) else error_exit_status(error)
        if status is None:
            raise
        print(f"Error: {error}", file=sys.stderr)
        return status


def print_args(args, cfg):
    print("***************")
    print("** Arguments **")
    print("***************")
    for key in sorted(vars(args)):
        print(f"{key}: {getattr(args, key)}")
    print("************")
    print("** Config **")
    print("************")
    print(cfg)


def reset_cfg(cfg, args):
    """Copy the command-line flags into the config (as Dassl's train.py does)."""
    if args.root:
        cfg.DATASET.ROOT = args.root
    if args.output_dir:
        cfg.OUTPUT_DIR = args.output_dir
    if args.resume:
        cfg.RESUME = args.resume
    if args.seed >= 0:  # [decision] --seed 0 means seed 0 (Dassl ignored it)
        cfg.SEED = args.seed
    if args.source_domains:
        cfg.DATASET.SOURCE_DOMAINS = args.source_domains
    if args.target_domains:
        cfg.DATASET.TARGET_DOMAINS = args.target_domains
    if args.transforms:
        cfg.INPUT.TRANSFORMS = args.transforms
    if args.trainer:
        cfg.TRAINER.NAME = args.trainer
    if args.backbone:
        cfg.MODEL.BACKBONE.NAME = args.backbone
    if args.head:
        cfg.MODEL.HEAD.NAME = args.head
    if args.eval_role:
        cfg.TEST.ROLE = args.eval_role


def merged_config_files(dataset_config_file, config_file, cache=None):
    """Defaults -> trainer nodes -> dataset YAML -> method YAML, as a new CfgNode.

    ``cache``: a dict keeping the merge of each pair of files for a caller that sets up many runs in
    one go (the protocol runner comparing a grid's settings): a merge costs tens of milliseconds.
    """
    from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file

    key = (dataset_config_file, config_file)
    if cache is not None and key in cache:
        return cache[key].clone()
    cfg = get_cfg_default()
    extend_cfg(cfg)
    if dataset_config_file:
        merge_from_file(cfg, dataset_config_file)
    if config_file:
        merge_from_file(cfg, config_file)
    if cache is not None:
        cache[key] = cfg.clone()
    return cfg


def setup_cfg(args, file_cache=None):
    """Defaults -> trainer nodes -> dataset YAML -> method YAML -> flags -> overrides, checked;
    then TEST.ROLE is set to the resolved evaluation scope. ``file_cache``: see
    :func:`merged_config_files`.

    Returns:
        (frozen cfg, EvalScope)
    """
    from vlprompt.config import merge_from_list
    from vlprompt.engine.config_checks import validate_cfg
    from vlprompt.engine.eval_scope import resolve_eval_scope

    import_project()
    cfg = merged_config_files(args.dataset_config_file, args.config_file, file_cache)
    reset_cfg(cfg, args)
    merge_from_list(cfg, args.opts)
    check_names(cfg)
    validate_cfg(cfg)
    scope = resolve_eval_scope(cfg, eval_only=args.eval_only, model_dir=args.model_dir if args.eval_only else "")
    cfg.TEST.ROLE = scope.scope
    cfg.freeze()
    return cfg, scope


def check_trainer_flag(name):
    """An unknown ``--trainer`` fails before torch and the methods are imported. Known are the
    trainers of ``trainers/`` (read from its source) and, when the engine is already imported
    (train.run called in-process), whatever its registry holds."""
    engine = sys.modules.get("vlprompt.engine")
    registry = set(engine.TRAINER_REGISTRY.registered_names()) if engine is not None else set()
    if not name or name in registry or registered_trainer_names(only=name):
        return
    names = sorted(set(registered_trainer_names()) | registry)  # every name, for the message
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" (do you mean {close[0]}?)" if close else ""
    raise ConfigError(f"Unknown trainer '{name}'{hint}. Registered trainers: {', '.join(names)}.")


def check_names(cfg):
    """Unknown trainer or dataset names fail before anything is built."""
    from vlprompt.data.datasets import DATASET_REGISTRY
    from vlprompt.engine import TRAINER_REGISTRY
    from vlprompt.utils import check_availability

    for what, name, registry, flag in (
        ("trainer", cfg.TRAINER.NAME, TRAINER_REGISTRY, "--trainer"),
        ("dataset", cfg.DATASET.NAME, DATASET_REGISTRY, "--dataset-config-file"),
    ):
        if not name:
            raise ConfigError(
                f"No {what} given: pass {flag} (registered: {', '.join(registry.registered_names())})."
            )
        try:
            check_availability(name, registry.registered_names())
        except ValueError as error:
            raise ConfigError(f"Unknown {what} '{name}'. {error}") from None


def prepare_backbone(cfg):
    """The backbone's part of the pre-flight checks, before any data loads: the empty INPUT preprocessing
    keys resolved from the backbone (:mod:`vlprompt.clip.preprocess`) and its tokenizer's files found
    (:func:`vlprompt.clip.check_tokenizer`).

    Returns:
        (resolved cfg, lines for the log: each preprocessing value with where it came from, the tokenizer).

    Raises:
        CLIPLoadError: an unknown backbone, or a tokenizer that cannot be found (what to download, where).
        ConfigError: a backbone preprocessing the data pipeline does not implement.
    """
    from vlprompt.clip import check_tokenizer
    from vlprompt.clip.preprocess import resolve_input

    cfg, lines = resolve_input(cfg)
    if cfg.MODEL.BACKBONE.NAME:
        lines.append(check_tokenizer(cfg.MODEL.BACKBONE.NAME))
    return cfg, lines


def main(args):
    """Set up the config of parsed ``args``, hold ``OUTPUT_DIR`` (its lock, see
    vlprompt/engine/run_lock.py), then train and/or evaluate."""
    from vlprompt.engine.config_checks import check_training_cfg
    from vlprompt.engine import TRAINER_REGISTRY
    from vlprompt.engine.run_folder import RunFolder

    cfg, scope = setup_cfg(args)
    training = not (args.eval_only or args.no_train)
    if training:
        check_training_cfg(cfg)
    cfg, notes = prepare_backbone(cfg)
    if args.restart:
        check_restart(args, cfg)
    model_dir = args.model_dir if args.eval_only else ""
    notes += TRAINER_REGISTRY.get(cfg.TRAINER.NAME).preflight(cfg, training, model_dir)
    # rank 0 holds the folder for a torchrun job; its other processes write only their own logs
    holds_folder = int(os.environ.get("RANK", "0")) == 0
    folder = RunFolder(cfg.OUTPUT_DIR)
    existed = folder.path.exists()
    fresh = not existed or (folder.path.is_dir() and not any(folder.path.iterdir()))
    try:
        with folder.lock() if holds_folder else contextlib.nullcontext():
            notes = [*prepare_folder(args, cfg, training, holds_folder), *notes]
            run_in_folder(args, cfg, scope, training, notes)
    except Exception as error:  # noqa: BLE001  (re-raised; bad input in a fresh folder leaves nothing behind)
        if holds_folder and fresh and error_exit_status(error) == 2:
            remove_setup_files(folder.path, remove_folder=not existed)
        raise


# What a run writes before it trains or evaluates: a run that stops on bad input in a folder that
# was empty removes them (nothing half-written stays). Any other file (a checkpoint, bad_images.txt)
# keeps the folder as it is.
SETUP_FILES = (CONFIG_FILENAME, EVAL_CONFIG_FILENAME, CLASSES_FILENAME, LOG_FILENAME, TENSORBOARD_DIRNAME)


def remove_setup_files(path, remove_folder):
    """Remove the files of SETUP_FILES from the run folder ``path`` when it holds nothing else (and
    the folder itself when ``remove_folder``); the log is closed first."""
    import shutil

    from vlprompt.utils import close_logger

    if not path.is_dir() or any(child.name not in SETUP_FILES for child in path.iterdir()):
        return
    close_logger()
    for child in path.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()
    if remove_folder:
        path.rmdir()


def evaluates_model_dir(args):
    """True for an evaluation of another run's model (--eval-only --model-dir): its folder records
    its settings as eval_config.yaml, not config.yaml (it is not a model itself)."""
    return bool(args.eval_only and args.model_dir)


def run_settings(argv, file_cache=None):
    """(merged config, whether it evaluates a --model-dir) of train.py's arguments ``argv``, merged
    as a run merges them, its empty preprocessing keys filled from the backbone as a run fills them
    (the protocol runner compares them with what run folders record)."""
    from vlprompt.clip.loading import CLIPLoadError
    from vlprompt.clip.preprocess import resolve_input

    args = build_parser().parse_args(list(argv))
    cfg, _ = setup_cfg(args, file_cache)
    try:  # a run records its preprocessing resolved from the backbone (prepare_backbone)
        cfg, _ = resolve_input(cfg)
    except (CLIPLoadError, ConfigError):
        pass  # the run itself stops with the message, before it reuses anything
    return cfg, evaluates_model_dir(args)


def check_restart(args, cfg):
    """ConfigError when --restart contradicts the command: RESUME names a folder to resume from, or the
    folder to start afresh is the --model-dir being evaluated."""
    from pathlib import Path

    if cfg.RESUME:
        raise ConfigError(f"--restart starts {cfg.OUTPUT_DIR} afresh, but RESUME ({cfg.RESUME}) asks to resume "
                          "from a folder's checkpoints: give one of them.")
    if evaluates_model_dir(args) and Path(args.model_dir).resolve() == Path(cfg.OUTPUT_DIR).resolve():
        raise ConfigError(f"--restart would move the model this run evaluates (--model-dir {args.model_dir}) out of "
                          "its folder, which is also --output-dir: give the evaluation another --output-dir.")


def prepare_folder(args, cfg, training, holds_folder):
    """Before anything is written into ``cfg.OUTPUT_DIR`` (its lock held): with --restart, move what it
    holds aside (the process holding the folder does); otherwise apply the rerun rule
    (vlprompt/engine/rerun.py: refuse when the folder holds state of a run with other settings).
    Returns lines for the log."""
    from vlprompt.engine.rerun import check_rerun
    from vlprompt.engine.run_folder import RunFolder

    if not args.restart:
        return check_rerun(cfg, training, evaluates_model_dir(args))
    replaced = RunFolder(cfg.OUTPUT_DIR).move_aside() if holds_folder else None
    if replaced is None:
        return []
    return [f'Starting afresh (--restart): the files of the earlier run in "{cfg.OUTPUT_DIR}" were moved into {replaced}']


def run_in_folder(args, cfg, scope, training, notes):
    """Everything that writes into ``cfg.OUTPUT_DIR`` (the caller holds the folder's lock): the
    log, ``config.yaml``, then training and/or evaluation; ``notes``: the lines of the backbone's and the
    trainer's pre-flight checks, printed into the log."""
    import torch

    from vlprompt.engine import build_trainer
    from vlprompt.engine.run_folder import RunFolder
    from vlprompt.utils import collect_env_info, set_random_seed, setup_logger

    setup_logger(cfg.OUTPUT_DIR)
    if cfg.SEED >= 0:
        print(f"Setting fixed seed: {cfg.SEED}")
        set_random_seed(cfg.SEED)
    if torch.cuda.is_available() and cfg.USE_CUDA:
        torch.backends.cudnn.benchmark = True

    print_args(args, cfg)
    if scope.warning:
        print(f"Warning: {scope.warning}")
    print(f"Evaluation scope: {scope.scope} ({scope.reason})")
    for note in notes:
        print(note)
    if training or args.eval_only:
        # An evaluation without --model-dir is the whole model (zero-shot CLIP): its folder is a run
        # that tools/predict.py and tools/export.py read, as a training run's (config.yaml).
        RunFolder(cfg.OUTPUT_DIR).write_config(cfg, evaluation=evaluates_model_dir(args))
    print("Collecting env info ...")
    print("** System info **")
    print(collect_env_info())
    print()

    trainer = build_trainer(cfg)
    if training or (args.eval_only and not args.model_dir):
        write_classes(cfg.OUTPUT_DIR, cfg.DATASET.NAME, trainer.dm.dataset)
    trainer.run_info.update(
        config_file=args.config_file,
        dataset_config_file=args.dataset_config_file,
        eval_only=args.eval_only,
        model_dir=args.model_dir,
        load_epoch=args.load_epoch,
    )
    if args.eval_only:
        trainer.load_model(args.model_dir, epoch=args.load_epoch)
        trainer.test()
        trainer.save_results()
        return
    if not args.no_train:
        trainer.train()


def write_classes(output_dir, dataset_name, dataset):
    """``OUTPUT_DIR/classes.json``: what tools/predict.py needs of the dataset, so that it reads none
    (none for a dataset scored through another's classes: predicting from it reads the dataset)."""
    from vlprompt.clip.templates import dataset_template
    from vlprompt.engine.run_folder import RunFolder

    if dataset.prediction_map is None:
        RunFolder(output_dir).write_classes(dataset.classnames, dataset_template(dataset), dataset_name)


def build_parser():
    parser = argparse.ArgumentParser(prog="train.py", description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=str, default="", help="path to the datasets folder")
    parser.add_argument("--output-dir", type=str, default="", help="output directory")
    parser.add_argument("--resume", type=str, default="", help="checkpoint directory to resume from")
    parser.add_argument("--seed", type=int, default=-1, help="only positive value enables a fixed seed")
    parser.add_argument("--source-domains", type=str, nargs="+", help="source domains for DA/DG")
    parser.add_argument("--target-domains", type=str, nargs="+", help="target domains for DA/DG")
    parser.add_argument("--transforms", type=str, nargs="+", help="data augmentation methods")
    parser.add_argument("--config-file", type=str, default="", help="path to the method config file")
    parser.add_argument("--dataset-config-file", type=str, default="", help="path to the dataset config file")
    parser.add_argument("--trainer", type=str, default="", help="name of the trainer")
    parser.add_argument("--backbone", type=str, default="", help="name of the CNN backbone")
    parser.add_argument("--head", type=str, default="", help="name of the head")
    parser.add_argument("--eval-only", action="store_true", help="evaluation only")
    parser.add_argument("--model-dir", type=str, default="", help="load model from this directory for eval-only mode")
    parser.add_argument("--load-epoch", type=int, help="load model weights at this epoch for evaluation")
    parser.add_argument("--no-train", action="store_true", help="do not call trainer.train()")
    parser.add_argument("--restart", action="store_true",
                        help="start --output-dir afresh: move the files of the run it holds into "
                             "OUTPUT_DIR/replaced-<date-time>/ first (a rerun with other settings is refused without it)")
    parser.add_argument("--eval-role", type=str, default="",
                        help="evaluation scope: base, new, source or target (default: inferred; sets TEST.ROLE)")
    parser.add_argument("opts", default=None, nargs=argparse.REMAINDER, help="modify config options using the command line")
    return parser


CONFIG_KEY = re.compile(r"^[A-Z][A-Z0-9_]*(\.[A-Z0-9_]+)+$")


def _option_values(action, items):
    """How many of ``items`` (what follows an option) are that option's values."""
    if action.nargs == 0:
        return 0
    if action.nargs in (None, 1):
        return min(1, len(items))
    count = 0
    while count < len(items) and not looks_like_option(items[count]) and not CONFIG_KEY.match(items[count]):
        count += 1
    return count


def check_option_order(parser, argv, opts):
    """ConfigError if one of train.py's options comes after the first KEY VALUE override.

    ``argv`` is the command line and ``opts`` what ``parser`` parsed as the trailing overrides.

    argparse puts everything from the first positional item on (Dassl's grammar: options,
    then KEY VALUE pairs) into ``opts``, so a misplaced ``--output-dir X`` would otherwise be
    reported as an unknown config key. The message names the option and gives the command
    with the options moved before the overrides (list options such as ``--transforms a b``
    first, so that the next option ends their values).
    """
    leading = argv[: len(argv) - len(opts)]
    options = parser._option_string_actions  # option string -> argparse action
    # a list option (--transforms a b) must not be last, or it would take the overrides as values
    moved_lists, moved_others, overrides, misplaced = [], [], [], []
    items = list(opts)
    while items:
        item = items.pop(0)
        action = options.get(item.split("=", 1)[0]) if looks_like_option(item) else None
        if action is None:
            overrides.append(item)
            continue
        misplaced.append(item.split("=", 1)[0])
        count = 0 if "=" in item else _option_values(action, items)
        is_list = action.nargs not in (None, 0, 1) and "=" not in item
        (moved_lists if is_list else moved_others).extend([item, *items[:count]])
        del items[:count]
    if misplaced:
        names = ", ".join(misplaced)
        verb, pronoun = ("is an option", "it") if len(misplaced) == 1 else ("are options", "they")
        raise ConfigError(
            f"{names} {verb} of train.py, but came after the KEY VALUE overrides, where {pronoun} would be read "
            "as config keys. Options must come before the KEY VALUE overrides (everything after the first KEY is "
            f"read as KEY VALUE pairs): python train.py {shlex.join(moved_lists + leading + moved_others + overrides)}"
        )


def run(argv=None):
    """Command-line entry point; returns the exit status (2 for bad input, 3 for a non-finite loss)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_option_order(parser, argv, args.opts)
        check_trainer_flag(args.trainer)
        main(args)
    except Exception as error:  # noqa: BLE001  (re-raised unless it is bad input or a non-finite loss)
        status = error_exit_status(error)
        if status is None:
            raise
        # a non-finite loss goes to stdout, so that log.txt has it
        print(f"\nError: {error}", file=sys.stderr if status == 2 else sys.stdout)
        return status
    return 0

