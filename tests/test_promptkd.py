"""PromptKD (trainers/promptkd.py): the student's prompted image tower and projector scored
against a PromptSRC teacher's text features, the distillation loss, transductive training on the
unlabelled images of all classes, the base/new evaluation, what is trained and saved, and the
errors about the teacher folder. The teacher is a PromptSRC run folder written here on the toy
world (5 OxfordPets classes, 3 base) with prompts 10x their init scale."""
import json
import os

import pytest
import torch
import torch.nn.functional as F
from baseline_setup import ROOT, build_seeded, frozen, learnable, make_cfg, toy_world, trainer_node  # noqa: F401

from trainers.promptkd import (
    KD_WEIGHTS, distillation_loss, kd_weight, read_teacher_run, resolve_teacher_dir, split_size,
)
from vlprompt.clip import CLIPRunner, Tokenizer, load_clip, vision_prompt_plan
from vlprompt.config import ConfigError, extend_cfg, get_cfg_default, merge_from_file
from vlprompt.engine.run_folder import RunFolder
from vlprompt.methods.independent_prompts import IVLPCLIP
from vlprompt.utils import load_checkpoint

ALL = ["abyssinian", "american bulldog", "bengal", "boxer", "persian"]
TOL = dict(rtol=1e-5, atol=1e-5)
NODE = trainer_node("PROMPTKD")


@pytest.fixture(scope="module")
def teacher_dir(toy_world, tmp_path_factory):  # noqa: F811
    """A finished PromptSRC base-class run folder: config.yaml, model.pth.tar-3, results.json."""
    folder = tmp_path_factory.mktemp("promptsrc_teacher")
    cfg = make_cfg(toy_world, "PromptSRC", folder, subsample="base")
    trainer = build_seeded(cfg)
    with torch.no_grad():
        for param in learnable(trainer.model):
            dict(trainer.model.named_parameters())[param].mul_(10.0)
    trainer.save_model(cfg.OPTIM.MAX_EPOCH - 1, str(folder))
    RunFolder(str(folder)).write_config(cfg)
    with open(folder / "results.json", "w", encoding="utf-8") as f:
        json.dump({"eval_only": False, "dataset": "OxfordPets", "num_classes": 3}, f)
    return str(folder)


def kd_cfg(toy_world, output_dir, teacher, subsample="base", **node):  # noqa: F811
    """PromptKD on the toy world: 3 vision layers with 2 prompt tokens, KD weight 1000."""
    settings = {"N_CTX_VISION": 2, "PROMPT_DEPTH_VISION": 3, "PREC": "fp32", "KD_WEIGHT": 1000.0,
                "TEACHER_DIR": teacher}
    cfg = make_cfg(toy_world, "PromptSRC", output_dir, subsample=subsample)
    cfg.defrost()
    cfg.TRAINER.NAME = "PromptKD"
    for name, value in {**settings, **node}.items():
        cfg.TRAINER.PROMPTKD[name] = value
    cfg.freeze()
    return cfg


def independent_teacher(teacher_dir, classnames):  # noqa: F811
    """The teacher rebuilt from its folder without trainers.promptkd: (text features [C, E], model)."""
    cfg = get_cfg_default()
    extend_cfg(cfg)
    cfg.merge_from_file(os.path.join(teacher_dir, "config.yaml"))
    backbone = cfg.MODEL.BACKBONE
    model = IVLPCLIP(CLIPRunner(load_clip(backbone.NAME, backbone.WEIGHTS)[0]), Tokenizer(backbone.NAME),
                     classnames, cfg.TRAINER.PROMPTSRC)
    state = load_checkpoint(os.path.join(teacher_dir, "VLPromptLearner", f"model.pth.tar-{cfg.OPTIM.MAX_EPOCH}"))
    model.load_state_dict(state["state_dict"], strict=False)
    with torch.no_grad():
        return F.normalize(model.compute_text_features(), dim=-1), model


def images(n=4, seed=0):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def perturbed(trainer):
    """Student prompts 10x their init scale, so that a misplaced prompt moves the logits."""
    with torch.no_grad():
        for param in trainer.model.vision_prompts:
            param.mul_(10.0)
    return trainer


def test_loss_on_one_batch_equals_an_independent_computation(toy_world, tmp_path, teacher_dir):  # noqa: F811
    trainer = perturbed(build_seeded(kd_cfg(toy_world, tmp_path, teacher_dir)))
    trainer.use_unlabelled_training_images()
    trainer.before_epoch()
    model, x = trainer.model, images()
    model.train()
    loss, logits, terms = model.loss(x, torch.zeros(4, dtype=torch.long))

    text, teacher = independent_teacher(teacher_dir, ALL)
    with torch.no_grad():
        teacher_logits = teacher.logit_scale * F.normalize(teacher.image_features(x), dim=-1) @ text.t()
        f = model.clip.encode_image(x, vision_prompt_plan(model.vision_prompts))
        linear1, bn, _, linear2 = model.projector
        h = f @ linear1.weight.t() + linear1.bias
        h = (h - h.mean(0)) / torch.sqrt(h.var(0, unbiased=False) + bn.eps) * bn.weight + bn.bias
        g = F.normalize(torch.relu(h) @ linear2.weight.t() + linear2.bias, dim=-1)
        student_logits = model.clip.logit_scale.exp() * g @ text.t()
        p_t = teacher_logits.softmax(1)
        kl = (p_t * (p_t.log() - student_logits.log_softmax(1))).sum() / student_logits.numel()
    assert logits.shape == (4, 5)
    torch.testing.assert_close(logits.detach(), student_logits, **TOL)
    torch.testing.assert_close(terms["kd"], kl, **TOL)
    torch.testing.assert_close(loss.detach(), 1000.0 * kl, **TOL)
    assert kl > 1e-4  # the student does not copy the teacher yet: the check can fail


def test_distillation_loss_scales_with_the_temperature():
    student, teacher = torch.randn(3, 6), torch.randn(3, 6)
    tau = 2.0
    p_t = (teacher / tau).softmax(1)
    expected = (p_t * (p_t.log() - (student / tau).log_softmax(1))).sum() * tau ** 2 / 18
    torch.testing.assert_close(distillation_loss(student, teacher, tau), expected)
    assert distillation_loss(teacher, teacher, 1.0).abs() < 1e-6


def test_transductive_training_reads_the_unlabelled_images_of_all_classes(toy_world, tmp_path, teacher_dir):  # noqa: F811
    trainer = build_seeded(kd_cfg(toy_world, tmp_path, teacher_dir))
    assert len(trainer.dm.dataset.train_x) == 3 * 4 and trainer.classnames == ALL[:3]
    trainer.use_unlabelled_training_images()
    assert len(trainer.train_loader_x.dataset) == 5 * 4 and trainer.train_classnames == ALL
    trainer.before_epoch()
    assert trainer.model(images()).shape == (4, 5)
    trainer.model.use_classes(trainer.classnames)
    assert trainer.model(images()).shape == (4, 3)


def test_without_transduction_the_run_trains_on_its_own_classes(toy_world, tmp_path, teacher_dir):  # noqa: F811
    trainer = build_seeded(kd_cfg(toy_world, tmp_path, teacher_dir, TRANSDUCTIVE=False, OPTIM__MAX_EPOCH=1))
    trainer.before_epoch()
    assert len(trainer.train_loader_x.dataset) == 3 * 4 and trainer.train_classnames == ALL[:3]


def test_base_and_new_evaluations_score_their_own_classes_teacher_features(toy_world, tmp_path, teacher_dir):  # noqa: F811
    base = perturbed(build_seeded(kd_cfg(toy_world, tmp_path / "b", teacher_dir)))
    base.model.eval()
    base.model.use_classes(ALL)
    with torch.no_grad():
        all_logits = base.model(images())
    new = build_seeded(kd_cfg(toy_world, tmp_path / "n", teacher_dir, subsample="new"))
    new.model.load_state_dict(base.model.state_dict())
    new.model.eval()
    assert new.classnames == ALL[3:] and base.classnames == ALL[:3]
    with torch.no_grad(), new.model.evaluation():
        new.model.use_classes(new.classnames)
        new_logits = new.model(images())
        base.model.use_classes(base.classnames)
        base_logits = base.model(images())
    torch.testing.assert_close(base_logits, all_logits[:, :3], **TOL)
    torch.testing.assert_close(new_logits, all_logits[:, 3:], **TOL)
    text, _ = independent_teacher(teacher_dir, ALL[3:])
    torch.testing.assert_close(new.model.teacher.text_features(ALL[3:]), text, **TOL)


def test_a_training_step_changes_only_the_student(toy_world, tmp_path, teacher_dir):  # noqa: F811
    trainer = build_seeded(kd_cfg(toy_world, tmp_path, teacher_dir, OPTIM__WARMUP_EPOCH=0))
    trainer.use_unlabelled_training_images()
    trainer.before_epoch()
    teacher = trainer.model.teacher
    names = set(learnable(trainer.model))
    assert names == {"vision_prompts.0", "vision_prompts.1", "vision_prompts.2", "projector.0.weight",
                     "projector.0.bias", "projector.1.weight", "projector.1.bias", "projector.3.weight",
                     "projector.3.bias"}
    assert not learnable(teacher)
    before, frozen_before, teacher_before = learnable(trainer.model), frozen(trainer.model), frozen(teacher)
    trainer.set_model_mode("train")
    trainer.batch_idx, trainer.num_batches = 0, 5
    trainer.forward_backward(next(iter(trainer.train_loader_x)))
    after = learnable(trainer.model)
    # the projector's first bias feeds a training-mode BatchNorm, which subtracts the batch mean:
    # its gradient is zero up to rounding, so whether it moves depends on the float kernels
    cancelled = {"projector.0.bias"}
    assert all(not torch.equal(before[name], after[name]) for name in names - cancelled)
    torch.testing.assert_close(after["projector.0.bias"], before["projector.0.bias"], rtol=0, atol=1e-6)
    assert all(torch.equal(value, frozen(trainer.model)[name]) for name, value in frozen_before.items())
    assert all(torch.equal(value, frozen(teacher)[name]) for name, value in teacher_before.items())


def test_the_checkpoint_holds_the_student_only(toy_world, tmp_path, teacher_dir):  # noqa: F811
    trainer = build_seeded(kd_cfg(toy_world, tmp_path, teacher_dir))
    trainer.save_model(0, str(tmp_path))
    keys = set(load_checkpoint(str(tmp_path / "VLPromptLearner" / "model.pth.tar-1"))["state_dict"])
    assert {key for key in keys if key.startswith(("vision_prompts", "projector"))} == {
        "vision_prompts.0", "vision_prompts.1", "vision_prompts.2", "projector.0.weight", "projector.0.bias",
        "projector.1.weight", "projector.1.bias", "projector.1.running_mean", "projector.1.running_var",
        "projector.1.num_batches_tracked", "projector.3.weight", "projector.3.bias"}
    assert not [key for key in keys if "teacher" in key or "prompt_learner" in key or "text_prompts" in key]


def test_kd_weight_per_dataset_by_name():
    assert kd_weight("auto", "FGVCAircraft") == 200.0 and kd_weight("auto", "DescribableTextures") == 200.0
    assert kd_weight("auto", "OxfordFlowers") == 200.0 and kd_weight("auto", "ImageNet") == 1000.0
    assert kd_weight(5.0, "FGVCAircraft") == 5.0
    assert len(KD_WEIGHTS) == 11
    with pytest.raises(ConfigError, match="TRAINER.PROMPTKD.KD_WEIGHT is 'auto'.*KD_WEIGHTS.*'SyntheticShapes'"):
        kd_weight("auto", "SyntheticShapes")
    with pytest.raises(ConfigError, match=r"TRAINER.PROMPTKD.KD_WEIGHT must be at least 0.0, got -1.0"):
        kd_weight(-1.0, "FGVCAircraft")


def test_teacher_dir_template():
    assert resolve_teacher_dir("out/{dataset}/seed{seed}", "OxfordPets", 2) == "out/oxford_pets/seed2"
    assert resolve_teacher_dir("out/fixed", "NoSuchDataset", 1) == "out/fixed"
    with pytest.raises(ConfigError, match=r"unknown placeholders \['shots'\]"):
        resolve_teacher_dir("out/{shots}", "OxfordPets", 1)
    with pytest.raises(ConfigError, match="TEACHER_DIR is empty"):
        resolve_teacher_dir("", "OxfordPets", 1)
    assert split_size(5, "base") == 3 and split_size(5, "new") == 2 and split_size(5, "all") == 5


def test_a_missing_teacher_names_the_folder_and_the_command(toy_world, tmp_path):  # noqa: F811
    missing = str(tmp_path / "no_teacher")
    with pytest.raises(ConfigError) as error:
        build_seeded(kd_cfg(toy_world, tmp_path, missing))
    message = str(error.value)
    assert missing in message and "does not exist" in message
    root = kd_cfg(toy_world, tmp_path, missing).DATASET.ROOT
    assert (f"python train.py --root {root} --trainer PromptSRC --dataset-config-file configs/datasets/oxford_pets.yaml "
            f"--config-file configs/trainers/PromptSRC/CONFIG.yaml --seed 1 --output-dir {missing} DATASET.NUM_SHOTS 16 "
            "DATASET.SUBSAMPLE_CLASSES base (CONFIG: the teacher's config under configs/trainers/PromptSRC") in message


@pytest.mark.parametrize("student_config, backbone", [
    ("vit_b16_c2_ep20_batch8_4+4ctx", "ViT-L/14"),  # the README's ViT-L/14 teacher
    ("synthetic", "configs/clip/tiny-synthetic-clip.json"),  # the synthetic benchmark's teacher
])
def test_the_suggested_teacher_command_writes_the_folder_the_student_reads(tmp_path, student_config, backbone):
    """The command in the message, run as printed, trains the PromptSRC run that the student's
    TEACHER_DIR names: that folder, its config, dataset, shots, seed and data root."""
    import shlex

    from vlprompt_app.commands.train import build_parser, setup_cfg

    student = get_cfg_default()
    extend_cfg(student)
    merge_from_file(student, os.path.join(ROOT, "configs", "trainers", "PromptKD", f"{student_config}.yaml"))
    dataset = "SyntheticShapes" if student_config == "synthetic" else "OxfordPets"
    folder = str(tmp_path / resolve_teacher_dir(student.TRAINER.PROMPTKD.TEACHER_DIR, dataset, 2))
    with pytest.raises(ConfigError, match="does not exist") as error:
        read_teacher_run(folder, dataset, (224, 224), 2, NODE, "/data/my datasets")
    command = str(error.value).split("Train the PromptSRC teacher first: ")[1]
    words = shlex.split(command)
    assert words[:2] == ["python", "train.py"]
    cfg, _ = setup_cfg(build_parser().parse_args(words[2:]))
    assert cfg.OUTPUT_DIR == folder and cfg.TRAINER.NAME == "PromptSRC" and cfg.SEED == 2
    assert cfg.DATASET.NAME == dataset and cfg.DATASET.ROOT == "/data/my datasets"
    assert cfg.DATASET.NUM_SHOTS == 16 and cfg.DATASET.SUBSAMPLE_CLASSES == "base"
    assert cfg.MODEL.BACKBONE.NAME == backbone


def test_teacher_folder_errors(teacher_dir, tmp_path):
    with pytest.raises(ConfigError, match="trained on OxfordPets.*this run uses Caltech101"):
        read_teacher_run(teacher_dir, "Caltech101", (32, 32), 1, NODE, "data")
    with pytest.raises(ConfigError, match=r"takes \(32, 32\) images"):
        read_teacher_run(teacher_dir, "OxfordPets", (224, 224), 1, NODE, "data")
    os.makedirs(tmp_path / "no_config")
    with pytest.raises(ConfigError, match="has neither config.yaml.*nor upstream"):
        read_teacher_run(str(tmp_path / "no_config"), "OxfordPets", (32, 32), 1, NODE, "data")
    unfinished = tmp_path / "unfinished"
    os.makedirs(unfinished)
    with open(os.path.join(teacher_dir, "config.yaml"), encoding="utf-8") as f:
        (unfinished / "config.yaml").write_text(f.read(), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"model.pth.tar-3.*is missing"):
        read_teacher_run(str(unfinished), "OxfordPets", (32, 32), 1, NODE, "data")
    run = read_teacher_run(teacher_dir, "OxfordPets", (32, 32), 1, NODE, "data")
    assert run.num_classes == 3 and run.subsample == "base"
    with pytest.raises(ConfigError, match="trained on 3 classes.*are 4"):
        run.check_class_count(4, "the base classes of OxfordPets here")


def test_a_teacher_of_another_trainer_is_refused(toy_world, tmp_path, teacher_dir):  # noqa: F811
    other = tmp_path / "ivlp"
    os.makedirs(other)
    cfg = make_cfg(toy_world, "IVLP", other)
    RunFolder(str(other)).write_config(cfg)
    with pytest.raises(ConfigError, match="is a IVLP run.*must be a PromptSRC run"):
        read_teacher_run(str(other), "OxfordPets", (32, 32), 1, NODE, "data")


def test_bad_config_values(toy_world, tmp_path, teacher_dir):  # noqa: F811
    with pytest.raises(ConfigError, match="TRAINER.PROMPTKD.TEMPERATURE"):
        build_seeded(kd_cfg(toy_world, tmp_path, teacher_dir, TEMPERATURE=0.0))
    with pytest.raises(ConfigError, match="TRAINER.PROMPTKD.UNLABELLED_SHOTS"):
        build_seeded(kd_cfg(toy_world, tmp_path, teacher_dir, UNLABELLED_SHOTS=-1))
    with pytest.raises(ConfigError, match="TRAINER.PROMPTKD.PROMPT_DEPTH_VISION"):
        build_seeded(kd_cfg(toy_world, tmp_path, teacher_dir, PROMPT_DEPTH_VISION=7))


def upstream_teacher(teacher_dir, folder, classes=3):
    """``teacher_dir``'s prompts saved as upstream's PromptSRC saves its teachers: the whole model under
    upstream's names in VLPromptLearner/model-best.pth.tar, with the base classes' token_prefix."""
    state = load_checkpoint(os.path.join(teacher_dir, "VLPromptLearner", "model.pth.tar-3"))["state_dict"]
    upstream = {"prompt_learner.ctx": state["prompt_learner.ctx"], "image_encoder.VPT": state["vision_prompts.0"],
                "image_encoder.transformer.resblocks.1.VPT_shallow": state["vision_prompts.1"],
                "image_encoder.transformer.resblocks.2.VPT_shallow": state["vision_prompts.2"],
                "text_encoder.transformer.resblocks.1.VPT_shallow": state["text_prompts.0"],
                "prompt_learner.token_prefix": torch.zeros(classes, 1, 32),
                "image_encoder.conv1.weight": torch.zeros(64, 3, 8, 8), "logit_scale": torch.tensor(4.6)}
    os.makedirs(os.path.join(folder, "VLPromptLearner"))
    torch.save({"state_dict": upstream, "epoch": 20}, os.path.join(folder, "VLPromptLearner", "model-best.pth.tar"))
    return folder


def test_a_teacher_in_upstreams_format_is_read(toy_world, tmp_path, teacher_dir):  # noqa: F811
    upstream_teacher(teacher_dir, str(tmp_path / "teacher_model" / "OxfordPets"))
    _, clip_config, clip_weights = toy_world
    cfg = kd_cfg(toy_world, tmp_path / "out", str(tmp_path / "teacher_model" / "{name}"),
                 TEACHER_BACKBONE=clip_config, TEACHER_WEIGHTS=clip_weights)
    trainer = build_seeded(cfg)
    run = trainer.teacher_run
    assert run.num_classes == 3 and run.subsample == "base"
    assert (run.cfg.TRAINER.PROMPTSRC.PROMPT_DEPTH_TEXT, run.cfg.TRAINER.PROMPTSRC.PROMPT_DEPTH_VISION) == (2, 3)
    text, teacher = independent_teacher(teacher_dir, ALL)
    torch.testing.assert_close(trainer.model.teacher.text_features(ALL), text, **TOL)
    with torch.no_grad():
        expected = teacher.logit_scale * F.normalize(teacher.image_features(images()), dim=-1) @ text.t()
    torch.testing.assert_close(trainer.model.teacher.logits(images(), text), expected, **TOL)


def test_an_upstream_teacher_of_another_class_count_is_refused(toy_world, tmp_path, teacher_dir):  # noqa: F811
    folder = upstream_teacher(teacher_dir, str(tmp_path / "teacher"), classes=4)
    _, clip_config, clip_weights = toy_world
    cfg = kd_cfg(toy_world, tmp_path / "out", folder, TEACHER_BACKBONE=clip_config, TEACHER_WEIGHTS=clip_weights)
    with pytest.raises(ConfigError, match="trained on 4 classes.*are 3"):
        build_seeded(cfg)
