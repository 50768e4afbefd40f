"""Hooks: behaviour attached to the training lifecycle without overriding the trainer's methods.

A hook subclasses :class:`HookBase` and overrides any of its five methods; each receives the
trainer. ``TrainerBase`` keeps an ordered list of hooks (``register_hooks``) and calls them

* ``before_train`` / ``after_train``: from ``TrainerBase.before_train`` / ``after_train``;
* ``before_epoch`` / ``after_epoch``: from ``TrainerBase.before_epoch`` / ``after_epoch``;
* ``after_step``: from ``TrainerX.run_epoch`` after every training step, once the step's
  progress line and scalars are written (``trainer.batch_idx`` is the step's batch index).

Every stage calls the hooks in registration order. Because the Dassl lifecycle methods are
where hooks run, the Dassl contract holds: a trainer that overrides ``after_epoch`` (say) and
calls ``super().after_epoch()`` gets the hooks at that point; one that overrides it without
``super()`` replaces them, as it replaced SimpleTrainer's epoch-end behaviour in Dassl.

An exception raised by a hook propagates unchanged in type and message, with a note (shown
under the traceback) naming the hook class and the stage, e.g.
``raised by hook CheckpointHook.after_epoch``.
"""

__all__ = ["HOOK_STAGES", "HookBase", "call_hooks"]

HOOK_STAGES = ("before_train", "before_epoch", "after_step", "after_epoch", "after_train")


class HookBase:
    """A no-op for every stage; subclasses override the stages they act on."""

    def before_train(self, trainer):
        """Before the first epoch (``trainer.start_epoch`` may still be changed, e.g. by resuming)."""

    def before_epoch(self, trainer):
        """Before ``run_epoch`` of epoch ``trainer.epoch`` (0-based)."""

    def after_step(self, trainer):
        """After training step ``trainer.batch_idx`` (0-based) of epoch ``trainer.epoch``."""

    def after_epoch(self, trainer):
        """After ``run_epoch`` of epoch ``trainer.epoch``; ``trainer.weights_epoch`` is ``epoch + 1``."""

    def after_train(self, trainer):
        """After the last epoch (also when resuming found every epoch done)."""


def call_hooks(hooks, stage, trainer):
    """Call ``hook.<stage>(trainer)`` for every hook in order.

    Raises:
        ValueError: ``stage`` is not one of ``HOOK_STAGES``.
        Exception: whatever a hook raises, with a note naming the hook and the stage.
    """
    if stage not in HOOK_STAGES:
        raise ValueError(f"Unknown hook stage {stage!r}: expected one of {HOOK_STAGES}")
    for hook in hooks:
        try:
            getattr(hook, stage)(trainer)
        except Exception as error:
            error.add_note(f"raised by hook {type(hook).__name__}.{stage}")
            raise
