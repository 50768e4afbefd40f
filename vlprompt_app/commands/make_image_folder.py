"""Write an example image folder for the ImageFolder dataset, offline, from the synthetic world.

    python tools/make_image_folder.py OUT_DIR [--classes K] [--images-per-class N] [--seed S]

Writes ``OUT_DIR/<class>/<n>.png``: K colour-shape classes of the synthetic benchmark
(``vlprompt.synthetic``; e.g. folder ``red_circle``, class name "red circle"), N images each,
32x32 PNGs drawn in the style of its downstream sets, so that the project's tiny synthetic CLIP
(``configs/trainers/*/synthetic.yaml``) recognises them. The K classes are spread over the 80
colour-shape classes (every 80/K-th); image n of class c is drawn from ``default_rng([S, c, n])``,
so a tree is the same on every machine. Then::

    python train.py --root OUT_DIR --trainer CoOp --dataset-config-file configs/datasets/image_folder.yaml \\
        --config-file configs/trainers/CoOp/synthetic.yaml --output-dir OUT_DIR/../coop

The tree is written to a temporary folder and renamed into place, so an interrupted run leaves
nothing behind; an existing OUT_DIR is refused (exit status 2).
"""
import argparse
import os
import shutil
import sys

import numpy as np

from vlprompt.synthetic.downstream import COLOR_SHAPE_CLASSES, DOWNSTREAM_STYLE
from vlprompt.synthetic.world import render, sample_scene


def pick_classes(count):
    """``count`` of the 80 colour-shape classes, every (80 / count)-th, in their order."""
    total = len(COLOR_SHAPE_CLASSES)
    return [COLOR_SHAPE_CLASSES[index * total // count] for index in range(count)]


def write_tree(out_dir, classes, images_per_class, seed):
    """Render ``images_per_class`` PNGs of each SynthClass of ``classes`` into ``out_dir/<class folder>/``."""
    for label, synth_class in enumerate(classes):
        folder = os.path.join(out_dir, synth_class.folder)
        os.makedirs(folder)
        for n in range(images_per_class):
            rng = np.random.default_rng([seed, label, n])
            scene = sample_scene(rng, DOWNSTREAM_STYLE, **synth_class.attributes)
            render(scene, rng, DOWNSTREAM_STYLE).save(os.path.join(folder, f"{n:04d}.png"), compress_level=1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", help="folder to create (must not exist)")
    parser.add_argument("--classes", type=int, default=10,
                        help=f"number of classes, 2 to {len(COLOR_SHAPE_CLASSES)} (default 10)")
    parser.add_argument("--images-per-class", type=int, default=20, help="images per class, at least 4 (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="drawing seed (default 0)")
    args = parser.parse_args(argv)
    if not 2 <= args.classes <= len(COLOR_SHAPE_CLASSES):
        parser.error(f"--classes must be between 2 and {len(COLOR_SHAPE_CLASSES)}, got {args.classes}")
    if args.images_per_class < 4:
        parser.error(f"--images-per-class must be at least 4 (a class is split 50/20/30 into train, val and test), "
                     f"got {args.images_per_class}")
    out_dir = os.path.abspath(os.path.expanduser(args.out_dir))
    if os.path.exists(out_dir):
        print(f"error: {out_dir} exists; give a folder that does not exist yet", file=sys.stderr)
        return 2
    existing = os.path.dirname(out_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        print(f"error: {existing} is a file, so {out_dir} cannot be made below it; give a path of folders",
              file=sys.stderr)
        return 2
    classes = pick_classes(args.classes)
    staging = f"{out_dir}.tmp-{os.getpid()}"
    try:
        write_tree(staging, classes, args.images_per_class, args.seed)
        os.rename(staging, out_dir)
    except OSError as error:
        print(f"error: could not write {out_dir} ({error.strerror or error}: {error.filename or out_dir}); nothing "
              "was left behind", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"Wrote {len(classes)} classes x {args.images_per_class} images to {out_dir}: "
          f"{', '.join(c.name for c in classes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
