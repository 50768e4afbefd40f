"""Multi-process training (DistributedDataParallel, Gloo on the CPU) and how it is launched.

The main test trains RAdaFFT and FT (each: image encoder and classifier) twice: once as one
process with global batch 8 (train.py's function, in this process), once as 2 processes x 4
images. RAdaFFT's 2 processes are started by run_protocol's launcher the same way a grid does
(``nproc_per_node`` 2: ``python -m torch.distributed.run --standalone --nproc_per_node 2
train.py ...``, i.e. torchrun); FT's are forked with the variables torchrun gives its workers
(forked_runs.run_ranks: the same code path without an interpreter per process). Set-up: the
tests' tiny CLIP, a miniature OxfordPets of 4 classes x 4 training images (2 steps per epoch, 2
epochs), RAdaFFT's stage 2 (image encoder, classifier and mask generator all train) or FT's
synthetic config (image encoder and head, gradient norm clipped to 1.0 after DDP's all-reduce,
so both runs clip the same mean gradient), inputs without random augmentation (INPUT.TRANSFORMS
normalize), DATALOADER.TRAIN_X.SAMPLER SequentialSampler (the two ranks take items 0, 2, 4, ...
and 1, 3, 5, ..., so step i sees the same 8 images as the single process) and SGD.

Tolerance (measured): the two runs differ only in the order in which per-image gradients
are summed (one sum of 8, or two sums of 4 averaged by DDP's all-reduce), so they agree to
float32 rounding: the largest difference of any trained weight after 4 steps was 3.3e-7 of
that tensor's largest value; the test asserts rtol 1e-5, atol 1e-6, while the weights move
by more than 1e-3 in the last epoch. SGD rather than the recipe's AdamW: Adam divides by
sqrt(v) + eps, so a parameter whose exact gradient is zero (e.g. attention key biases, to
which softmax is invariant) takes +-lr steps driven by the sign of rounding noise, and any
change of summation order moves it by about lr per step (5e-4 measured with AdamW). The
logged per-step loss is averaged over the processes, so both logs show the same losses.

FLYP's contrastive loss needs every row of the global batch: its test trains 2 Gloo processes of
4 (image, template) rows, which gather their features, against one process of 8 rows, both
forked as torchrun's workers (FLYP's epoch order under torchrun comes from (SEED, epoch), not
from the single-process sampler), with the same tolerances.

The other tests: the DDP loader augments an item the same whichever process reads it (and
leaves the global generator alone), a global batch the processes do not divide and a
trainer without DDP support are refused, run_protocol's ``--nproc-per-node`` (torchrun for
training runs only, device slots of N GPUs, N GPUs per Slurm job), and the README's DDP
commands resolve (configs merge, the grid expands).
"""
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from baseline_setup import toy_pets_cfg
from forked_runs import run_ranks

from vlprompt.engine import fine_tuning
from vlprompt.config import ConfigError, extend_cfg, get_cfg_default
from vlprompt.data import DataManager
from vlprompt.engine import build_trainer
from vlprompt.engine.distributed import DistributedContext, distributed_train_loader
from vlprompt_app.protocols.execute import OK, Launcher, execute_chain
from vlprompt_app.protocols.grid import Chain, Run
from vlprompt.testing import OXFORD_PETS_TOY_CLASSES, write_oxford_pets_tree
from vlprompt.utils import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]

from vlprompt_app.commands import run_protocol
from vlprompt_app.commands import train

GLOBAL_BATCH = 8


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ddp_data"))
    write_oxford_pets_tree(root, classes=OXFORD_PETS_TOY_CLASSES[:4], train=4, val=1, test=2)
    return root


# (trainer, config, how its 2 processes start): RAda-FT (stage 2) and FT, each training its image
# encoder and classifier
TRAINERS = [("RAdaFFT", "configs/trainers/RAdaFFT/toy_stage2.yaml", "launcher"),
            ("FT", "configs/trainers/FT/synthetic.yaml", "forked")]


def train_argv(data_root, output_dir, clip_files, trainer="RAdaFFT", config="configs/trainers/RAdaFFT/toy_stage2.yaml",
               extra=()):
    return ("--root", data_root, "--trainer", trainer, "--seed", "1",
            "--dataset-config-file", "configs/datasets/oxford_pets.yaml",
            "--config-file", config, "--output-dir", str(output_dir),
            "MODEL.BACKBONE.NAME", clip_files[0], "MODEL.BACKBONE.WEIGHTS", clip_files[1], "USE_CUDA", "False",
            "DATALOADER.TRAIN_X.BATCH_SIZE", str(GLOBAL_BATCH), "DATALOADER.TRAIN_X.SAMPLER", "SequentialSampler",
            "INPUT.TRANSFORMS", "['normalize']", "OPTIM.NAME", "sgd", "OPTIM.LR", "0.05", *extra)


def launch(launcher, data_root, output_dir, clip_files, trainer="RAdaFFT",
           config="configs/trainers/RAdaFFT/toy_stage2.yaml", extra=()):
    """Run train.py with ``launcher`` like a grid run; return the run folder."""
    run = Run(str(output_dir), train_argv(data_root, output_dir, clip_files, trainer, config, extra), None,
              output_dir.name)
    env = {} if launcher.in_process else {"OMP_NUM_THREADS": "1"}  # an in-process run has the worker's threads
    (outcome,) = execute_chain(Chain((run,)), launcher, env)
    assert outcome.status == OK, (output_dir / "console.txt").read_text()[-3000:]
    return output_dir


def fork_ranks(world_size, data_root, output_dir, clip_files, trainer, config, extra=()):
    """Run train.py as the ``world_size`` processes of a torchrun job, forked (forked_runs.run_ranks);
    return the run folder."""
    command = [sys.executable, str(ROOT / "train.py"), *train_argv(data_root, output_dir, clip_files, trainer, config,
                                                                  extra)]
    run_ranks(command, world_size, output_dir.parent / f"{output_dir.name}-console", cwd=ROOT)
    return output_dir


def logged_losses(log_file):
    """The per-step losses of the progress lines of ``log_file``."""
    return [float(match) for match in re.findall(r"batch \[\d+/\d+\].* loss (\S+) \(", log_file.read_text())]


def weights(run_dir, epoch, trainer="RAdaFFT"):
    return load_checkpoint(str(run_dir / trainer / f"model.pth.tar-{epoch}"))["state_dict"]


needs_gloo = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with the Gloo backend is not available in this torch build")


def assert_trained_alike(single, ddp, trainer, steps=4):
    """The 2-process run ``ddp`` logged the losses, saved the weights and got the results of ``single``."""
    log = (ddp / "log.txt").read_text()
    assert f"DistributedDataParallel: 2 processes x {GLOBAL_BATCH // 2} images per step" in log
    assert "Checkpoint saved" not in (ddp / "log-rank1.txt").read_text()  # only rank 0 writes files

    single_losses, ddp_losses = logged_losses(single / "log.txt"), logged_losses(ddp / "log.txt")
    assert len(single_losses) == steps  # 16 images / global batch 8 = 2 steps per epoch, 2 epochs
    assert ddp_losses == pytest.approx(single_losses, abs=2e-4)  # 4 printed decimals

    final_single, final_ddp = weights(single, 2, trainer), weights(ddp, 2, trainer)
    assert set(final_ddp) == set(final_single)
    for name, value in final_single.items():
        torch.testing.assert_close(final_ddp[name], value, rtol=1e-5, atol=1e-6, msg=name)
    moved = max((final_single[name] - value).abs().max().item() for name, value in weights(single, 1, trainer).items())
    assert moved > 1e-3  # the last epoch changes the weights by far more than the tolerance

    results = [json.loads((run / "results.json").read_text()) for run in (single, ddp)]
    assert results[0]["metrics"] == pytest.approx(results[1]["metrics"], abs=1e-9)


@needs_gloo
@pytest.mark.parametrize("trainer, config, start", TRAINERS)
@pytest.mark.e2e
def test_two_gloo_processes_train_as_one_process_with_the_same_global_batch(data_root, tiny_clip_files, tmp_path,
                                                                             trainer, config, start):
    # the one-process reference in this process (train.py's function), the two processes by torchrun or forked
    single = launch(Launcher(str(ROOT / "train.py"), in_process=train.run, cwd=str(ROOT)), data_root,
                    tmp_path / "single", tiny_clip_files, trainer, config)
    if start == "launcher":
        ddp = launch(Launcher(str(ROOT / "train.py"), cwd=str(ROOT), nproc_per_node=2), data_root, tmp_path / "ddp",
                     tiny_clip_files, trainer, config)
    else:
        ddp = fork_ranks(2, data_root, tmp_path / "ddp", tiny_clip_files, trainer, config)
    assert "DistributedDataParallel" not in (single / "log.txt").read_text()
    assert_trained_alike(single, ddp, trainer)


@needs_gloo
@pytest.mark.e2e
def test_flyp_contrasts_the_gathered_rows_of_all_processes(data_root, tiny_clip_files, tmp_path):
    """FLYP's loss contrasts every (image, caption) row of the global batch with every other: two
    processes of 4 rows gather their features, so they train as one process of 8 rows (both as
    torchrun's processes, whose epoch order comes from (SEED, epoch)); 80 templates, so rows are
    (image, template) pairs. Without the gather each process would contrast 4 x 4 rows and the
    losses would differ."""
    config, extra = "configs/trainers/FLYP/synthetic.yaml", ("TRAINER.FLYP.TEMPLATE_ENSEMBLE", "True", "OPTIM.LR", "0.01",
                                                           "OPTIM.MAX_EPOCH", "2")
    runs = {n: fork_ranks(n, data_root, tmp_path / f"nproc{n}", tiny_clip_files, "FLYP", config, extra) for n in (1, 2)}
    assert f"DistributedDataParallel: 1 processes x {GLOBAL_BATCH} images per step" in (runs[1] / "log.txt").read_text()
    assert "FLYP captions: 80 template(s) x 4 classes" in (runs[2] / "log.txt").read_text()
    assert_trained_alike(runs[1], runs[2], "FLYP")


def test_an_item_is_augmented_by_its_epoch_and_index_whichever_process_reads_it(data_root, tiny_clip_files, tmp_path):
    cfg = toy_pets_cfg("RAdaFFT", "RAdaFFT/toy_stage1.yaml", data_root, tmp_path, tiny_clip_files,
                       "INPUT.TRANSFORMS", "['random_resized_crop', 'random_flip', 'normalize']")
    loader = DataManager(cfg).train_loader_x

    def images(world_size, rank, epoch):
        shard = distributed_train_loader(loader, DistributedContext(rank, world_size, rank), 2, seed=1)
        shard.sampler.set_epoch(epoch)
        return {int(i): image for batch in shard for i, image in zip(batch["index"], batch["img"])}

    generator = torch.get_rng_state()
    alone = images(1, 0, epoch=0)
    shared = {**images(2, 0, epoch=0), **images(2, 1, epoch=0)}
    assert torch.equal(torch.get_rng_state(), generator)  # reading items leaves the global generator alone
    assert alone.keys() == shared.keys() == set(range(16))
    assert all(torch.equal(alone[i], shared[i]) for i in alone)  # not a stream per process
    next_epoch = images(1, 0, epoch=1)
    assert not any(torch.equal(alone[i], next_epoch[i]) for i in alone)  # a new crop every epoch


def test_the_global_batch_must_divide_among_the_processes(data_root, tiny_clip_files, tmp_path, monkeypatch):
    monkeypatch.setattr(fine_tuning, "init_distributed", lambda use_cuda: DistributedContext(rank=0, world_size=2, local_rank=0))
    cfg = toy_pets_cfg("RAdaFFT", "RAdaFFT/toy_stage1.yaml", data_root, tmp_path, tiny_clip_files,
                       "DATALOADER.TRAIN_X.BATCH_SIZE", "7")
    with pytest.raises(ConfigError, match=r"BATCH_SIZE \(7\) is the global batch and must be divisible by the number "
                                          r"of processes \(2\)"):
        build_trainer(cfg)


def test_a_trainer_without_ddp_support_refuses_several_processes(monkeypatch):
    cfg = get_cfg_default()
    extend_cfg(cfg)
    cfg.TRAINER.NAME = "CoOp"
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"Trainer 'CoOp' runs as one process, but 2 processes .*supported by: FLYP, FT, L2SP, LPFT, RAdaFFT, WiSEFT\."):
        build_trainer(cfg)


def grid(tmp_path, *extra, trainers=("RAdaFFT:toy_stage1",)):
    return ["--protocol", "base2new", "--benchmark", "synthetic", "--datasets", "synthetic_shapes", "--seeds", "1",
            "--shots", "2", "--root", str(tmp_path / "data"), "--output", str(tmp_path / "out"),
            "--trainers", *trainers, *extra]


def test_run_protocol_starts_training_runs_with_torchrun(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert run_protocol.main(grid(tmp_path, "--dry-run", "--nproc-per-node", "2")) == 0
    train, test = capsys.readouterr().out.splitlines()
    assert train.startswith(f"python -m torch.distributed.run --standalone --nproc_per_node 2 {ROOT / 'train.py'} ")
    assert test.startswith(f"python {ROOT / 'train.py'} ") and "--eval-only" in test  # evaluation: one process

    assert run_protocol.main(grid(tmp_path, "--dry-run", "--nproc-per-node", "2",
                                  trainers=("RAdaFFT:toy_stage1", "CoOp:synthetic"))) == 2
    assert "Trainer 'CoOp' runs as one process, but 2 processes" in capsys.readouterr().err
    assert run_protocol.main(grid(tmp_path, "--in-process", "--nproc-per-node", "2")) == 2
    assert "--in-process cannot be combined with --nproc-per-node" in capsys.readouterr().err
    assert run_protocol.main(grid(tmp_path, "--nproc-per-node", "0")) == 2
    assert "--nproc-per-node must be at least 1, got 0" in capsys.readouterr().err


def test_device_slots_and_slurm_gpus_follow_nproc_per_node(tmp_path):
    assert run_protocol._devices("0,1,2,3", 1, 2) == ["0,1", "2,3"]
    assert run_protocol._devices("0,1", 2, 2) == ["0,1", "0,1"]
    with pytest.raises(ConfigError, match="--nproc-per-node 2 needs a multiple of 2 devices .*got 3"):
        run_protocol._devices("0,1,2", 1, 2)
    parse = run_protocol.build_parser().parse_args
    assert run_protocol._slurm_options(parse(grid(tmp_path, "--nproc-per-node", "4")), "out").gpus_per_node == 4
    assert run_protocol._slurm_options(parse(grid(tmp_path)), "out").gpus_per_node == 1
    options = run_protocol._slurm_options(parse(grid(tmp_path, "--nproc-per-node", "4", "--slurm-gpus", "8")), "out")
    assert options.gpus_per_node == 8
    with pytest.raises(ValueError, match="nproc_per_node > 1 needs subprocess runs"):
        Launcher("train.py", in_process=lambda argv: 0, nproc_per_node=2)


def readme_ddp_commands():
    """The commands of the README's "Multi-GPU (DDP)" subsection, as argument lists."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^### Multi-GPU \(DDP\)\n(.*?)(?=^##)", readme, re.M | re.S)
    assert match, "README has no 'Multi-GPU (DDP)' subsection"
    blocks = re.findall(r"```bash\n(.*?)```", match.group(1), re.S)
    return [shlex.split(block.replace("\\\n", " ").replace("$DATA", "/data")) for block in blocks]


def test_the_readme_ddp_commands_resolve(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    launch_command, grid_command = readme_ddp_commands()
    assert launch_command[:5] == ["torchrun", "--standalone", "--nproc_per_node", "8", "train.py"]
    cfg, _ = train.setup_cfg(train.build_parser().parse_args(launch_command[5:]))
    assert cfg.TRAINER.NAME == "RAdaFFT" and cfg.DATALOADER.TRAIN_X.BATCH_SIZE == 512  # 64 per process

    assert grid_command[:2] == ["python", "tools/run_protocol.py"]
    assert run_protocol.main(grid_command[2:] + ["--output", str(tmp_path), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 * 5  # seeds 1-3: stage 1 on ImageNet, then 4 evaluations
    assert lines[0].startswith("python -m torch.distributed.run --standalone --nproc_per_node 8 ")
    assert "imagenet.yaml" in lines[0] and "DATASET.NUM_SHOTS -1" in lines[0]
    assert all(line.startswith("python ") and "--eval-only" in line for line in lines[1:5])
