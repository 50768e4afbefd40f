"""The full fine-tuning rivals FT, LP, LPFT, L2SP and WiSEFT (trainers/ft.py, lp.py, lpft.py, l2sp.py,
wiseft.py) on the tests' tiny CLIP and a miniature OxfordPets (4 classes x 4 training images).

The head against the zero-shot classifier, L2-SP's penalty and WiSE-FT's interpolation against hand
computations, and what each trainer trains, saves, loads and reports. FT's head, loss and WiSE-FT's
interpolation against the official code: tests/test_fidelity.py; FT under two
Gloo processes: tests/test_ddp_gloo.py.
"""
import json
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image
from baseline_setup import runner_and_tokenizer, toy_pets_cfg

import datasets  # noqa: F401  (registers OxfordPets)
from trainers.l2sp import l2sp_penalty
from trainers.wiseft import interpolate
from vlprompt.config import ConfigError
from vlprompt.data.transforms import build_transform
from vlprompt.engine import build_trainer
from vlprompt.engine.run_folder import RunFolder
from vlprompt.methods.template_head import TemplateCLIP
from vlprompt.methods.zero_shot_head import FineTunedCLIP
from vlprompt.testing import OXFORD_PETS_TOY_CLASSES, write_oxford_pets_tree
from vlprompt.utils import load_checkpoint

CLASSES = ["red star", "blue circle", "green square", "cat"]
TEMPLATES = ["a photo of a {}.", "a drawing of a {}."]
REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("fine_tuning_data"))
    write_oxford_pets_tree(root, classes=OXFORD_PETS_TOY_CLASSES[:4], train=4, val=1, test=2)
    return root


def cfg(trainer, config, data_root, output_dir, clip_files, *opts):
    """One epoch of batch 4 (4 steps), 2 warm-up iterations, on the toy pets."""
    node = trainer.upper()
    return toy_pets_cfg(trainer, f"{trainer}/{config}.yaml", data_root, output_dir, clip_files,
                        "OPTIM.MAX_EPOCH", "1", "DATALOADER.TRAIN_X.BATCH_SIZE", "4", "DATALOADER.TEST.BATCH_SIZE", "16",
                        f"TRAINER.{node}.WARMUP_ITERS", "2", "FEATURE_CACHE.DIR", str(output_dir / "cache"), *opts)


def trained_state(trainer):
    return {name: param.detach().clone() for name, param in trainer.model.named_parameters()}


def changed(before, after):
    return {name for name in before if not torch.equal(before[name], after[name])}


def test_head_starts_as_the_zero_shot_classifier(tiny_clip_files):
    clip, tokenizer = runner_and_tokenizer(tiny_clip_files)
    model = FineTunedCLIP(clip, tokenizer, CLASSES, TEMPLATES).eval()
    zero_shot = TemplateCLIP(clip, tokenizer, CLASSES, TEMPLATES).eval()
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model.head.weight, zero_shot.logit_scale * zero_shot.class_text_features())
        assert torch.equal(model.head.bias, torch.zeros(4))
        torch.testing.assert_close(model(images), zero_shot(images), rtol=0, atol=1e-4)


def test_l2sp_recipes_take_the_l2sp_authors_penalty_weights_and_cite_them():
    """ALPHA 0.1 / BETA 0.01: the authors' implementation (holyseven/TransferLearningClassification)
    trains L2-SP with --weight_decay_rate 0.1 --weight_decay_rate2 0.01 on tf.nn.l2_loss (sum / 2)."""
    for recipe in ("vit_b16", "synthetic"):
        path = REPOSITORY / "configs" / "trainers" / "L2SP" / f"{recipe}.yaml"
        text = path.read_text()
        node = yaml.safe_load(text)["TRAINER"]["L2SP"]
        assert (node["ALPHA"], node["BETA"]) == (0.1, 0.01), recipe
        header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
        assert "holyseven/TransferLearningClassification" in header, recipe
    header = (REPOSITORY / "configs" / "trainers" / "L2SP" / "vit_b16.yaml").read_text()
    assert "--weight_decay_rate 0.1 --weight_decay_rate2 0.01" in header


def test_l2sp_penalty_by_hand():
    encoder = [torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([[3.0]], requires_grad=True)]
    anchors = [torch.tensor([0.0, 1.0]), torch.tensor([[1.0]])]
    head = [torch.tensor([2.0, 0.0], requires_grad=True), torch.tensor([1.0], requires_grad=True)]
    penalty = l2sp_penalty(encoder, anchors, head, alpha=0.5, beta=0.1)
    # 0.5 / 2 * ((1 - 0)² + (2 - 1)² + (3 - 1)²) + 0.1 / 2 * (2² + 0² + 1²) = 0.25 * 6 + 0.05 * 5
    assert penalty.item() == pytest.approx(1.75)
    penalty.backward()
    assert encoder[1].grad.item() == pytest.approx(0.5 * 2.0)  # ALPHA (w - w0)
    assert head[0].grad.tolist() == pytest.approx([0.2, 0.0])  # BETA w


def test_wiseft_interpolation_by_hand():
    mixed = interpolate({"a": torch.tensor([0.0, 2.0]), "b": torch.tensor(8.0)},
                        {"a": torch.tensor([4.0, 6.0]), "b": torch.tensor(0.0)}, 0.25)
    assert mixed["a"].tolist() == [1.0, 3.0] and mixed["b"].item() == 6.0
    with pytest.raises(ValueError, match="differ in their names"):
        interpolate({"a": torch.zeros(1)}, {"b": torch.zeros(1)}, 0.5)


def test_ft_trains_encoder_and_head_and_clips_gradients(data_root, tiny_clip_files, tmp_path):
    trainer = build_trainer(cfg("FT", "synthetic", data_root, tmp_path / "ft", tiny_clip_files))
    before = trained_state(trainer)
    trainer.train()
    moved = changed(before, trained_state(trainer))
    assert any(name.startswith("head.") for name in moved) and any(name.startswith("clip.visual.") for name in moved)
    assert not any(name.startswith("clip.text.") for name in moved)
    saved = load_checkpoint(str(tmp_path / "ft" / "FT" / "model.pth.tar-1"))
    assert saved["trainer_state"]["classnames"] == trainer.classnames
    assert {"head.weight", "head.bias"} <= set(saved["state_dict"])
    for param in trainer.model.trainable_parameters():
        param.grad = torch.full_like(param, 10.0)
    trainer.clip_gradients()
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in trainer.model.trainable_parameters()]))
    assert norm.item() == pytest.approx(1.0, rel=1e-5)  # GRAD_CLIP 1.0


def test_lp_trains_the_head_on_cached_features(data_root, tiny_clip_files, tmp_path):
    trainer = build_trainer(cfg("LP", "synthetic", data_root, tmp_path / "lp", tiny_clip_files))
    assert trainer.feature_cache is not None
    before = trained_state(trainer)
    trainer.train()
    assert changed(before, trained_state(trainer)) == {"head.weight", "head.bias"}
    saved = load_checkpoint(str(tmp_path / "lp" / "LP" / "model.pth.tar-1"))["state_dict"]
    assert set(saved) == {"head.weight", "head.bias"}


def test_lp_trains_on_the_evaluation_view_as_upstream(data_root, tiny_clip_files, tmp_path):
    """Upstream's features use CLIP's preprocess: shorter side resized, then the center crop (not a
    resize of both sides to INPUT.SIZE)."""
    trainer = build_trainer(cfg("LP", "synthetic", data_root, tmp_path / "lp_view", tiny_clip_files))
    transform = trainer.train_loader_x.dataset.transform
    assert repr(transform) == repr(build_transform(trainer.cfg, is_train=False))
    image = Image.new("RGB", (64, 32), (0, 0, 0))
    image.paste((255, 255, 255), (0, 0, 16, 32))  # white left quarter, cropped away by the center crop
    view = transform(image)
    assert view.shape == (3, 32, 32)
    black = -torch.tensor(trainer.cfg.INPUT.PIXEL_MEAN) / torch.tensor(trainer.cfg.INPUT.PIXEL_STD)
    torch.testing.assert_close(view, black.view(3, 1, 1).expand(3, 32, 32), rtol=0, atol=1e-5)


def test_lpft_stage_two_fine_tunes_everything_from_the_probed_head(data_root, tiny_clip_files, tmp_path):
    stage1 = build_trainer(cfg("LPFT", "synthetic_stage1", data_root, tmp_path / "s1", tiny_clip_files))
    stage1.train()
    init = str(tmp_path / "s1" / "LPFT" / "model.pth.tar-1")
    probed = load_checkpoint(init)["state_dict"]
    assert set(probed) == {"head.weight", "head.bias"}
    stage2 = build_trainer(cfg("LPFT", "synthetic_stage2", data_root, tmp_path / "s2", tiny_clip_files,
                               "MODEL.INIT_WEIGHTS", init))
    assert stage2.feature_cache is None
    torch.testing.assert_close(stage2.model.head.weight, probed["head.weight"], rtol=0, atol=0)
    before = trained_state(stage2)
    stage2.train()
    moved = changed(before, trained_state(stage2))
    assert "head.weight" in moved and any(name.startswith("clip.visual.") for name in moved)
    with pytest.raises(ConfigError, match="STAGE must be 1"):
        build_trainer(cfg("LPFT", "synthetic_stage1", data_root, tmp_path / "bad", tiny_clip_files,
                          "TRAINER.LPFT.STAGE", "3"))


def test_l2sp_adds_its_penalty_instead_of_weight_decay(data_root, tiny_clip_files, tmp_path):
    trainer = build_trainer(cfg("L2SP", "synthetic", data_root, tmp_path / "l2sp", tiny_clip_files))
    head = trainer.model.head
    logits = torch.zeros(2, 4)
    labels = torch.tensor([0, 1])
    loss, terms = trainer.objective(logits, labels)
    by_hand = 0.01 / 2 * (head.weight.square().sum() + head.bias.square().sum())  # encoder still at w0
    assert terms["l2sp"].item() == pytest.approx(by_hand.item(), rel=1e-6)
    assert loss.item() == pytest.approx(torch.log(torch.tensor(4.0)).item() + by_hand.item(), rel=1e-6)
    with pytest.raises(ConfigError, match="replaces weight decay"):
        build_trainer(cfg("L2SP", "synthetic", data_root, tmp_path / "wd", tiny_clip_files,
                          "OPTIM.WEIGHT_DECAY", "0.1"))


def test_wiseft_sweeps_alpha_and_reports_one_half(data_root, tiny_clip_files, tmp_path):
    alphas = "[0.0, 0.5, 1.0]"
    run = tmp_path / "wiseft"
    trainer = build_trainer(cfg("WiSEFT", "synthetic", data_root, run, tiny_clip_files,
                                "TRAINER.WISEFT.ALPHAS", alphas, "OPTIM.LR", "0.01", "OPTIM.MAX_EPOCH", "2"))
    trainer.train()
    fine_tuned = trained_state(trainer)
    sweep = json.loads(RunFolder(run).wiseft_sweep_path.read_text())
    points = {point["alpha"]: point["accuracy"] for point in sweep["points"]}
    assert sweep["alpha"] == 0.5 and sorted(points) == [0.0, 0.5, 1.0]
    results = json.loads((run / "results.json").read_text())
    assert results["metrics"]["accuracy"] == pytest.approx(points[0.5])
    assert not changed(fine_tuned, trained_state(trainer))  # the model holds θ_ft after the sweep

    # α = 0 is the untrained (zero-shot) model, α = 1 the fine-tuned one: FT evaluating either
    zero_shot = build_trainer(cfg("FT", "synthetic", data_root, tmp_path / "zs", tiny_clip_files))
    assert zero_shot.test() == pytest.approx(points[0.0])
    evaluation = build_trainer(cfg("FT", "synthetic", data_root, tmp_path / "ft_eval", tiny_clip_files))
    parameters = dict(evaluation.model.named_parameters())
    with torch.no_grad():
        for name, value in fine_tuned.items():
            parameters[name].copy_(value)
    assert evaluation.test() == pytest.approx(points[1.0])


def test_wiseft_evaluates_an_ft_run_folder(data_root, tiny_clip_files, tmp_path):
    ft = build_trainer(cfg("FT", "synthetic", data_root, tmp_path / "ft", tiny_clip_files, "OPTIM.LR", "0.01"))
    ft.train()
    wiseft = build_trainer(cfg("WiSEFT", "synthetic", data_root, tmp_path / "mix", tiny_clip_files,
                               "TRAINER.WISEFT.ALPHAS", "[1.0]", "TRAINER.WISEFT.ALPHA", "1.0"))
    wiseft.load_model(str(tmp_path / "ft"), epoch=1)
    assert not changed(trained_state(ft), trained_state(wiseft))
    assert wiseft.test() == pytest.approx(ft.test())
