"""The command lines over the harness: tools/official_equivalence.py (record a fixture),
tools/official_wiseft.py (WiSE-FT's fixture) and tools/official_benchmark.py (the cost family
that ``tools/benchmark.py official`` runs)."""
import argparse

from .harness import record, write_fixture
from .methods import METHODS
from .spec import DEFAULT_BACKBONE, DEFAULT_CLASSNAMES


def main(argv=None):
    """Record METHOD's fixture: run its official code and ours side by side; 0 when written."""
    parser = argparse.ArgumentParser(description="Compare a trainer's model with its official implementation on "
                                     "the same random weights and record tests/fixtures/official/<method>.json.")
    parser.add_argument("method", help=f"one of {sorted(METHODS)}")
    parser.add_argument("--official-git", help="clone (or git directory) of the official repository")
    parser.add_argument("--dassl-git", help="clone (or git directory) of the Dassl fork the official code imports "
                        "(not for repositories that hold their own fork, e.g. ProGrad's)")
    parser.add_argument("--backbone", default=DEFAULT_BACKBONE,
                        help="an OpenAI CLIP name, optionally at another input size (default %(default)s: "
                        "ViT-B/16's towers on a 4 x 4 patch grid)")
    args = parser.parse_args(argv)
    if args.method not in METHODS:
        parser.error(f"unknown method '{args.method}'; this tool knows {sorted(METHODS)}")
    spec = METHODS[args.method]
    if not args.official_git or (spec.needs_dassl and not args.dassl_git):
        parser.error(f"{args.method} needs --official-git" + (" and --dassl-git" if spec.needs_dassl else ""))
    fixture = record(args.method, args.official_git, args.dassl_git, args.backbone, DEFAULT_CLASSNAMES)
    path = write_fixture(fixture, spec.fixture_name)
    print(f"{args.method} vs {fixture['official_repository']}@{fixture['official_commit'][:8]}: "
          "relative max difference " + ", ".join(f"{key} {value:.2e}" for key, value in
                                                 fixture["relative_max_difference"].items()) + f"; wrote {path}")
    return 0


def wiseft_main(argv=None):
    """``tools/official_wiseft.py --official-git PATH``: the WiSEFT fixture (``main`` of WiSEFT)."""
    parser = argparse.ArgumentParser(description="FT's model and WiSE-FT's interpolation side by side with "
                                     "mlfoundations/wise-ft; records tests/fixtures/official/wiseft.json.")
    parser.add_argument("--official-git", required=True, help="clone (or git directory) of mlfoundations/wise-ft")
    args = parser.parse_args(argv)
    return main(["WiSEFT", "--official-git", args.official_git])


def benchmark_main(argv=None):
    """``tools/official_benchmark.py``: the ``official`` family of tools/benchmark.py on its own
    (the same options, the same report); 0 when every method was measured, 1 otherwise."""
    from vlprompt_app.benchmarking.report import finish_report, format_report, start_report, write_report

    from . import cost

    parser = argparse.ArgumentParser(description=cost.__doc__.split("\n\n")[0])
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time by the wall clock or by the process's CPU time (for a shared CPU)")
    parser.add_argument("--json", help="also write the report to this JSON file")
    parser.add_argument("--format", default="simple", help='tabulate table format ("github" for Markdown)')
    cost.add_arguments(parser)
    args = parser.parse_args(argv)
    report = start_report("official")
    settings, records = cost.measure(args)
    report = finish_report(report, settings, records)
    print(format_report(report, cost, args.format))
    if args.json:
        write_report(report, args.json)
        print(f"JSON written to {args.json}")
    return 1 if any("error" in record for record in records) else 0
