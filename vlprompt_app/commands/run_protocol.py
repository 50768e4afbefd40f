"""Run an evaluation protocol over methods x datasets x seeds with train.py.

    python tools/run_protocol.py --protocol base2new --root $DATA \\
        --trainers CoOp:vit_b16_ctxv1 MaPLe:vit_b16_c2_ep5_batch4_2ctx --seeds 1 2 3
    python tools/run_protocol.py --protocol base2new --benchmark synthetic --root output/data \\
        --trainers CoOp,DeAR --config synthetic --backend gpus --gpus 0,1
    python tools/run_protocol.py --protocol cross_dataset dg --trainers DeAR:vit_b16_cross_dataset \\
        --backend slurm --slurm-partition gpu

Protocols (``--protocol``, several allowed): ``base2new``, ``fewshot``, ``cross_dataset``,
``dg``, ``fft`` (RAda's full fine-tuning: train on the whole source set, test ID and OOD; a
staged method TRAINER:CFG1@E:CFG2 runs both stages), ``ttt`` (test-time methods on each
target; ``--source-model`` trains the model they start from); their datasets, shots and seeds come from ``--benchmark`` (configs/benchmarks/*.yaml,
default ``paper``) unless given. Runs write to the reference repositories' folders under
``--output`` (vlprompt_app/protocols/layout.py). Each run is given its evaluation scope
(``--eval-role`` base, new, source or target; vlprompt/engine/eval_scope.py), so methods whose
inference depends on it (DeAR's INFERENCE auto) need no per-protocol test options. A run
whose results.json says it completed is skipped, so the same command resumes a grid;
``--dry-run`` lists what would run. A grid whose folders hold runs made with other settings
(other ``--opts``, an edited config file) stops before anything runs, listing them, unless
``--restart`` starts those runs afresh (vlprompt_app/protocols/settings.py). One runner at a time
works on an ``--output`` (``OUTPUT/grid.lock``); a run that another process holds is reported as
held, naming it.

Exit status: 0 when every run completed, 1 when some failed or are held by another process, 2 for
bad input, a grid whose folders hold runs with other settings, or an output another runner holds.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Sequence

from vlprompt.paths import repository_root
from vlprompt.config import ConfigError
from vlprompt.engine.run_lock import RunFolderBusyError
from vlprompt_app.protocols import PROTOCOLS, BenchmarkError, GridSpec, build_grid, load_benchmark
from vlprompt_app.protocols.benchmark import ProtocolDatasets
from vlprompt_app.protocols.execute import (
    GridLock, Launcher, Progress, SlurmOptions, pending_runs, run_queue, run_sequential, submit_slurm,
    summarize, wait_for_jobs,
)
from vlprompt_app.protocols.settings import changed_runs, refusal, restart
from vlprompt_app.protocols.benchmark import TRANSFER
from vlprompt_app.protocols.grid import resolve_method, resolve_methods
from vlprompt_app.project import import_project_package

from vlprompt_app.commands import train

REPO = repository_root()

CONFIGS = REPO / "configs"
TRAIN_SCRIPT = REPO / "train.py"
BACKENDS = ("sequential", "gpus", "slurm")


def _split_commas(values: Optional[Sequence[str]]) -> List[str]:
    return [item for value in values or () for item in value.split(",") if item]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Run base-to-novel, few-shot, cross-dataset, domain-generalisation, full "
                    "fine-tuning (fft) or test-time (ttt) grids with train.py (skips completed runs, lists failures at the end).")
    grid = parser.add_argument_group("grid")
    grid.add_argument("--protocol", nargs="+", required=True, choices=PROTOCOLS, metavar="NAME",
                      help=f"one or more of {', '.join(PROTOCOLS)}")
    grid.add_argument("--trainers", nargs="+", required=True, metavar="TRAINER[:CONFIG]",
                      help="trainers, comma- or space-separated, each with an optional config "
                           "(a name under configs/trainers/TRAINER/ or a .yaml path); "
                           "TRAINER:CFG1@E:CFG2 chains stages (stage 2 starts from stage 1's epoch E; "
                           "cross_dataset, dg, fft)")
    grid.add_argument("--source-model", metavar="TRAINER[:CONFIG]",
                      help="ttt: the method trained on the source dataset (--shots shots) that every "
                           "test-time run starts from (default: none, the test-time method starts from CLIP)")
    grid.add_argument("--config", help="config name for trainers given without one "
                                       "(e.g. synthetic -> configs/trainers/TRAINER/synthetic.yaml)")
    grid.add_argument("--benchmark", default="paper",
                      help="benchmark name under configs/benchmarks/ or a YAML path (default: paper)")
    grid.add_argument("--datasets", nargs="+", metavar="DATASET",
                      help="dataset YAML stems (comma- or space-separated; 'all' = the benchmark's); "
                           "for cross_dataset/dg these are the targets")
    grid.add_argument("--source", help="training dataset of cross_dataset/dg (default: the benchmark's)")
    grid.add_argument("--shots", nargs="+", type=int, help="shot counts (default: the benchmark's)")
    grid.add_argument("--seeds", nargs="+", type=int, help="seeds (default: the benchmark's)")
    grid.add_argument("--root", required=True, help="datasets folder (train.py --root)")
    grid.add_argument("--output", default="output", help="output root (default: output)")
    grid.add_argument("--opts", nargs="+", default=[], metavar="KEY_VALUE",
                      help="KEY VALUE config overrides for every run")
    grid.add_argument("--train-opts", nargs="+", default=[], metavar="KEY_VALUE",
                      help="KEY VALUE overrides for training runs only")
    grid.add_argument("--test-opts", nargs="+", default=[], metavar="KEY_VALUE",
                      help="KEY VALUE overrides for evaluation-only runs only "
                           "(e.g. TEST.SPLIT val)")
    grid.add_argument("--dry-run", action="store_true",
                      help="print the pending runs as train.py commands and exit")
    grid.add_argument("--restart", action="store_true",
                      help="start afresh the runs whose folders hold a run made with other settings (and the runs "
                           "that load them): their files are moved into FOLDER/replaced-<date-time>/ (without it, "
                           "such a grid stops before running anything, listing them)")

    execution = parser.add_argument_group("execution")
    execution.add_argument("--backend", choices=BACKENDS, default="sequential",
                           help="sequential (default), gpus (one run per GPU slot) or slurm")
    execution.add_argument("--in-process", action="store_true",
                           help="call train.run() in this process instead of a python subprocess "
                                "per run (saves the start-up time; sequential and slurm backends)")
    execution.add_argument("--gpus", default="all",
                           help="gpus backend: comma-separated device ids, or 'all' (default)")
    execution.add_argument("--runs-per-gpu", type=int, default=1,
                           help="gpus backend: concurrent runs per device (default 1)")
    execution.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                           help="processes per training run (default 1): N > 1 starts each training "
                                "run with torchrun --standalone --nproc_per_node N (DistributedDataParallel, "
                                "one GPU per process; trainers with DDP support only, e.g. RAdaFFT); the "
                                "gpus backend then gives each run N devices, slurm N GPUs per job")

    slurm = parser.add_argument_group("slurm (one job per training run and its evaluations)")
    slurm.add_argument("--slurm-partition")
    slurm.add_argument("--slurm-account")
    slurm.add_argument("--slurm-qos")
    slurm.add_argument("--slurm-constraint")
    slurm.add_argument("--slurm-time", type=int, default=24 * 60, help="minutes per job (default 1440)")
    slurm.add_argument("--slurm-gpus", type=int, help="GPUs per job (default: --nproc-per-node)")
    slurm.add_argument("--slurm-cpus", type=int, default=8, help="CPUs per job (default 8)")
    slurm.add_argument("--slurm-mem-gb", type=int, help="memory per job in GB")
    slurm.add_argument("--slurm-array-parallelism", type=int, default=256,
                       help="jobs of the array running at once (default 256)")
    slurm.add_argument("--slurm-extra", nargs="+", default=[], metavar="KEY=VALUE",
                       help="further #SBATCH options, e.g. exclude=node3")
    slurm.add_argument("--slurm-folder", help="submitit's folder (default: OUTPUT/.submitit)")
    slurm.add_argument("--slurm-cluster", choices=("slurm", "local", "debug"),
                       help="force submitit's executor: local/debug run the jobs on this machine")
    slurm.add_argument("--wait", action="store_true",
                       help="wait for the jobs and list failures (default: submit and exit)")
    slurm.add_argument("--poll-seconds", type=float, default=30.0,
                       help="with --wait: seconds between job status checks (default 30)")
    return parser


def _trainer_learns(name: str) -> bool:
    """Whether the registered trainer trains (class attribute ``learns``); ConfigError if unknown."""
    from vlprompt.engine import TRAINER_REGISTRY

    registered = TRAINER_REGISTRY.registered_names()
    if name not in registered:
        raise ConfigError(f"Unknown trainer '{name}'; registered: {', '.join(sorted(registered))}.")
    return bool(getattr(TRAINER_REGISTRY.get(name), "learns", True))


def _check_process_count(methods, nproc_per_node: int) -> None:
    """ConfigError when a method that trains would run as several processes without DDP support
    (evaluation-only runs are always one process)."""
    from vlprompt.engine import TRAINER_REGISTRY
    from vlprompt.engine.distributed import check_world_size

    for method in methods:
        if method.learns:
            check_world_size(method.trainer, TRAINER_REGISTRY, nproc_per_node)


def protocol_datasets(args, benchmark) -> dict:
    """Protocol name -> ProtocolDatasets: the benchmark's, with the command line's overrides.

    Raises:
        BenchmarkError: the benchmark lacks the protocol and the command line does not fill
            the gap, or a protocol other than fewshot gets several shot counts.
    """
    datasets = [d for d in _split_commas(args.datasets) if d != "all"]
    chosen = {}
    for name in args.protocol:
        defined = benchmark.protocols.get(name)
        names = tuple(datasets) or (defined.datasets if defined else ())
        shots = tuple(args.shots or ()) or (defined.shots if defined else ())
        source = (args.source or (defined.source if defined else None)) if name in TRANSFER else None
        missing = [flag for flag, value in (("--datasets", names), ("--shots", shots)) if not value]
        if name in TRANSFER and not source:
            missing.append("--source")
        if missing:
            raise BenchmarkError(f"Protocol {name}: benchmark '{benchmark.name}' does not define it; "
                                 f"give {', '.join(missing)}.")
        if name != "fewshot" and len(shots) != 1:
            raise BenchmarkError(f"Protocol {name} takes one shot count, got --shots {list(shots)}.")
        chosen[name] = ProtocolDatasets(names, shots, source)
    return chosen


def _source_model(args):
    """The --source-model Method (ttt only), or None."""
    if args.source_model is None:
        return None
    if "ttt" not in args.protocol:
        raise ConfigError("--source-model is for the ttt protocol (the model test-time runs start from).")
    return resolve_method(args.source_model, args.config, CONFIGS, _trainer_learns)


def _devices(spec: str, runs_per_gpu: int, nproc_per_node: int = 1) -> List[str]:
    """Device slots of the gpus backend: the ids in groups of ``nproc_per_node`` (a slot
    "0,1" is one two-process run), each repeated ``runs_per_gpu`` times."""
    if spec == "all":
        import torch

        count = torch.cuda.device_count()
        if count == 0:
            raise ConfigError("--backend gpus found no CUDA device; pass --gpus 0,1,... or use "
                              "--backend sequential.")
        ids = [str(i) for i in range(count)]
    else:
        ids = _split_commas([spec])
    if runs_per_gpu < 1:
        raise ConfigError(f"--runs-per-gpu must be at least 1, got {runs_per_gpu}.")
    if len(ids) % nproc_per_node:
        raise ConfigError(f"--nproc-per-node {nproc_per_node} needs a multiple of {nproc_per_node} devices "
                          f"for --backend gpus, got {len(ids)} ({','.join(ids)}).")
    slots = [",".join(ids[i:i + nproc_per_node]) for i in range(0, len(ids), nproc_per_node)]
    return [slot for slot in slots for _ in range(runs_per_gpu)]


def _slurm_options(args, output: str) -> SlurmOptions:
    extra = {}
    for item in args.slurm_extra:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--slurm-extra takes KEY=VALUE items, got '{item}'.")
        extra[key] = value
    return SlurmOptions(
        folder=args.slurm_folder or os.path.join(output, ".submitit", "%j"),
        cluster=args.slurm_cluster, timeout_min=args.slurm_time,
        gpus_per_node=args.nproc_per_node if args.slurm_gpus is None else args.slurm_gpus,
        cpus_per_task=args.slurm_cpus, mem_gb=args.slurm_mem_gb, partition=args.slurm_partition,
        account=args.slurm_account, qos=args.slurm_qos, constraint=args.slurm_constraint,
        array_parallelism=args.slurm_array_parallelism, additional=extra)


def _print_dry_run(chains, launcher: Launcher, changed) -> None:
    """The pending runs as commands; with --restart, the changed runs among them (marked)."""
    import shlex

    afresh = {item.run for item in changed}
    pending = set(pending_runs(chains))
    for run in [run for chain in chains for run in chain.runs if run in afresh or run in pending]:
        needs = f"   # after {run.requires}" if run.requires else ""
        note = "   # started afresh (--restart)" if run in afresh else ""
        print(f"{shlex.join(['python', *launcher.command(run)[1:]])}{needs}{note}")


def _changed(args, chains):
    """The changed runs (vlprompt_app/protocols/settings.py), or None after printing the refusal
    when there are some and --restart is not given."""
    changed = changed_runs(chains, train.run_settings)
    if changed and not args.restart:
        print(f"error: {refusal(changed, args.output)}", file=sys.stderr)
        return None
    return changed


def _submit_with_repo_on_path(chains, launcher: Launcher, options: SlurmOptions) -> list:
    """Submit with the repository on the jobs' PYTHONPATH (jobs inherit the environment at
    submission), so that they can unpickle vlprompt's job function."""
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), previous]))
    try:
        return submit_slurm(chains, launcher, options)
    finally:
        if previous is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = previous


def _execute(args, chains, launcher: Launcher) -> int:
    changed = _changed(args, chains)
    if changed is None:
        return 2
    for line in restart(changed):
        print(line, flush=True)
    runs = pending_runs(chains)
    total = sum(len(chain.runs) for chain in chains)
    if not runs:
        print(f"Nothing to run: all {total} runs of the grid are completed.")
        return 0
    pending = set(runs)
    todo = [chain for chain in chains if any(run in pending for run in chain.runs)]
    print(f"Grid: {total} runs in {len(chains)} chains; {total - len(runs)} completed already, "
          f"{len(runs)} to run in {len(todo)} chains (backend: {args.backend}).", flush=True)
    progress = Progress(runs)
    if args.backend == "sequential":
        return summarize(run_sequential(todo, launcher, progress))
    if args.backend == "gpus":
        devices = _devices(args.gpus, args.runs_per_gpu, args.nproc_per_node)
        print(f"Device slots: {', '.join(devices)}", flush=True)
        return summarize(run_queue(todo, launcher, devices, progress))
    options = _slurm_options(args, os.path.abspath(args.output))
    jobs = _submit_with_repo_on_path(todo, launcher, options)
    print(f"Submitted {len(jobs)} jobs (job ids {jobs[0].job_id} ... {jobs[-1].job_id}); "
          f"submitit files in {options.folder}.", flush=True)
    if not args.wait:
        print("Run the same command again later: completed runs are skipped and the rest "
              "resubmitted (do so only once these jobs have ended).")
        return 0
    return summarize(wait_for_jobs(jobs, todo, progress, args.poll_seconds))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.backend == "gpus" and args.in_process:
        print("error: --in-process cannot be combined with --backend gpus (each run needs its "
              "own CUDA_VISIBLE_DEVICES, so runs are subprocesses).", file=sys.stderr)
        return 2
    if args.nproc_per_node < 1:
        print(f"error: --nproc-per-node must be at least 1, got {args.nproc_per_node}.", file=sys.stderr)
        return 2
    if args.nproc_per_node > 1 and args.in_process:
        print("error: --in-process cannot be combined with --nproc-per-node > 1 (torchrun starts "
              "the processes of each training run).", file=sys.stderr)
        return 2
    try:
        import_project_package("trainers")  # registers the trainers and their config nodes
        benchmark = load_benchmark(args.benchmark, CONFIGS)
        protocols = protocol_datasets(args, benchmark)
        methods = [method for spec in _split_commas(args.trainers)
                   for method in resolve_methods(spec, args.config, CONFIGS, _trainer_learns)]
        source_model = _source_model(args)
        _check_process_count(methods + ([source_model] if source_model else []), args.nproc_per_node)
        spec = GridSpec(data_root=args.root, output_root=args.output, methods=methods,
                        seeds=args.seeds or benchmark.seeds, configs_dir=str(CONFIGS),
                        opts=args.opts, train_opts=args.train_opts, test_opts=args.test_opts,
                        source_model=source_model)
        chains = build_grid(spec, protocols)
    except (ConfigError, BenchmarkError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    launcher = Launcher(str(TRAIN_SCRIPT), in_process=train.run if args.in_process else None,
                        nproc_per_node=args.nproc_per_node)
    try:
        if args.dry_run:
            changed = _changed(args, chains)
            if changed is None:
                return 2
            _print_dry_run(chains, launcher, changed)
            return 0
        with GridLock(args.output):  # one runner at a time over an output
            return _execute(args, chains, launcher)
    except (ConfigError, RunFolderBusyError) as error:  # a run's arguments, device slots, a held output
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
