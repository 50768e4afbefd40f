"""The GPU acceptance run: prepare it here, run it on a lent CUDA GPU in one command.

Here (with a package registry and the official clones):

    python tools/gpu_acceptance.py prepare --official-git KaiyangZhou/CoOp=CoOp --official-git Koorye/DePT=DePT \\
        --official-git muzairkhattak/PromptSRC=PromptSRC --official-git yunncheng/MMRL=MMRL \\
        --dassl-git Dassl.pytorch

There (the GPU machine; ``.gpu`` travels with the working tree):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/wheels/*.whl && \\
    PYTHONPATH=/tmp/site:$PWD python3 tools/gpu_acceptance.py run --official .gpu/official --out OUT

Anywhere, without a GPU (what CI runs): ``python tools/gpu_acceptance.py run --rehearsal --out DIR``.
The stages, their budget and the report: vlprompt_app/gpu_acceptance/run.py; PERFORMANCE.md has the figures.
"""
import argparse
import sys

from vlprompt_app.gpu_acceptance.run import CARRIED_FOLDER as DEFAULT_FOLDER, STAGES


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="the carried folder: wheels, official trees, commit")
    prepare.add_argument("--into", default=DEFAULT_FOLDER, help=f"the folder to fill (default {DEFAULT_FOLDER})")
    prepare.add_argument("--official-git", action="append", default=[], metavar="OWNER/NAME=PATH",
                         help="a clone (or git directory) of an official repository; one per repository")
    prepare.add_argument("--dassl-git", help="a clone (or git directory) of Dassl.pytorch")
    prepare.add_argument("--no-wheels", action="store_true", help="only the official trees and the commit")
    run = commands.add_parser("run", help="the stages and the report (acceptance.md, acceptance.json)")
    run.add_argument("--out", required=True, help="the folder of the report")
    run.add_argument("--official", default=f"{DEFAULT_FOLDER}/official",
                     help="the exported official trees (prepare's FOLDER/official)")
    run.add_argument("--rehearsal", action="store_true", help="on the CPU with tiny settings (no GPU needed)")
    run.add_argument("--budget", type=float, default=330.0, help="seconds for all stages (default 330)")
    run.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES, metavar="STAGE",
                     help=f"the stages to run (default all: {' '.join(STAGES)}; the environment always runs)")
    run.add_argument("--cases", nargs="+", default=[], metavar="CASE",
                     help="the cases (or trainers) of the parity, trainers and compiled stages (default all)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.command == "prepare":
        from vlprompt_app.gpu_acceptance.prepare import prepare

        summary = prepare(args.into, args.official_git, args.dassl_git, wheels=not args.no_wheels)
        for name, commit in summary["commits"].items():
            print(f"{name}: {commit}")
        print(f"wheels: {', '.join(summary.get('wheels', [])) or 'none'}; folder: {args.into}")
        return 0
    import torch

    from vlprompt_app.gpu_acceptance.checks import checks
    from vlprompt_app.gpu_acceptance.run import run as run_stages

    if not args.rehearsal and not torch.cuda.is_available():
        print("error: CUDA is not available; use --rehearsal to run the stages on the CPU with tiny settings",
              file=sys.stderr)
        return 2
    report = run_stages(args.out, official=args.official, rehearsal=args.rehearsal, budget_s=args.budget,
                        stages=args.stages, cases=args.cases)
    for name, passed, detail in checks(report):
        print(f"{'not measured' if passed is None else 'pass' if passed else 'FAIL'}: {name} ({detail})")
    print(f"report: {args.out}/acceptance.md")
    return 0
