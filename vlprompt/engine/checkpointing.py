"""Checkpoints of a trainer: saving, exact resuming, loading weights for evaluation.

Layout (Dassl's names): ``DIR/<model name>/model.pth.tar-N`` (N = completed epochs),
``DIR/<model name>/model-best.pth.tar``, and the ``checkpoint`` pointer file holding the base
name of the file written last; ours add mid-epoch files ``model.pth.tar-E-batchB``
(:mod:`vlprompt.engine.resume`).

:class:`CheckpointingMixin` gives ``TrainerBase`` the Dassl methods (a trainer may override
any of them; the engine always calls them through the trainer):

* ``save_model(epoch, directory, is_best=False, val_result=None, model_name="")``: one file
  per registered model holding "state_dict" (frozen parameters dropped unless
  ``save_frozen_weights``; buffers kept), "epoch" (epoch + 1), "optimizer", "scheduler",
  "val_result", "rng_state", "scaler" and "trainer_state" (``get_trainer_state()``);
* ``save_mid_epoch_model(directory, batches_done, data_position)``;
* ``resume_model_if_exist(directory)`` -> epoch index to continue from: restores weights,
  optimizer, scheduler, RNG, scaler and trainer states from the newest usable checkpoint;
  after a mid-epoch checkpoint, ``epoch_batches(loader, num_batches)`` then gives the
  batches the interrupted epoch had not run (``pending_mid_epoch()`` tells ``before_epoch``
  that it continues one);
* ``load_model(directory, epoch=None)``: weights only, non-strict, class-dependent keys
  (``get_class_dependent_keys``) dropped, missing/unexpected keys reported.

:class:`CheckpointHook` is the engine's checkpoint policy: resume before training; at each
epoch end, with TEST.FINAL_MODEL best_val, evaluate on val and save ``model-best.pth.tar`` when
the result improves (strictly), then save ``model.pth.tar-N`` every TRAIN.CHECKPOINT_FREQ
epochs and after the last epoch; after every TRAIN.CHECKPOINT_ITERS steps a mid-epoch file;
after training, mid-epoch files deleted (the final checkpoint supersedes them).

The host class provides ``get_model_names``, ``_models``, ``_optims``, ``_scheds``, ``amp``
and ``max_epoch``; the hook also ``cfg``, ``output_dir``, ``test``, ``train_loader_x``.
"""
import os.path as osp
from collections import OrderedDict

from torch import nn

from vlprompt.run_layout import epoch_checkpoint_name
from vlprompt.utils import (
    CheckpointError, get_rng_state, load_checkpoint, restore_checkpoint, save_checkpoint, set_rng_state,
)

from .hooks import HookBase
from .run_folder import BEST_CHECKPOINT, RunFolder
from .resume import (
    checkpoint_files,
    continue_epoch,
    find_resume_point,
    prune_mid_epoch_checkpoints,
    resumable_sampler,
    resume_banner,
)

__all__ = ["CheckpointHook", "CheckpointingMixin", "ModelNotFoundError", "unwrap_model"]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module inside DataParallel / DistributedDataParallel, else ``model``."""
    if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        return model.module
    return model


def _frozen_parameter_names(model: nn.Module) -> set:
    """State-dict names of the parameters of ``model`` with ``requires_grad`` False (aliases included)."""
    return {name for name, param in model.named_parameters(remove_duplicate=False) if not param.requires_grad}


class ModelNotFoundError(CheckpointError, FileNotFoundError):
    """The checkpoint file an evaluation loads is not there (bad input: train.py exits with status 2)."""


class CheckpointingMixin:
    """Checkpoint methods of ``TrainerBase`` (see the module docstring).

    Attributes:
        save_frozen_weights (bool): keep ``requires_grad=False`` parameters in saved state dicts.
        weights_epoch (int): completed training epochs of the weights the models hold now
            (0 for untrained weights; set by training, resuming and ``load_model``).
        last_checkpoint (str or None): path of the checkpoint written or resumed from last.
    """

    def __init__(self):
        super().__init__()
        self.save_frozen_weights = False
        self.weights_epoch = 0
        self.last_checkpoint = None
        self._pending_mid_epoch = None

    def get_class_dependent_keys(self, name):
        """State-dict keys of model ``name`` that depend on the class list (list of str).

        ``load_model`` deletes them from a checkpoint before loading, so the values built for
        the current classes stay (e.g. CoOp's ``["token_prefix", "token_suffix"]``). Default: none.
        """
        return []

    def get_trainer_state(self):
        """Trainer state (plain numbers/containers/tensors) saved in checkpoints as "trainer_state".

        Override together with :meth:`set_trainer_state` for state that resuming must restore
        and that lives outside the registered models. Default: {}.
        """
        return {}

    def set_trainer_state(self, state):
        """Restore what :meth:`get_trainer_state` returned (called when resuming)."""

    # ----------------------------------------------------------------------------------------
    # Saving
    # ----------------------------------------------------------------------------------------
    def save_model(self, epoch, directory, is_best=False, val_result=None, model_name=""):
        """Save every registered model to ``directory/<name>/`` (file ``model_name`` or ``model.pth.tar-<epoch+1>``).

        Each file holds "state_dict" (without frozen parameters unless ``save_frozen_weights``;
        buffers always kept), "epoch" (epoch + 1), "optimizer", "scheduler", "val_result",
        "rng_state", "scaler" and "trainer_state".
        """
        folder = RunFolder(directory)
        paths = [
            save_checkpoint(
                self._checkpoint_state(name, epoch + 1, val_result),
                str(folder.model_dir(name)),
                is_best=is_best,
                model_name=model_name or folder.checkpoint_path(name, epoch + 1).name,
            )
            for name in self.get_model_names()
        ]
        if paths and not model_name:
            self.last_checkpoint = paths[0]

    def save_mid_epoch_model(self, directory, batches_done, data_position):
        """Save every registered model as ``directory/<name>/model.pth.tar-E-batchB`` (E = ``self.epoch``).

        The file holds what ``save_model`` saves, with "epoch" = E (completed epochs), plus
        "mid_epoch" = ``data_position`` (batches done, batches per epoch, sampler state).
        Only the ``MID_EPOCH_KEEP`` newest mid-epoch files are kept per model.
        """
        paths = []
        for name in self.get_model_names():
            state = self._checkpoint_state(name, self.epoch, None)
            state["mid_epoch"] = dict(data_position, batches_done=batches_done)
            path = RunFolder(directory).mid_epoch_checkpoint_path(name, self.epoch, batches_done)
            paths.append(save_checkpoint(state, str(path.parent), model_name=path.name))
            prune_mid_epoch_checkpoints(str(path.parent))
        if paths:
            self.last_checkpoint = paths[0]

    def _checkpoint_state(self, name, epochs_done, val_result):
        """The checkpoint dict of model ``name`` (tensors and plain containers only)."""
        model = unwrap_model(self._models[name])
        state_dict = model.state_dict()
        if not self.save_frozen_weights:
            frozen = _frozen_parameter_names(model)
            state_dict = OrderedDict((key, value) for key, value in state_dict.items() if key not in frozen)
        optim, sched = self._optims[name], self._scheds[name]
        return {
            "state_dict": state_dict,
            "epoch": epochs_done,
            "optimizer": None if optim is None else optim.state_dict(),
            "scheduler": None if sched is None else sched.state_dict(),
            "val_result": val_result,
            "rng_state": get_rng_state(),
            "scaler": self.amp.state_dict(),
            "trainer_state": self.get_trainer_state(),
        }

    # ----------------------------------------------------------------------------------------
    # Resuming
    # ----------------------------------------------------------------------------------------
    def resume_model_if_exist(self, directory):
        """Resume every registered model from the newest usable checkpoint in ``directory/<name>/``.

        The newest position (epoch or mid-epoch checkpoint) whose files load for every model is
        used; unusable newer files are skipped with a message (:func:`find_resume_point`). Loads
        weights, optimizer, scheduler, RNG, scaler and trainer states and prints a banner. After
        a mid-epoch checkpoint, the next ``run_epoch`` continues that epoch where it stopped.

        Returns:
            int: the epoch index to continue from (0 when nothing was found).
        """
        point = find_resume_point(directory, self.get_model_names())
        if point is None:
            print("No checkpoint found, train from scratch")
            return 0
        print(f"Found checkpoint at {directory} (will resume training)")
        for name in self.get_model_names():
            path, checkpoint = point.paths[name], point.checkpoints[name]
            print(f'Loading checkpoint from "{path}"')
            restore_checkpoint(checkpoint, path, self._models[name], self._optims[name], self._scheds[name])
        first = point.checkpoints[self.get_model_names()[0]]
        if first.get("rng_state") is not None:
            set_rng_state(first["rng_state"])
            print("Loaded random number generator states")
        print(f"Previous epoch: {point.epochs_done}")
        self.amp.load_state_dict(first.get("scaler"))
        self.set_trainer_state(first.get("trainer_state") or {})
        if point.mid_epoch:
            self._pending_mid_epoch = dict(first["mid_epoch"], rng_state=first.get("rng_state"))
        self.weights_epoch = point.epochs_done
        self.last_checkpoint = point.paths[self.get_model_names()[0]]
        print(resume_banner(directory, point.epochs_done, self.max_epoch, point.batches_done))
        return point.epochs_done

    def pending_mid_epoch(self):
        """The position of the mid-epoch checkpoint the next epoch continues from ("num_batches",
        "sampler", "batches_done", "rng_state"), or None: set by ``resume_model_if_exist``, used up
        by ``epoch_batches``. A trainer that draws its epoch's data in ``before_epoch`` (e.g. a
        per-epoch cache) reads it there to draw the interrupted epoch's data again."""
        return self._pending_mid_epoch

    def epoch_batches(self, loader, num_batches):
        """(iterator over this epoch's training batches, index of its first batch): the whole
        ``loader``, or right after resuming from a mid-epoch checkpoint the batches that the
        interrupted epoch had not run (:func:`vlprompt.engine.resume.continue_epoch`)."""
        pending, self._pending_mid_epoch = self._pending_mid_epoch, None
        if pending is None:
            return iter(loader), 0
        return continue_epoch(loader, pending, num_batches, self.last_checkpoint)

    # ----------------------------------------------------------------------------------------
    # Loading weights
    # ----------------------------------------------------------------------------------------
    def load_model(self, directory, epoch=None):
        """Load the weights of every registered model from ``directory/<name>/``.

        The file is ``model.pth.tar-<epoch>``, or ``model-best.pth.tar`` when ``epoch`` is None.
        Keys from :meth:`get_class_dependent_keys` are deleted from the checkpoint first; loading
        is non-strict and reports unexpected keys and missing keys other than frozen parameters
        (which are not saved by default). An empty ``directory`` only prints a note.

        Raises:
            ModelNotFoundError: 'Model not found at "PATH"', listing the ``model.pth.tar-N`` files present.
        """
        if not directory:
            print("Note that load_model() is skipped as no pretrained model is given (ignore this if it's done on purpose)")
            return
        for name in self.get_model_names():
            model_path = str(RunFolder(directory).checkpoint_path(name, epoch))
            if not osp.exists(model_path):
                raise ModelNotFoundError(self._model_not_found_message(model_path))
            checkpoint = load_checkpoint(model_path)
            state_dict = checkpoint["state_dict"]
            class_dependent = self.get_class_dependent_keys(name)
            for key in class_dependent:
                state_dict.pop(key, None)
            loaded_epoch = checkpoint["epoch"]
            val_result = checkpoint.get("val_result")
            details = f"epoch = {loaded_epoch}"
            if val_result is not None:
                details += f", val_result = {val_result:.1f}"
            print(f'Loading weights to {name} from "{model_path}" ({details})')
            self._load_state_dict_reporting(name, state_dict, set(class_dependent))
            self.weights_epoch = loaded_epoch

    @staticmethod
    def _model_not_found_message(model_path):
        """'Model not found at "PATH" (...)' naming the ``model.pth.tar-N`` files that are there."""
        folder = osp.dirname(model_path)
        if not osp.isdir(folder):
            return f'Model not found at "{model_path}" (the folder "{folder}" does not exist; check --model-dir)'
        available = [name for (_, batches), name in sorted(checkpoint_files(folder).items()) if batches == 0]
        epoch_files = epoch_checkpoint_name("N")
        if available:
            found = f"{epoch_files} files in that folder: {', '.join(available)}; pick one with --load-epoch N"
        else:
            found = f"that folder holds no {epoch_files} file"
        if osp.isfile(osp.join(folder, BEST_CHECKPOINT)):
            found += f"; {BEST_CHECKPOINT} is there too (loaded when --load-epoch is omitted)"
        return f'Model not found at "{model_path}" ({found})'

    def _load_state_dict_reporting(self, name, state_dict, intentionally_absent):
        """Load non-strictly into model ``name``; print unexpected keys and unintentionally missing keys."""
        model = unwrap_model(self._models[name])
        result = model.load_state_dict(state_dict, strict=False)
        expected_absent = intentionally_absent | _frozen_parameter_names(model)
        missing = [key for key in result.missing_keys if key not in expected_absent]
        if result.unexpected_keys:
            print(f"Warning: keys in the checkpoint that {name} does not have (ignored): {result.unexpected_keys}")
        if missing:
            print(f"Warning: keys of {name} missing from the checkpoint (current values kept): {missing}")


class CheckpointHook(HookBase):
    """The engine's checkpoint policy (see the module docstring); reads ``trainer.cfg``:
    RESUME, OUTPUT_DIR, TEST.NO_TEST, TEST.FINAL_MODEL, TRAIN.CHECKPOINT_FREQ, TRAIN.CHECKPOINT_ITERS."""

    def __init__(self):
        self._mid_epoch_notice_printed = False

    def before_train(self, trainer):
        directory = trainer.cfg.RESUME if trainer.cfg.RESUME else trainer.cfg.OUTPUT_DIR
        trainer.start_epoch = trainer.resume_model_if_exist(directory)

    def after_step(self, trainer):
        """Save a mid-epoch checkpoint every TRAIN.CHECKPOINT_ITERS steps (counted over the whole
        run), except at the last batch of an epoch, which ``after_epoch`` handles."""
        interval = trainer.cfg.TRAIN.CHECKPOINT_ITERS
        done = trainer.epoch * trainer.num_batches + trainer.batch_idx + 1
        if interval <= 0 or done % interval != 0 or trainer.batch_idx + 1 == trainer.num_batches:
            return
        sampler = resumable_sampler(trainer.train_loader_x)
        if sampler is None:
            if not self._mid_epoch_notice_printed:
                print("Note: TRAIN.CHECKPOINT_ITERS is set, but the training loader cannot resume mid-epoch: "
                      "only epoch checkpoints are written")
                self._mid_epoch_notice_printed = True
            return
        position = {"num_batches": trainer.num_batches, "sampler": sampler.state_dict()}
        trainer.save_mid_epoch_model(trainer.output_dir, trainer.batch_idx + 1, position)

    def after_epoch(self, trainer):
        cfg = trainer.cfg
        last_epoch = (trainer.epoch + 1) == trainer.max_epoch
        checkpoint_freq = cfg.TRAIN.CHECKPOINT_FREQ
        meet_checkpoint_freq = checkpoint_freq > 0 and (trainer.epoch + 1) % checkpoint_freq == 0
        if not cfg.TEST.NO_TEST and cfg.TEST.FINAL_MODEL == "best_val":
            curr_result = trainer.test(split="val")
            if curr_result > trainer.best_result:
                trainer.best_result = curr_result
                trainer.save_model(trainer.epoch, trainer.output_dir, val_result=curr_result,
                                   model_name=BEST_CHECKPOINT)
        if meet_checkpoint_freq or last_epoch:
            trainer.save_model(trainer.epoch, trainer.output_dir)

    def after_train(self, trainer):
        for name in trainer.get_model_names():
            prune_mid_epoch_checkpoints(str(RunFolder(trainer.output_dir).model_dir(name)), keep=0)
