"""What a training run reports while it runs: Dassl's progress lines, tensorboard scalars, elapsed time.

* :func:`progress_line`: Dassl's per-batch line, e.g.
  ``epoch [3/10] batch [5/9] time 0.210 (0.240) data 0.001 (0.020) loss 1.2345 (1.4000) acc 62.5000 (55.0000) lr 1.9511e-03 eta 0:00:20``.
* :class:`WriterMixin`: ``init_writer`` / ``write_scalar`` / ``close_writer`` of ``TrainerBase``
  (a tensorboard SummaryWriter, or nothing when tensorboard is not installed), and
  ``log_training_step``, which prints the progress line when due and writes the
  "train/<loss name>" and "train/lr" scalars at step ``epoch * num_batches + batch_idx``. A step's
  loss values stay on the device until they are logged (every TRAIN.PRINT_FREQ batches and at the
  end of an epoch): then they are read at once, so reporting them makes no other step wait for the
  device.
* :class:`LoggingHook`: before training, the writer (``OUTPUT_DIR/tensorboard``) and the
  clock; after training, "Elapsed: H:MM:SS" and the writer closed.
"""
import datetime
import time

from vlprompt.utils import mkdir_if_missing

from .hooks import HookBase
from .run_folder import RunFolder

__all__ = ["LoggingHook", "WriterMixin", "progress_line"]


def progress_line(epoch, max_epoch, batch_idx, num_batches, batch_time, data_time, losses, lr):
    """Dassl's progress line of batch ``batch_idx`` (0-based) of epoch ``epoch`` (0-based).

    Args:
        batch_time, data_time (AverageMeter): seconds per batch (data loading included) and
            seconds waiting for data; the line shows the last value and the epoch's average.
        losses (MetricMeter): the epoch's running loss terms ("name V.VVVV (AVG)" each).
        lr (float): the learning rate now in effect.

    The eta is the average batch time times the batches left in this epoch and the later
    epochs, truncated to whole seconds.
    """
    batches_left = num_batches - batch_idx - 1 + (max_epoch - epoch - 1) * num_batches
    eta = datetime.timedelta(seconds=int(batch_time.avg * batches_left))
    return (
        f"epoch [{epoch + 1}/{max_epoch}] "
        f"batch [{batch_idx + 1}/{num_batches}] "
        f"time {batch_time.val:.3f} ({batch_time.avg:.3f}) "
        f"data {data_time.val:.3f} ({data_time.avg:.3f}) "
        f"{losses} "
        f"lr {lr:.4e} "
        f"eta {eta}"
    )


class WriterMixin:
    """Tensorboard writer methods of ``TrainerBase`` (see the module docstring).

    The host class provides ``get_current_lr``, and during training ``epoch``, ``max_epoch``,
    ``batch_idx``, ``num_batches``.
    """

    def __init__(self):
        super().__init__()
        self._writer = None
        self._unwritten_steps = []  # (step, lr) of the steps whose scalars wait for the next read

    def init_writer(self, log_dir):
        """Create the tensorboard writer once; without the tensorboard package print a notice and go on."""
        if self._writer is not None:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            print("Tensorboard is not installed: training runs without a tensorboard writer (pip install tensorboard)")
            return
        print(f"Initialize tensorboard (log_dir={log_dir})")
        self._writer = SummaryWriter(log_dir=log_dir)

    def write_scalar(self, tag, scalar_value, global_step=None):
        if self._writer is not None:
            self._writer.add_scalar(tag, scalar_value, global_step)

    def close_writer(self):
        if self._writer is not None:
            self._writer.close()

    def log_training_step(self, losses, batch_time, data_time, print_freq):
        """Print the progress line when ``batch_idx + 1`` is a multiple of ``print_freq`` (or
        on every batch when the epoch has fewer batches than that). The step's scalars are
        written when ``losses`` is next read (then, or by ``write_training_scalars`` at the end of
        the epoch): reading a loss on the device waits for the step, so only a logged step waits for it."""
        if self._writer is not None:
            self._unwritten_steps.append((self.epoch * self.num_batches + self.batch_idx, self.get_current_lr()))
        if (self.batch_idx + 1) % print_freq == 0 or self.num_batches < print_freq:
            self.write_training_scalars(losses)
            print(progress_line(self.epoch, self.max_epoch, self.batch_idx, self.num_batches,
                                batch_time, data_time, losses, self.get_current_lr()))

    def write_training_scalars(self, losses):
        """Read ``losses`` (a MetricMeter) and write the scalars of the steps since the last
        write: at each step, "train/<name>" (the running average after that step) for every
        loss term, then "train/lr"."""
        averages = losses.read()  # one per update since the last read: the steps since the last write
        steps, self._unwritten_steps = self._unwritten_steps, []
        for (n_iter, lr), step_averages in zip(steps, averages):
            for name, value in step_averages.items():
                self.write_scalar("train/" + name, value, n_iter)
            self.write_scalar("train/lr", lr, n_iter)


class LoggingHook(HookBase):
    """Tensorboard writer in ``trainer.output_dir/tensorboard`` and the run's elapsed time.

    Sets ``trainer.time_start`` before training; prints "Elapsed: H:MM:SS" (seconds rounded)
    and closes the writer after training.
    """

    def before_train(self, trainer):
        writer_dir = str(RunFolder(trainer.output_dir).tensorboard_dir)
        mkdir_if_missing(writer_dir)
        trainer.init_writer(writer_dir)
        trainer.time_start = time.time()

    def after_train(self, trainer):
        elapsed = round(time.time() - trainer.time_start)
        print(f"Elapsed: {datetime.timedelta(seconds=elapsed)}")
        trainer.close_writer()
