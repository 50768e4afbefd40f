"""The optimisation step of the Dassl contract: autocast, anomaly check, backward, update, lr.

:class:`OptimizationMixin` gives ``TrainerBase`` the methods that a trainer's
``forward_backward`` calls:

* ``autocast()``: context manager for forward passes at the trainer's precision (``self.amp``);
* ``model_backward_and_update(loss, names=None, terms=None)``: ``model_zero_grad``, then
  ``model_backward`` (inf/NaN check, then backward, scaled when a GradScaler is active), then
  ``model_update`` (optimizer steps, through the GradScaler when active);
* ``update_lr(names=None)``: one scheduler step per model. The engine never calls it: a
  trainer's ``forward_backward`` does, when ``(self.batch_idx + 1) == self.num_batches``.

A non-finite loss raises :class:`NonFiniteLossError` ("Loss is infinite or NaN! ..." with the
step, the loss terms and the last checkpoint), or with ``nonfinite_loss == "skip"``
(TRAIN.NONFINITE_LOSS) is counted in ``nonfinite_steps`` and the next update does not step.

The host class provides ``get_model_names``, ``_optims``, ``_scheds``, ``_models``, ``amp``
(:class:`vlprompt.engine.amp.MixedPrecision`), ``last_checkpoint``, and during training
``epoch``, ``max_epoch``, ``batch_idx``, ``num_batches``.
"""
import torch

__all__ = ["NonFiniteLossError", "OptimizationMixin", "step_summary"]


class NonFiniteLossError(FloatingPointError):
    """The loss is infinite or NaN; the message gives the step, the loss terms and the last checkpoint."""


def _format_loss(loss: torch.Tensor) -> str:
    """A loss value for messages: the number, or the list of values of a non-scalar loss."""
    values = loss.detach().float().flatten().tolist()
    return f"{values[0]:.6g}" if len(values) == 1 else str([float(f"{v:.6g}") for v in values])


def step_summary(loss, terms, accuracy):
    """A training step's summary for the progress line: {"loss", the terms' names..., "acc"}.

    Tensors stay on the device (detached), so reporting them does not make the step wait for it; the
    loop reads them when it logs (``MetricMeter``). (The non-finite-loss check of ``model_backward``
    still reads one flag per step: it must stop before the weights change.) Numbers among ``terms`` become floats.

    Args:
        loss: the step's loss, a one-element tensor.
        terms: {name: one-element tensor or number}, the loss's named parts.
        accuracy: the batch's accuracy in percent, a one-element tensor.
    """
    summary = {"loss": loss.detach()}
    summary.update({name: value.detach() if isinstance(value, torch.Tensor) else float(value)
                    for name, value in terms.items()})
    summary["acc"] = accuracy.detach()
    return summary


class OptimizationMixin:
    """Optimisation-step methods of ``TrainerBase`` (see the module docstring).

    Attributes:
        nonfinite_loss (str): "stop" (raise NonFiniteLossError) or "skip" (leave the weights
            unchanged for that step and count it in ``nonfinite_steps``).
        nonfinite_steps (int): steps skipped for a non-finite loss.
    """

    def __init__(self):
        super().__init__()
        self.nonfinite_loss = "stop"
        self.nonfinite_steps = 0
        self._step_skipped = False

    def autocast(self):
        """Context manager for forward passes: autocast at the trainer's precision (no-op for fp32 / CPU)."""
        return self.amp.autocast()

    def update_lr(self, names=None):
        """Step the scheduler of each (given) model once."""
        for name in self.get_model_names(names):
            if self._scheds[name] is not None:
                self._scheds[name].step()

    def detect_anomaly(self, loss, terms=None):
        """Raise NonFiniteLossError (a FloatingPointError) if any element of ``loss`` is infinite or NaN.

        The message starts with "Loss is infinite or NaN!" and gives the step, the loss terms
        (``terms``: name -> number or tensor, optional) and the last checkpoint written.
        """
        if not torch.isfinite(loss).all():
            raise NonFiniteLossError(
                f"Loss is infinite or NaN! {self._step_description(loss, terms)} Training stopped before "
                "this step changed the weights. "
                + self._last_checkpoint_note()
                + " Lower OPTIM.LR, check the data, or set TRAIN.NONFINITE_LOSS skip to skip such steps."
            )

    def _step_description(self, loss, terms):
        """"At epoch E/M, batch B/NB: loss = L (a = ..., b = ...)." for the current step."""
        where = ""
        if hasattr(self, "batch_idx") and hasattr(self, "num_batches"):
            where = f"At epoch {self.epoch + 1}/{self.max_epoch}, batch {self.batch_idx + 1}/{self.num_batches}: "
        values = ", ".join(f"{name} = {_format_loss(torch.as_tensor(value))}" for name, value in (terms or {}).items())
        return f"{where}loss = {_format_loss(loss)}" + (f" ({values})." if values else ".")

    def _last_checkpoint_note(self):
        if self.last_checkpoint is None:
            return "No checkpoint has been written yet (TRAIN.CHECKPOINT_ITERS sets mid-epoch checkpoints)."
        others = " with the same file of every other model" if len(self._models) > 1 else ""
        return f'The last good checkpoint is kept: "{self.last_checkpoint}"{others}.'

    def model_zero_grad(self, names=None):
        for name in self.get_model_names(names):
            if self._optims[name] is not None:
                self._optims[name].zero_grad()

    def model_backward(self, loss, terms=None):
        """Check ``loss`` for inf/NaN, then back-propagate it (scaled when a GradScaler is active).

        A non-finite loss raises NonFiniteLossError, or with ``nonfinite_loss == "skip"`` is
        counted and not back-propagated, and the next ``model_update`` does not step.
        """
        if self.nonfinite_loss == "skip" and not torch.isfinite(loss).all():
            self.nonfinite_steps += 1
            self._step_skipped = True
            print(f"Skipping a step with a non-finite loss (TRAIN.NONFINITE_LOSS skip): {self._step_description(loss, terms)}")
            return
        self.detect_anomaly(loss, terms)
        self.amp.backward(loss)

    def model_update(self, names=None):
        """Step the optimizer of each (given) model (through the GradScaler when active).

        After a skipped non-finite loss nothing is stepped and the GradScaler, if any, lowers
        its scale as it does after an overflow.
        """
        if self._step_skipped:
            self._step_skipped = False
            self.amp.skip_step()
            return
        optims = [self._optims[name] for name in self.get_model_names(names)]
        self.amp.step([optim for optim in optims if optim is not None])

    def model_backward_and_update(self, loss, names=None, terms=None):
        """zero_grad, backward and optimizer step for the (given) models (``terms``: see ``detect_anomaly``)."""
        self.model_zero_grad(names)
        self.model_backward(loss, terms)
        self.model_update(names)
