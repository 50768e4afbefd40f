"""PromptAlign's source statistics: token means and variances of a source MaPLe model.

    python tools/promptalign_stats.py --model-dir output/imagenet/MaPLe/vit_b16_c2_ep5_batch4_2ctx_cross_datasets_16shots/seed1 \\
        --root $DATA

The run folder (a MaPLe training run of this project: its ``config.yaml`` and
``MultiModalPromptLearner/model.pth.tar-<E>``) gives the model and the source dataset; the model
runs over that dataset's training images (``--num-shots`` per class, default all, as upstream's
ImageNet pass) with the test transform, and for every block l of the image tower and token position
p the mean and the variance over the images of the block's input are kept (trainers/promptalign.py).
Writes, in upstream's format (one ``torch.save``'d float32 tensor [blocks, L, D] each),
``--output-dir``/vis_means.pt and vis_vars.pt; the default folder, ``<model-dir>/promptalign_stats``,
is where PromptAlign looks when TRAINER.PROMPTALIGN.VIS_MEANS / VIS_VARS are empty.
Bad input ends with one paragraph on stderr and exit status 2.
"""
import argparse
import os.path as osp
import sys

from vlprompt_app.project import import_project

import_project()  # the project's trainers/ and datasets/ (registers them)
from trainers.promptalign import (  # noqa: E402  (trainers/ is loaded by import_project above)
    MEANS_FILENAME, STATISTICS_DIRNAME, VARIANCES_FILENAME, read_run_config, source_cfg, source_statistics,
    training_images_loader, write_source_statistics,
)
from vlprompt.config import ConfigError  # noqa: E402
from vlprompt.engine import build_trainer  # noqa: E402
from vlprompt.utils import set_random_seed  # noqa: E402

SOURCE_TRAINER = "MaPLe"


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True, help="folder of the source MaPLe training run")
    parser.add_argument("--load-epoch", type=int,
                        help="checkpoint epoch (default: the run's last, as tools/run_protocol.py loads)")
    parser.add_argument("--root", help="datasets folder (default: the run's DATASET.ROOT)")
    parser.add_argument("--num-shots", type=int, default=0,
                        help="training images per class (default 0: all of them, as upstream)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--output-dir", help=f"where to write (default: MODEL_DIR/{STATISTICS_DIRNAME})")
    return parser


def compute(args):
    """Build the source run's model and write its statistics; returns the (means, variances) paths."""
    run_cfg = read_run_config(args.model_dir)
    if run_cfg.TRAINER.NAME != SOURCE_TRAINER:
        raise ConfigError(f'"{args.model_dir}" is a {run_cfg.TRAINER.NAME} run; PromptAlign starts from a '
                          f"{SOURCE_TRAINER} model, so its statistics come from a {SOURCE_TRAINER} run.")
    if args.num_shots < 0 or args.batch_size < 1:
        raise ConfigError(f"--num-shots must be >= 0 and --batch-size >= 1, got {args.num_shots} and {args.batch_size}.")
    cfg = source_cfg(run_cfg, args.num_shots, args.root)
    set_random_seed(max(cfg.SEED, 0))
    trainer = build_trainer(cfg)
    epoch = trainer.training_epochs(cfg) if args.load_epoch is None else args.load_epoch
    trainer.load_model(args.model_dir, epoch=epoch)
    trainer.set_model_mode("eval")
    loader = training_images_loader(cfg, trainer.dm, args.batch_size)
    means, variances = source_statistics(trainer.model, loader, trainer.device, trainer.amp.autocast)
    folder = args.output_dir or osp.join(args.model_dir, STATISTICS_DIRNAME)
    paths = osp.join(folder, MEANS_FILENAME), osp.join(folder, VARIANCES_FILENAME)
    write_source_statistics(means, variances, *paths)
    return paths


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        compute(args)
    except (ConfigError, FileNotFoundError) as error:
        print(f"Error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
