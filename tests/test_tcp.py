"""TCP: class-aware tokens T_c = meta_net(ê_c) replace the context at one text block;
loss = CE + W_TEXT (1 - mean_c cos(t̂_c, ê_c)) (trainers/tcp.py)."""
import pytest
import torch
import torch.nn.functional as F
from baseline_setup import build_seeded, toy_world, toy_world_cfg  # noqa: F401
from trainer_checks import assert_config_errors, one_step_changes_only_the_learnable

from trainers.tcp import TCP_TEMPLATES, TCPCLIP
from vlprompt.clip import CLIPRunner, Tokenizer, load_clip
from vlprompt.config import extend_cfg, get_cfg_default

CLASSNAMES = ["abyssinian", "american_bulldog", "bengal"]
CONTEXT, KNOWLEDGE = "{}, a type of pet.", "a photo of a {}, a type of pet."
TOL = dict(rtol=1e-5, atol=1e-5)


def tcp_node(**changes):
    cfg = get_cfg_default()
    extend_cfg(cfg)
    node = cfg.TRAINER.TCP
    node.INJECT_LAYER = 1  # the tiny CLIP's text tower has 2 blocks
    for name, value in changes.items():
        node[name] = value
    return node


@pytest.fixture(scope="module")
def runner(toy_world):  # noqa: F811
    _, config, weights = toy_world
    model, _ = load_clip(config, weights)
    return CLIPRunner(model), Tokenizer(config)


def build_model(runner, classnames=CLASSNAMES, **changes):
    clip, tokenizer = runner
    torch.manual_seed(0)
    model = TCPCLIP(clip, tokenizer, classnames, tcp_node(**changes), CONTEXT, KNOWLEDGE)
    with torch.no_grad():  # perturbed well beyond init, so a misplaced token moves the features
        model.prompt_learner.ctx.normal_(std=0.5)
        for p in model.prompt_learner.meta_net.parameters():
            p.mul_(10.0)
    return model


def frozen_knowledge(runner, classnames):
    """ê [C, E] computed with the runner's plain encode_text."""
    clip, tokenizer = runner
    sentences = tokenizer([KNOWLEDGE.format(name.replace("_", " ")) for name in classnames])
    with torch.no_grad():
        return F.normalize(clip.encode_text(sentences), dim=-1)


def reference_tokens(model, inject_at, position=1):
    """Final hidden states [C, L', D] of the text tower computed block by block without a
    plan: CoOp's embeddings, blocks before ``inject_at``, T_c written at ``position``."""
    text, context = model.clip.text, model.prompt_learner
    ids = context.token_ids
    x = text.embed(ids).clone()
    x[:, 1 : 1 + context.n_ctx] = context.ctx
    x = x + text.positional_embedding
    x = text.run_blocks(x, 0, inject_at)
    tokens = context.meta_net(model.knowledge).reshape(len(ids), context.n_ctx, -1)
    x = torch.cat([x[:, :position], tokens, x[:, position + context.n_ctx :]], dim=1)
    x = text.run_blocks(x, inject_at, text.num_layers)
    return x


def test_sentences_follow_the_dataset_template(runner):
    model = build_model(runner)
    assert model.prompt_learner.sentence("american bulldog") == "X X X X american bulldog, a type of pet."
    torch.testing.assert_close(model.knowledge, frozen_knowledge(runner, CLASSNAMES), **TOL)
    assert "knowledge" not in model.state_dict()
    assert TCP_TEMPLATES["UCF101"] == ("person doing {}.", "a photo of a person doing {}.")


def test_meta_net_maps_each_class_knowledge_to_n_context_tokens(runner):
    model = build_model(runner)
    meta = model.prompt_learner.meta_net
    assert (meta.linear1.in_features, meta.linear1.out_features) == (32, 8)  # E -> E // 4
    assert (meta.linear2.in_features, meta.linear2.out_features) == (8, 4 * 32)  # -> n * D_t
    tokens = model.prompt_learner.class_tokens(model.knowledge)
    assert tokens.shape == (3, 4, 32)
    hidden = meta.linear1(model.knowledge)
    expected = meta.linear2(hidden * torch.sigmoid(1.702 * hidden)).reshape(3, 4, 32)
    torch.testing.assert_close(tokens, expected, **TOL)


def test_class_tokens_replace_exactly_the_context_slots_at_the_injection_block(runner):
    model = build_model(runner)
    context = model.prompt_learner
    with torch.no_grad():
        ours = model.clip.text(embeddings=context(), eot=context.eot, plan=model.text_plan(), all_tokens=True)
        expected = reference_tokens(model, inject_at=1)
        torch.testing.assert_close(ours.tokens, expected[:, : ours.tokens.shape[1]], **TOL)
        pooled = expected[torch.arange(3), context.eot]
        torch.testing.assert_close(model.compute_text_features(), model.clip.text.project(pooled), **TOL)
        # The reference can tell a misplaced injection (one slot later, or one block earlier).
        for wrong in (reference_tokens(model, inject_at=1, position=2), reference_tokens(model, inject_at=0)):
            assert (wrong[:, : ours.tokens.shape[1]] - ours.tokens).abs().max() > 1e-2


def test_loss_is_cross_entropy_plus_weighted_text_consistency(runner):
    model = build_model(runner, W_TEXT=8.0)
    images, labels = torch.randn(3, 3, 32, 32), torch.tensor([2, 0, 1])
    loss, logits, terms = model.loss(images, labels)
    with torch.no_grad():
        image = model.clip.encode_image(images)
        text = model.compute_text_features()
        image, text = image / image.norm(dim=-1, keepdim=True), text / text.norm(dim=-1, keepdim=True)
        expected_logits = model.clip.logit_scale.exp() * image @ text.t()
        target = frozen_knowledge(runner, CLASSNAMES)
        consistency = 1 - (text * target).sum(-1).mean()
    torch.testing.assert_close(logits, expected_logits, **TOL)
    torch.testing.assert_close(terms["ce"], F.cross_entropy(expected_logits, labels), **TOL)
    torch.testing.assert_close(terms["text"], consistency, **TOL)
    torch.testing.assert_close(loss, terms["ce"] + 8.0 * consistency, **TOL)
    assert consistency.item() > 1e-3  # the term is active


def test_novel_classes_get_their_own_class_tokens(runner):
    base = build_model(runner)
    novel = build_model(runner, classnames=["bengal", "birman"])
    novel.prompt_learner.load_state_dict(base.prompt_learner.state_dict())
    with torch.no_grad():
        target = frozen_knowledge(runner, ["bengal", "birman"])
        torch.testing.assert_close(novel.knowledge, target, **TOL)
        tokens = novel.prompt_learner.class_tokens(novel.knowledge)
        torch.testing.assert_close(tokens[0], base.prompt_learner.class_tokens(base.knowledge)[2], **TOL)
        assert (tokens[0] - tokens[1]).abs().max() > 1e-2
        # "bengal" scores the same in both class lists: each class uses only its own T_c.
        torch.testing.assert_close(novel.compute_text_features()[0], base.compute_text_features()[2], **TOL)


def pets_cfg(toy_world, tmp_path, *opts):  # noqa: F811
    return toy_world_cfg(toy_world, "TCP", "TCP/vit_b16_ep100_ctxv1.yaml", tmp_path,
                         "DATALOADER.TRAIN_X.BATCH_SIZE", "4", "TRAINER.TCP.PREC", "fp32",
                         "TRAINER.TCP.INJECT_LAYER", "1", *opts)


def test_a_training_step_changes_only_the_context_and_the_meta_net(toy_world, tmp_path):  # noqa: F811
    trainer = build_seeded(pets_cfg(toy_world, tmp_path, "DATASET.SUBSAMPLE_CLASSES", "base"))
    learned, _, _ = one_step_changes_only_the_learnable(trainer)
    assert sorted(learned) == [
        "prompt_learner.ctx", "prompt_learner.meta_net.linear1.bias", "prompt_learner.meta_net.linear1.weight",
        "prompt_learner.meta_net.linear2.bias", "prompt_learner.meta_net.linear2.weight",
    ]
    assert trainer.model.knowledge.shape == (3, 32)  # the toy world's 3 base classes (of 5)


def test_config_errors(toy_world, tmp_path):  # noqa: F811
    cases = [
        (("TRAINER.TCP.INJECT_LAYER", "2"), r"INJECT_LAYER.*0\.\.1.*2 blocks"),
        (("TRAINER.TCP.KNOWLEDGE_TEMPLATE", "a photo"), r"TRAINER\.TCP\.KNOWLEDGE_TEMPLATE must contain exactly one"),
        (("DATASET.NAME", "Mars"), r"TRAINER\.TCP\.CONTEXT_TEMPLATE is 'auto'.*TCP_TEMPLATES of trainers/tcp.py.*"
                                   r"'Mars'.*set TRAINER\.TCP\.CONTEXT_TEMPLATE explicitly. "
                                   r"It is the text after the context"),
        (("DATASET.NAME", "Mars", "TRAINER.TCP.CONTEXT_TEMPLATE", "{}."),
         r"TRAINER\.TCP\.KNOWLEDGE_TEMPLATE is 'auto'.*'Mars'.*It is the hand-written sentence"),
        (("TRAINER.TCP.CONTEXT_TEMPLATE", '""'), r"TRAINER\.TCP\.CONTEXT_TEMPLATE must be 'auto'.*got ''"),
        (("TRAINER.TCP.PREC", "fp8"),
         r"TRAINER\.TCP\.PREC must be one of \['fp32', 'fp16', 'amp', 'bf16'\], got 'fp8'"),
    ]
    assert_config_errors(lambda *opts: pets_cfg(toy_world, tmp_path, *opts), cases)
