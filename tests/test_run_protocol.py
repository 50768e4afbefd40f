"""tools/run_protocol.py and vlprompt_app.protocols: grid expansion, skipping, failures, backends.

The end-to-end grid is ZeroshotCLIP + CoOp x the synthetic benchmark's two base-to-novel
sets (synthetic_shapes, synthetic_patterns, rendered into a temporary root with 4 training, 4
validation and 1 test image per class) x seeds 1, 2, with the tests' tiny random CLIP, 2 shots,
one epoch and evaluation on the validation split, run in-process to keep it fast.
"""
import gc
import io
import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest
from synthetic_counts import smaller_sets

from vlprompt.config import ConfigError
from vlprompt_app.protocols import BenchmarkError, GridSpec, Method, build_grid, load_benchmark
from vlprompt_app.protocols.benchmark import ProtocolDatasets
from vlprompt_app.protocols.execute import (
    BLOCKED, FAILED, HELD, OK, SKIPPED, Launcher, error_paragraph, execute_chain, is_completed, run_chain_job, run_queue,
    summarize,
)
from vlprompt_app.protocols.grid import Chain, Run, resolve_method
from vlprompt_app.protocols.layout import parse_run_path
from vlprompt.synthetic.downstream import SETS, ensure_dataset

ROOT = Path(__file__).resolve().parents[1]

from vlprompt_app.commands import run_protocol

CONFIGS = ROOT / "configs"
SYNTHETIC_DATASETS = "synthetic_shapes,synthetic_patterns"


# Images per class (train, val, test) of the two sets the grid reads: 2 shots sample 2 training and
# 2 validation images per class (the evaluated split), so the full sets (24, 6, 25) only cost
# rendering time; what the grid test checks does not depend on their size.
SMALL_COUNTS = {"SyntheticShapes": (4, 4, 1), "SyntheticPatterns": (4, 4, 1)}


@pytest.fixture(scope="module")
def small_sets():
    """The two sets at SMALL_COUNTS while this module's runs read them (the runs are in-process)."""
    with smaller_sets(SMALL_COUNTS):
        yield


@pytest.fixture(scope="module")
def data_root(tmp_path_factory, small_sets):
    """A datasets root holding the rendered SyntheticShapes and SyntheticPatterns sets (SMALL_COUNTS)."""
    root = tmp_path_factory.mktemp("protocol") / "data"
    for name in SMALL_COUNTS:
        ensure_dataset(str(root), SETS[name])
    return root


@pytest.fixture(autouse=True)
def repository_cwd(monkeypatch):
    """Run from the repository root, as the README's commands do (relative config and weight paths)."""
    monkeypatch.chdir(ROOT)


def grid_argv(data_root, output, *extra, trainers=("ZeroshotCLIP:configs/trainers/CoOp/synthetic.yaml",
                                                    "CoOp:synthetic"),
              datasets=SYNTHETIC_DATASETS, seeds=("1", "2"), opts=()):
    """run_protocol arguments of a short base-to-novel grid on the synthetic sets (2 shots, one
    epoch, evaluated on the validation split, a few images per class, instead of the test split),
    with ``opts`` added to its --opts."""
    return ["--benchmark", "synthetic", "--protocol", "base2new", "--trainers", *trainers,
            "--datasets", datasets, "--seeds", *seeds, "--shots", "2", "--root", str(data_root),
            "--output", str(output), "--opts", "OPTIM.MAX_EPOCH", "1", "TEST.SPLIT", "val", *opts, *extra]


def results_mtimes(output):
    return {p.parent.relative_to(output).as_posix(): p.stat().st_mtime_ns
            for p in Path(output).rglob("results.json")}


def progress_labels(out):
    """Run labels of the progress lines '[k/N] status seconds label'."""
    return [line.split()[-1] for line in out.splitlines() if line.startswith("[")]


# ------------------------------------------------------------------- end to end


@pytest.mark.e2e
def test_base2new_grid_skips_completed_reruns_deleted_and_reports_failures(data_root, tiny_clip_files, tmp_path,
                                                                           capsys):
    output = tmp_path / "out"
    b2n = output / "base2new"
    broken = b2n / "train_base/synthetic_patterns/shots_2/CoOp/synthetic/seed2"
    broken.mkdir(parents=True)
    (broken / "prompt_learner").write_text("a file where the checkpoint folder goes")  # saving fails
    # the tests' tiny random CLIP: the grid's skipping, reruns and failures are not about the synthetic configs' CLIP
    backbone = ("MODEL.BACKBONE.NAME", tiny_clip_files[0], "MODEL.BACKBONE.WEIGHTS", tiny_clip_files[1])

    def run_grid():
        return run_protocol.main(grid_argv(data_root, output, "--in-process", opts=backbone))

    assert run_grid() == 1
    out = capsys.readouterr().out
    assert "16 runs in 8 chains; 0 completed already, 16 to run in 8 chains" in out
    assert len(progress_labels(out)) == 16 and "[16/16]" in out
    assert "Finished: 14 ok, 1 failed, 1 blocked (their training run failed), 0 already completed." in out
    failed_line = next(line for line in out.splitlines() if line.startswith("  FAILED"))
    assert failed_line.split()[-1] == "base2new/train_base/synthetic_patterns/shots_2/CoOp/synthetic/seed2"
    assert "not run: " + str(broken) + " did not complete" in out
    console = (broken / "console.txt").read_text()
    assert console.count("==== exit status ") == 1 and "==== exit status 0" not in console
    completed = results_mtimes(output)
    assert len(completed) == 14
    zs = json.loads((b2n / "test_new/synthetic_shapes/shots_2/ZeroshotCLIP/synthetic/seed1"
                     / "results.json").read_text())
    assert zs["eval_only"] and zs["model_dir"] == "" and zs["subsample_classes"] == "new"
    assert zs["num_classes"] == 40
    coop_new = json.loads((b2n / "test_new/synthetic_patterns/shots_2/CoOp/synthetic/seed1"
                           / "results.json").read_text())
    assert coop_new["load_epoch"] == 1 and coop_new["epoch"] == 1 and coop_new["num_classes"] == 20
    assert coop_new["model_dir"] == str(b2n / "train_base/synthetic_patterns/shots_2/CoOp/synthetic/seed1")

    # the cause is fixed: exactly the failed chain runs, resuming in place
    (broken / "prompt_learner").unlink()
    assert run_grid() == 0
    out = capsys.readouterr().out
    assert progress_labels(out) == ["base2new/train_base/synthetic_patterns/shots_2/CoOp/synthetic/seed2",
                                    "base2new/test_new/synthetic_patterns/shots_2/CoOp/synthetic/seed2"]
    assert {k: v for k, v in results_mtimes(output).items() if k in completed} == completed

    # the same command again runs nothing
    before = results_mtimes(output)
    assert run_grid() == 0
    assert "Nothing to run: all 16 runs of the grid are completed." in capsys.readouterr().out
    assert results_mtimes(output) == before

    # deleting one results file re-runs exactly that run
    deleted = "base2new/test_new/synthetic_shapes/shots_2/CoOp/synthetic/seed1"
    (output / deleted / "results.json").unlink()
    assert run_grid() == 0
    out = capsys.readouterr().out
    assert progress_labels(out) == [deleted]
    assert "Finished: 1 ok, 0 failed, 0 blocked" in out
    after = results_mtimes(output)
    assert {k for k in after if after[k] != before.get(k)} == {deleted}

    # the results tool reads the grid back: both trainers side by side, both sets, 2 seeds each
    from vlprompt_app.commands import parse_results

    assert parse_results.main([str(output), "--protocol", "base2new", "--benchmark", "synthetic",
                               "--format", "markdown"]) == 0
    table = capsys.readouterr().out
    assert "ZeroshotCLIP" in table and "CoOp" in table and "Average" in table
    assert "synthetic_shapes" in table and "synthetic_patterns" in table and "missing" not in table.lower()


FAKE_TRAIN = (
    "import json, os, sys\n"
    "out = sys.argv[sys.argv.index('--output-dir') + 1]\n"
    "os.makedirs(out, exist_ok=True)\n"
    "record = {'completed': True, 'argv': sys.argv[1:], 'pid': os.getpid(),\n"
    "          'executor': os.environ.get('SUBMITIT_EXECUTOR'),\n"
    "          'device': os.environ.get('CUDA_VISIBLE_DEVICES')}\n"
    "print('training on', record['device'])\n"
    "if out.endswith('bad'):\n"
    "    sys.exit('Error: broken on purpose')\n"
    "json.dump(record, open(os.path.join(out, 'results.json'), 'w'))\n")


@pytest.mark.e2e
def test_slurm_backend_submits_a_job_array_through_submitit_local(tmp_path, capsys, monkeypatch):
    """The CLI's Slurm path with submitit's local executor; the jobs run a stand-in for
    train.py (the real one is exercised by the sequential grid above). One seed: a job array of
    2 chains (each job a process that unpickles its chain without importing torch: see below)."""
    pytest.importorskip("submitit")
    fake_train = tmp_path / "fake_train.py"
    fake_train.write_text(FAKE_TRAIN)
    monkeypatch.setattr(run_protocol, "TRAIN_SCRIPT", fake_train)
    output = tmp_path / "out"
    argv = grid_argv(tmp_path / "data", output, "--backend", "slurm", "--slurm-cluster", "local",
                     "--slurm-gpus", "0", "--slurm-cpus", "1", "--wait", "--poll-seconds", "0.2",
                     datasets="synthetic_shapes", seeds=("1",))
    assert run_protocol.main(argv) == 0
    out = capsys.readouterr().out
    assert "Submitted 2 jobs" in out
    assert "Finished: 4 ok, 0 failed, 0 blocked" in out
    records = {path.parent.relative_to(output).as_posix(): json.loads(path.read_text())
               for path in output.rglob("results.json")}
    assert len(records) == 4 and {r["executor"] for r in records.values()} == {"local"}
    train = records["base2new/train_base/synthetic_shapes/shots_2/CoOp/synthetic/seed1"]
    test = records["base2new/test_new/synthetic_shapes/shots_2/CoOp/synthetic/seed1"]
    assert train["pid"] != test["pid"] and "--load-epoch" in test["argv"]
    assert len(list((output / ".submitit").glob("*/*_result.pkl"))) == 2
    assert run_protocol.main(argv) == 0
    assert "Nothing to run" in capsys.readouterr().out


def test_a_slurm_job_unpickles_its_chain_without_importing_torch(tmp_path):
    """What each job's interpreter loads (submitit pickles run_chain_job with its chain and
    launcher): the protocol runner's modules and the engine's run folders and locks, not torch,
    the CLIP runner or the methods (seconds of CPU per job, before its train.py runs start)."""
    job = pickle.dumps((run_chain_job, fake_chain(tmp_path, "c0"), Launcher(str(ROOT / "train.py"))))
    probe = ("import pickle, sys; function, chain, launcher = pickle.loads(sys.stdin.buffer.read()); "
             "print(function.__name__, len(chain.runs), sorted(name for name in ('torch', 'open_clip', 'trainers') "
             "if name in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], input=job, capture_output=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().split() == ["run_chain_job", "2", "[]"]


# -------------------------------------------------------------------- the queue


def fake_chain(tmp_path, name, n_runs=2):
    runs, previous = [], None
    for i in range(n_runs):
        output_dir = str(tmp_path / name / f"run{i}")
        runs.append(Run(output_dir, (name, str(i)), previous, f"{name}/run{i}"))
        previous = output_dir
    return Chain(tuple(runs))


class FakeLauncher:
    """Records (device, run label, start, end); 'fails' the runs whose label is in ``fail``."""

    def __init__(self, fail=()):
        self.fail = set(fail)
        self.calls = []
        self.lock = threading.Lock()

    def __call__(self, run, env, console):
        start = time.monotonic()
        time.sleep(0.02)
        if run.label not in self.fail:
            Path(run.output_dir, "results.json").write_text('{"completed": true}')
        with self.lock:
            self.calls.append((env["CUDA_VISIBLE_DEVICES"], run.label, start, time.monotonic()))
        return 1 if run.label in self.fail else 0


def test_queue_gives_each_device_one_chain_at_a_time_and_keeps_chain_order(tmp_path):
    chains = [fake_chain(tmp_path, f"c{i}") for i in range(7)]
    launcher = FakeLauncher(fail={"c3/run0"})
    outcomes = run_queue(chains, launcher, ["0", "1", "2"])
    assert len(launcher.calls) == 13  # c3/run1 is blocked
    by_label = {o.run.label: o for o in outcomes}
    assert by_label["c3/run0"].status == FAILED and by_label["c3/run1"].status == BLOCKED
    assert sum(o.status == OK for o in outcomes) == 12
    assert {device for device, *_ in launcher.calls} == {"0", "1", "2"}
    for device in ("0", "1", "2"):
        spans = sorted((s, e) for d, _, s, e in launcher.calls if d == device)
        assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))
    for chain in chains:
        calls = [c for c in launcher.calls if c[1].startswith(chain.runs[0].label.split("/")[0] + "/")]
        assert [c[1] for c in sorted(calls, key=lambda c: c[2])] == [r.label for r in chain.runs][:len(calls)]
        assert len({c[0] for c in calls}) == 1  # a chain stays on its device


def test_queue_slots_share_a_device_and_finished_work_is_skipped(tmp_path):
    chains = [fake_chain(tmp_path, f"c{i}", n_runs=1) for i in range(4)]
    Path(chains[0].head).mkdir(parents=True)
    Path(chains[0].head, "results.json").write_text('{"completed": true}')
    launcher = FakeLauncher()
    outcomes = run_queue(chains, launcher, ["7", "7"])
    assert sorted(o.status for o in outcomes) == [OK, OK, OK, SKIPPED]
    spans = sorted((s, e) for _, _, s, e in launcher.calls)
    assert any(end > next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))  # 2 at once


def test_subprocess_launcher_sets_the_device_of_each_run(tmp_path, capsys):
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    chains = [Chain((Run(str(tmp_path / name), ("--output-dir", str(tmp_path / name)), None, name),))
              for name in ("a", "b", "bad")]
    outcomes = run_queue(chains, Launcher(str(script)), ["3", "5"])
    status = {o.run.label: o for o in outcomes}
    devices = {json.loads((tmp_path / n / "results.json").read_text())["device"] for n in "ab"}
    assert devices <= {"3", "5"} and status["a"].status == status["b"].status == OK
    assert status["bad"].status == FAILED
    assert status["bad"].detail.startswith("exit status 1: Error: broken on purpose (see ")
    assert "training on" in (tmp_path / "bad" / "console.txt").read_text()
    assert summarize(outcomes) == 1
    assert "FAILED  bad" in capsys.readouterr().out


def test_an_in_process_run_collects_its_objects_and_leaves_the_freeze_as_found(tmp_path):
    """What was alive before an in-process run is frozen while it runs (gc.freeze); the run's own
    cycles are collected after it, and the process's freeze is as before (a caller's kept)."""
    class Node:
        pass

    made = []

    def train(argv):
        node = Node()
        node.me = node  # a cycle: only the collector frees it
        made.append(weakref.ref(node))
        return 0

    launcher = Launcher(str(ROOT / "train.py"), in_process=train)
    run = Run(str(tmp_path / "run"), ("--output-dir", str(tmp_path / "run")), None, "run")
    assert gc.get_freeze_count() == 0
    assert launcher(run, {}, io.StringIO()) == 0
    assert made[-1]() is None and gc.get_freeze_count() == 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert launcher(run, {}, io.StringIO()) == 0
        assert made[-1]() is None and gc.get_freeze_count() >= frozen
    finally:
        gc.unfreeze()


def test_partial_results_file_is_not_completed(tmp_path):
    assert not is_completed(tmp_path)
    (tmp_path / "results.json").write_text('{"completed": false, "metrics": {}}')
    assert not is_completed(tmp_path)
    (tmp_path / "results.json").write_text('{"completed": tr')
    assert not is_completed(tmp_path)
    (tmp_path / "results.json").write_text('{"completed": true}')
    assert is_completed(tmp_path)
    run = Run(str(tmp_path), (), None, "x")
    assert [o.status for o in execute_chain(Chain((run,)), FakeLauncher())] == [SKIPPED]


# ------------------------------------------------------------------------- grid


def grid(protocols, methods, output="out", seeds=(1,), **kwargs):
    spec = GridSpec(data_root="DATA", output_root=output, methods=methods, seeds=seeds,
                    configs_dir=str(CONFIGS), **kwargs)
    return build_grid(spec, protocols)


COOP = Method("CoOp", "configs/trainers/CoOp/toy.yaml", "toy")
ZS = Method("ZeroshotCLIP", "configs/trainers/CoOp/toy.yaml", "toy", learns=False)


def test_base2new_phases_and_load_epoch_from_the_merged_config():
    import trainers  # noqa: F401  (config nodes)

    chains = grid({"base2new": ProtocolDatasets(("dtd",), (16,))}, [COOP, ZS],
                  train_opts=["OPTIM.MAX_EPOCH", "7"], test_opts=["TEST.SPLIT", "test"])
    (train, test), (zs_base, zs_new) = [c.runs for c in chains]
    assert train.output_dir == "out/base2new/train_base/dtd/shots_16/CoOp/toy/seed1"
    assert train.argv == (
        "--root", "DATA", "--seed", "1", "--trainer", "CoOp",
        "--dataset-config-file", "configs/datasets/dtd.yaml", "--config-file",
        "configs/trainers/CoOp/toy.yaml", "--output-dir", train.output_dir, "--eval-role", "base",
        "DATASET.NUM_SHOTS", "16", "DATASET.SUBSAMPLE_CLASSES", "base", "OPTIM.MAX_EPOCH", "7")
    assert test.argv[10:] == (
        "--output-dir", "out/base2new/test_new/dtd/shots_16/CoOp/toy/seed1", "--eval-role", "new", "--eval-only",
        "--model-dir", train.output_dir, "--load-epoch", "7",
        "DATASET.NUM_SHOTS", "16", "DATASET.SUBSAMPLE_CLASSES", "new", "TEST.SPLIT", "test")
    assert test.requires == train.output_dir and test.label == "base2new/test_new/dtd/shots_16/CoOp/toy/seed1"
    assert zs_base.argv[12:] == ("--eval-role", "base", "--eval-only", "DATASET.NUM_SHOTS", "16",
                                 "DATASET.SUBSAMPLE_CLASSES", "base", "TEST.SPLIT", "test")
    assert zs_new.requires is None and "--model-dir" not in zs_new.argv
    assert parse_run_path(Path(test.label).parts).kind == "test_new"
    # without overrides --load-epoch is toy.yaml's MAX_EPOCH (3)
    (_, default), = [c.runs for c in grid({"base2new": ProtocolDatasets(("dtd",), (16,))}, [COOP])]
    assert default.argv[default.argv.index("--load-epoch") + 1] == "3"


def test_fewshot_and_transfer_layouts_with_shared_source_training():
    import trainers  # noqa: F401

    protocols = {
        "fewshot": ProtocolDatasets(("imagenet", "dtd"), (4, 16)),
        "cross_dataset": ProtocolDatasets(("dtd", "eurosat"), (16,), "imagenet"),
        "dg": ProtocolDatasets(("imagenetv2",), (16,), "imagenet"),
    }
    chains = grid(protocols, [COOP, ZS], seeds=(2,))
    heads = [c.head for c in chains]
    assert heads == ["out/imagenet/CoOp/toy_4shots/seed2", "out/imagenet/CoOp/toy_16shots/seed2",
                     "out/dtd/CoOp/toy_4shots/seed2", "out/dtd/CoOp/toy_16shots/seed2",
                     "out/imagenet/ZeroshotCLIP/toy_0shots/seed2", "out/dtd/ZeroshotCLIP/toy_0shots/seed2",
                     "out/imagenet/ZeroshotCLIP/toy_16shots/seed2"]
    transfer = chains[1].runs
    assert [r.output_dir for r in transfer[1:]] == [
        f"out/evaluation/CoOp/toy_16shots/{d}/seed2" for d in ("dtd", "eurosat", "imagenetv2")]
    assert all(r.requires == transfer[0].output_dir for r in transfer[1:])
    assert transfer[0].argv[-2:] == ("DATASET.NUM_SHOTS", "16")
    assert transfer[3].argv[-5:] == ("--eval-only", "--model-dir", transfer[0].output_dir,
                                     "--load-epoch", "3")
    zs_fewshot = chains[4].runs[0]
    assert zs_fewshot.argv[-1] == "--eval-only"  # all classes, no shot count
    # every run is given its evaluation scope: the source runs (few-shot and transfer
    # training), the transfer targets, and the zero-shot method's target evaluations
    role = {r.output_dir: r.argv[r.argv.index("--eval-role") + 1] for c in chains for r in c.runs}
    assert [role[r.output_dir] for r in transfer] == ["source", "target", "target", "target"]
    assert role[zs_fewshot.output_dir] == role[chains[0].head] == "source"
    assert [role[r.output_dir] for r in chains[6].runs] == ["source", "target", "target", "target"]
    assert all(r.requires is None for r in chains[6].runs) and len(chains[6].runs) == 4
    keys = [parse_run_path(Path(r.label).parts) for c in chains for r in c.runs]
    assert [(k.kind, k.dataset, k.cfg, k.shots) for k in keys[:3]] == [
        ("train", "imagenet", "toy", 4), ("train", "imagenet", "toy", 16), ("evaluation", "dtd", "toy", 16)]


def test_bad_grid_input_gets_one_clear_message(tmp_path):
    with pytest.raises(ConfigError, match="DATASET.NUM_SHOTS, which the protocol sets itself"):
        grid({}, [COOP], opts=["DATASET.NUM_SHOTS", "4"])
    with pytest.raises(ConfigError, match="TEST.ROLE, which the protocol sets itself .*evaluation scope"):
        grid({}, [COOP], test_opts=["TEST.ROLE", "target"])
    with pytest.raises(ConfigError, match="odd number"):
        grid({}, [COOP], test_opts=["TEST.SPLIT"])
    with pytest.raises(ConfigError, match="Dataset 'nope' has no config file"):
        grid({"base2new": ProtocolDatasets(("nope",), (16,))}, [COOP])
    with pytest.raises(ConfigError, match="Configs in .*CoOp: .*vit_b16_ctxv1"):
        resolve_method("CoOp:vit_b99", None, CONFIGS, lambda name: True)
    with pytest.raises(ConfigError, match="No config for trainer CoOp"):
        resolve_method("CoOp", None, CONFIGS, lambda name: True)
    method = resolve_method("CoOp", "toy", CONFIGS, lambda name: False)
    assert (method.cfg, method.learns) == ("toy", False)
    assert method.config_file.endswith("configs/trainers/CoOp/toy.yaml")


def test_cli_errors_exit_2_without_traceback(tmp_path, capsys):
    data_root = tmp_path / "data"
    assert run_protocol.main(grid_argv(data_root, tmp_path, trainers=("NoSuchTrainer:synthetic",))) == 2
    assert "Unknown trainer 'NoSuchTrainer'; registered:" in capsys.readouterr().err
    assert run_protocol.main(grid_argv(data_root, tmp_path, "--benchmark", "nope")) == 2
    assert "Benchmark file 'configs/benchmarks/nope.yaml' does not exist" in capsys.readouterr().err.replace(
        str(CONFIGS), "configs")
    assert run_protocol.main(grid_argv(data_root, tmp_path, "--backend", "gpus", "--in-process")) == 2
    assert "--in-process cannot be combined with --backend gpus" in capsys.readouterr().err


def test_dry_run_lists_pending_commands(tmp_path, capsys):
    assert run_protocol.main(grid_argv(tmp_path / "data", tmp_path / "out", "--dry-run",
                                       trainers=("CoOp:synthetic",), datasets="synthetic_patterns",
                                       seeds=("3",))) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith("python ") and "train.py" in line for line in lines)
    assert "--load-epoch 1 DATASET.NUM_SHOTS 2 DATASET.SUBSAMPLE_CLASSES new" in lines[1]
    assert lines[1].endswith(
        "# after " + str(tmp_path / "out/base2new/train_base/synthetic_patterns/shots_2/CoOp/synthetic/seed3"))
    assert not (tmp_path / "out").exists()


# -------------------------------------------------------------------- benchmark


def test_benchmarks_load_and_validate(tmp_path):
    paper = load_benchmark("paper", CONFIGS)
    assert paper.seeds == (1, 2, 3) and len(paper.protocol("base2new").datasets) == 11
    assert paper.protocol("dg").source == "imagenet" and paper.protocol("fewshot").shots == (1, 2, 4, 8, 16)
    fft = paper.protocol("fft")  # RAda's full fine-tuning (Table 1's column order)
    assert fft == ProtocolDatasets(("imagenetv2", "imagenet_r", "imagenet_a", "imagenet_sketch", "objectnet"), (0,), "imagenet")
    assert paper.protocol("ttt") == ProtocolDatasets(
        ("imagenetv2", "imagenet_sketch", "imagenet_a", "imagenet_r"), (16,), "imagenet")
    assert {"fft", "ttt"} <= set(run_protocol.build_parser()._option_string_actions["--protocol"].choices)
    for benchmark in (paper, load_benchmark("synthetic", CONFIGS)):
        for protocol in benchmark.protocols.values():
            for name in (*protocol.datasets, *([protocol.source] if protocol.source else [])):
                assert (CONFIGS / "datasets" / f"{name}.yaml").is_file(), (benchmark.name, name)
    bad = tmp_path / "bad.yaml"
    bad.write_text("seeds: [1]\nbase2new: {datasets: dtd, shots: 16}\n")
    with pytest.raises(BenchmarkError, match="base2new.datasets must be a non-empty list"):
        load_benchmark(str(bad), CONFIGS)
    bad.write_text("seeds: [1]\ndg: {source: imagenet, targets: [imagenetv2]}\n")
    expected = r"section 'dg' must have exactly the keys \['shots', 'source', 'targets'\]"
    with pytest.raises(BenchmarkError, match=expected):
        load_benchmark(str(bad), CONFIGS)
    bad.write_text("seeds: [1]\nfewshot: {datasets: [dtd], shots: [1, 2]}\n")
    with pytest.raises(BenchmarkError, match="does not define the protocol 'base2new'"):
        load_benchmark(str(bad), CONFIGS).protocol("base2new")


def test_command_line_overrides_of_the_benchmark():
    paper = load_benchmark("paper", CONFIGS)
    parse = run_protocol.build_parser().parse_args
    common = ["--trainers", "CoOp:toy", "--root", "DATA"]
    chosen = run_protocol.protocol_datasets(
        parse(["--protocol", "dg", "base2new", "--datasets", "all", *common]), paper)
    assert chosen["dg"] == paper.protocol("dg") and chosen["base2new"] == paper.protocol("base2new")
    chosen = run_protocol.protocol_datasets(
        parse(["--protocol", "dg", "--datasets", "imagenet_a,imagenet_r", "--source", "dtd", *common]), paper)
    assert chosen["dg"] == ProtocolDatasets(("imagenet_a", "imagenet_r"), (16,), "dtd")
    with pytest.raises(BenchmarkError, match=r"Protocol base2new takes one shot count, got --shots \[4, 8\]"):
        run_protocol.protocol_datasets(parse(["--protocol", "base2new", "--shots", "4", "8", *common]), paper)
    synthetic = load_benchmark("synthetic", CONFIGS)
    chosen = run_protocol.protocol_datasets(parse(["--protocol", "fewshot", "--shots", "2", *common]), synthetic)
    assert chosen["fewshot"] == ProtocolDatasets(("synthetic_shapes", "synthetic_patterns"), (2,))
    assert run_protocol._devices("0,1", 2) == ["0", "0", "1", "1"]


# ------------------------------------------- reruns with other settings, two runners, held runs


@pytest.fixture
def fake_train(monkeypatch):
    """train.run replaced for --in-process grids: it merges the run's arguments as train.py does,
    records the merged config (config.yaml, or eval_config.yaml for an evaluation of a --model-dir)
    and a completed results.json, without training. Returns the list of output folders it ran."""
    from vlprompt_app.commands import train

    ran = []

    def run(argv):
        args = train.build_parser().parse_args(argv)
        cfg, _ = train.setup_cfg(args)
        cfg, _ = train.prepare_backbone(cfg)  # a run records its preprocessing resolved from the backbone
        folder = Path(cfg.OUTPUT_DIR)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ("eval_config.yaml" if args.eval_only and args.model_dir else "config.yaml")).write_text(cfg.dump())
        (folder / "results.json").write_text('{"completed": true}')
        ran.append(cfg.OUTPUT_DIR)
        return 0

    monkeypatch.setattr(train, "run", run)
    return ran


TRAIN_BASE = "base2new/train_base/synthetic_shapes/shots_2/CoOp/synthetic/seed1"
TEST_NEW = "base2new/test_new/synthetic_shapes/shots_2/CoOp/synthetic/seed1"


def one_chain_grid(tmp_path, *extra):
    """A base2new grid of one chain (CoOp's training on the base classes, its test on the new ones)."""
    return grid_argv(tmp_path / "data", tmp_path / "out", "--in-process", *extra, trainers=("CoOp:synthetic",),
                     datasets="synthetic_shapes", seeds=("1",))


def test_a_grid_holding_runs_with_other_settings_stops_and_restart_starts_them_afresh(tmp_path, fake_train, capsys):
    output = tmp_path / "out"
    assert run_protocol.main(one_chain_grid(tmp_path)) == 0
    assert fake_train == [str(output / TRAIN_BASE), str(output / TEST_NEW)]
    assert run_protocol.main(one_chain_grid(tmp_path)) == 0
    assert "Nothing to run: all 2 runs of the grid are completed." in capsys.readouterr().out

    # another learning rate for the training run: refused (the dry run too), nothing runs
    changed = one_chain_grid(tmp_path, "--train-opts", "OPTIM.LR", "0.5")
    for extra in ((), ("--dry-run",)):
        assert run_protocol.main(changed + list(extra)) == 2
        err = capsys.readouterr().err
        assert (f"1 run(s) of this grid hold a run made with other settings than this command gives them, so they "
                f"would be skipped as completed or resumed: {TRAIN_BASE} (OPTIM.LR 0.02 -> 0.5); and 1 run(s) that "
                f"load their checkpoints: {TEST_NEW}. Give this grid another --output than {output}, or add "
                "--restart") in err
    assert len(fake_train) == 2
    assert run_protocol.main(changed + ["--dry-run", "--restart"]) == 0
    assert capsys.readouterr().out.count("# started afresh (--restart)") == 2

    # --restart: both runs again, the earlier files kept aside; then the grid is complete
    assert run_protocol.main(changed + ["--restart"]) == 0
    assert fake_train[2:] == fake_train[:2]
    for label in (TRAIN_BASE, TEST_NEW):
        assert len(list((output / label).glob("replaced-*/results.json"))) == 1
    (aside,) = (output / TRAIN_BASE).glob("replaced-*")
    assert "LR: 0.02\n" in (aside / "config.yaml").read_text()
    assert "LR: 0.5\n" in (output / TRAIN_BASE / "config.yaml").read_text()
    assert run_protocol.main(changed) == 0 and "Nothing to run" in capsys.readouterr().out

    # an evaluation option changes the evaluation only; neutral keys change nothing
    assert run_protocol.main(changed + ["--test-opts", "TEST.PER_CLASS_RESULT", "True"]) == 2
    assert f"{TEST_NEW} (TEST.PER_CLASS_RESULT False -> True)." in capsys.readouterr().err
    assert run_protocol.main(changed + ["--test-opts", "DATALOADER.TEST.BATCH_SIZE", "7"]) == 0


def _hold(folder, name):
    """A lock file in ``folder`` held by this (live) process, as another runner's would be."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                           "started": "2026-01-02T03:04:05+00:00", "token": "other"}))


def test_a_second_runner_over_one_output_refuses_at_once(tmp_path, fake_train, capsys):
    _hold(tmp_path / "out", "grid.lock")
    assert run_protocol.main(one_chain_grid(tmp_path)) == 2
    err = capsys.readouterr().err
    assert (f"error: Another tools/run_protocol.py runs a grid into {tmp_path / 'out'} (pid {os.getpid()} on host "
            f"{socket.gethostname()}, started 2026-01-02T03:04:05+00:00)") in err
    assert fake_train == [] and json.loads((tmp_path / "out" / "grid.lock").read_text())["token"] == "other"


def test_a_run_another_process_holds_is_reported_as_held_not_failed(tmp_path, capsys):
    chain = fake_chain(tmp_path, "c")
    _hold(Path(chain.runs[0].output_dir), "run.lock")
    launcher = FakeLauncher()
    outcomes = execute_chain(chain, launcher, {"CUDA_VISIBLE_DEVICES": "0"})
    holder = f"held by another process (pid {os.getpid()} on host {socket.gethostname()}, started 2026-01-02"
    assert [o.status for o in outcomes] == [HELD, BLOCKED] and launcher.calls == []
    assert outcomes[0].detail.startswith(holder)
    assert outcomes[1].detail == f"not run: {chain.runs[0].output_dir} is {holder}T03:04:05+00:00)"
    assert summarize(outcomes[:1]) == 1
    out = capsys.readouterr().out
    assert "1 held by another process (0 of them completed there)" in out and "run the same command again" in out
    Path(chain.runs[0].output_dir, "results.json").write_text('{"completed": true}')  # the holder finished it
    assert summarize(outcomes[:1]) == 0


def test_the_error_paragraph_of_a_failed_run():
    progress = "Loading CLIP (backbone: tiny)\nepoch [1/2] loss 1.0\n  0%|     | 0/4\r 50%|##   | 2/4\r100%|#####| 4/4\n"
    paragraph = "\nError: The run folder out is in use by another run (pid 7):\ntwo runs would do the work twice.\n"
    assert error_paragraph(progress + paragraph + "==== exit status 2\n") == (
        "Error: The run folder out is in use by another run (pid 7): two runs would do the work twice.")
    crash = "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n    f()\nValueError: boom\n"
    assert error_paragraph(progress + crash) == "ValueError: boom"
    assert error_paragraph(paragraph + progress + crash) == "ValueError: boom"  # the later one
    assert error_paragraph(progress) == "100%|#####| 4/4"  # a progress bar's last state


LOUD_TRAIN = (
    "import sys\n"
    "print('Loading CLIP (backbone: tiny)')\n"  # stdout, block-buffered into a file unless unbuffered
    "print('\\nError: broken on purpose,\\nsecond line of the paragraph.', file=sys.stderr)\n"
    "sys.exit(2)\n")


@pytest.mark.e2e
def test_a_subprocess_failure_quotes_its_error_paragraph_not_buffered_output(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # the runner's own setting counts
    script = tmp_path / "loud_train.py"
    script.write_text(LOUD_TRAIN)
    run = Run(str(tmp_path / "run"), (), None, "run")
    (outcome,) = execute_chain(Chain((run,)), Launcher(str(script)))
    assert outcome.status == FAILED
    assert outcome.detail.startswith("exit status 2: Error: broken on purpose, second line of the paragraph. (see ")
