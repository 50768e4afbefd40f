"""KgCoOp: CoOp plus the knowledge term W (1 - mean cos(W_c, W_clip,c))."""
import torch
import torch.nn.functional as F
from baseline_setup import build_seeded, make_cfg, tiny_node, tiny_runner, toy_world  # noqa: F401

from trainers.kgcoop import KNOWLEDGE_TEMPLATES, KgCoOpCLIP

CLASSNAMES = ["abyssinian", "american_bulldog", "bengal"]
TOL = dict(rtol=1e-5, atol=1e-5)


def test_target_is_the_frozen_hand_crafted_sentence(tiny_runner):  # noqa: F811
    runner, tokenizer = tiny_runner
    model = KgCoOpCLIP(runner, tokenizer, CLASSNAMES, tiny_node("KgCoOp"), "a photo of a {}, a type of pet.")
    sentences = tokenizer([f"a photo of a {name.replace('_', ' ')}, a type of pet." for name in CLASSNAMES])
    with torch.no_grad():
        expected = F.normalize(runner.encode_text(sentences), dim=-1)
    torch.testing.assert_close(model.clip_text_features, expected, **TOL)
    assert "clip_text_features" not in model.state_dict()


def test_loss_is_cross_entropy_plus_weighted_knowledge_term(tiny_runner):  # noqa: F811
    runner, tokenizer = tiny_runner
    model = KgCoOpCLIP(runner, tokenizer, CLASSNAMES, tiny_node("KgCoOp", W=8.0), "itap of a {}.")
    with torch.no_grad():
        model.prompt_learner.ctx.add_(torch.randn_like(model.prompt_learner.ctx))
    images, labels = torch.randn(3, 3, 32, 32), torch.tensor([2, 0, 1])
    loss, logits, _ = model.loss(images, labels)
    text = model.class_text_features()
    cosine = (text * model.clip_text_features).sum(-1) / (text.norm(dim=-1) * model.clip_text_features.norm(dim=-1))
    expected = F.cross_entropy(logits, labels) + 8.0 * (1 - cosine.mean())
    torch.testing.assert_close(loss, expected, **TOL)
    assert (1 - cosine.detach().mean()).item() > 1e-3  # the term is active


def test_trainer_uses_the_dataset_template_except_for_textures(toy_world, tmp_path):  # noqa: F811
    trainer = build_seeded(make_cfg(toy_world, "KgCoOp", tmp_path))
    assert trainer.knowledge_template() == "a photo of a {}, a type of pet."
    assert KNOWLEDGE_TEMPLATES == {"DescribableTextures": "a photo of a {}, a type of texture."}
