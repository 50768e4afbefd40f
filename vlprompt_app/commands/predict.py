"""Predict classes of images with a trained run: one row per image.

    python tools/predict.py RUN_DIR|EXPORTED_FILE IMAGES_OR_FOLDERS... [--topk K] [--epoch N]
        [--classes NAME... | --classes-file F] [--output preds.csv|preds.json]
        [--batch-size N] [--device cpu|cuda] [--root DATA]
        [--test-time TPT --test-time-config configs/trainers/TPT/synthetic.yaml] [--weights FILE]

Folders are walked for image files (sorted) with a progress bar. Each row names the file, then
the top-k (label, probability) pairs, then ``error``: why an image could not be read (such an
image does not stop the others). RUN_DIR may also be a file written by tools/export.py
(its backbone weights are checked against the recorded sha256). Without ``--output`` the CSV goes to stdout
(what building the model prints goes to stderr). The model is the
one ``train.py --eval-only --model-dir RUN_DIR`` evaluates (vlprompt_app/predict.py); bad input
(not a run folder, no checkpoint, an unknown device, class names the method cannot score) ends
with one paragraph on stderr and exit status 2.
"""
import argparse
import contextlib
import csv
import io
import json
import os
import sys

from vlprompt.config import ConfigError
from vlprompt.run_layout import CONFIG_FILENAME

CSV_SUFFIX, JSON_SUFFIX = ".csv", ".json"


def build_parser():
    parser = argparse.ArgumentParser(prog="tools/predict.py", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help=f"output folder of a training run ({CONFIG_FILENAME} and checkpoints), "
                                        "or a file of tools/export.py")
    parser.add_argument("images", nargs="+", help="image files and/or folders of images")
    parser.add_argument("--topk", type=int, default=1, help="classes per image (default 1)")
    parser.add_argument("--epoch", type=int, help="checkpoint epoch to load (default: the run's last)")
    classes = parser.add_mutually_exclusive_group()
    classes.add_argument("--classes", nargs="+", help="class names to score instead of the run's own")
    classes.add_argument("--classes-file", help="text file with one class name per line")
    parser.add_argument("--output", help="write the rows to this .csv or .json file (default: CSV on stdout)")
    parser.add_argument("--batch-size", type=int, help="images per batch (default: the run's test batch size)")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when the run used it and it is there)")
    parser.add_argument("--root", help="datasets folder holding the run's dataset (default: its DATASET.ROOT)")
    parser.add_argument("--weights", help="an exported classifier's backbone weights (default: the recorded path)")
    parser.add_argument("--test-time", default="", help="a test-time method adapting from this run (e.g. TPT)")
    parser.add_argument("--test-time-config", default="", help="that method's config file")
    return parser


def read_classes_file(path):
    """Class names of a text file, one per line (blank lines skipped)."""
    try:
        with open(path, encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip()]
    except OSError as error:
        raise ConfigError(f'Cannot read the classes file "{path}" ({error.strerror or error}).') from None


def output_format(path):
    """"csv" or "json" from the output file's suffix."""
    if path is None or path.lower().endswith(CSV_SUFFIX):
        return "csv"
    if path.lower().endswith(JSON_SUFFIX):
        return "json"
    raise ConfigError(f'--output "{path}" must end in {CSV_SUFFIX} or {JSON_SUFFIX}.')


def rows_csv(predictions, topk):
    """CSV text: path, label_1, probability_1, ..., label_k, probability_k, error."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    header = ["path"]
    for rank in range(1, topk + 1):
        header += [f"label_{rank}", f"probability_{rank}"]
    writer.writerow(header + ["error"])
    for prediction in predictions:
        pairs = []
        for rank in range(topk):
            if rank < len(prediction.labels):
                pairs += [prediction.labels[rank], f"{prediction.probabilities[rank]:.6f}"]
            else:
                pairs += ["", ""]
        writer.writerow([prediction.source, *pairs, prediction.error])
    return out.getvalue()


def rows_json(predictions):
    """JSON text: a list of {"path", "predictions": [{"label", "probability"}...], "error"}."""
    rows = [{"path": p.source,
             "predictions": [{"label": label, "probability": prob} for label, prob in zip(p.labels, p.probabilities)],
             "error": p.error} for p in predictions]
    return json.dumps(rows, indent=1) + "\n"


def predict(args):
    """Predict and write the rows; returns the exit status."""
    from vlprompt.fileio import atomic_write
    from vlprompt_app.export import load_exported
    from vlprompt_app.predict import expand_images, load_run

    fmt = output_format(args.output)
    if args.topk < 1:
        raise ConfigError(f"--topk must be >= 1, got {args.topk}.")
    classes = read_classes_file(args.classes_file) if args.classes_file else args.classes
    # What building the model prints (dataset, transforms, weights) goes to stderr, so that stdout
    # holds the rows alone.
    with contextlib.redirect_stdout(sys.stderr):
        if os.path.isfile(args.run_dir):
            if classes:
                raise ConfigError(f'"{args.run_dir}" is an exported classifier: it scores the class names it was '
                                  "exported with; predict from the run folder to score other names with --classes.")
            predictor = load_exported(args.run_dir, weights=args.weights, device=args.device,
                                      batch_size=args.batch_size)
        else:
            predictor = load_run(args.run_dir, epoch=args.epoch, classes=classes, device=args.device,
                                 batch_size=args.batch_size, root=args.root, test_time=args.test_time,
                                 test_time_config=args.test_time_config)
        paths = expand_images(args.images)
        if not paths:
            raise ConfigError(f"No image files found in {', '.join(args.images)}.")
        topk = min(args.topk, len(predictor.classnames))
        predictions = predictor.predict(paths, topk=topk, progress=True)
    text = rows_csv(predictions, topk) if fmt == "csv" else rows_json(predictions)
    if args.output:
        with atomic_write(args.output, "w") as f:
            f.write(text)
        failed = sum(1 for p in predictions if p.error)
        print(f"{len(predictions)} predictions written to {args.output}"
              + (f" ({failed} image(s) could not be read)" if failed else ""), file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def main(argv=None):
    """Command-line entry point; returns the exit status (2 for bad input)."""
    from vlprompt_app.commands.train import run_reporting_bad_input

    args = build_parser().parse_args(argv)
    return run_reporting_bad_input(lambda: predict(args))
