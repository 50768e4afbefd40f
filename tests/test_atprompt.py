"""ATPrompt: soft attribute tokens and attribute words after [SOS] of the base method's prompt;
CE of the base method's logits (trainers/atprompt.py)."""
import pytest
import torch
import torch.nn.functional as F
import yaml
from baseline_setup import (  # noqa: F401
    ROOT, build_seeded, tiny_node, tiny_runner, toy_world, toy_world_cfg,
)
from trainer_checks import assert_config_errors, one_step_changes_only_the_learnable, saved_keys

from trainers.atprompt import ATPromptCLIP, AttributeTokens, load_attribute_words
from vlprompt.clip import Plan, ReplaceTokens, Tokenizer
from vlprompt.config import ConfigError
from vlprompt.methods.coupled_prompts import MaPLeCLIP
from vlprompt.methods.text_context import CoOpCLIP
from vlprompt.synthetic.world import ATTRIBUTES

CLASSNAMES = ["abyssinian", "american bulldog", "bengal"]
WORDS = ["color", "shape"]
TOL = dict(rtol=1e-5, atol=1e-5)
SHIPPED = f"{ROOT}/configs/resources/atprompt_attributes.yaml"


def build_model(tiny_runner, base="CoOp", words=WORDS, n_att=2, n_ctx=2):  # noqa: F811
    """ATPromptCLIP on the tiny CLIP with every learnable value drawn at 10x its init std."""
    runner, tokenizer = tiny_runner
    torch.manual_seed(0)
    if base == "CoOp":
        base_model = CoOpCLIP(runner, tokenizer, CLASSNAMES, tiny_node("CoOp", N_CTX=n_ctx, CTX_INIT=""))
    else:
        base_model = MaPLeCLIP(runner, tokenizer, CLASSNAMES, tiny_node("MaPLe", N_CTX=n_ctx, PROMPT_DEPTH=2))
    model = ATPromptCLIP(base_model, AttributeTokens(runner.text, tokenizer, words, n_att))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.normal_(std=0.2 if "attributes" in name else 0.3)
    return model


def official_layout_features(model, words, n_att):
    """Text features [C, E] written out as upstream builds them: the whole sentence
    "X..X w_1 X..X w_2 ... <base phrase> <name>." tokenized, its placeholder slots overwritten
    by A_1, A_2, ... and the context, the plain tower run on it (MaPLe's deep prompts at the
    context slots at the inputs of blocks 1..J-1), pooled at the sentence's end-of-text token."""
    runner, prompts = model.clip, model.base.prompt_learner
    attribute_phrase = " ".join(" ".join(["X"] * n_att) + " " + word for word in words)
    sentences = [f"{attribute_phrase} {prompts.phrase} {name}." for name in CLASSNAMES]
    ids = prompts.tokenizer(sentences)
    x = runner.text.embed(ids).clone()
    position = 1
    for soft in model.attributes.soft:
        x[:, position: position + n_att] = soft
        position += n_att + 1
    context_start = position
    x[:, context_start: context_start + prompts.n_ctx] = prompts.ctx
    deep = getattr(prompts, "compound_prompts_text", ())
    plan = Plan(layers={index: ReplaceTokens(p, at=context_start) for index, p in enumerate(deep, start=1)})
    return runner.text(embeddings=x, eot=ids.argmax(dim=-1), plan=plan).features


@pytest.mark.parametrize("base, words, n_att", [
    ("CoOp", WORDS, 2), ("CoOp", ["texture"], 3), ("CoOp", ["color", "habitat", "growth"], 1), ("MaPLe", WORDS, 2),
])
def test_text_features_follow_the_official_prompt_layout(tiny_runner, base, words, n_att):  # noqa: F811
    model = build_model(tiny_runner, base, words, n_att)
    with torch.no_grad():
        ours = model.compute_text_features()
        torch.testing.assert_close(ours, official_layout_features(model, words, n_att), **TOL)
        # The attribute block matters: the base method's own prompt gives other features.
        assert (model.base.compute_text_features() - ours).abs().max() > 1e-2


def test_the_attribute_words_are_frozen_word_embeddings(tiny_runner):  # noqa: F811
    model = build_model(tiny_runner)
    runner, tokenizer = tiny_runner
    block = model.attributes()
    assert block.shape == (2 * (2 + 1), 32) and len(model.attributes) == 6
    ids = tokenizer(WORDS)[:, 1]
    torch.testing.assert_close(block[[2, 5]], runner.text.token_embedding.weight[ids])
    torch.testing.assert_close(block[0:2], model.attributes.soft[0])
    torch.testing.assert_close(block[3:5], model.attributes.soft[1])


def test_logits_are_the_scaled_cosine_of_the_base_image_features(tiny_runner):  # noqa: F811
    model = build_model(tiny_runner, "MaPLe")
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        f = F.normalize(model.base.unnormalised_image_features(x), dim=-1)
        t = F.normalize(model.compute_text_features(), dim=-1)
        torch.testing.assert_close(model(x), model.clip.logit_scale.exp() * f @ t.t(), **TOL)


def test_initial_standard_deviations(tiny_runner):  # noqa: F811
    runner, tokenizer = tiny_runner
    torch.manual_seed(0)
    attributes = AttributeTokens(runner.text, tokenizer, WORDS, 400)  # 2 x 400 x 32 values
    context = CoOpCLIP(runner, tokenizer, CLASSNAMES, tiny_node("CoOp", N_CTX=20, CTX_INIT="")).prompt_learner.ctx
    for soft in attributes.soft:
        assert soft.mean().abs() < 1e-3 and abs(soft.std().item() - 0.01) < 5e-4
    assert abs(context.std().item() - 0.02) < 2.5e-3  # 20 x 32 values


def test_a_word_of_several_tokens_is_refused_by_the_module(tiny_runner):  # noqa: F811
    runner, tokenizer = tiny_runner
    with pytest.raises(ValueError, match="one BPE token"):
        AttributeTokens(runner.text, tokenizer, ["playfulness"], 2)


def pets_cfg(toy_world, tmp_path, *opts, words=("playful", "energy")):  # noqa: F811
    """The ViT-B/16 recipe on the toy OxfordPets; its attribute file holds ``words`` for OxfordPets."""
    attributes = tmp_path / "attributes.yaml"
    tmp_path.mkdir(parents=True, exist_ok=True)
    attributes.write_text(yaml.safe_dump({"OxfordPets": list(words)}))
    return toy_world_cfg(toy_world, "ATPrompt", "ATPrompt/vit_b16.yaml", tmp_path, "DATALOADER.TRAIN_X.BATCH_SIZE", "4",
                         "TRAINER.ATPROMPT.PREC", "fp32", "TRAINER.ATPROMPT.ATTRIBUTES_FILE", str(attributes),
                         "TRAINER.MAPLE.PROMPT_DEPTH", "2", "OPTIM.WARMUP_EPOCH", "0", *opts)


@pytest.mark.parametrize("base", ["CoOp", "MaPLe"])
def test_a_training_step_changes_only_the_prompts_and_saves_only_them(toy_world, tmp_path, base):  # noqa: F811
    trainer = build_seeded(pets_cfg(toy_world, tmp_path, "DATASET.SUBSAMPLE_CLASSES", "base",
                                    "TRAINER.ATPROMPT.BASE", base))
    model = trainer.model
    expected = {"attributes.soft.0", "attributes.soft.1"} | (
        {"base.prompt_learner.ctx"} if base == "CoOp" else
        {"base.prompt_learner.ctx", "base.prompt_learner.proj.weight", "base.prompt_learner.proj.bias",
         "base.prompt_learner.compound_prompts_text.0", "base.prompt_learner.compound_prompt_projections.0.weight",
         "base.prompt_learner.compound_prompt_projections.0.bias"})
    assert model.base.prompt_learner.ctx.shape == (2, 32) and model.attributes.soft[0].shape == (2, 32)
    learned, _, _ = one_step_changes_only_the_learnable(trainer)
    assert learned == expected
    assert saved_keys(trainer, tmp_path / "run", "ATPrompt") == expected


def test_new_classes_load_the_base_run_with_the_same_attributes(toy_world, tmp_path):  # noqa: F811
    trained = build_seeded(pets_cfg(toy_world, tmp_path / "base", "DATASET.SUBSAMPLE_CLASSES", "base"))
    with torch.no_grad():
        trained.model.attributes.soft[1].add_(1.0)
    trained.save_model(0, str(tmp_path / "run"))
    novel = build_seeded(pets_cfg(toy_world, tmp_path / "new", "DATASET.SUBSAMPLE_CLASSES", "new", "TEST.ROLE", "new"))
    novel.load_model(str(tmp_path / "run"), epoch=1)
    torch.testing.assert_close(novel.model.attributes.soft[1], trained.model.attributes.soft[1])
    assert novel.classnames != trained.classnames
    assert novel.model.class_text_features().shape[0] == len(novel.classnames)


def test_config_errors(toy_world, tmp_path):  # noqa: F811
    cases = [
        (("TRAINER.ATPROMPT.BASE", "CoCoOp"), r"TRAINER\.ATPROMPT\.BASE must be one of \['CoOp', 'MaPLe'\]"),
        (("TRAINER.ATPROMPT.N_ATT", "0"), r"TRAINER\.ATPROMPT\.N_ATT .* must be >= 1"),
        (("TRAINER.ATPROMPT.PREC", "fp8"), "TRAINER.ATPROMPT.PREC"),
        (("TRAINER.COOP.CLASS_TOKEN_POSITION", "front"), "CLASS_TOKEN_POSITION must be 'end'"),
        (("TRAINER.ATPROMPT.BASE", "MaPLe", "TRAINER.MAPLE.PROMPT_DEPTH", "0"), "PROMPT_DEPTH"),  # the base's checks
    ]
    assert_config_errors(lambda *opts: pets_cfg(toy_world, tmp_path, *opts), cases)


def test_attribute_file_errors_name_the_word_dataset_and_file(toy_world, tmp_path):  # noqa: F811
    with pytest.raises(ConfigError, match=r"'playfulness' of dataset 'OxfordPets' \(in .*attributes.yaml\) is 2 BPE"):
        build_seeded(pets_cfg(toy_world, tmp_path, words=("playfulness", "energy")))
    with pytest.raises(ConfigError, match=r"'playfulness' of dataset 'OxfordPets' \(in configs/resources/atprompt"):
        build_seeded(pets_cfg(toy_world, tmp_path, "TRAINER.ATPROMPT.ATTRIBUTES_FILE",
                              "configs/resources/atprompt_attributes.yaml"))
    with pytest.raises(ConfigError, match=r"has no entry 'Food101' \(DATASET.NAME\); it has OxfordPets"):
        load_attribute_words(str(tmp_path / "attributes.yaml"), "Food101")
    missing = str(tmp_path / "nowhere.yaml")
    with pytest.raises(ConfigError, match=r"ATTRIBUTES_FILE '.*nowhere.yaml' does not exist.*atprompt_attributes"):
        load_attribute_words(missing, "OxfordPets")
    bad = tmp_path / "bad.yaml"
    bad.write_text("OxfordPets: playful\n")
    with pytest.raises(ConfigError, match="must be a non-empty list of words, got 'playful'"):
        load_attribute_words(str(bad), "OxfordPets")


def test_the_shipped_attribute_file(tmp_path):
    table = yaml.safe_load(open(SHIPPED))
    assert table["ImageNet"] == ["color", "shape"] and table["DescribableTextures"] == ["pattern", "color", "design"]
    assert load_attribute_words("configs/resources/atprompt_attributes.yaml", "SyntheticPatterns") == ["texture", "shape"]
    for name in ("SyntheticShapes", "SyntheticShapesV2", "SyntheticShapesSketch", "SyntheticPatterns"):
        assert set(table[name]) <= set(ATTRIBUTES), name  # words of the synthetic world
    tokenizers = {"ViT-B/16": Tokenizer("ViT-B/16"), "tiny": Tokenizer(f"{ROOT}/configs/clip/tiny-synthetic-clip.json")}
    for tokenizer in tokenizers.values():
        several = {word for words in table.values() for word in words if tokenizer.num_tokens(word) != 1}
        assert several == {"playfulness"}  # upstream's two-token word (see the file's header)


@pytest.mark.parametrize("target_words", [("texture",), ("texture", "shape", "size")])
def test_a_target_takes_its_own_words_and_the_sources_first_attribute_tokens(toy_world, tmp_path, target_words,  # noqa: F811
                                                                             capsys):
    source = build_seeded(pets_cfg(toy_world, tmp_path / "source", "DATASET.SUBSAMPLE_CLASSES", "all"))
    with torch.no_grad():
        for soft in source.model.attributes.soft:
            soft.add_(1.0)
    source.save_model(0, str(tmp_path / "run"))
    target = build_seeded(pets_cfg(toy_world, tmp_path / "target", "DATASET.SUBSAMPLE_CLASSES", "all",
                                   "TEST.ROLE", "target", words=target_words))
    initial = [soft.detach().clone() for soft in target.model.attributes.soft]
    capsys.readouterr()
    target.load_model(str(tmp_path / "run"), epoch=1)
    report = capsys.readouterr().out
    assert target.model.attributes.words == list(target_words)
    shared = min(len(target_words), 2)
    for k in range(shared):
        torch.testing.assert_close(target.model.attributes.soft[k], source.model.attributes.soft[k])
    if len(target_words) > 2:  # the third keeps its init, reported as missing
        torch.testing.assert_close(target.model.attributes.soft[2], initial[2])
        assert "attributes.soft.2" in report
    else:  # the source's second is not used, reported as unexpected
        assert "attributes.soft.1" in report
    torch.testing.assert_close(target.model.base.prompt_learner.ctx, source.model.base.prompt_learner.ctx)
