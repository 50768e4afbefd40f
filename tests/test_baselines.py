"""What every baseline trainer (CoCoOp, KgCoOp, IVLP, MaPLe, PromptSRC, VPT) must do, on a
tiny random CLIP and a miniature OxfordPets: an optimisation step changes only the learned
tensors, evaluation is deterministic, checkpoints hold only the learned tensors and reload
for another class list, reference checkpoints load, bad config values fail in check_cfg
(before any data is read), and the shipped recipes give the spec's parameter counts on
the ViT-B/16 architecture (built on the meta device: shapes only, no weights)."""
import glob
import os

import open_clip
import pytest
import torch
from baseline_setup import BASELINES, build_seeded, frozen, learnable, make_cfg, toy_world  # noqa: F401
from fast_cases import representative

from trainers.kgcoop import KgCoOpCLIP
from trainers.promptsrc import PromptSRCCLIP
from trainers.vpt import VPTCLIP
from vlprompt.clip import CLIPRunner, Tokenizer
from vlprompt.config import ConfigError, extend_cfg, get_cfg_default, merge_from_file
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.methods.conditional_context import CoCoOpCLIP
from vlprompt.methods.coupled_prompts import MaPLeCLIP
from vlprompt.methods.independent_prompts import IVLPCLIP

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The trainer-building contracts run on these two in the fast loop (a conditional context and coupled
# deep prompts), on every baseline in the full suite.
BUILT = representative(BASELINES, {"CoCoOp", "MaPLe"})
CHECKPOINT_NAMES = {
    "CoCoOp": "prompt_learner", "KgCoOp": "prompt_learner", "IVLP": "VLPromptLearner",
    "MaPLe": "MultiModalPromptLearner", "PromptSRC": "VLPromptLearner", "VPT": "prompt_learner",
}


def first_batch(trainer):
    return next(iter(trainer.train_loader_x))


def one_step(trainer, batch):
    trainer.batch_idx, trainer.num_batches = 0, len(trainer.train_loader_x)
    trainer.set_model_mode("train")
    return trainer.forward_backward(batch)


@pytest.mark.parametrize("name", BUILT)
def test_one_step_changes_only_the_learned_tensors(toy_world, tmp_path, name):  # noqa: F811
    trainer = build_seeded(make_cfg(toy_world, name, tmp_path, OPTIM__WARMUP_EPOCH=0))
    model = trainer.model
    before_learned, before_frozen = learnable(model), frozen(model)
    buffers = {key: value.clone() for key, value in model.state_dict(keep_vars=False).items() if key not in before_learned}
    assert before_learned and all(not p.requires_grad for p in model.clip.parameters())
    summary = one_step(trainer, first_batch(trainer))
    assert torch.isfinite(torch.as_tensor(summary["loss"]))
    after_learned, after_frozen = learnable(model), frozen(model)
    assert after_frozen.keys() == before_frozen.keys()
    assert all(torch.equal(after_frozen[key], before_frozen[key]) for key in before_frozen)
    for key, value in model.state_dict().items():
        if key in buffers:
            assert torch.equal(value, buffers[key]), key
    for key in before_learned:
        param = dict(model.named_parameters())[key]
        assert param.grad is not None and param.grad.abs().sum() > 0, f"no gradient reaches {key}"
        assert not torch.equal(after_learned[key], before_learned[key]), key


@pytest.mark.parametrize("name", BUILT)
def test_evaluation_is_deterministic(toy_world, tmp_path, name):  # noqa: F811
    trainer = build_seeded(make_cfg(toy_world, name, tmp_path))
    images = next(iter(trainer.test_loader))["img"]
    trainer.set_model_mode("eval")
    with torch.no_grad():
        first = trainer.model_inference(images)
        second = trainer.model_inference(images)
        trainer.set_model_mode("train")
        trainer.set_model_mode("eval")  # drops the cached class features
        third = trainer.model_inference(images)
    assert first.shape == (images.shape[0], 3)
    assert torch.equal(first, second) and torch.equal(first, third)


@pytest.mark.parametrize("name", BUILT)
def test_checkpoint_holds_learned_tensors_and_reloads_for_new_classes(toy_world, tmp_path, name):  # noqa: F811
    trained = build_seeded(make_cfg(toy_world, name, tmp_path / "base", OPTIM__WARMUP_EPOCH=0))
    one_step(trained, first_batch(trained))
    trained.save_model(0, str(tmp_path / "base"))
    folder = tmp_path / "base" / CHECKPOINT_NAMES[name]
    state = torch.load(folder / "model.pth.tar-1", weights_only=True)["state_dict"]
    assert set(state) == set(learnable(registered(trained, name)))
    novel = build_seeded(make_cfg(toy_world, name, tmp_path / "new", subsample="new"))
    assert novel.num_classes == 2
    novel.load_model(str(tmp_path / "base"), epoch=1)
    loaded = learnable(registered(novel, name))
    assert all(torch.equal(loaded[key], state[key]) for key in state)
    images = next(iter(novel.test_loader))["img"]
    novel.set_model_mode("eval")
    with torch.no_grad():
        assert novel.model_inference(images).shape == (images.shape[0], 2)


def registered(trainer, name):
    """The module the trainer checkpoints (as the reference trainer does)."""
    return trainer._models[CHECKPOINT_NAMES[name]]


def _reference_state(name, model):
    """A state dict as the reference trainer of ``name`` saves it, from ``model``'s tensors
    plus entries our models must drop (class-dependent buffers of another class list,
    frozen CLIP weights)."""
    ours = {key: value.detach().clone() + 1.0 for key, value in learnable(model).items()}
    wrong_classes = {"token_prefix": torch.zeros(7, 1, 32), "token_suffix": torch.zeros(7, 25, 32)}
    if name in ("CoCoOp", "KgCoOp"):  # the prompt learner is registered
        return {**ours, **wrong_classes}, ours
    renamed = {}
    for key, value in ours.items():
        if key.startswith("vision_prompts."):
            index = int(key.split(".")[1])
            key = "image_encoder.VPT" if index == 0 else f"image_encoder.transformer.resblocks.{index}.VPT_shallow"
        elif key.startswith("text_prompts."):
            key = f"text_encoder.transformer.resblocks.{int(key.split('.')[1]) + 1}.VPT_shallow"
        renamed[key] = value
    frozen_entries = {"image_encoder.conv1.weight": torch.zeros(1), "text_encoder.ln_final.weight": torch.zeros(1),
                      "logit_scale": torch.zeros(())}
    if name != "VPT":
        frozen_entries.update({f"prompt_learner.{key}": value for key, value in wrong_classes.items()})
    return {**renamed, **frozen_entries}, ours


@pytest.mark.parametrize("name", BUILT)
def test_reference_checkpoints_load(toy_world, tmp_path, name, capsys):  # noqa: F811
    trainer = build_seeded(make_cfg(toy_world, name, tmp_path / "run"))
    reference, expected = _reference_state(name, registered(trainer, name))
    folder = tmp_path / "reference" / CHECKPOINT_NAMES[name]
    folder.mkdir(parents=True)
    torch.save({"state_dict": reference, "epoch": 5, "optimizer": None, "scheduler": None}, folder / "model.pth.tar-5")
    capsys.readouterr()
    trainer.load_model(str(tmp_path / "reference"), epoch=5)
    out = capsys.readouterr().out
    assert "Warning" not in out, out
    loaded = learnable(registered(trainer, name))
    assert all(torch.equal(loaded[key], expected[key]) for key in expected)


def _assert_config_error(toy_world, tmp_path, name, match, node=None, **keys):  # noqa: F811
    # A missing dataset folder proves the check runs before any data is read.
    cfg = make_cfg(toy_world, name, tmp_path, node=node, DATASET__ROOT=str(tmp_path / "no_data"), **keys)
    with pytest.raises(ConfigError, match=match):
        build_seeded(cfg)


@pytest.mark.parametrize("name", BASELINES)
def test_bad_precision_is_a_config_error(toy_world, tmp_path, name):  # noqa: F811
    _assert_config_error(toy_world, tmp_path, name, rf"TRAINER\.{name.upper()}\.PREC must be one of", node={"PREC": "fp8"})


@pytest.mark.parametrize(
    "name, node, match",
    [
        ("IVLP", {"PROMPT_DEPTH_TEXT": 3}, r"PROMPT_DEPTH_TEXT must be between 1 and 2, got 3\. The text tower .* has 2 layers"),
        ("IVLP", {"PROMPT_DEPTH_VISION": 4}, r"PROMPT_DEPTH_VISION must be between 0 and 3, got 4\. The image tower"),
        ("IVLP", {"PROMPT_DEPTH_TEXT": 0}, "use the VPT trainer"),
        ("IVLP", {"N_CTX_VISION": 0}, "N_CTX_VISION must be at least 1"),
        ("PromptSRC", {"CTX_INIT": "a photo"}, r'N_CTX_TEXT is 4, but TRAINER\.PROMPTSRC\.CTX_INIT "a photo" has only 2 tokens'),
        ("PromptSRC", {"GPA_MEAN": 500}, "give no weight to any of the epochs 1..3"),
        ("PromptSRC", {"TEXT_LOSS_WEIGHT": -1}, "TEXT_LOSS_WEIGHT must be at least 0"),
        ("MaPLe", {"PROMPT_DEPTH": 3}, r"PROMPT_DEPTH must be between 1 and 2, got 3"),
        ("MaPLe", {"PROMPT_DEPTH": 0}, r"PROMPT_DEPTH must be between 1 and 2, got 0"),
        ("MaPLe", {"N_CTX": 3, "CTX_INIT": "a_photo"}, 'N_CTX is 3, but TRAINER.MAPLE.CTX_INIT "a_photo" has only 2'),
        ("VPT", {"PROMPT_DEPTH_VISION": 0}, r"PROMPT_DEPTH_VISION must be between 1 and 3, got 0"),
        ("CoCoOp", {"TEXT_CHUNK_SIZE": 0}, "TEXT_CHUNK_SIZE must be at least 1"),
        ("KgCoOp", {"CLASS_TOKEN_POSITION": "left"}, "CLASS_TOKEN_POSITION must be one of"),
    ],
)
def test_bad_values_fail_in_check_cfg(toy_world, tmp_path, name, node, match):  # noqa: F811
    _assert_config_error(toy_world, tmp_path, name, match, node=node)


def test_vision_prompts_need_a_vit_backbone(toy_world, tmp_path):  # noqa: F811
    _assert_config_error(toy_world, tmp_path, "IVLP", "image tower of RN50 is not a ViT",
                         node={"PROMPT_DEPTH_TEXT": 1}, MODEL__BACKBONE__NAME="RN50")


# ------------------------------------------------------------------ recipes (ViT-B/16)

RECIPES = {
    # config file: (trainer, learnable parameters at ViT-B/16 sizes, {key: value} spot checks)
    "CoCoOp/vit_b16_c4_ep10_batch1_ctxv1.yaml": ("CoCoOp", 35_360, {"OPTIM.LR": 0.002, "DATALOADER.TRAIN_X.BATCH_SIZE": 1}),
    "CoCoOp/vit_b16_c4_ep10_batch1.yaml": ("CoCoOp", 2_048 + 33_312, {"TRAINER.COCOOP.CTX_INIT": ""}),
    "CoCoOp/vit_b16_c8_ep10_batch1.yaml": ("CoCoOp", 4_096 + 33_312, {"TRAINER.COCOOP.N_CTX": 8}),
    "CoCoOp/vit_b16_c16_ep10_batch1.yaml": ("CoCoOp", 8_192 + 33_312, {"OPTIM.MAX_EPOCH": 10}),
    "KgCoOp/vit_b16_ep100_ctxv1.yaml": ("KgCoOp", 2_048, {"TRAINER.KGCOOP.W": 8.0, "DATALOADER.TRAIN_X.BATCH_SIZE": 128}),
    "IVLP/vit_b16_c2_ep20_batch4_4+4ctx.yaml": ("IVLP", 46_080, {"OPTIM.LR": 0.0025, "OPTIM.MAX_EPOCH": 20}),
    "IVLP/vit_b16_c2_ep5_batch4_2+2ctx.yaml": ("IVLP", 30_720, {"OPTIM.LR": 0.0035, "TRAINER.IVLP.PROMPT_DEPTH_TEXT": 12}),
    "IVLP/vit_b16_c2_ep5_batch4_4ctx_language_only.yaml": ("IVLP", 24_576, {"TRAINER.IVLP.PROMPT_DEPTH_VISION": 0}),
    "MaPLe/vit_b16_c2_ep5_batch4_2ctx.yaml": ("MaPLe", 3_555_072, {"OPTIM.LR": 0.0035, "OPTIM.MAX_EPOCH": 5}),
    "MaPLe/vit_b16_c2_ep5_batch4_2ctx_cross_datasets.yaml": ("MaPLe", 1_185_024, {"OPTIM.LR": 0.0026, "OPTIM.MAX_EPOCH": 2}),
    "PromptSRC/vit_b16_c2_ep20_batch4_4+4ctx.yaml": ("PromptSRC", 46_080, {"TRAINER.PROMPTSRC.GPA_MEAN": 15, "TRAINER.PROMPTSRC.GPA_STD": 1}),
    "PromptSRC/vit_b16_c2_ep20_batch4_4+4ctx_cross_datasets.yaml": ("PromptSRC", 15_360, {"TRAINER.PROMPTSRC.GPA_MEAN": 6, "TRAINER.PROMPTSRC.GPA_STD": 10}),
    "PromptSRC/vit_b16_c2_ep50_batch4_4+4ctx_few_shot.yaml": ("PromptSRC", 46_080, {"OPTIM.MAX_EPOCH": 50, "TRAINER.PROMPTSRC.GPA_MEAN": 30}),
    "VPT/vit_b16_c2_ep5_batch4_4.yaml": ("VPT", 73_728, {"TRAINER.VPT.N_CTX_VISION": 8, "TRAINER.VPT.PROMPT_DEPTH_VISION": 12}),
}
MODELS = {"CoCoOp": CoCoOpCLIP, "IVLP": IVLPCLIP, "MaPLe": MaPLeCLIP, "PromptSRC": PromptSRCCLIP, "VPT": VPTCLIP}


@pytest.fixture(scope="module")
def vit_b16_meta():
    """ViT-B/16's towers on the meta device (shapes only) and its tokenizer."""
    with torch.device("meta"):
        model = open_clip.create_model("ViT-B-16", pretrained=None, force_quick_gelu=True, device="meta")
    model.requires_grad_(False)
    return CLIPRunner(model), Tokenizer("ViT-B/16")


def recipe_cfg(path, trainer):
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, os.path.join(ROOT, "configs", "trainers", path))
    cfg.TRAINER.NAME = trainer
    return cfg


def test_every_shipped_recipe_is_listed():
    shipped = {os.path.relpath(path, os.path.join(ROOT, "configs", "trainers"))
               for method in BASELINES
               for path in glob.glob(os.path.join(ROOT, "configs", "trainers", method, "vit_b16*.yaml"))}
    assert shipped == set(RECIPES)


@pytest.mark.parametrize("trainer", BASELINES)
def test_synthetic_configs_fit_the_tiny_synthetic_clip(trainer, monkeypatch):
    monkeypatch.chdir(ROOT)  # the synthetic configs name the tiny CLIP relative to the repository
    cfg = recipe_cfg(f"{trainer}/synthetic.yaml", trainer)
    assert cfg.MODEL.BACKBONE.NAME == "configs/clip/tiny-synthetic-clip.json" and cfg.INPUT.SIZE == (32, 32)
    trainer_class = TRAINER_REGISTRY.get(trainer)
    trainer_class.check_declared_cfg(cfg)
    trainer_class.__new__(trainer_class).check_cfg(cfg)


@pytest.mark.parametrize("path", sorted(RECIPES))
def test_recipes_pass_the_checks_and_have_the_spec_parameter_counts(vit_b16_meta, path):
    trainer, expected, spot = RECIPES[path]
    cfg = recipe_cfg(path, trainer)
    trainer_class = TRAINER_REGISTRY.get(trainer)
    trainer_class.check_declared_cfg(cfg)  # the checks alone, nothing built
    trainer_class.__new__(trainer_class).check_cfg(cfg)
    for key, value in spot.items():
        node = cfg
        for name in key.split("."):
            node = node[name]
        assert node == value, key
    assert cfg.MODEL.BACKBONE.NAME == "ViT-B/16" and cfg.DATALOADER.TEST.BATCH_SIZE == 100
    assert (cfg.OPTIM.LR_SCHEDULER, cfg.OPTIM.WARMUP_EPOCH, cfg.OPTIM.WARMUP_CONS_LR) == ("cosine", 1, 1e-5)
    runner, tokenizer = vit_b16_meta
    node = cfg.TRAINER[trainer.upper()]
    with torch.device("meta"):
        if trainer == "KgCoOp":
            model = KgCoOpCLIP(runner, tokenizer, ["dog", "cat"], node, "a photo of a {}.")
        else:
            model = MODELS[trainer](runner, tokenizer, ["dog", "cat"], node)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == expected
