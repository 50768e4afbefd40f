"""Aggregate test accuracies of CoOp-family run folders (successor of ``parse_test_res.py``).

Usage::

    python tools/parse_results.py DIRECTORY [--ci95] [--test-log] [--keyword accuracy]
                                  [--multi-exp] [--full-precision] [--json OUT.json]
    python tools/parse_results.py output/base2new          # Base / Novel / HM tables
    python tools/parse_results.py --base DIR --new DIR      # the same for an explicit pair
    python tools/parse_results.py output --protocol base2new [--format markdown|latex|csv]
                                  [--trainers ZeroshotCLIP,CoOp,DeAR] [--published] [--seeds 1 2 3]
    python tools/parse_results.py output --protocol fewshot cross_dataset dg
    python tools/parse_results.py output --protocol fft ttt --published   # RAda's Tables 1 and 3

``--protocol`` prints the paper tables of the protocol runner's output root
(``tools/run_protocol.py``, layout in ``vlprompt_app/protocols/layout.py``): methods side by
side, mean ± std over seeds, missing seeds flagged, optionally the published numbers
(``configs/published/*.yaml``) with our difference; see ``vlprompt_app/protocols/tables.py``.

What a run folder is, which files are read and how seeds are aggregated: :mod:`vlprompt_app.results`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple

from vlprompt.fileio import write_text
from vlprompt.paths import repository_root
from vlprompt.run_layout import RESULTS_FILENAME
from vlprompt_app.protocols.benchmark import PROTOCOLS, BenchmarkError, load_benchmark
from vlprompt_app.protocols.published import PUBLISHED_PROTOCOLS, PublishedError, load_published, published_path
from vlprompt_app.protocols.tables import FORMATS, render
from vlprompt_app.results import (
    BASE2NEW_NEW_DIR, BASE2NEW_TEST_BASE_DIR, BASE2NEW_TRAIN_DIR, TEST_END_SIGNALS, TRAIN_END_SIGNALS,
    TRANSFER_TITLES, NoResultsError, ProtocolScope, ResultsDirectoryError, RunResult, _describe_signals,
    _no_completed_message, base2new_to_json, collect_base2new, collect_experiments, collect_measurements,
    experiments_to_json, format_base2new, format_experiments, format_incomplete, is_base2new_dir, protocol_table,
    require_directory, write_json,
)

REPO = repository_root()


# ------------------------------------------------------------------------------ CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Aggregate accuracies of CoOp-family run folders (mean ± std over seeds), "
                    "or Base / Novel / HM tables for an output/base2new folder.")
    parser.add_argument("directory", nargs="?", help="folder to search for run folders")
    parser.add_argument("--base",
                        help="base side of a base-to-novel pair (train_base or test_base)")
    parser.add_argument("--new", help="novel side of a base-to-novel pair (test_new)")
    parser.add_argument("--ci95", action="store_true",
                        help="report 1.96·std/√n instead of the population std "
                             "(not in base-to-novel mode)")
    parser.add_argument("--test-log", action="store_true",
                        help="end signal '=> result' (evaluation-only runs) instead of "
                             "'Finish training' / 'Finished training'")
    parser.add_argument("--keyword", default="accuracy", help="metric name in '* KEYWORD: X%%'")
    parser.add_argument("--multi-exp", action="store_true",
                        help="add the mean of the experiment means (not in base-to-novel mode)")
    parser.add_argument("--full-precision", action="store_true",
                        help=f"use {RESULTS_FILENAME} values unrounded (default: one decimal, as logged)")
    parser.add_argument("--json", metavar="OUT.json", help="also write the results as JSON")
    tables = parser.add_argument_group(
        "paper tables (--protocol; DIRECTORY is the output root of tools/run_protocol.py)")
    tables.add_argument("--protocol", nargs="+", choices=PROTOCOLS, metavar="NAME",
                        help=f"print the tables of these protocols ({', '.join(PROTOCOLS)})")
    tables.add_argument("--format", choices=FORMATS, default="terminal",
                        help="terminal (default), markdown, latex (booktabs) or csv (one line per cell)")
    tables.add_argument("--trainers", nargs="+", metavar="TRAINER[:CFG]",
                        help="methods to show, in this order (comma- or space-separated)")
    tables.add_argument("--benchmark", default="paper",
                        help="benchmark giving dataset order, sources and targets (default: paper)")
    tables.add_argument("--datasets", nargs="+",
                        help="only these datasets (cross_dataset/dg: the targets)")
    tables.add_argument("--source", help="source dataset of cross_dataset/dg")
    tables.add_argument("--shots", nargs="+", type=int, help="only these shot counts")
    tables.add_argument("--seeds", nargs="+",
                        help="expected seeds (default: every seed found); cells lacking one are flagged")
    tables.add_argument("--published", nargs="?", const="", metavar="FILE",
                        help="add the published numbers (default file: configs/published/PROTOCOL.yaml) "
                             "and our difference")
    tables.add_argument("--decimals", type=int, default=2, help="decimals shown (default 2)")
    tables.add_argument("--output", metavar="FILE", help="write the tables to FILE instead of stdout")
    return parser


def _print_notes(results: Iterable[RunResult]) -> None:
    for result in results:
        for note in result.notes:
            print(f"warning: {note}", file=sys.stderr)



def _run_experiments(args, end_signals: Tuple[str, ...]) -> int:
    report = collect_experiments(args.directory, args.keyword, end_signals, args.ci95,
                                 args.full_precision)
    _print_notes([r for e in report.experiments for r in e.runs.values()] + report.incomplete)
    n_runs = sum(len(e.runs) for e in report.experiments) + len(report.incomplete)
    print(f"Parsed {n_runs} run folder(s) under {report.directory}: '* {report.keyword}: X%' "
          f"after {_describe_signals(end_signals)} in the newest log, or {RESULTS_FILENAME}")
    if report.experiments:
        print(format_experiments(report, args.multi_exp))
    if report.incomplete:
        print(format_incomplete(report.incomplete))
    if not report.experiments:
        hint = "" if end_signals == TEST_END_SIGNALS else " Evaluation-only runs need --test-log."
        raise NoResultsError(_no_completed_message(
            f"'{report.directory}'", n_runs, report.keyword, _describe_signals(end_signals)) + hint)
    if args.json:
        write_json(experiments_to_json(report), args.json)
    return 0


def _run_base2new(args, base_dir: Path, new_dir: Path,
                  base_end_signals: Tuple[str, ...]) -> int:
    report = collect_base2new(base_dir, new_dir, args.keyword, base_end_signals,
                              args.full_precision)
    _print_notes(report.runs)
    print(f"Base-to-novel: Base from {base_dir} ('* {args.keyword}: X%' after "
          f"{_describe_signals(base_end_signals)}), Novel from {new_dir} (after '=> result')")
    if report.groups:
        print(format_base2new(report))
    if report.incomplete:
        print(format_incomplete(report.incomplete))
    if not report.groups:
        signals = f"{_describe_signals(base_end_signals)} (base) or '=> result' (novel)"
        raise NoResultsError(_no_completed_message(
            f"'{base_dir}' and '{new_dir}'", len(report.incomplete), args.keyword, signals))
    if args.json:
        write_json(base2new_to_json(report), args.json)
    return 0


def _base2new_dirs(args) -> Optional[Tuple[Path, Path, Tuple[str, ...]]]:
    """(base dir, novel dir, base end signals) in base-to-novel mode, else None."""
    if args.base is not None:
        base_dir = Path(args.base)
        new_dir = Path(args.new)
    elif is_base2new_dir(args.directory):
        root = Path(args.directory)
        base_dir = root / BASE2NEW_TRAIN_DIR
        if not base_dir.is_dir():
            base_dir = root / BASE2NEW_TEST_BASE_DIR
        new_dir = root / BASE2NEW_NEW_DIR
    else:
        return None
    eval_only_base = args.test_log or base_dir.name == BASE2NEW_TEST_BASE_DIR
    return base_dir, new_dir, (TEST_END_SIGNALS if eval_only_base else TRAIN_END_SIGNALS)


def _split_commas(values: Optional[Sequence[str]]) -> List[str]:
    return [item for value in values or () for item in str(value).split(",") if item]


def _protocol_scope(args, protocol: str, benchmark) -> ProtocolScope:
    """The benchmark's definition of ``protocol`` with the command line's overrides."""
    defined = benchmark.protocols.get(protocol)
    datasets = tuple(_split_commas(args.datasets)) or None
    shots = tuple(args.shots) if args.shots else None
    order = defined.datasets if defined else ()
    if protocol not in TRANSFER_TITLES:
        return ProtocolScope(datasets, shots, order=datasets or order)
    source = args.source or (defined.source if defined else None)
    targets = datasets or (defined.datasets if defined else None)
    if not source or not targets:
        raise BenchmarkError(f"Benchmark '{benchmark.name}' does not define {protocol}; give "
                             "--source and --datasets (the targets).")
    return ProtocolScope(targets, shots or (defined.shots if defined else None), source)


def _run_protocols(args) -> int:
    benchmark = load_benchmark(args.benchmark, REPO / "configs")
    select = _split_commas(args.trainers) or None
    tables, incomplete = [], []
    for protocol in args.protocol:
        scope = _protocol_scope(args, protocol, benchmark)
        results = collect_measurements(args.directory, protocol, scope, args.seeds, args.keyword,
                                       args.full_precision)
        _print_notes(results.runs)
        incomplete += results.incomplete
        published = None
        if args.published is not None and protocol in PUBLISHED_PROTOCOLS:
            path = args.published or published_path(protocol, REPO / "configs")
            published = load_published(path, protocol)
        elif args.published is not None:
            print(f"note: there are no published numbers for {protocol} "
                  f"(only {', '.join(PUBLISHED_PROTOCOLS)})", file=sys.stderr)
        if not results.measurements.values:
            print(f"warning: no completed {protocol} run under {results.directory}"
                  + ("; the published numbers alone follow" if published else ""), file=sys.stderr)
            if not published:
                continue
        seeds = list(args.seeds) if args.seeds else results.measurements.seeds()
        table = protocol_table(results, seeds, scope, select, published)
        if table.columns and table.rows:
            tables.append(table)
    if incomplete:
        print(format_incomplete(incomplete), file=sys.stderr)
    if not tables:
        raise NoResultsError(f"No completed run of {', '.join(args.protocol)} under "
                             f"'{args.directory}' (see the layout in vlprompt_app/protocols/layout.py).")
    text = render(tables, args.format, args.decimals)
    if args.output:
        write_text(text + "\n", args.output)
        print(f"Wrote {len(tables)} table(s) to {args.output}")
    else:
        print(text)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns the exit status (0 ok, 1 nothing found, 2 bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.base is None) != (args.new is None):
        parser.error("--base and --new must be given together "
                     "(e.g. --base output/base2new/train_base --new output/base2new/test_new).")
    if args.base is None and args.directory is None:
        parser.error("give DIRECTORY, or --base DIR --new DIR for a base-to-novel pair.")
    if args.base is not None and args.directory is not None:
        parser.error("give either DIRECTORY or --base/--new, not both.")
    if args.protocol and args.directory is None:
        parser.error("--protocol needs DIRECTORY (the output root of tools/run_protocol.py).")
    try:
        if args.directory is not None:
            require_directory(args.directory)
        if args.protocol:
            return _run_protocols(args)
        b2n = _base2new_dirs(args)
        if b2n is not None:
            return _run_base2new(args, *b2n)
        return _run_experiments(args, TEST_END_SIGNALS if args.test_log else TRAIN_END_SIGNALS)
    except ResultsDirectoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (BenchmarkError, PublishedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except NoResultsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
