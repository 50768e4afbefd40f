"""Export a trained run as one classifier file (vlprompt/export.py describes its contents).

    python tools/export.py RUN_DIR --output model.pt [--epoch N] [--device cpu|cuda] [--root DATA]
        [--test-time TPT --test-time-config configs/trainers/TPT/synthetic.yaml]

``tools/predict.py model.pt IMAGES...`` (or ``vlprompt.load_classifier`` for a class-text-feature
head, ``vlprompt_app.export.load_exported`` for any) predicts with it. Bad input ends with one
paragraph on stderr and exit status 2.
"""
import argparse
import sys

from vlprompt.run_layout import CONFIG_FILENAME


def build_parser():
    parser = argparse.ArgumentParser(prog="tools/export.py", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help=f"output folder of a training run ({CONFIG_FILENAME} and checkpoints)")
    parser.add_argument("--output", required=True, help="the file to write")
    parser.add_argument("--epoch", type=int, help="checkpoint epoch to export (default: the run's last)")
    parser.add_argument("--device", help="cpu or cuda, where the model is built to compute the head")
    parser.add_argument("--root", help="datasets folder holding the run's dataset (default: its DATASET.ROOT)")
    parser.add_argument("--test-time", default="", help="a test-time method adapting from this run (e.g. TPT)")
    parser.add_argument("--test-time-config", default="", help="that method's config file")
    return parser


def main(argv=None):
    """Command-line entry point; returns the exit status (2 for bad input)."""
    from vlprompt_app.commands.train import run_reporting_bad_input
    from vlprompt_app.export import export_run

    args = build_parser().parse_args(argv)

    def export():
        record = export_run(args.run_dir, args.output, epoch=args.epoch, device=args.device, root=args.root,
                            test_time=args.test_time, test_time_config=args.test_time_config)
        print(f"{record['trainer']} classifier ({len(record['classnames'])} classes, {record['head']['kind']} head) "
              f"written to {args.output}", file=sys.stderr)
        return 0

    return run_reporting_bad_input(export)
