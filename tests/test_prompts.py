"""TextContext: the CoOp-family prefix/context/suffix construction."""
import pytest
import torch

from vlprompt.clip import CLIPRunner, TextContext, Tokenizer, load_clip

CLASSNAMES = ["golden_retriever", "red star", "cat"]


@pytest.fixture(scope="module")
def runner_and_tokenizer(tiny_clip_files):
    config, weights = tiny_clip_files
    model, _ = load_clip(config, weights)
    return CLIPRunner(model), Tokenizer(config)


def test_word_initialised_context_reproduces_the_sentence(runner_and_tokenizer, capsys):
    """'a photo of a' context at step 0 == frozen CLIP on the sentence; its 4 words, not N_CTX, are the
    number of context vectors (upstream CoOp's rule), and a line says so."""
    runner, tokenizer = runner_and_tokenizer
    context = TextContext(runner.text, tokenizer, CLASSNAMES, n_ctx=16, ctx_init="a photo of a")
    assert context.n_ctx == 4 and context.ctx.shape == (4, 32)
    assert capsys.readouterr().out == ('N_CTX 16 is not used: CTX_INIT "a photo of a" gives 4 context vector(s), one '
                                       "per word (CoOp's rule)\n")
    TextContext(runner.text, tokenizer, CLASSNAMES, n_ctx=4, ctx_init="a photo of a")
    assert capsys.readouterr().out == ""  # N_CTX agrees with the phrase: nothing to say
    prompted = runner.text(embeddings=context(), eot=context.eot).features
    sentences = tokenizer([f"a photo of a {c.replace('_', ' ')}." for c in CLASSNAMES])
    assert torch.equal(context.eot, sentences.argmax(-1))
    torch.testing.assert_close(prompted, runner.encode_text(sentences), rtol=1e-5, atol=1e-5)


def test_ivlp_mode_keeps_the_phrase_and_learns_its_first_tokens(runner_and_tokenizer):
    runner, tokenizer = runner_and_tokenizer
    context = TextContext(runner.text, tokenizer, CLASSNAMES, n_ctx=2, ctx_init="a photo of a", init_mode="ivlp")
    assert context.n_ctx == 2 and context.phrase == "a photo of a"
    prompted = runner.text(embeddings=context(), eot=context.eot).features
    sentences = tokenizer([f"a photo of a {c.replace('_', ' ')}." for c in CLASSNAMES])
    torch.testing.assert_close(prompted, runner.encode_text(sentences), rtol=1e-5, atol=1e-5)


def test_random_context_uses_x_placeholders_and_positions_permute_tokens(runner_and_tokenizer):
    runner, tokenizer = runner_and_tokenizer
    torch.manual_seed(0)
    ends = TextContext(runner.text, tokenizer, CLASSNAMES, n_ctx=4)
    assert ends.phrase == "X X X X" and ends.ctx.shape == (4, 32)
    assert abs(float(ends.ctx.detach().std()) - 0.02) < 0.01
    for position in ("middle", "front"):
        other = TextContext(runner.text, tokenizer, CLASSNAMES, n_ctx=4, class_token_position=position)
        other.ctx.data.copy_(ends.ctx.data)
        a, b = ends(), other()
        assert a.shape == b.shape
        # Same tokens, other order: the sorted rows of each prompt agree.
        for c in range(len(CLASSNAMES)):
            n = 2 + 4 + int(ends.name_lens[c])
            torch.testing.assert_close(a[c, :n].sort(0).values, b[c, :n].sort(0).values)
        assert not torch.equal(a, b)
    front = TextContext(runner.text, tokenizer, CLASSNAMES, n_ctx=4, class_token_position="front")
    # front: the class-name tokens follow the start-of-text token directly.
    name_ids = tokenizer(["golden retriever"])[0, 1:3]
    torch.testing.assert_close(front()[0, 1:3], runner.text.embed(name_ids))


def test_class_specific_context_and_class_list_change(runner_and_tokenizer):
    runner, tokenizer = runner_and_tokenizer
    csc = TextContext(runner.text, tokenizer, CLASSNAMES, n_ctx=4, class_specific=True)
    assert csc.ctx.shape == (3, 4, 32)
    with pytest.raises(ValueError, match="cannot be used for 2 other classes"):
        csc.set_classnames(["a", "b"])
    shared = TextContext(runner.text, tokenizer, CLASSNAMES, n_ctx=4)
    shared.set_classnames(["dog", "cat"])
    assert shared().shape == (2, 32, 32) and shared.eot.shape == (2,)
    assert list(shared.state_dict()) == ["ctx"]  # class-dependent buffers are never saved


def test_bad_class_token_position_is_rejected(runner_and_tokenizer):
    runner, tokenizer = runner_and_tokenizer
    with pytest.raises(ValueError, match="CLASS_TOKEN_POSITION must be one of"):
        TextContext(runner.text, tokenizer, CLASSNAMES, n_ctx=4, class_token_position="left")
