"""Write the toy setup used by the README's smoke run and the tests.

    python tools/make_toy_setup.py [--out output/toy]

Creates OUT/tiny-clip.json + OUT/tiny-clip.pt (a tiny CLIP with random weights, in
open_clip's formats) and OUT/oxford_pets/ (five breeds of coloured squares in the real
OxfordPets layout with split_zhou_OxfordPets.json). configs/trainers/CoOp/toy.yaml points
at these files. The numbers such a run prints measure nothing: it checks the plumbing.
"""
import argparse

from vlprompt.testing import write_oxford_pets_tree, write_tiny_clip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="output/toy", help="folder to write (default: output/toy)")
    args = parser.parse_args(argv)
    config, weights = write_tiny_clip(args.out, name="tiny-clip")
    dataset_dir = write_oxford_pets_tree(args.out)
    print(f"Tiny CLIP: {config} + {weights}")
    print(f"Dataset:   {dataset_dir} (use --root {args.out})")


if __name__ == "__main__":
    main()
