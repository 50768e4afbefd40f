"""DeAR end to end through train.py on a miniature OxfordPets tree with a tiny random CLIP,
using the real base-to-novel config with the tiny model's overrides: what the checkpoint,
the log and results.json hold, and that a reloaded evaluation reproduces the result."""
import json
import shlex
import os
import re
import sys
from collections import Counter

import pytest
import torch
from forked_runs import run_script

from vlprompt.clip.head_roles import parse_role_map
from vlprompt.testing import TINY_CLIP_CONFIG, write_oxford_pets_tree, write_tiny_clip

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(f for f in os.listdir(os.path.join(ROOT, "configs/trainers/DeAR")) if f.startswith("vit_b16"))
TINY_ROLES = {
    "num_layers": 3, "num_heads": 4, "attributes": ["color", "shape"],
    "roles": {2: ["A color", "G", "M", "O text"], 3: ["A shape", "A color", "G style", "M"]},
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("dear_cli")
    config, weights = write_tiny_clip(str(base), name="tiny-clip-dear")
    write_oxford_pets_tree(str(base / "data"), train=4, val=1, test=10)
    role_map = str(base / "roles.yaml")
    parse_role_map(TINY_ROLES).save(role_map)
    return base, config, weights, role_map


def run_train(setup, output_dir, *extra):
    """train.py with the base-to-novel config and the tiny model's overrides; ``extra``:
    flags (--x [value]) and KEY VALUE overrides, which go last."""
    base, config, weights, role_map = setup
    flags, opts, items = [], [], list(extra)
    while items:
        item = items.pop(0)
        if item == "--eval-only":
            flags.append(item)
        elif item.startswith("--"):
            flags += [item, items.pop(0)]
        else:
            opts += [item, items.pop(0)]
    command = [
        sys.executable, "train.py", "--root", str(base / "data"), "--trainer", "DeAR", "--seed", "1",
        "--dataset-config-file", "configs/datasets/oxford_pets.yaml",
        "--config-file", "configs/trainers/DeAR/vit_b16_base2new.yaml", "--output-dir", str(output_dir), *flags,
        "MODEL.BACKBONE.NAME", config, "MODEL.BACKBONE.WEIGHTS", weights, "INPUT.SIZE", "(32, 32)",
        "DATALOADER.NUM_WORKERS", "0", "DATALOADER.TRAIN_X.BATCH_SIZE", "4", "OPTIM.MAX_EPOCH", "2",
        "TRAINER.DEAR.ROLE_MAP", role_map, "TRAINER.DEAR.INJECT_LAYER", "2",
        "TRAINER.DEAR.ATTRIBUTES", "['color', 'shape']", "DATASET.NUM_SHOTS", "4", *opts,
    ]
    return run_script(command)


def succeeded(result):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture(scope="module")
def trained(setup):
    """2 epochs on the 3 base classes (12 images, 3 steps of 4 per epoch) at lr 0.05 (enough
    to move the tiny random CLIP's test accuracy away from the untrained model's)."""
    run_dir = setup[0] / "train_base"
    succeeded(run_train(setup, run_dir, "DATASET.SUBSAMPLE_CLASSES", "base", "OPTIM.LR", "0.05"))
    return run_dir


def printed_result(log):
    """{"total", "correct", "accuracy", "error", "macro_f1"} of the last evaluation printed in ``log``."""
    return {key: float(value) for key, value in re.findall(r"^\* (\w+): ([\d.]+)%?$", log, re.M)}


@pytest.mark.e2e
def test_checkpoint_holds_exactly_deears_learnable_tensors(setup, trained):
    vision, text = TINY_CLIP_CONFIG["vision_cfg"]["width"], TINY_CLIP_CONFIG["text_cfg"]["width"]
    embed = TINY_CLIP_CONFIG["embed_dim"]
    checkpoint = torch.load(trained / "prompt_learner" / "model.pth.tar-2", weights_only=True)
    shapes = {name: tuple(tensor.shape) for name, tensor in checkpoint["state_dict"].items()}
    # K = 2 attributes of 1 token, N_CTX_TEXT = 4 (the config), W_attr, K + 1 fusion logits.
    assert shapes == {"attr_tokens": (2, 1, vision), "text_tokens": (4, text), "attr_proj": (vision, embed),
                      "fusion_logits": (3,)}
    assert checkpoint["epoch"] == 2
    assert [len(group["params"]) for group in checkpoint["optimizer"]["param_groups"]] == [4]
    # Trained: W_attr left CLIP's projection it was copied from, L_fusion raised w_0 above 1/3.
    visual_proj = torch.load(setup[2], weights_only=True)["visual.proj"]
    assert not torch.equal(checkpoint["state_dict"]["attr_proj"], visual_proj)
    assert checkpoint["state_dict"]["fusion_logits"].softmax(0)[0] > 1 / 3


@pytest.mark.e2e
def test_log_has_the_loss_terms_and_they_add_up(trained):
    """Every logged step: loss = ce + 1.0 * reg + 0.7 * fusion (the config's lambdas; values
    printed to 4 decimals), and the first fusion term is 1 - 1/3 (a = 0: w_0 = 1/3)."""
    log = (trained / "log.txt").read_text()
    assert "Head roles (role) of image layers 2..3: 3 A, 1 O, 2 G, 2 M" in log
    steps = re.findall(r"^epoch \[(\d)/2\] batch \[(\d)/3\] .* loss ([\d.]+) \([\d.]+\) ce ([\d.]+) \([\d.]+\) "
                       r"reg ([\d.]+) \([\d.]+\) fusion ([\d.]+) \([\d.]+\) acc", log, re.M)
    assert [step[:2] for step in steps] == [(e, b) for e in "12" for b in "123"], log[-2000:]
    for *_, loss, ce, reg, fusion in steps:
        assert float(loss) == pytest.approx(float(ce) + 1.0 * float(reg) + 0.7 * float(fusion), abs=2e-4)
        assert float(reg) > 0
    assert steps[0][-1] == "0.6667"


@pytest.mark.e2e
def test_results_json_is_the_printed_result(trained):
    log, results = (trained / "log.txt").read_text(), json.loads((trained / "results.json").read_text())
    printed = printed_result(log)
    assert (results["trainer"], results["subsample_classes"], results["epoch"]) == ("DeAR", "base", 2)
    assert printed["total"] == results["num_test"] == 30
    for key, name in (("accuracy", "accuracy"), ("error", "error_rate"), ("macro_f1", "macro_f1")):
        assert printed[key] == round(results["metrics"][name], 1), key
    assert printed["accuracy"] == pytest.approx(100 * printed["correct"] / printed["total"], abs=0.05)


@pytest.mark.e2e
def test_eval_only_reload_reproduces_the_result(setup, trained):
    """--eval-only with the saved epoch gives the training run's metrics exactly; without the
    saved weights (the seeded initial tensors) the metrics differ, so the reload mattered."""
    base = setup[0]
    reloaded = base / "reload_base"
    succeeded(run_train(setup, reloaded, "--eval-only", "--model-dir", str(trained), "--load-epoch", "2",
                        "DATASET.SUBSAMPLE_CLASSES", "base"))
    log = (reloaded / "log.txt").read_text()
    assert "Loading weights to prompt_learner" in log and "missing" not in log
    results = json.loads((reloaded / "results.json").read_text())
    assert results["eval_only"] is True and results["load_epoch"] == 2
    assert results["metrics"] == json.loads((trained / "results.json").read_text())["metrics"]
    assert printed_result(log) == printed_result((trained / "log.txt").read_text())

    untrained = base / "untrained_base"
    succeeded(run_train(setup, untrained, "--eval-only", "DATASET.SUBSAMPLE_CLASSES", "base"))
    assert json.loads((untrained / "results.json").read_text())["metrics"] != results["metrics"]


@pytest.mark.e2e
def test_new_classes_with_decoupled_inference(setup, trained):
    new_dir = setup[0] / "test_new"
    succeeded(run_train(setup, new_dir, "--eval-only", "--model-dir", str(trained), "--load-epoch", "2",
                        "DATASET.SUBSAMPLE_CLASSES", "new", "TRAINER.DEAR.INFERENCE", "cls"))
    log = (new_dir / "log.txt").read_text()
    assert "Loading weights to prompt_learner" in log and "missing" not in log
    results = json.loads((new_dir / "results.json").read_text())
    assert (results["subsample_classes"], results["num_classes"], results["num_test"]) == ("new", 2, 20)
    assert printed_result(log)["accuracy"] == round(results["metrics"]["accuracy"], 1)


@pytest.mark.e2e
def test_bad_role_map_fails_before_loading_data(setup):
    base = setup[0]
    bad = base / "bad_roles.yaml"
    bad.write_text("num_layers: 3\nnum_heads: 4\nattributes: [color]\n"
                   "roles:\n  2: [A color, G, M, M]\n  3: [A hue, G, M, M]\n")
    result = run_train(setup, base / "bad", "TRAINER.DEAR.ROLE_MAP", str(bad))
    assert result.returncode == 2
    assert 'layer 3, head 0: unknown attribute "hue"' in result.stderr
    assert "Traceback" not in result.stderr and "Building transform" not in result.stdout


@pytest.mark.e2e
def test_auto_role_map_of_an_unregistered_backbone_lists_the_known_maps(setup):
    base, config = setup[0], setup[1]
    result = run_train(setup, base / "auto", "TRAINER.DEAR.ROLE_MAP", "auto")
    assert result.returncode == 2
    assert f'No head-role map is registered for backbone "{config}"' in result.stderr
    assert "ViT-B/16, openai -> configs/head_roles/vit_b16_openai.yaml" in result.stderr
    # the exact command that makes this backbone's map from this run's dataset, and what to set then
    command = next(line.strip() for line in result.stderr.splitlines() if line.strip().startswith("python tools/"))
    from vlprompt_app.commands.head_roles import build_parser

    args = build_parser().parse_args(shlex.split(command)[2:])
    assert (args.backbone, args.first_layer, args.root) == (str(config), 2, str(base / "data"))
    assert args.opts[:2] == ["DATASET.NAME", "OxfordPets"]
    assert f"rerun with TRAINER.DEAR.ROLE_MAP {args.output_dir}/head_roles.yaml." in result.stderr
    assert "Traceback" not in result.stderr and "Building transform" not in result.stdout


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_configs_merge_and_pass_check_cfg(name):
    from trainers.dear import check_dear_config
    from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file

    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, os.path.join(ROOT, "configs/trainers/DeAR", name))
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        check_dear_config(cfg.TRAINER.DEAR, cfg.MODEL.BACKBONE)
    finally:
        os.chdir(cwd)
    assert cfg.OPTIM.NAME == "adamw" and cfg.OPTIM.LR == 1e-3 and cfg.OPTIM.MAX_EPOCH == 10
    assert tuple(cfg.INPUT.RRCROP_SCALE) == (0.5, 1.0) and cfg.DATALOADER.TRAIN_X.BATCH_SIZE == 16
    assert cfg.TRAINER.DEAR.INFERENCE == "auto"  # fusion or f_cls by the evaluation scope


GROUND_TRUTH_CORE_COUNTS = {"shape": 14, "size": 11, "location": 7, "color": 7}  # 39 of 48 heads, none texture


@pytest.mark.parametrize("role_map, strategy, core_heads", [
    ("tiny_synthetic.yaml", "role",
     {(4, 7): "color", (5, 1): "location", (5, 15): "color", (6, 2): "shape", (6, 5): "size", (6, 6): "color"}),
    ("tiny_synthetic_discovered.yaml", "role",
     {(4, 7): "color", (5, 1): "location", (5, 4): "shape", (5, 14): "location", (5, 15): "color", (6, 2): "shape",
      (6, 4): "shape", (6, 6): "color", (6, 13): "shape"}),
    ("tiny_synthetic_discovered.yaml", "random_shuffle",
     {(4, 2): "shape", (4, 4): "shape", (4, 8): "color", (5, 4): "shape", (5, 10): "color", (5, 11): "location",
      (6, 0): "shape", (6, 7): "location", (6, 10): "color"}),
])
def test_synthetic_config_with_the_tiny_clips_role_maps(role_map, strategy, core_heads, monkeypatch):
    """The core heads DeAR/synthetic.yaml gets from each map (ground truth: its strict
    specialists among them, and the count per attribute)."""
    from trainers.dear import check_dear_config, deep_head_roles
    from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file

    monkeypatch.chdir(ROOT)  # the config names the tiny CLIP and the role maps relative to the repository
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, "configs/trainers/DeAR/synthetic.yaml")
    node = cfg.TRAINER.DEAR
    node.ROLE_MAP, node.MASK_STRATEGY = f"configs/head_roles/{role_map}", strategy
    node.SHUFFLE_SEED = 0  # random_shuffle: the permutation of seed 0
    check_dear_config(node)
    assert cfg.MODEL.BACKBONE.NAME == "configs/clip/tiny-synthetic-clip.json" and node.INJECT_LAYER == 4
    roles = deep_head_roles(node, 6, 16)
    cores = {(layer, head): role.core_attribute(node.ATTRIBUTES)
             for layer, heads in roles.items() for head, role in enumerate(heads)}
    found = {key: attribute for key, attribute in cores.items() if attribute}
    assert sorted(roles) == [4, 5, 6]
    if role_map == "tiny_synthetic.yaml":
        assert core_heads.items() <= found.items()
        assert Counter(found.values()) == GROUND_TRUTH_CORE_COUNTS
    else:
        assert found == core_heads


def synthetic_shuffle_node(monkeypatch, shuffle_seed=-1):
    """TRAINER.DEAR of DeAR/synthetic.yaml with the discovered map under random_shuffle."""
    from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file

    monkeypatch.chdir(ROOT)
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, "configs/trainers/DeAR/synthetic.yaml")
    node = cfg.TRAINER.DEAR
    node.ROLE_MAP, node.MASK_STRATEGY = "configs/head_roles/tiny_synthetic_discovered.yaml", "random_shuffle"
    node.SHUFFLE_SEED = shuffle_seed
    return node


def test_random_shuffle_draws_its_permutation_from_the_run_seed_by_default(monkeypatch):
    """The three seeds of the ablation get three permutations; an explicit SHUFFLE_SEED wins."""
    from trainers.dear import deep_head_roles, shuffle_seed

    node = synthetic_shuffle_node(monkeypatch)
    assert node.SHUFFLE_SEED == -1  # the default: follow SEED
    assert [shuffle_seed(node, seed) for seed in (1, 2, 3)] == [(1, "SEED"), (2, "SEED"), (3, "SEED")]
    roles = [deep_head_roles(node, 6, 16, permutation_seed=shuffle_seed(node, seed)[0]) for seed in (1, 2, 3)]
    assert roles[0] != roles[1] and roles[1] != roles[2] and roles[0] != roles[2]
    assert deep_head_roles(node, 6, 16, permutation_seed=shuffle_seed(node, 2)[0]) == roles[1]  # deterministic

    explicit = synthetic_shuffle_node(monkeypatch, shuffle_seed=7)
    assert shuffle_seed(explicit, 1) == shuffle_seed(explicit, 2) == (7, "TRAINER.DEAR.SHUFFLE_SEED")
    assert deep_head_roles(explicit, 6, 16) == deep_head_roles(node, 6, 16, permutation_seed=7)
    assert deep_head_roles(explicit, 6, 16) not in roles


def test_unseeded_random_shuffle_draws_a_permutation_seed_and_says_so(monkeypatch):
    from trainers.dear import shuffle_seed

    node = synthetic_shuffle_node(monkeypatch)
    seed, origin = shuffle_seed(node, -1)
    assert 0 <= seed < 2**31 and origin == "drawn at random: SEED and TRAINER.DEAR.SHUFFLE_SEED are < 0"


def test_shuffle_seed_below_minus_one_is_rejected(monkeypatch):
    from trainers.dear import check_dear_config
    from vlprompt.config import ConfigError

    with pytest.raises(ConfigError, match="TRAINER.DEAR.SHUFFLE_SEED must be at least -1, got -2"):
        check_dear_config(synthetic_shuffle_node(monkeypatch, shuffle_seed=-2))


@pytest.mark.parametrize("extra, expected", [
    (("--seed", "2"), "permutation seed 2 (SEED)"),
    (("--seed", "3", "TRAINER.DEAR.SHUFFLE_SEED", "7"), "permutation seed 7 (TRAINER.DEAR.SHUFFLE_SEED)"),
])
@pytest.mark.e2e
def test_train_logs_the_permutation_seed_of_random_shuffle(setup, tmp_path, extra, expected):
    result = run_train(setup, tmp_path / "run", "OPTIM.MAX_EPOCH", "1", "TRAINER.DEAR.MASK_STRATEGY", "random_shuffle",
                       *extra)
    succeeded(result)
    assert f"Random role shuffle: {expected}" in result.stdout
