"""Evaluation of a trainer's model on a split, and the final test of a training run.

:class:`EvaluationMixin` gives ``SimpleTrainer`` the Dassl methods (a trainer may override any
of them; the engine always calls them through the trainer):

* ``test(split=None)`` (no grad) -> the evaluator's first metric (accuracy): eval mode, prints
  "Evaluate on the *SPLIT* set", then for every batch of the split's loader
  ``parse_batch_test(batch)`` -> (input, label), ``model_inference(input)`` -> logits [B, K],
  ``evaluator.process(logits, label)`` (logits first projected onto the labels by the
  dataset's ``prediction_map`` when it has one, e.g. ObjectNet); the evaluator prints its
  result block ("* accuracy: X%", ...), each metric is written as scalar "SPLIT/KEY" at step
  ``epoch``, and the full result is kept in ``last_test`` ({"split", "metrics", "num_samples"}).
  "val" falls back to "test" with a warning when the dataset has no val split;
* ``save_results()``: ``OUTPUT_DIR/results.json`` of the last ``test()``
  (:mod:`vlprompt.engine.results`), plus the entries of ``results_extra()``.

:class:`FinalEvaluationHook`: after training (unless TEST.NO_TEST) deploy the best-on-val
model (TEST.FINAL_MODEL best_val: "Deploy the model with the best val performance" and
``load_model(OUTPUT_DIR)``) or keep the last epoch's ("Deploy the last-epoch model"), then
``test()`` and ``save_results()``.

The host class provides ``cfg``, ``evaluator``, ``val_loader``, ``test_loader``, ``dm``,
``device``, ``model``, ``check_images``, ``set_model_mode``, ``write_scalar``, ``autocast``,
``epoch``, ``run_info``, ``num_classes``, ``weights_epoch``, ``time_created``,
``skipped_images``, ``nonfinite_steps`` and ``output_dir``.
"""
import time

import torch
from tqdm import tqdm

from .compilation import mark_step
from .hooks import HookBase
from .results import make_results_record
from .run_folder import RunFolder

__all__ = ["EvaluationMixin", "FinalEvaluationHook"]


class EvaluationMixin:
    """Evaluation methods of ``SimpleTrainer`` (see the module docstring).

    Attributes:
        last_test (dict or None): the result of the last ``test()``.
    """

    def __init__(self):
        super().__init__()
        self.last_test = None
        self._val_warning_printed = False

    def _eval_loader(self, split):
        """(split actually used, loader): "val" falls back to "test" when there is no val split."""
        if split == "val" and self.val_loader is not None:
            if self.dm.dataset.val is self.dm.dataset.test and not self._val_warning_printed:
                print("Warning: this dataset's val split is its test split (e.g. ImageNet): evaluating on *val* uses the test images")
                self._val_warning_printed = True
            return "val", self.val_loader
        if split == "val" and not self._val_warning_printed:
            print(
                "Warning: the dataset has no val split, so the *test* set is evaluated instead "
                "(with TEST.FINAL_MODEL best_val the model is then selected on test data)"
            )
            self._val_warning_printed = True
        return "test", self.test_loader

    @torch.no_grad()
    def test(self, split=None):
        """Evaluate on ``split`` (default TEST.SPLIT) and return the first metric (accuracy).

        The full result is kept in ``self.last_test`` ({"split", "metrics", "num_samples"}).
        """
        self.set_model_mode("eval")
        self.evaluator.reset()
        split, data_loader = self._eval_loader(self.cfg.TEST.SPLIT if split is None else split)
        self.check_images([split])
        print(f"Evaluate on the *{split}* set")
        num_samples = 0
        prediction_map = self.dm.dataset.prediction_map
        for batch in tqdm(data_loader):
            input, label = self.parse_batch_test(batch)
            mark_step(self.compile_mode)
            output = self.model_inference(input)
            if prediction_map is not None:
                output = prediction_map.project(output)
            self.evaluator.process(output, label)
            num_samples += label.shape[0]
        results = self.evaluator.evaluate()
        for key, value in results.items():
            self.write_scalar(f"{split}/{key}", value, self.epoch)
        self.last_test = {"split": split, "metrics": dict(results), "num_samples": num_samples}
        return list(results.values())[0]

    def save_results(self):
        """Write ``OUTPUT_DIR/results.json`` for the last ``test()`` and return its path."""
        if self.last_test is None:
            raise RuntimeError("save_results() records the last test() result, but test() has not run yet")
        record = make_results_record(
            self.cfg,
            self.run_info,
            split=self.last_test["split"],
            metrics=self.last_test["metrics"],
            num_classes=self.num_classes,
            num_test=self.last_test["num_samples"],
            epoch=self.weights_epoch,
            wall_time_s=time.time() - self.time_created,
            skipped_images=self.skipped_images,
            skipped_nonfinite_steps=self.nonfinite_steps,
        )
        record.update(self.results_extra())
        path = RunFolder(self.output_dir).write_results(record)
        print(f"Results saved to {path}")
        return path

    def results_extra(self):
        """Further entries of results.json (a method's measurements; e.g. a test-time run's throughput)."""
        return {}

    def model_inference(self, input):
        """Logits [B, K] of ``self.model`` for a test input, under autocast."""
        with self.autocast():
            return self.model(input)

    def parse_batch_test(self, batch):
        """(images, labels) of a test batch, moved to the device."""
        return batch["img"].to(self.device), batch["label"].to(self.device)


class FinalEvaluationHook(HookBase):
    """The test after training (see the module docstring)."""

    def after_train(self, trainer):
        if trainer.cfg.TEST.NO_TEST:
            return
        if trainer.cfg.TEST.FINAL_MODEL == "best_val":
            print("Deploy the model with the best val performance")
            trainer.load_model(trainer.output_dir)
        else:
            print("Deploy the last-epoch model")
        trainer.test()
        trainer.save_results()
