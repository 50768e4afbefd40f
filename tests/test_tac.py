"""TAC (trainers/tac.py): the towers with cluster tokens and the patch mask, the description
embeddings and k-means, the loss, what is learned and saved, the uniform epoch average (exact
after a resume), evaluation on other classes with the trained centres, and the descriptions
files (upstream format, synthetic generation, errors); checked against hand computations with
open_clip's own blocks."""
import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from baseline_setup import build_seeded, learnable, make_cfg, tiny_runner, toy_world, trainer_node  # noqa: F401

from trainers.tac import TACCLIP, CPUDrawnDropout, cosine_kmeans
from vlprompt.config import ConfigError
from vlprompt.data.descriptions import DescriptionsError, descriptions_file, read_class_descriptions
from vlprompt.synthetic.descriptions import class_descriptions
from vlprompt.synthetic.downstream import SETS
from vlprompt_app.benchmarking.device_placement import DevicelessTensorCheck

CLASSNAMES = ["abyssinian", "american_bulldog", "bengal"]
PETS = ["abyssinian", "american bulldog", "bengal", "boxer", "persian"]
K, N_TEXT, N_VISION = 2, 2, 2
TOL = dict(rtol=1e-5, atol=1e-5)


def pets_descriptions(folder):
    """Upstream-format descriptions of the toy OxfordPets classes in ``folder``; returns the folder."""
    folder.mkdir(exist_ok=True)
    table = {name: [f"a photo of a {name}, a type of pet.", f"a {name} sitting on a sofa.", f"a cute {name}."]
             for name in PETS}
    (folder / "oxford_pets_prompt.json").write_text(json.dumps(table))
    return str(folder)


def build_model(tiny_runner, perturb=True, fit=True, **changes):  # noqa: F811
    """TAC on the tiny CLIP (K 2, 2+2 tokens, depths 2 / 3); with ``perturb`` every learnable
    tensor is 10x its initial scale, so that a misplaced token moves the outputs."""
    runner, tokenizer = tiny_runner
    torch.manual_seed(0)
    node = trainer_node("TAC", **{"N_CLUSTERS": K, "N_CTX_TEXT": N_TEXT, "N_CTX_VISION": N_VISION,
                                  "PROMPT_DEPTH_TEXT": 2, "PROMPT_DEPTH_VISION": 3, **changes})
    model = TACCLIP(runner, tokenizer, CLASSNAMES, node)
    if fit:
        descriptions = [["a photo of a abyssinian."], ["a american bulldog.", "the american bulldog."], ["a cute bengal."]]
        model.fit_descriptions(descriptions, torch.Generator().manual_seed(0))
    if perturb:
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.mul_(10.0)
    return model


def hand_text(model, shift=K + N_TEXT, deep_at=1):
    """t [C, E]: [SOS; G_t; T_1; sentence from its first word] + positional embedding, causal
    mask; at block 1 positions 1..K get G_t again and K+1..K+n_t get T_2; pooled at eot + shift."""
    text, tokenizer = model.clip.text, model.tokenizer
    ids = tokenizer([f"a photo of a {n.replace('_', ' ')}." for n in CLASSNAMES])
    g_t = model.text_map(model.centres)
    emb = text.embed(ids)
    length = ids.shape[1]
    x = torch.cat([emb[:, :1], g_t.expand(3, -1, -1), model.ctx.expand(3, -1, -1), emb[:, 1:length - K - N_TEXT]], 1)
    x = x + text.positional_embedding
    causal = torch.full((length, length), float("-inf")).triu_(1)
    for index, block in enumerate(text.blocks):
        if index == deep_at:
            deep = torch.cat([g_t, model.text_prompts[0]]).expand(3, -1, -1)
            x = torch.cat([x[:, :1], deep, x[:, 1 + K + N_TEXT:]], 1)
        x = block(x, attn_mask=causal)
    return text.project(x[torch.arange(3), text.eot_positions(ids) + shift])


def hand_image(model, images, masked=True):
    """f [B, E] (no dropout): [CLS; patches; G_v; V_1] before ln_pre, [G_v; V_l] replacing the
    last K + n_v tokens at blocks 1, 2, patch rows blocked from the G_v columns in every block."""
    visual = model.clip.visual
    g_v = model.vision_map(model.centres)
    x = visual.embed(images)
    patches = x.shape[1] - 1
    x = visual.ln_pre(torch.cat([x, torch.cat([g_v, model.vision_prompts[0]]).expand(len(x), -1, -1)], 1))
    mask = torch.zeros(x.shape[1], x.shape[1])
    if masked:
        mask[1:1 + patches, 1 + patches:1 + patches + K] = float("-inf")
    for index, block in enumerate(visual.blocks):
        if index >= 1:
            tokens = torch.cat([g_v, model.vision_prompts[index]]).expand(len(x), -1, -1)
            x = torch.cat([x[:, :-(K + N_VISION)], tokens], 1)
        x = block(x, attn_mask=mask)
    return visual.token_features(x[:, 0])


def test_learnables_initialisation_and_buffers(tiny_runner):  # noqa: F811
    model = build_model(tiny_runner, perturb=False, fit=False)
    runner, tokenizer = tiny_runner
    names = {name for name, p in model.named_parameters() if p.requires_grad}
    assert names == {"ctx", "text_map.weight", "text_map.bias", "vision_map.weight", "vision_map.bias",
                     "text_prompts.0", "vision_prompts.0", "vision_prompts.1", "vision_prompts.2"}
    assert model.text_map.weight.shape == (32, 32) and model.vision_map.weight.shape == (64, 32)
    assert [tuple(p.shape) for p in model.vision_prompts] == [(N_VISION, 64)] * 3
    # T_1 = token embeddings 1..n of the tokenised phrase (for n 5: the four words and end-of-text).
    model5 = build_model(tiny_runner, perturb=False, fit=False, N_CTX_TEXT=5)
    ids = tokenizer(["a photo of a"])
    torch.testing.assert_close(model5.ctx.detach(), runner.text.embed(ids)[0, 1:6])
    assert int(ids[0, 5]) == tokenizer.eot_token_id
    # The centres are a saved buffer (NaN until fitted); the class-dependent buffers are not saved.
    state = model.state_dict()
    assert "centres" in state and torch.isnan(state["centres"]).all() and not model.centres_fitted()
    assert not {"token_prefix", "token_suffix", "eot", "patch_mask"} & set(state)


def test_text_tower_equals_the_hand_computation(tiny_runner):  # noqa: F811
    model = build_model(tiny_runner)
    with torch.no_grad():
        ours = model.compute_text_features()
        torch.testing.assert_close(ours, hand_text(model), **TOL)
        assert (ours - hand_text(model, shift=0)).abs().max() > 1e-3  # pooled at the unshifted EOT
        assert (ours - hand_text(model, deep_at=-1)).abs().max() > 1e-3  # no re-insertion at block 1


def test_image_tower_equals_the_hand_computation_with_the_patch_mask(tiny_runner):  # noqa: F811
    model = build_model(tiny_runner).eval()
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ours = model.clip.encode_image(images, model.vision_plan())
        torch.testing.assert_close(ours, hand_image(model, images), **TOL)
        assert (ours - hand_image(model, images, masked=False)).abs().max() > 1e-3
        torch.testing.assert_close(model.image_features(images), F.normalize(ours, dim=-1), **TOL)


def test_dropout_acts_on_the_image_feature_in_training_only(tiny_runner):  # noqa: F811
    model = build_model(tiny_runner)
    images = torch.randn(64, 3, 32, 32)
    with torch.no_grad():
        model.train()
        zeros = (model.image_features(images) == 0).float().mean().item()
        model.eval()
        assert (model.image_features(images) == 0).sum() == 0
    assert 0.25 < zeros < 0.35


def test_the_training_step_draws_nothing_on_the_data_device(tiny_runner):  # noqa: F811
    """The training step draws its dropout masks on the CPU (the same masks for a seed on every
    device) and makes no tensor without the data's device."""
    model = build_model(tiny_runner).train()
    images = torch.randn(4, 3, 32, 32)
    views, labels = torch.cat([images, images.flip(-1)]), torch.arange(4).repeat(2) % K
    with DevicelessTensorCheck() as check:
        model.loss((views, images), labels)
    assert check.device_draws == [] and check.faults == []


def test_dropout_masks_come_from_the_cpu_generator_on_every_device():
    """The same seed gives the same masks on any device: the mask is drawn on the CPU (the meta
    device stands in for CUDA: its input still advances the CPU generator as a CPU input does), and
    on a CPU input the result is nn.Dropout's, bit for bit."""
    dropout = CPUDrawnDropout(0.3).train()
    x = torch.randn(4, 8)
    torch.manual_seed(5)
    expected = torch.nn.Dropout(0.3).train()(x)
    torch.manual_seed(5)
    assert torch.equal(dropout(x), expected)
    after_cpu = torch.random.get_rng_state()
    torch.manual_seed(5)
    assert dropout(x.to("meta")).device.type == "meta"
    assert torch.equal(torch.random.get_rng_state(), after_cpu)
    assert torch.equal(dropout.eval()(x), x)


def test_description_embeddings_and_centres(tiny_runner):  # noqa: F811
    runner, tokenizer = tiny_runner
    model = build_model(tiny_runner, perturb=False, fit=False)
    descriptions = [["a photo of a cat.", "a small cat."], ["a dog.", "a big dog.", "the dog."], ["a bird."]]
    assert model.fit_descriptions(descriptions, torch.Generator().manual_seed(0))
    with torch.no_grad():
        means = [runner.encode_text(tokenizer(s)).mean(0) for s in descriptions]
    expected = F.normalize(torch.stack(means), dim=-1)  # unnormalised features averaged, then normalised
    torch.testing.assert_close(model.description_targets, expected, **TOL)
    assert model.centres_fitted() and torch.allclose(model.centres.norm(dim=-1), torch.ones(K))
    centres = model.centres.clone()
    assert not model.fit_descriptions(descriptions, torch.Generator().manual_seed(5))  # fitted centres stay
    assert torch.equal(model.centres, centres)
    with pytest.raises(ConfigError, match="N_CLUSTERS is 2, but there are only 1 training classes"):
        build_model(tiny_runner, fit=False).fit_descriptions([["a cat."]], torch.Generator())


def test_cosine_kmeans_finds_separated_directions():
    generator = torch.Generator().manual_seed(0)
    directions = torch.eye(4)[:3] * torch.tensor([[1.0], [3.0], [0.5]])
    points = torch.cat([direction + 0.05 * torch.randn(10, 4, generator=generator) for direction in directions])
    centres = cosine_kmeans(points, 3, torch.Generator().manual_seed(1))
    expected = F.normalize(torch.stack([points[i * 10:(i + 1) * 10].mean(0) for i in range(3)]), dim=-1)
    order = (centres @ expected.t()).argmax(dim=1)
    assert sorted(order.tolist()) == [0, 1, 2]
    torch.testing.assert_close(centres, expected[order], **TOL)
    with pytest.raises(ValueError, match="at least 4 points for 4 clusters"):
        cosine_kmeans(points[:3], 4, generator)


def test_loss_is_ce_plus_the_weighted_l1_terms_over_the_views(tiny_runner):  # noqa: F811
    runner, _ = tiny_runner
    model = build_model(tiny_runner).eval()  # eval: no dropout, so the terms are deterministic
    originals = torch.randn(2, 3, 32, 32)
    views = torch.cat([originals.flip(-1), originals + 0.1])  # view-major: [view1 of 0, of 1, view2 of 0, of 1]
    labels = torch.tensor([0, 2, 0, 2])
    loss, logits, terms = model.loss((views, originals), labels)
    with torch.no_grad():
        text = F.normalize(hand_text(model), dim=-1)
        image = F.normalize(hand_image(model, views), dim=-1)
        reference = F.normalize(runner.encode_image_plain(originals), dim=-1)
        expected_logits = runner.logit_scale.exp() * image @ text.t()
        expected = (F.cross_entropy(expected_logits, labels) + 20 * (text - model.description_targets).abs().mean()
                    + 25 * (image - torch.cat([reference, reference])).abs().mean())
    torch.testing.assert_close(logits.detach(), expected_logits, **TOL)
    torch.testing.assert_close(loss.detach(), expected, **TOL)
    assert terms["image_l1"] > 1e-3 and terms["text_l1"] > 1e-3


@pytest.fixture(scope="module")
def tac_run(toy_world, tmp_path_factory):  # noqa: F811
    """A 3-epoch TAC run on the toy OxfordPets (3 base classes, K 2, 2 views), checkpoints every
    epoch; records the raw learnable tensors at each epoch end. (output, raw, trainer, descriptions)."""
    output = tmp_path_factory.mktemp("tac_run")
    folder = pets_descriptions(tmp_path_factory.mktemp("tac_descriptions") / "descriptions")
    cfg = make_cfg(toy_world, "TAC", output, node={"DESCRIPTIONS": folder}, TRAIN__CHECKPOINT_FREQ=1,
                   TEST__NO_TEST=True, DATALOADER__RETURN_IMG0=True, DATALOADER__K_TRANSFORMS=2)
    trainer = build_seeded(cfg)
    raw, steps = [], []
    add = trainer.weight_average.add
    trainer.weight_average.add = lambda epoch, tensors: (
        raw.append({k: v.detach().clone() for k, v in tensors.items()}), add(epoch, tensors))
    step = trainer.forward_backward
    trainer.forward_backward = lambda batch: (steps.append(batch), step(batch))[1]
    before = {name: t.detach().clone() for name, t in trainer.model.state_dict().items()}
    trainer.train()
    return output, raw, trainer, folder, before, steps


def saved(folder, epoch):
    return torch.load(folder / "VLPromptLearner" / f"model.pth.tar-{epoch}", weights_only=True)


def test_training_changes_only_the_learnables_and_saves_them_with_the_centres(tac_run):
    output, raw, trainer, _, before, steps = tac_run
    model = trainer.model
    after = model.state_dict()
    trainable = set(learnable(model))
    changed = {name for name in before if name != "centres" and not torch.equal(before[name], after[name])}
    assert changed == trainable
    # The centres were NaN at construction, fitted by k-means at the start, and never trained.
    assert torch.isnan(before["centres"]).all() and model.centres_fitted()
    assert torch.equal(saved(output, 1)["state_dict"]["centres"], after["centres"])
    assert set(saved(output, 3)["state_dict"]) == trainable | {"centres"}
    # Two views per image, view-major, and the un-augmented image.
    batch = steps[0]
    assert isinstance(batch["img"], list) and len(batch["img"]) == 2 and batch["img0"].shape == batch["img"][0].shape
    (views, originals), labels = trainer.parse_batch_train(batch)
    assert torch.equal(views[:4], batch["img"][0]) and torch.equal(labels, batch["label"].repeat(2))


def test_final_weights_are_the_uniform_average_of_the_epochs(tac_run):
    output, raw, trainer, _, _, _ = tac_run
    final = learnable(trainer.model)
    assert len(raw) == 3
    for key in final:
        torch.testing.assert_close(final[key], sum(epoch[key] for epoch in raw) / 3, rtol=1e-6, atol=1e-7)
        assert not torch.allclose(final[key], raw[-1][key])
    last = saved(output, 3)["state_dict"]
    assert all(torch.equal(last[key], final[key]) for key in final)
    assert saved(output, 2)["trainer_state"]["weight_average"]["epochs"] == [0, 1]


def test_a_resumed_run_ends_with_the_same_average_and_centres(tac_run, tmp_path, capsys):
    output, _, trainer, _, _, _ = tac_run
    folder = tmp_path / "VLPromptLearner"
    folder.mkdir()
    shutil.copy(output / "VLPromptLearner" / "model.pth.tar-1", folder)
    (folder / "checkpoint").write_text("model.pth.tar-1\n")
    resumed = build_seeded(trainer.cfg.clone())
    resumed.cfg.defrost()
    resumed.cfg.OUTPUT_DIR = resumed.output_dir = str(tmp_path)
    resumed.train()
    assert "cluster centres kept from the checkpoint" in capsys.readouterr().out
    uninterrupted, again = saved(output, 3)["state_dict"], saved(tmp_path, 3)["state_dict"]
    assert uninterrupted.keys() == again.keys()
    assert all(torch.equal(uninterrupted[key], again[key]) for key in uninterrupted)


def test_new_classes_are_scored_with_the_trained_centres_without_descriptions(tac_run, toy_world, tmp_path):  # noqa: F811
    output, _, trainer, _, _, _ = tac_run
    cfg = make_cfg(toy_world, "TAC", tmp_path, subsample="new", node={"DESCRIPTIONS": str(tmp_path / "none")},
                   DATALOADER__RETURN_IMG0=True, DATALOADER__K_TRANSFORMS=2, TEST__ROLE="new")
    evaluator = build_seeded(cfg)
    with pytest.raises(RuntimeError, match="evaluate a trained TAC model"):
        evaluator.test()
    evaluator.load_model(str(output), epoch=3)
    assert torch.equal(evaluator.model.centres, trainer.model.centres)
    assert evaluator.model.classnames == ["boxer", "persian"]
    assert 0 <= evaluator.test() <= 100


def test_upstream_checkpoint_names_are_read(tiny_runner):  # noqa: F811
    source = build_model(tiny_runner)
    target = build_model(tiny_runner, perturb=False, fit=False)
    state = source.state_dict()
    upstream = {"prompt_learner.ctx": state["ctx"], "prompt_learner.topk": state["centres"],
                "VPT_topk_t.weight": state["text_map.weight"], "VPT_topk_t.bias": state["text_map.bias"],
                "VPT_topk_v.weight": state["vision_map.weight"], "VPT_topk_v.bias": state["vision_map.bias"],
                "image_encoder.VPT": state["vision_prompts.0"],
                "image_encoder.transformer.resblocks.1.VPT_shallow": state["vision_prompts.1"],
                "image_encoder.transformer.resblocks.2.VPT_shallow": state["vision_prompts.2"],
                "text_encoder.transformer.resblocks.1.VPT_shallow": state["text_prompts.0"]}
    result = target.load_state_dict(upstream, strict=False)
    assert not result.unexpected_keys
    for key, value in target.state_dict().items():
        if key in state and not key.startswith("clip."):
            assert torch.equal(value, state[key]), key


def test_descriptions_file_errors(tmp_path):
    with pytest.raises(DescriptionsError, match=r"oxford_pets_prompt.json does not exist.*FushengHao/TAC"):
        read_class_descriptions(str(tmp_path), "OxfordPets", PETS)
    folder = pets_descriptions(tmp_path / "d")
    with pytest.raises(DescriptionsError, match=r"no descriptions for 1 of the 2 classes: \['sphynx'\]"):
        read_class_descriptions(folder, "OxfordPets", ["american_bulldog", "sphynx"])
    assert read_class_descriptions(folder, "OxfordPets", ["american_bulldog"])[0][1] == "a american bulldog sitting on a sofa."
    (tmp_path / "d" / "oxford_pets_prompt.json").write_text('{"boxer": []}')
    with pytest.raises(DescriptionsError, match="not non-empty lists of sentences: \\['boxer'\\]"):
        read_class_descriptions(folder, "OxfordPets", ["boxer"])
    (tmp_path / "d" / "oxford_pets_prompt.json").write_text("[1, 2")
    with pytest.raises(DescriptionsError, match="Cannot read the descriptions file"):
        read_class_descriptions(folder, "OxfordPets", ["boxer"])
    with pytest.raises(DescriptionsError, match="No descriptions file name is known for the dataset 'Mars'"):
        read_class_descriptions(folder, "Mars", ["boxer"])


def test_each_dataset_class_names_its_descriptions_file():
    """The stems are upstream TAC's file names (descriptions/<stem>_prompt.json), held by the dataset classes."""
    upstream = {
        "Caltech101": "caltech", "DescribableTextures": "dtd", "EuroSAT": "eurosat", "FGVCAircraft": "fgvc",
        "Food101": "food101", "ImageNet": "imagenet", "ImageNetA": "imagenet_a", "ImageNetR": "imagenet_r",
        "ImageNetSketch": "imagenet_sketch", "ImageNetV2": "imagenetv2", "OxfordFlowers": "oxford_flowers",
        "OxfordPets": "oxford_pets", "StanfordCars": "stanford_cars", "SUN397": "sun397", "UCF101": "ucf101",
    }
    for name, stem in {**upstream, **{name: spec.folder for name, spec in SETS.items()}}.items():
        assert descriptions_file("d", name) == f"d/{stem}_prompt.json", name
    for name in ("ObjectNet", "ImageFolder"):  # no descriptions are published for them
        with pytest.raises(DescriptionsError, match=rf"'{name}' \(known: .*FGVCAircraft.*\); set the "
                                                    "description_stem attribute of its dataset class"):
            descriptions_file("d", name)


def test_synthetic_descriptions_are_written_on_first_use(tmp_path):
    spec = SETS["SyntheticShapes"]
    names = [c.name for c in spec.classes]
    read = read_class_descriptions(str(tmp_path), "SyntheticShapes", names)
    written = json.loads((tmp_path / "synthetic_shapes_prompt.json").read_text())
    assert list(written) == names and read == [written[name] for name in names]
    red_star = written["red star"]
    assert red_star[0] == "a photo of a red star." and "a huge red star." in red_star
    assert "a red star with stripes." in red_star and "a star that is red." in red_star
    assert all("red star" in s or s == "a star that is red." for s in red_star)
    assert class_descriptions(spec) == written  # deterministic
    patterns = class_descriptions(SETS["SyntheticPatterns"])["striped star"]
    assert "an orange striped star." in patterns and "a star that is striped." in patterns


def test_config_errors(toy_world, tmp_path):  # noqa: F811
    with pytest.raises(ConfigError, match="set DATALOADER.RETURN_IMG0 True"):
        build_seeded(make_cfg(toy_world, "TAC", tmp_path))
    with pytest.raises(ConfigError, match="TRAINER.TAC.PROMPT_DEPTH_VISION"):
        build_seeded(make_cfg(toy_world, "TAC", tmp_path, node={"PROMPT_DEPTH_VISION": 0}, DATALOADER__RETURN_IMG0=True))
    cfg = make_cfg(toy_world, "TAC", tmp_path, node={"DESCRIPTIONS": str(tmp_path / "missing")}, DATALOADER__RETURN_IMG0=True)
    with pytest.raises(DescriptionsError, match="missing/oxford_pets_prompt.json does not exist"):
        build_seeded(cfg).train()
