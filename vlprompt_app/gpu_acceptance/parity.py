"""CUDA against CPU: every benchmark case's outputs on the tiny CLIP, the same weights and values.

For each benchmark case the trainers declare (vlprompt_app/benchmarking/trainer_cases.py), the trainer is built twice from
its synthetic config (``tiny_case``) on the project's tiny CLIP with random weights, in fp32: once on the CPU and once
on ``device``. The second copy gets the first one's state (``load_state_dict``: weights,
learnable values, buffers), after the learnable values were drawn away from their init with a
seeded generator, so a zero-initialised adapter or prompt also shows a misplaced value. Then on
one seeded batch:

* ``logits``: the evaluation output (``model_inference`` inside ``model.evaluation()``; from
  the batch's image features for a cached case; the episode's prediction of one image for a
  test-time case);
* ``loss``: one training step's loss (``forward_backward``), for cases that train;
* ``logits after step``: the evaluation output after that step.

Each is compared as a relative max difference (max |a - b| / max |b|). The default generators are
seeded alike before each build and each step, so a step's draws (a sampled class subset,
augmented views) agree when they come from the CPU generator; a step that draws on the device
shows here as a difference.
"""
import contextlib
import io
import os
import tempfile

import torch

TINY_CLIP = "configs/clip/tiny-synthetic-clip.json"
TOLERANCE = 1e-4  # fp32 on two devices: kernel order only (TF32 is off for matmuls by default)
# A test-time episode adapts with AdamW, whose first step moves each value by about lr times the
# sign of its gradient: where a gradient element is at the level of the devices' rounding, its
# sign (and so a step of lr) can differ, and the prediction moves more than the forward pass does.
TEST_TIME_TOLERANCE = 1e-3
VALUE_SEED, BATCH_SEED, STEP_SEED = 1, 2, 3


def tiny_case(case):
    """``case`` built from its synthetic config (the benchmark's ``synthetic_case``)."""
    from vlprompt_app.benchmarking.trainer_cases import synthetic_case

    return synthetic_case(case)


def relative_difference(ours, reference):
    """max |ours - reference| / max |reference| of two tensors (on the CPU, in float64)."""
    ours, reference = ours.detach().double().cpu(), reference.detach().double().cpu()
    return float((ours - reference).abs().max() / reference.abs().max().clamp_min(1e-12))


def _perturb(model, generator):
    """Draw every learnable value 0.1 * N(0, 1) away from its init (the same draws on every device)."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float32)
                parameter.add_(0.1 * noise.to(parameter.device, parameter.dtype))


def _outputs(case, trainer, images, labels, kinds):
    """{output name: tensor} of ``trainer`` on the batch (see the module docstring)."""
    from vlprompt.engine.benchmark_case import CACHED, TEST_TIME, TRAIN
    from vlprompt_app.benchmarking.trainer_cases import training_batch

    model, device = trainer.model, trainer.device
    images, labels = images.to(device), labels.to(device)

    def evaluate():
        trainer.set_model_mode("eval")
        with torch.no_grad(), model.evaluation():
            if case.kind == TEST_TIME:
                trainer.start_episodes()
                with contextlib.redirect_stdout(io.StringIO()):
                    return trainer.adapt_and_predict(images)
            if case.kind == CACHED:
                return trainer.model_inference(model.encode_image_features(images))
            return trainer.model_inference(images)

    outputs = {"logits": evaluate()}
    if case.kind in (TRAIN, CACHED) and "loss" in kinds:
        batch = training_batch(case, trainer, images, labels)
        trainer.batch_idx, trainer.num_batches = 0, len(trainer.train_loader_x)
        trainer.set_model_mode("train")
        torch.manual_seed(STEP_SEED)  # the step's draws from the default generators start alike
        with contextlib.redirect_stdout(io.StringIO()):
            summary = trainer.forward_backward(batch)
        outputs["loss"] = torch.as_tensor(summary["loss"])
        outputs["logits after step"] = evaluate()
    return outputs


def compare_case(case, device, classes=6, batch=2):
    """The record of one case: {"case", "trainer", "config", output name: relative difference, "passed"}."""
    from vlprompt.engine.benchmark_case import TEST_TIME
    from vlprompt_app.benchmarking.trainer_cases import build_trainer

    settings = {"backbone": TINY_CLIP, "weights": "random", "image_size": 32, "batch": batch, "prec": "fp32",
                "opts": [], "classes": classes}
    parity_case = tiny_case(case)
    record = {"case": case.name, "trainer": case.trainer, "config": f"configs/trainers/{parity_case.config}",
              "opts": list(parity_case.opts)}
    with tempfile.TemporaryDirectory(prefix="parity_") as output_dir:
        torch.manual_seed(0)  # files a case prepares (PromptKD's stand-in teacher) are drawn alike
        reference = build_trainer(parity_case, dict(settings, device="cpu"), os.path.join(output_dir, "cpu"))
        _perturb(reference.model, torch.Generator().manual_seed(VALUE_SEED))
        torch.manual_seed(0)
        other = build_trainer(parity_case, dict(settings, device=device.type), os.path.join(output_dir, "other"))
        other.model.load_state_dict(reference.model.state_dict())
        generator = torch.Generator().manual_seed(BATCH_SEED)
        count = reference.episode_cfg.NUM_VIEWS if case.kind == TEST_TIME else (case.batch or batch)
        images = torch.randn(count, 3, 32, 32, generator=generator)
        labels = torch.arange(count) % classes
        expected = _outputs(case, reference, images, labels, ("loss",))
        found = _outputs(case, other, images, labels, ("loss",))
    for name, value in expected.items():
        record[name] = relative_difference(found[name], value)
    tolerance = TEST_TIME_TOLERANCE if case.kind == TEST_TIME else TOLERANCE
    record["tolerance"] = tolerance
    record["passed"] = all(record[name] <= tolerance for name in expected)
    return record
