"""Reporting a training step's loss does not make the step wait for the device: the loop reads a
step's loss and accuracy only when it logs them (every TRAIN.PRINT_FREQ batches and at the end of
the epoch), and what it logs (progress lines, tensorboard scalars) is what reading them at every
step gave."""
import pytest
import torch
from baseline_setup import build_seeded, make_cfg, toy_world  # noqa: F401
from toy_images import quietly

from vlprompt.utils import MetricMeter

READS = ("item", "tolist", "__float__")  # the ways a tensor's value reaches Python


class RecordingWriter:
    """Stands in for the tensorboard writer (not installed here): records (tag, value, step)."""

    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))


@pytest.fixture(scope="module")
def coop_epoch(toy_world, tmp_path_factory):  # noqa: F811
    """One epoch of CoOp on the tiny CLIP, 12 batches of 1 image, PRINT_FREQ 5, with a recording
    writer: (reads [(batch_idx, phase)], the steps' summaries, the writer's scalars, the printed
    lines). The phase is "step" inside ``forward_backward``, "log" inside ``log_training_step`` and
    ``write_training_scalars``, "data" while the loader makes a batch (the random crops read their
    CPU draws), else "other"."""
    cfg = make_cfg(toy_world, "CoOp", tmp_path_factory.mktemp("coop_epoch"), DATALOADER__TRAIN_X__BATCH_SIZE=1, TRAIN__PRINT_FREQ=5,
                   OPTIM__MAX_EPOCH=1)
    trainer, _ = quietly(lambda: build_seeded(cfg))
    trainer._writer = RecordingWriter()
    phase = ["other"]
    reads, summaries = [], []

    def in_phase(name, method):
        def run(*args):
            phase.append(name)
            try:
                return method(*args)
            finally:
                phase.pop()
        return run

    step = in_phase("step", trainer.forward_backward)

    def recorded_step(batch):
        summaries.append(step(batch))
        return summaries[-1]

    trainer.forward_backward = recorded_step
    trainer.log_training_step = in_phase("log", trainer.log_training_step)
    trainer.write_training_scalars = in_phase("log", trainer.write_training_scalars)
    epoch_batches = trainer.epoch_batches

    def loading_batches(loader, num_batches):
        batches, first = in_phase("data", epoch_batches)(loader, num_batches)
        return iter(in_phase("data", lambda: next(batches, None)), None), first

    trainer.epoch_batches = loading_batches
    with pytest.MonkeyPatch.context() as monkeypatch:
        for name in READS:
            def counted(tensor, *args, _read=getattr(torch.Tensor, name), **kwargs):
                reads.append((getattr(trainer, "batch_idx", None), phase[-1]))
                return _read(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)
        _, lines = quietly(trainer.run_epoch)
    return reads, summaries, trainer._writer.scalars, lines


def test_the_loss_is_read_only_at_the_logged_steps_and_the_end_of_the_epoch(coop_epoch):
    reads, summaries, _, lines = coop_epoch
    assert len(summaries) == 12
    assert all(isinstance(value, torch.Tensor) for summary in summaries for value in summary.values())
    assert {phase for _, phase in reads} == {"data", "log"}  # no read inside a step nor between steps
    # batches 5 and 10 are logged (batch_idx 4 and 9); batch_idx 11 is the end of the epoch
    assert {batch_idx for batch_idx, phase in reads if phase == "log"} == {4, 9, 11}
    assert [line.split(" time ")[0] for line in lines if line.startswith("epoch [")] == [
        "epoch [1/1] batch [5/12]", "epoch [1/1] batch [10/12]"]


def test_what_is_logged_is_the_running_average_of_every_step(coop_epoch):
    """The progress line's values and the tensorboard scalars of all 12 steps are those of
    reading each step's values at that step (Dassl's meter, one float per step, summed in order)."""
    _, summaries, scalars, lines = coop_epoch
    names = list(summaries[0])
    assert names == ["loss", "acc"]
    values = [{name: summary[name].item() for name in names} for summary in summaries]
    averages = [{name: sum(step[name] for step in values[:count]) / count for name in names}
                for count in range(1, 13)]
    logged = [(tag, value, step) for tag, value, step in scalars if tag != "train/lr"]
    assert logged == [(f"train/{name}", averages[step][name], step) for step in range(12) for name in names]
    assert [step for tag, _, step in scalars if tag == "train/lr"] == list(range(12))
    tenth = next(line for line in lines if "batch [10/12]" in line)
    assert (f"loss {values[9]['loss']:.4f} ({averages[9]['loss']:.4f}) "
            f"acc {values[9]['acc']:.4f} ({averages[9]['acc']:.4f})") in tenth


def test_the_meter_reads_its_tensors_late_and_as_floats():
    meter = MetricMeter()
    meter.update({"loss": torch.tensor(1.5, dtype=torch.float16), "acc": 50.0})
    meter.update(None)
    meter.update({"loss": torch.tensor(0.1), "acc": torch.tensor(62.5, dtype=torch.float64)})
    assert meter.read() == [{"loss": 1.5, "acc": 50.0}, {"loss": 1.5, "acc": 50.0},
                            {"loss": (1.5 + torch.tensor(0.1).item()) / 2, "acc": 56.25}]
    assert meter.read() == [] and str(meter) == "loss 0.1000 (0.8000) acc 62.5000 (56.2500)"
    with pytest.raises(ValueError, match="loss has 2 elements, expected one"):
        meter.update({"loss": torch.ones(2)})


def test_the_mean_over_processes_stays_on_the_device(tmp_path, monkeypatch):
    """Under DDP the step's summary is averaged over the processes without reading it: float64
    0-dim tensors, which read as the float64 of each value (a float32 loss exactly)."""
    import torch.distributed as dist

    from vlprompt.engine.distributed import mean_over_processes

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with the Gloo backend is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        loss = torch.tensor(0.1)  # float32
        reads = []
        for name in READS:
            monkeypatch.setattr(torch.Tensor, name, lambda tensor, *args, _name=name: reads.append(_name))
        mean = mean_over_processes({"loss": loss, "scale": 2.5, "acc": torch.tensor(75.0)}, torch.device("cpu"))
        monkeypatch.undo()
        assert reads == []
        assert list(mean) == ["loss", "scale", "acc"]
        assert all(value.dtype == torch.float64 and value.dim() == 0 for value in mean.values())
        assert [value.item() for value in mean.values()] == [loss.item(), 2.5, 75.0]
    finally:
        dist.destroy_process_group()
