"""Default configuration: the keys and values of Dassl 0.6.3,
plus ``DATASET.SUBSAMPLE_CLASSES`` and the project keys marked below.

Trainer-specific nodes (``TRAINER.COOP`` ...) are not here: each trainer module adds its
own through ``vlprompt.config.register_cfg_extension``.
"""
from yacs.config import CfgNode as CN

_C = CN()

_C.VERSION = 1
_C.OUTPUT_DIR = "./output"  # log, tensorboard, checkpoints
_C.RESUME = ""  # folder to resume from instead of OUTPUT_DIR
_C.SEED = -1  # >= 0: seed everything; < 0: no seeding
_C.USE_CUDA = True
_C.VERBOSE = True

###########################
# Input
###########################
_C.INPUT = CN()
# The image preprocessing keys SIZE, INTERPOLATION, PIXEL_MEAN, PIXEL_STD and RESIZE_MODE: empty
# means the backbone's own preprocessing (vlprompt.clip.preprocess; Dassl's values without a backbone).
_C.INPUT.SIZE = ()  # (height, width)
_C.INPUT.INTERPOLATION = ""  # bilinear, bicubic or nearest
_C.INPUT.TRANSFORMS = ()
_C.INPUT.NO_TRANSFORM = False
_C.INPUT.PIXEL_MEAN = []
_C.INPUT.PIXEL_STD = []
_C.INPUT.RESIZE_MODE = ""  # test transform: shortest (resize, center crop), squash or longest (resize, pad)
_C.INPUT.CROP_PADDING = 4
_C.INPUT.RRCROP_SCALE = (0.08, 1.0)
_C.INPUT.CUTOUT_N = 1
_C.INPUT.CUTOUT_LEN = 16
_C.INPUT.GN_MEAN = 0.0
_C.INPUT.GN_STD = 0.15
_C.INPUT.RANDAUGMENT_N = 2
_C.INPUT.RANDAUGMENT_M = 10
_C.INPUT.COLORJITTER_B = 0.4
_C.INPUT.COLORJITTER_C = 0.4
_C.INPUT.COLORJITTER_S = 0.4
_C.INPUT.COLORJITTER_H = 0.1
_C.INPUT.RGS_P = 0.2
_C.INPUT.GB_P = 0.5
_C.INPUT.GB_K = 21

###########################
# Dataset
###########################
_C.DATASET = CN()
_C.DATASET.ROOT = ""
_C.DATASET.NAME = ""
_C.DATASET.SOURCE_DOMAINS = ()
_C.DATASET.TARGET_DOMAINS = ()
_C.DATASET.NUM_LABELED = -1
_C.DATASET.NUM_SHOTS = -1  # 0 or -1: all training data; >= 1: few-shot (K per class); < -1 refused
_C.DATASET.VAL_PERCENT = 0.1
_C.DATASET.STL10_FOLD = -1
_C.DATASET.CIFAR_C_TYPE = ""
_C.DATASET.CIFAR_C_LEVEL = 1
_C.DATASET.ALL_AS_UNLABELED = False
_C.DATASET.SUBSAMPLE_CLASSES = "all"  # CoOp-family key: "all", "base" or "new"
# Project key: check the image files a run reads before using them: "verify" (open + PIL
# verify; a JPEG without its end marker is decoded), "decode" (decode every file), "off"
_C.DATASET.CHECK_IMAGES = "verify"
# Project key: leave unreadable images out (counted in results.json) instead of stopping
_C.DATASET.SKIP_BAD_IMAGES = False
# Project key: where a dataset's generated split and few-shot caches (and the default feature cache of
# its root) go (vlprompt/data/generated_files.py): "": the dataset folder, or
# ~/.cache/vlprompt/datasets/<folder>-<hash> when it cannot be written; a folder: always <CACHE_DIR>/<folder>-<hash>
_C.DATASET.CACHE_DIR = ""
# Project node: the ImageFolder dataset (datasets/image_folder.py), the user's own images in the
# tree DATASET.ROOT (or DATASET.ROOT/DIR); relative file names below are relative to the tree
_C.DATASET.IMAGE_FOLDER = CN()
_C.DATASET.IMAGE_FOLDER.DIR = ""  # "": the tree is DATASET.ROOT; else a folder under it (beside other datasets)
_C.DATASET.IMAGE_FOLDER.LAYOUT = "auto"  # "folders" (ROOT/<class>/...), "list" (LIST_FILE) or "auto"
_C.DATASET.IMAGE_FOLDER.LIST_FILE = ""  # CSV or JSON rows (path, label[, split]); "": labels.csv / labels.json
_C.DATASET.IMAGE_FOLDER.CLASSNAMES_FILE = ""  # lines "KEY class name"; "": classnames.txt if present
_C.DATASET.IMAGE_FOLDER.SPLIT_FILE = "split_zhou_ImageFolder.json"  # read if present, else written
_C.DATASET.IMAGE_FOLDER.SPLIT_RATIO = (0.5, 0.2, 0.3)  # train, val, test share of each class
_C.DATASET.IMAGE_FOLDER.SPLIT_SEED = 1  # seed of the generated split (not the run's SEED)
_C.DATASET.IMAGE_FOLDER.TEMPLATE = "a photo of a {}."  # the class sentence, one "{}"

###########################
# Dataloader
###########################
_C.DATALOADER = CN()
_C.DATALOADER.NUM_WORKERS = 4
_C.DATALOADER.K_TRANSFORMS = 1
_C.DATALOADER.RETURN_IMG0 = False
_C.DATALOADER.TRAIN_X = CN()
_C.DATALOADER.TRAIN_X.SAMPLER = "RandomSampler"
_C.DATALOADER.TRAIN_X.BATCH_SIZE = 32
_C.DATALOADER.TRAIN_X.N_DOMAIN = 0
_C.DATALOADER.TRAIN_X.N_INS = 16
_C.DATALOADER.TRAIN_U = CN()
_C.DATALOADER.TRAIN_U.SAME_AS_X = True
_C.DATALOADER.TRAIN_U.SAMPLER = "RandomSampler"
_C.DATALOADER.TRAIN_U.BATCH_SIZE = 32
_C.DATALOADER.TRAIN_U.N_DOMAIN = 0
_C.DATALOADER.TRAIN_U.N_INS = 16
_C.DATALOADER.TEST = CN()
_C.DATALOADER.TEST.SAMPLER = "SequentialSampler"
_C.DATALOADER.TEST.BATCH_SIZE = 32

###########################
# Model
###########################
_C.MODEL = CN()
_C.MODEL.INIT_WEIGHTS = ""
_C.MODEL.BACKBONE = CN()
_C.MODEL.BACKBONE.NAME = ""  # CLIP model name, e.g. "ViT-B/16"
_C.MODEL.BACKBONE.PRETRAINED = True
# Project key: pretrained tag (e.g. "openai") or a local weights file; "" = the backbone's default
_C.MODEL.BACKBONE.WEIGHTS = ""
_C.MODEL.HEAD = CN()
_C.MODEL.HEAD.NAME = ""
_C.MODEL.HEAD.HIDDEN_LAYERS = ()
_C.MODEL.HEAD.ACTIVATION = "relu"
_C.MODEL.HEAD.BN = True
_C.MODEL.HEAD.DROPOUT = 0.0

###########################
# Optimization
###########################
_C.OPTIM = CN()
_C.OPTIM.NAME = "adam"
_C.OPTIM.LR = 0.0003
_C.OPTIM.WEIGHT_DECAY = 5e-4
_C.OPTIM.MOMENTUM = 0.9
_C.OPTIM.SGD_DAMPNING = 0
_C.OPTIM.SGD_NESTEROV = False
_C.OPTIM.RMSPROP_ALPHA = 0.99
_C.OPTIM.ADAM_BETA1 = 0.9
_C.OPTIM.ADAM_BETA2 = 0.999
_C.OPTIM.STAGED_LR = False  # NEW_LAYERS at LR, all other layers at LR * BASE_LR_MULT
_C.OPTIM.NEW_LAYERS = ()
_C.OPTIM.BASE_LR_MULT = 0.1
_C.OPTIM.LR_SCHEDULER = "single_step"
_C.OPTIM.STEPSIZE = (-1,)  # -1 or 0: MAX_EPOCH
_C.OPTIM.GAMMA = 0.1
_C.OPTIM.MAX_EPOCH = 10
_C.OPTIM.WARMUP_EPOCH = -1  # <= 0: no warm-up
_C.OPTIM.WARMUP_TYPE = "linear"  # "constant" or "linear"
_C.OPTIM.WARMUP_CONS_LR = 1e-5
_C.OPTIM.WARMUP_MIN_LR = 1e-5
_C.OPTIM.WARMUP_RECOUNT = True  # False: the scheduler after warm-up starts counting at WARMUP_EPOCH

###########################
# Train
###########################
_C.TRAIN = CN()
_C.TRAIN.CHECKPOINT_FREQ = 0  # <= 0: save only the last epoch
_C.TRAIN.PRINT_FREQ = 10
_C.TRAIN.COUNT_ITER = "train_x"
# Project key: also save parameters with requires_grad False
_C.TRAIN.SAVE_FROZEN_WEIGHTS = False
# Project key: mid-epoch checkpoint interval in iterations; 0 = off
_C.TRAIN.CHECKPOINT_ITERS = 0
# Project key: a non-finite loss "stop"s the run (step, loss terms and last checkpoint
# reported) or its step is "skip"ped (weights unchanged, counted in results.json)
_C.TRAIN.NONFINITE_LOSS = "stop"
# Project key: on a CPU, run TRAINER.<NAME>.PREC as on CUDA (fp16/amp autocast with a
# GradScaler, bf16 autocast) instead of fp32; slow, for checking mixed precision without a GPU
_C.TRAIN.CPU_AUTOCAST = False
# Project key: torch.compile the model's training-step forward and loss and its evaluation
# forward with this backend: "" (off), "inductor", "aot_eager" or "eager" (vlprompt/engine/compilation.py)
_C.TRAIN.COMPILE = ""

###########################
# Feature cache (project keys; vlprompt/data/feature_cache.py)
###########################
_C.FEATURE_CACHE = CN()
# Encode the images once and train/evaluate on features; only for trainers whose image
# encoder is frozen (RAda EFT, CLIPAdapter, ZeroshotCLIP, ...)
_C.FEATURE_CACHE.ENABLED = False
_C.FEATURE_CACHE.DIR = ""  # "": <DATASET.ROOT>/feature_cache, or in the DATASET.CACHE_DIR folder of a read-only ROOT
_C.FEATURE_CACHE.BATCH_SIZE = 256  # images per encoder call while filling the cache

###########################
# Test
###########################
_C.TEST = CN()
_C.TEST.EVALUATOR = "Classification"
_C.TEST.PER_CLASS_RESULT = False
_C.TEST.COMPUTE_CMAT = False
_C.TEST.NO_TEST = False
_C.TEST.SPLIT = "test"  # "val" or "test"
_C.TEST.FINAL_MODEL = "last_step"  # "last_step" or "best_val"
# Project key: evaluation scope, "base", "new", "source" or "target"; "" = inferred from the run
# (train.py --eval-role; vlprompt/engine/eval_scope.py). Methods may choose their inference by it.
_C.TEST.ROLE = ""

###########################
# Trainer (specific nodes are added by the trainer modules)
###########################
_C.TRAINER = CN()
_C.TRAINER.NAME = ""
