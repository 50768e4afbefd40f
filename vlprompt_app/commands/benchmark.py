"""Cost measurements of the project, one subcommand per family of cases.

    python tools/benchmark.py trainers --clock cpu --json output/benchmarks/cpu.json  # every trainer
    python tools/benchmark.py trainers --trainers CoOp DeAR --clock cpu
    python tools/benchmark.py trainers --device cuda --amp --batch 16 --eval-batch 250 --threads 0
    python tools/benchmark.py dear --batch 4 --rounds 5 --clock cpu --flops       # DeAR's L_reg
    python tools/benchmark.py cocoop --classes 1000 --images 2 --chunks 0 1024 256
    python tools/benchmark.py feature-cache --trainer RAda
    python tools/benchmark.py loader --synthetic output/loader_bench --workers 0 2 4
    python tools/benchmark.py official --clock cpu --official-git KaiyangZhou/CoOp=CoOp ... --dassl-git Dassl.pytorch
    python tools/benchmark.py show output/benchmarks/cpu.json [--compare output/benchmarks/before.json]

Every family times with the same clocks (``--clock wall`` or ``cpu``: the process's CPU
time, for a CPU shared with other jobs; images/s always use the wall clock) and prints one
table: a header line (settings, commit, load average), one row per case, then the figures
derived from the rows. ``--json PATH`` writes the same report as JSON; ``show`` prints a saved
one. What each family measures: vlprompt_app/benchmarking/<family>.py (``official``: our trainers
against their official code, vlprompt_app/fidelity/cost.py) and PERFORMANCE.md.
"""
import argparse
import sys

from vlprompt_app.benchmarking import cocoop, dear, feature_cache, loader, per_trainer
from vlprompt_app.benchmarking.report import finish_report, format_report, read_report, start_report, write_report
from vlprompt_app.benchmarking.trainer_cases import BenchmarkCoverageError
from vlprompt.clip import CLIPLoadError
from vlprompt.config import ConfigError
from vlprompt_app.fidelity import cost as official_benchmark

FAMILIES = {"trainers": per_trainer, "dear": dear, "cocoop": cocoop, "feature-cache": feature_cache,
            "loader": loader, "official": official_benchmark}


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="family", required=True, metavar="{" + ",".join([*FAMILIES, "show"]) + "}")
    for name, family in FAMILIES.items():
        command = commands.add_parser(name, help=family.__doc__.split("\n")[0],
                                      description=family.__doc__.split("\n\n")[0])
        command.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                             help="time by the wall clock or by the process's CPU time (for a shared CPU)")
        command.add_argument("--json", help="also write the report to this JSON file")
        command.add_argument("--format", default="simple", help='tabulate table format ("github" for Markdown)')
        family.add_arguments(command)
    show = commands.add_parser("show", help="print the table of a saved report")
    show.add_argument("report", help="a JSON file written with --json")
    show.add_argument("--compare", metavar="JSON", help="(trainers) also print the ratios of this earlier run")
    show.add_argument("--format", default="simple", help='tabulate table format ("github" for Markdown)')
    return parser


def print_report(report, table_format, compare=None):
    family = FAMILIES[report["benchmark"]]
    if compare and not hasattr(family, "comparison_lines"):
        raise SystemExit(f"error: --compare compares trainers reports; this one is a {report['benchmark']} report")
    extra = family.comparison_lines(report, read_report(compare), compare, table_format) if compare else None
    print(format_report(report, family, table_format, extra))


def main(argv=None):
    """Run one subcommand; 0 when every case was measured, 1 when one failed, 2 when the
    trainers family misses a case for a registered trainer or a config, CLIP or role map is
    wrong (the error names it)."""
    args = build_parser().parse_args(argv)
    if args.family == "show":
        try:
            print_report(read_report(args.report), args.format, args.compare)
        except (OSError, ValueError) as error:
            print(f"error: cannot read the report: {error}", file=sys.stderr)
            return 2
        return 0
    family = FAMILIES[args.family]
    try:
        report = start_report(args.family)
        settings, records = family.measure(args)
    except (BenchmarkCoverageError, ConfigError, CLIPLoadError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    report = finish_report(report, settings, records)
    print_report(report, args.format, getattr(args, "compare", None))
    if args.json:
        write_report(report, args.json)
        print(f"JSON written to {args.json}")
    return 1 if any("error" in record for record in records) else 0


if __name__ == "__main__":
    sys.exit(main())
