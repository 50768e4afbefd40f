"""Check a data folder before launching runs: which of the benchmark datasets are usable.

    python tools/check_datasets.py --root DATA                      # all 16
    python tools/check_datasets.py --root DATA --datasets imagenet oxford_pets EuroSAT
    python tools/check_datasets.py --root DATA --images decode      # decode every image (slower)

The benchmark datasets are those of configs/benchmarks/paper.yaml: the 15 of the CoOp family
and ObjectNet (RAda's full fine-tuning). For each dataset (registered name or YAML stem):
found or missing; what the folder lacks compared to the expected layout (DATASETS.md); the
number of classes and of images per split, compared with the published split sizes (the
dataset class's published_sizes); images that are listed but missing, and image files that
cannot be read (the check that training runs, vlprompt.data.checks). A missing
split_zhou_*.json counts as a fault even when the dataset could build its own split, because
a built split does not match the published one.

Exit status 1 if a requested dataset is unusable (named with --datasets; default:
every dataset whose folder exists), else 0. The check reads the datasets the way
training does, so it may create `split_fewshot/` and, for ImageNet, the folder-listing
cache `preprocessed.json` (reported when it does).
"""
import argparse
import contextlib
import io
import os
import pickle
import sys

from vlprompt.config import get_cfg_default
from vlprompt.data.checks import IMAGE_CHECKS, find_unreadable_images
from vlprompt.data.datasets import DATASET_REGISTRY, DatasetLayoutError
from vlprompt.data.splits import FEWSHOT_DIRNAME
from vlprompt.paths import repository_root
from vlprompt_app.project import import_project_package
from vlprompt_app.protocols.benchmark import dataset_config_names, load_benchmark

REPO = str(repository_root())
import_project_package("datasets")  # registers the dataset classes

CONFIGS = os.path.join(REPO, "configs")
BENCHMARK = "paper"  # the benchmark file whose datasets are checked by default
MAX_LISTED = 5


class Report:
    """The outcome for one dataset: status "ok", "missing" or "broken", the folder and what was found."""

    def __init__(self, name):
        self.name = name
        self.status = "ok"
        self.folder = None
        self.problems = []
        self.notes = []
        self.summary = ""

    def fail(self, problem):
        self.status = "broken"
        self.problems.append(problem)


def benchmark_datasets(benchmark=BENCHMARK):
    """The registered names of the datasets of ``configs/benchmarks/<benchmark>.yaml``, in its order."""
    names = dataset_config_names(CONFIGS)
    return [names[stem] for stem in load_benchmark(benchmark, CONFIGS).dataset_stems()]


def resolve(requested):
    """Registered names for the requested names or YAML stems (case-insensitive).

    Raises:
        SystemExit: a name is unknown (the message lists the valid ones).
    """
    by_key = {name.lower(): name for name in DATASET_REGISTRY.registered_names()}
    stems = dataset_config_names(CONFIGS)
    by_key.update({stem.lower(): name for stem, name in stems.items()})
    unknown = [name for name in requested if name.lower() not in by_key]
    if unknown:
        raise SystemExit(
            f"Unknown dataset(s) {unknown}. Use registered names ({', '.join(benchmark_datasets())}) or the YAML "
            f"stems of configs/datasets/ ({', '.join(stems)})."
        )
    return list(dict.fromkeys(by_key[name.lower()] for name in requested))


def _split_file_problem(cls, folder):
    """Why the split JSON is a problem, or None if it is present (or the dataset has none)."""
    if cls.split_file is None or os.path.isfile(os.path.join(folder, cls.split_file)):
        return None
    sources = [p for p in cls.split_sources if not os.path.exists(os.path.join(folder, p))]
    if sources:
        return f"{cls.split_file} is missing, and so is what it could be built from: {', '.join(sources)}"
    return (
        f"{cls.split_file} is missing: a run would build its own split, which does not match the "
        "published one (download the published file, DATASETS.md)"
    )


def check(name, root, images="verify", workers=1):
    """Check one registered dataset under `root` and return its Report."""
    cls = DATASET_REGISTRY.get(name)
    report = Report(name)
    report.folder = cls.locate(root)
    if report.folder is None:
        report.status = "missing"
        report.summary = "no folder " + " or ".join(f'"{f}"' for f in cls.folder_names())
        return report

    missing = [p for p in cls.required_paths if not os.path.exists(os.path.join(report.folder, p))]
    for path in missing:
        report.fail(f"missing {path}")
    split_problem = _split_file_problem(cls, report.folder)
    if split_problem:
        report.fail(split_problem)
    if report.problems:
        return report

    cfg = get_cfg_default()
    cfg.DATASET.ROOT = root
    cfg.DATASET.NAME = name
    cfg.VERBOSE = False
    before = set(os.listdir(report.folder))
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            dataset = cls(cfg)
    except (DatasetLayoutError, ValueError, OSError, pickle.UnpicklingError) as error:
        report.fail(str(error).split("\nExpected layout")[0])
        return report
    created = sorted(set(os.listdir(report.folder)) - before - {FEWSHOT_DIRNAME})
    if created:
        report.notes.append(f"wrote {', '.join(created)} (a cache that later runs reuse)")

    test_only = dataset.train_x is dataset.test
    val_is_test = dataset.val is dataset.test
    if test_only:
        sizes = (None, None, len(dataset.test))
        report.summary = f"{dataset.num_classes:,} classes; {sizes[2]:,} test images (test only)"
    else:
        sizes = (len(dataset.train_x), None if val_is_test else len(dataset.val or []), len(dataset.test))
        val_text = "val = test" if val_is_test else f"val {sizes[1]:,}"
        report.summary = f"{dataset.num_classes:,} classes; train {sizes[0]:,}, {val_text}, test {sizes[2]:,}"
    if cls.published_sizes is not None:
        if tuple(cls.published_sizes) == sizes:
            report.summary += " (as published)"
        else:
            published = ", ".join(
                f"{part} {n:,}" for part, n in zip(("train", "val", "test"), cls.published_sizes) if n is not None
            )
            report.notes.append(f"the published split has {published}; this copy differs")

    if images != "off":
        paths = list(dict.fromkeys(item.impath for part in (dataset.train_x, dataset.val or [], dataset.test)
                                   for item in part))
        bad = find_unreadable_images(paths, mode=images, num_threads=workers)
        if bad:
            shown = "".join(f"\n{path} ({reason})" for path, reason in list(bad.items())[:MAX_LISTED])
            report.fail(f"{len(bad):,} of {len(paths):,} images cannot be read:{shown}")
    return report


def print_report(report, root):
    """Print a Report: a head line (name, status, folder, summary), then its faults and notes."""
    folder = os.path.relpath(report.folder, root) + "/" if report.folder else ""
    head = f"{report.name:<20} {report.status.upper():<8}"
    print(f"{head} {folder}  {report.summary}".rstrip() if folder else f"{head} {report.summary}")
    for problem in report.problems:
        lines = problem.splitlines()
        print(f"    fault: {lines[0]}" + "".join(f"\n      {line.strip()}" for line in lines[1:]))
    for note in report.notes:
        print(f"    note:  {note}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True, help="the data folder (DATASET.ROOT)")
    parser.add_argument("--datasets", nargs="+", metavar="NAME",
                        help="registered names or YAML stems to require (default: the paper benchmark's 16, of "
                        "which those present are required)")
    parser.add_argument("--images", choices=IMAGE_CHECKS, default="verify",
                        help='how image files are checked: "verify" (PIL verify; JPEGs without an end marker are '
                        'decoded), "decode" (full decode, slower) or "off" (existence only); default: verify')
    parser.add_argument("--workers", type=int, default=8, help="threads that check images (default: 8)")
    args = parser.parse_args(argv)

    root = os.path.abspath(os.path.expanduser(args.root))
    names = resolve(args.datasets) if args.datasets else benchmark_datasets()
    print(f"Datasets under {root} (layouts: DATASETS.md)\n")
    reports = []
    for name in names:
        report = check(name, root, images=args.images, workers=args.workers)
        print_report(report, root)
        reports.append(report)

    counts = {status: sum(r.status == status for r in reports) for status in ("ok", "broken", "missing")}
    print(f"\n{counts['ok']} ok, {counts['broken']} broken, {counts['missing']} missing")
    required = reports if args.datasets else [r for r in reports if r.status != "missing"]
    unusable = [r.name for r in required if r.status != "ok"]
    if unusable:
        print(f"Unusable: {', '.join(unusable)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
