"""Shared set-up of the baseline-trainer tests: a tiny random CLIP, a miniature OxfordPets
tree, and configs that fit the tiny towers (3 image layers of width 64, 2 text layers of
width 32, joint embedding 32)."""
import os

import pytest

import datasets  # noqa: F401  (registers the datasets)
import trainers  # noqa: F401  (registers the trainers and their config nodes)
from vlprompt.clip import CLIPRunner, Tokenizer, load_clip
from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file, merge_from_list
from vlprompt.engine import build_trainer
from vlprompt.testing import tiny_clip_config, write_oxford_pets_tree, write_tiny_clip
from vlprompt.utils import set_random_seed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINES = ("CoCoOp", "KgCoOp", "IVLP", "MaPLe", "PromptSRC", "VPT")

# Settings of each trainer's node that fit the tiny CLIP (depths within its layers).
TINY_NODES = {
    "CoOp": {"N_CTX": 4, "CTX_INIT": "a photo of a"},
    "CoCoOp": {"N_CTX": 4, "CTX_INIT": "a photo of a", "TEXT_CHUNK_SIZE": 4},
    "KgCoOp": {"N_CTX": 4, "CTX_INIT": "a photo of a", "W": 8.0},
    "IVLP": {"N_CTX_TEXT": 2, "N_CTX_VISION": 2, "PROMPT_DEPTH_TEXT": 2, "PROMPT_DEPTH_VISION": 3},
    "MaPLe": {"N_CTX": 2, "PROMPT_DEPTH": 2},
    "PromptSRC": {"N_CTX_TEXT": 4, "N_CTX_VISION": 4, "PROMPT_DEPTH_TEXT": 2, "PROMPT_DEPTH_VISION": 3},
    "VPT": {"N_CTX_VISION": 2, "PROMPT_DEPTH_VISION": 3},
    "TAC": {"N_CTX_TEXT": 2, "N_CTX_VISION": 2, "PROMPT_DEPTH_TEXT": 2, "PROMPT_DEPTH_VISION": 3, "N_CLUSTERS": 2},
}


@pytest.fixture(scope="session")
def toy_world(tmp_path_factory):
    """(data root, tiny CLIP config JSON, tiny CLIP weights) shared by the session."""
    base = tmp_path_factory.mktemp("baselines")
    config, weights = write_tiny_clip(str(base), name="tiny-clip-baselines")
    write_oxford_pets_tree(str(base / "data"), train=4, val=2, test=4)
    return str(base / "data"), config, weights


def make_cfg(toy_world, trainer, output_dir, node=None, subsample="base", **keys):
    """Config of ``trainer`` on the toy world: 5 OxfordPets classes (3 base), batch 4,
    warm-up then cosine over 3 epochs, CPU. ``node`` entries update TINY_NODES[trainer];
    ``keys`` are dotted config keys with "." written as "__" (e.g. OPTIM__LR=0.1)."""
    root, clip_config, clip_weights = toy_world
    cfg = get_cfg_default()
    extend_cfg(cfg)
    cfg.SEED = 1
    cfg.USE_CUDA = False
    cfg.OUTPUT_DIR = str(output_dir)
    cfg.DATASET.ROOT = root
    cfg.DATASET.NAME = "OxfordPets"
    cfg.DATASET.SUBSAMPLE_CLASSES = subsample
    cfg.INPUT.SIZE = (32, 32)
    cfg.INPUT.TRANSFORMS = ("random_resized_crop", "random_flip", "normalize")
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.TRAIN_X.BATCH_SIZE = 4
    cfg.DATALOADER.TEST.BATCH_SIZE = 8
    cfg.OPTIM.NAME = "sgd"
    cfg.OPTIM.LR = 0.05
    cfg.OPTIM.MAX_EPOCH = 3
    cfg.OPTIM.LR_SCHEDULER = "cosine"
    cfg.OPTIM.WARMUP_EPOCH = 1
    cfg.OPTIM.WARMUP_TYPE = "constant"
    cfg.OPTIM.WARMUP_CONS_LR = 1e-5
    cfg.TRAIN.PRINT_FREQ = 100
    cfg.MODEL.BACKBONE.NAME = clip_config
    cfg.MODEL.BACKBONE.WEIGHTS = clip_weights
    cfg.TRAINER.NAME = trainer
    node_cfg = cfg.TRAINER[trainer.upper()]
    for name, value in {**TINY_NODES[trainer], **(node or {})}.items():
        node_cfg[name] = value
    for dotted, value in keys.items():
        *path, leaf = dotted.split("__")
        group = cfg
        for name in path:
            group = group[name]
        group[leaf] = value
    cfg.freeze()
    return cfg


def toy_pets_cfg(trainer, trainer_config, data_root, output_dir, clip_files, *opts):
    """Frozen config of ``trainer`` on a miniature OxfordPets under ``data_root`` (seed 1 set, CPU, quiet).

    Args:
        trainer_config: the trainer YAML under configs/trainers/ (e.g. "RAda/toy.yaml").
        clip_files: (CLIP config JSON, weights). opts: KEY VALUE overrides, applied last.
    """
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, os.path.join(ROOT, "configs/datasets/oxford_pets.yaml"))
    merge_from_file(cfg, os.path.join(ROOT, "configs/trainers", trainer_config))
    cfg.TRAINER.NAME, cfg.DATASET.ROOT, cfg.OUTPUT_DIR = trainer, data_root, str(output_dir)
    cfg.MODEL.BACKBONE.NAME, cfg.MODEL.BACKBONE.WEIGHTS = clip_files
    cfg.SEED, cfg.USE_CUDA, cfg.VERBOSE = 1, False, False
    merge_from_list(cfg, list(opts))
    cfg.freeze()
    set_random_seed(cfg.SEED)
    return cfg


def toy_world_cfg(toy_world, trainer, trainer_config, output_dir, *opts):
    """``toy_pets_cfg`` on the ``toy_world`` fixture (data root, CLIP config, weights) with the tiny
    CLIP's 32x32 images and no loader workers; ``opts``: KEY VALUE overrides, applied after those."""
    data, clip_config, weights = toy_world
    return toy_pets_cfg(trainer, trainer_config, data, output_dir, (clip_config, weights),
                        "INPUT.SIZE", "(32, 32)", "DATALOADER.NUM_WORKERS", "0", *opts)


def build_seeded(cfg):
    """What train.py does: seed everything, then build the trainer."""
    set_random_seed(cfg.SEED)
    return build_trainer(cfg)


def learnable(model):
    """{name: detached copy} of the parameters with requires_grad."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def frozen(model):
    """{name: detached copy} of the parameters without requires_grad (CLIP's weights)."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}


def trainer_node(node_name, **changes):
    """cfg.TRAINER.<node_name> of the default config (every trainer's node added) with ``changes`` applied."""
    cfg = get_cfg_default()
    extend_cfg(cfg)
    node = cfg.TRAINER[node_name]
    for name, value in changes.items():
        node[name] = value
    return node


def tiny_node(trainer, **updates):
    """The trainer's config node with TINY_NODES[trainer] and ``updates`` applied."""
    return trainer_node(trainer.upper(), **{**TINY_NODES[trainer], **updates})


# 4 image and 3 text blocks: prompted layers 2..3 leave a frozen block before them in both towers.
DEEPER_CLIP = tiny_clip_config(4, 3)


def deeper_runner(folder, name):
    """(CLIPRunner, Tokenizer) of a tiny CLIP with DEEPER_CLIP's blocks, its files written to ``folder``."""
    return runner_and_tokenizer(write_tiny_clip(str(folder), name=name, config=DEEPER_CLIP))


def runner_and_tokenizer(clip_files):
    """(CLIPRunner, Tokenizer) of the CLIP saved as ``clip_files`` = (config JSON, weights)."""
    config, weights = clip_files
    model, _ = load_clip(config, weights)
    return CLIPRunner(model), Tokenizer(config)


@pytest.fixture(scope="session")
def tiny_runner(toy_world):
    """(CLIPRunner, Tokenizer) of the toy world's tiny CLIP."""
    _, clip_config, clip_weights = toy_world
    return runner_and_tokenizer((clip_config, clip_weights))
