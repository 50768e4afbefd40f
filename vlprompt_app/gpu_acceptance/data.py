"""The GPU acceptance run's real-size data stages: a photo-sized ImageNet-layout tree, then a
whole base-to-novel chain trained and tested from it, with the time each step waits for data.

    python -m vlprompt_app.gpu_acceptance.data tree OUT SETTINGS_JSON    # data_tree.json
    python -m vlprompt_app.commands.gpu_acceptance_chain OUT SETTINGS_JSON   # data.jsonl

``SETTINGS_JSON`` is the run's settings; its ``"data"`` entry (:data:`vlprompt_app.gpu_acceptance.run.GPU_SETTINGS`)
gives the root folder of the tree (outside OUT: OUT comes back to the caller), the tree's shape
(classes, train and val images per class, the photo size), and the chain: the method
(``TRAINER:CONFIG``), shots, seed, the loader workers and further ``--opts``.

* ``tree``: :func:`vlprompt_app.benchmarking.photos.write_imagenet_tree` with one writer process per
  CPU (a finished tree of the same shape is reused).
* the chain (:mod:`vlprompt_app.commands.gpu_acceptance_chain`, in the command layer because it runs
  train.py and run_protocol.py in-process): ``tools/run_protocol.py --protocol base2new`` over that tree (``--datasets imagenet``,
  one method, one seed), its runs in this process (``--in-process``): the training run on the base
  classes, which ends with the test on them, then the test on the new classes. Meanwhile every
  pass over a data loader is timed (:class:`LoaderWaits`: the time each ``next()`` of its iterator
  blocks), so each step splits into the wait for its batch and the rest; one line per pass goes
  to ``data.jsonl`` when the pass ends (a training pass also every ``PARTIAL_EVERY`` batches, so a
  stage stopped at its limit keeps what it measured), and one line per run when the run ends.
"""
import contextlib
import json
import os
import statistics
import sys
import time

from vlprompt.fileio import atomic_write
from vlprompt_app.benchmarking.photos import write_imagenet_tree

PARTIAL_EVERY = 100  # batches between the partial lines of a training pass


def _append(path, record):
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def tree(out_dir, settings):
    """Write (or reuse) the tree; its summary into OUT/data_tree.json."""
    data = settings["data"]
    summary = write_imagenet_tree(data["root"], data["classes"], data["train_per_class"], data["val_per_class"],
                                  tuple(data["size"]), processes=os.cpu_count())
    with atomic_write(os.path.join(out_dir, "data_tree.json"), "w") as f:
        json.dump(dict(summary, root=data["root"]), f)
    print(json.dumps(summary), flush=True)


def pass_summary(waits, returns, images, finished):
    """A loader pass's figures from its ``next()`` calls.

    Args:
        waits: seconds each ``next()`` that gave a batch blocked, in order.
        returns: perf_counter times at which those calls returned, plus (``finished``) the start
            of the call that ended the pass, which closes the last step.
        images: images in the batches given.
        finished: whether the pass ran to its end.

    Returns:
        {"batches", "images", "seconds" (first call's start to the last step's end), "images_per_s",
        "first_wait_s" (the first batch: worker start-up included), "wait_s" (the other batches),
        "wait_share" (wait_s over the time of the steps after the first batch's arrival; None
        for a pass of one batch),
        "step_share_median", "step_share_max" (per step: its batch's wait over the step, from the
        previous batch's arrival to this one's; a step's work is the time between), "finished"}.
    """
    start = returns[0] - waits[0]
    steps = [end - begin for begin, end in zip(returns, returns[1:])]
    later = waits[1:len(steps) + 1]  # the waits inside the steps between two arrivals
    shares = [wait / step for wait, step in zip(later, steps) if step > 0]
    seconds = returns[-1] - start
    return {"batches": len(waits), "images": images, "seconds": seconds,
            "images_per_s": images / seconds if seconds > 0 else None, "first_wait_s": waits[0],
            "wait_s": sum(later), "wait_share": sum(later) / sum(steps) if later and sum(steps) > 0 else None,
            "step_share_median": statistics.median(shares) if shares else None,
            "step_share_max": max(shares) if shares else None, "finished": finished}


def _is_train(dataset):
    """Whether a loader's dataset is a training set (the DatasetWrapper's ``is_train``, below any
    wrapper that keeps it as ``.dataset``, such as the seeded items of a loader with workers)."""
    while not hasattr(dataset, "is_train") and hasattr(dataset, "dataset"):
        dataset = dataset.dataset
    return bool(getattr(dataset, "is_train", False))


def _batch_images(batch):
    """Images in a loader's batch (its "label" entry), or 0 when it has none."""
    if isinstance(batch, dict) and "label" in batch:
        return len(batch["label"])
    return 0


class LoaderWaits:
    """Times every ``next()`` of every data loader iterator while :meth:`active`; ``on_pass(record)``
    gets a pass's record (``pass_summary`` plus "train", "workers", "pin_memory", "pass") when it ends,
    and a training pass's partial record every ``PARTIAL_EVERY`` batches."""

    def __init__(self, on_pass):
        self.on_pass, self.passes, self.open = on_pass, 0, {}

    def _record(self, state, finished):
        returns = state["returns"] + ([state["ended"]] if finished else [])
        return dict(pass_summary(state["waits"], returns, state["images"], finished), **state["about"])

    def timed_next(self, original):
        """``__next__`` timing ``original``."""
        def timed(iterator):
            state = self.open.get(id(iterator))
            start = time.perf_counter()
            try:
                batch = original(iterator)
            except StopIteration:
                if state is not None and state["waits"]:
                    state["ended"] = start
                    self.on_pass(self._record(state, True))
                    del self.open[id(iterator)]
                raise
            end = time.perf_counter()
            if state is None:
                self.passes += 1
                about = {"pass": self.passes, "train": _is_train(iterator._dataset),
                         "workers": iterator._num_workers, "pin_memory": iterator._pin_memory}
                state = self.open[id(iterator)] = {"waits": [], "returns": [], "images": 0, "about": about}
            state["waits"].append(end - start)
            state["returns"].append(end)
            state["images"] += _batch_images(batch)
            if state["about"]["train"] and len(state["waits"]) % PARTIAL_EVERY == 0:
                self.on_pass(self._record(state, False))
            return batch
        return timed

    @contextlib.contextmanager
    def active(self):
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        original = _BaseDataLoaderIter.__next__
        _BaseDataLoaderIter.__next__ = self.timed_next(original)
        try:
            yield self
        finally:
            _BaseDataLoaderIter.__next__ = original


def protocol_argv(data):
    """``tools/run_protocol.py``'s options of the chain (see the module docstring); its runs go to
    ``<root>/runs``."""
    output = os.path.join(data["root"], "runs")
    return ["--protocol", "base2new", "--datasets", "imagenet", "--trainers", data["method"],
            "--shots", str(data["shots"]), "--seeds", str(data["seed"]), "--root", data["root"],
            "--output", output, "--in-process",
            "--opts", "DATALOADER.NUM_WORKERS", str(data["workers"] or os.cpu_count()), *data["opts"]]


def _run_name(argv):
    """The protocol's name of a run (its folder under base2new/: train_base, test_new)."""
    output = argv[argv.index("--output-dir") + 1]
    parts = os.path.normpath(output).split(os.sep)
    return parts[parts.index("base2new") + 1] if "base2new" in parts else output


def main(argv):
    command, out_dir, settings = argv
    {"tree": tree}[command](out_dir, json.loads(settings))


if __name__ == "__main__":
    main(sys.argv[1:])
