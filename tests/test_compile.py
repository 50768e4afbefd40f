"""TRAIN.COMPILE over every trainer: the contract of vlprompt_app/benchmarking/compiled.py over the
benchmark's cases (one per registered trainer at least, which tests/test_benchmark.py enforces), so a
new trainer is covered once it has its case, without a test of its own.

Every case whose trainer does not refuse TRAIN.COMPILE runs its training step (an eval-only case: its
evaluation) eagerly and then compiled, from the same state: with the cheap "eager" backend (dynamo
traces the step; the graph runs PyTorch's kernels) the step must trace as one graph per compiled method
(fullgraph), unless the trainer declares why not, and give the eager losses, gradients and logits.
Dynamo traces every block anew (about 0.3 s of CPU per block, of a CoCoOp step's 4.5 s on the synthetic
CLIP), so a case runs on the first CLIP of a ladder its trainer builds on (tests/small_clips.py): a random
CLIP of one block per tower, then random CLIPs of the same tiny shape just deep enough for the prompts,
adapters and representation layers that the deeper configs ask for (3 to 6 image and 3 or 4 text blocks),
then the synthetic CLIP (6 image and 4 text blocks) that the configs are written for (DeAR's role map of
it). Inductor, the compiler that makes code, compiles two representative cases (marked slow: it builds C++
kernels). The cases of the fast loop are CoOp (prompts through the text tower, with its evaluation),
CoCoOp (per-image text in chunks), CLIP-Adapter (cached features, the template classifier) and MaPLe (deep
prompts in both towers, on 3 image and 3 text blocks); the others are marked slow (each trace costs
seconds of CPU).
"""
import glob
import os.path as osp

import pytest
import torch
from clip_loads import shared_clip_loads  # noqa: F401  (the module's fixture)
from fast_cases import representative
from small_clips import backbone_opts, clip_ladder, one_block_clip  # noqa: F401  (fixtures)

from vlprompt.config import ConfigError
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.benchmark_case import CACHED, EVAL_ONLY
from vlprompt.engine.compilation import STEP_METHODS
from vlprompt_app.benchmarking import compiled, mixed_precision
from vlprompt_app.benchmarking.trainer_cases import declared_cases

CASES = mixed_precision.contract_cases(declared_cases())
REFUSING = [case for case in CASES if TRAINER_REGISTRY.get(case.trainer).compile_refusal]
COMPILING = [case for case in CASES if case not in REFUSING]
FAST = {"CoOp", "CoCoOp", "CLIPAdapter", "MaPLe"}
EVALUATED = {"CoOp"}  # trained cases whose evaluation is compared too (eval-only cases always are)
NAMED = {case.name: case for case in CASES}
pytestmark = pytest.mark.usefixtures("shared_clip_loads")  # the synthetic CLIP is read once


def params(cases, fast):
    return representative(cases, fast, name=lambda case: case.name)


def assert_matches_eager(record, case, relative):
    """Losses, gradients and logits of the compiled run within ``relative`` of the eager run's scale."""
    assert record.graphs >= 1, "the step ran no compiled method"
    assert record.state_keys_kept
    for eager, traced in record.losses:
        assert eager.keys() == traced.keys()
        for name in eager:
            assert abs(traced[name] - eager[name]) <= relative * max(1.0, abs(eager[name])), (name, eager, traced)
    assert len(record.gradient_errors) == (0 if case.kind == EVAL_ONLY else 2)
    for error in record.gradient_errors:
        assert error <= relative * record.gradient_scale, (error, record.gradient_scale)
    if record.logits_error is not None:
        assert record.logits_error <= relative * record.logit_scale, record.logits_error


@pytest.mark.parametrize("case", params(COMPILING, FAST))
def test_every_case_traces_its_step_and_compiles_it_exactly(case, clip_ladder):  # noqa: F811
    declared = TRAINER_REGISTRY.get(case.trainer).compile_graph_breaks
    record = compiled.check_case(case, "eager", evaluate=case.name in EVALUATED, backbones=clip_ladder)
    assert record.fullgraph == (not declared)  # fullgraph: a graph break would have raised with its reason
    assert {"forward", "loss"} <= set(record.compiled) <= set(STEP_METHODS)
    if case.kind == CACHED:  # trained on cached features: forward_features (and loss_features, if the model has it)
        assert "forward_features" in record.compiled
    # the eager backend runs the traced graph with the eager kernels: the same numbers
    assert_matches_eager(record, case, relative=0.0)


def test_a_case_that_fits_none_of_the_backbones_is_the_last_ones_config_error(one_block_clip):  # noqa: F811
    with pytest.raises(ConfigError):  # MaPLe's prompts 3 blocks deep do not fit one block per tower
        compiled.check_case(NAMED["MaPLe"], "eager", backbones=(backbone_opts(one_block_clip),))


# Inductor's kernels sum in other orders than PyTorch's: the difference is that of fp32 rounding. Measured
# on these cases (2 steps, 5 classes, the one-block CLIP): losses within 3.3e-7 relative (CoOp),
# gradients within 1.4e-6 of their largest value (CoOp; CLIP-Adapter 4.3e-7). The tolerance is 3e-5, about
# twenty times that.
INDUCTOR_TOLERANCE = 3e-5
# Inductor builds a C++ kernel for every distinct fused operation (about 1.5 s of CPU each with the kernel
# cache cold, as on CI): on the one-block CLIP CoOp's step has 13 forward and 7 backward kernels, with the
# suite's tiny CLIP (3 image and 2 text blocks) 21 and 12.


@pytest.mark.slow
@pytest.mark.parametrize("name, evaluate", [("CoOp", False), ("CLIPAdapter", True)])
def test_inductor_compiles_representative_steps_within_fp32_rounding(name, evaluate,
                                                                      one_block_clip):  # noqa: F811
    """CoOp's step (inductor compiles its forward and backward, through both towers); CLIP-Adapter's step and
    evaluation. On a random CLIP of one block per tower (the synthetic CLIP has 6 image and 4 text blocks):
    inductor's time grows with the graph, what it must get right does not."""
    case = NAMED[name]
    record = compiled.check_case(case, "inductor", evaluate=evaluate, opts=backbone_opts(one_block_clip))
    assert record.fullgraph
    assert_matches_eager(record, case, relative=INDUCTOR_TOLERANCE)


@pytest.mark.parametrize("case", REFUSING, ids=[case.name for case in REFUSING])
def test_a_trainer_that_does_not_compile_refuses_train_compile_before_it_is_built(case, tmp_path):
    trainer_class = TRAINER_REGISTRY.get(case.trainer)
    cfg = mixed_precision.build_cfg(case, "fp32", "cpu", str(tmp_path), opts=("TRAIN.COMPILE", "eager"))
    with pytest.raises(ConfigError) as info:
        trainer_class.check_declared_cfg(cfg)
    message = str(info.value)
    assert message.startswith(f"TRAIN.COMPILE is 'eager', but {case.trainer} does not compile: it adapts at test time")
    assert message.endswith("Leave TRAIN.COMPILE empty.") and "\n" not in message


def test_the_test_time_trainers_are_the_ones_that_refuse():
    assert {case.trainer for case in REFUSING} == {"TPT", "PromptAlign", "RAdaTTT"}


def test_a_bad_backend_is_one_paragraph_and_exit_status_2_before_the_run_folder(tmp_path, capsys):
    from vlprompt_app.commands import train

    argv = ["--root", str(tmp_path / "no-data"), "--trainer", "CoOp", "--dataset-config-file",
            "configs/datasets/oxford_pets.yaml", "--config-file", "configs/trainers/CoOp/vit_b16_ep50.yaml",
            "--output-dir", str(tmp_path / "run"), "TRAIN.COMPILE", "inducter"]
    assert train.run(argv) == 2
    error = capsys.readouterr().err.strip()
    assert error == ("Error: TRAIN.COMPILE is 'inducter', but it must be empty (no compiling, the default) or the name "
                     "of a torch.compile backend among ['inductor', 'aot_eager', 'eager']: \"inductor\" generates "
                     "kernels (on the CPU it needs a C++ compiler), \"aot_eager\" and \"eager\" only trace the step (to "
                     "check it compiles).")
    assert not (tmp_path / "run").exists()


def checkpoint_states(folder):
    """{file path under ``folder``: its state dict} of the checkpoints save_model wrote."""
    from vlprompt.utils import load_checkpoint

    paths = sorted(glob.glob(osp.join(folder, "**", "*.pth*"), recursive=True))
    assert paths
    return {osp.relpath(path, folder): load_checkpoint(path)["state_dict"] for path in paths}


def test_a_compiled_run_writes_the_eager_checkpoints_and_resumes_to_the_uninterrupted_state(
        tmp_path, capsys, one_block_clip):  # noqa: F811
    """Built with TRAIN.COMPILE (the caches cold: the first trace reads the class text outside the graph),
    CLIP-Adapter takes the eager steps; its checkpoint has the eager one's names and values (no
    ``_orig_mod.``), and a compiled trainer resumed from it takes the same next step as the one not stopped.
    On the one-block CLIP: the compiled trainers trace the text tower (the class text), once each."""
    case = NAMED["CLIPAdapter"]
    backbone = backbone_opts(one_block_clip)
    compile_opts = backbone + ("TRAIN.COMPILE", "eager")
    eager = mixed_precision.build_trainer(case, "fp32", "cpu", str(tmp_path / "eager"), opts=backbone)
    first = mixed_precision.build_trainer(case, "fp32", "cpu", str(tmp_path / "compiled"), opts=compile_opts)
    assert {"forward", "forward_features", "loss", "loss_features"} <= set(vars(first.model))
    assert "forward" not in vars(eager.model)
    labels = (torch.arange(mixed_precision.BATCH) % mixed_precision.CLASSES).to(eager.device)
    batches = [mixed_precision.random_images(mixed_precision.BATCH, seed, eager.device) for seed in (2, 3, 4)]
    for index, images in enumerate(batches[:2]):
        losses = [mixed_precision.train_step(case, trainer, index, images, labels) for trainer in (eager, first)]
        assert {k: float(v) for k, v in losses[0].items()} == {k: float(v) for k, v in losses[1].items()}
    for trainer in (eager, first):
        trainer.save_model(0, osp.join(trainer.output_dir, "checkpoints"))
    saved_eager = checkpoint_states(str(tmp_path / "eager" / "checkpoints"))
    saved = checkpoint_states(str(tmp_path / "compiled" / "checkpoints"))
    assert saved.keys() == saved_eager.keys()
    for path, state in saved.items():
        assert list(state) == list(saved_eager[path])
        assert all(torch.equal(state[key], saved_eager[path][key]) for key in state)
    resumed = mixed_precision.build_trainer(case, "fp32", "cpu", str(tmp_path / "resumed"), opts=compile_opts)
    resumed.resume_model_if_exist(str(tmp_path / "compiled" / "checkpoints"))
    for trainer in (first, resumed):
        torch.manual_seed(5)
        mixed_precision.train_step(case, trainer, 2, batches[2], labels)
    differences = mixed_precision.state_differences(mixed_precision.trainer_state(first),
                                                    mixed_precision.trainer_state(resumed))
    assert differences == []


def test_the_log_line_names_the_backend_the_mode_and_the_compiled_methods(tmp_path, capsys):
    case = NAMED["CLIPAdapter"]
    trainer = mixed_precision.build_trainer(case, "fp32", "cpu", str(tmp_path))
    assert trainer.compile_model("") is None and "forward" not in vars(trainer.model)
    capsys.readouterr()
    assert trainer.compile_model("aot_eager") is None  # the CPU's default mode
    assert capsys.readouterr().out == ("TRAIN.COMPILE: torch.compile (backend aot_eager, mode default) of "
                                       "CLIPAdapterCLIP.forward, CLIPAdapterCLIP.forward_features, "
                                       "CLIPAdapterCLIP.loss, CLIPAdapterCLIP.loss_features\n")


def test_cuda_graphs_are_used_for_inductor_on_cuda_only():
    from vlprompt.engine.compilation import compile_mode

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert compile_mode("inductor", cuda) == "reduce-overhead"
    assert compile_mode("inductor", cpu) is None
    assert compile_mode("aot_eager", cuda) is None and compile_mode("eager", cuda) is None
