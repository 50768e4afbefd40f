"""Train or evaluate a method: the CoOp-family command line.

    python train.py --root DATA --trainer CoOp \
        --dataset-config-file configs/datasets/oxford_pets.yaml \
        --config-file configs/trainers/CoOp/vit_b16_ep50.yaml \
        --output-dir output/oxford_pets/CoOp/seed1 --seed 1 DATASET.NUM_SHOTS 16

``python train.py --help`` lists the options; :mod:`vlprompt_app.commands.train` holds the
command (trailing KEY VALUE overrides, evaluation scopes, exit statuses).
"""
import sys

from vlprompt_app.commands.train import run

if __name__ == "__main__":
    sys.exit(run())
