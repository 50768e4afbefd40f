"""The prompted runner against open_clip, on a tiny random CLIP loaded from local files."""
import os
import warnings

import open_clip
import pytest
import torch

from vlprompt.clip import (
    CLIPLoadError, CLIPRunner, InsertTokens, MapTokens, Plan, PromptTooLongError, ReplaceTokens,
    SharedPrefix, Tokenizer, load_clip,
)
from vlprompt.clip.runner.blocks import OpenCLIPBlockOps, block_qkv as _block_qkv, run_block

OPS = OpenCLIPBlockOps()


def attention_block(block, x, *args, **kwargs):
    """One open_clip ResidualAttentionBlock through the runner's block computation."""
    return run_block(OPS, block, x, *args, **kwargs)


def block_qkv(block, x):
    return _block_qkv(OPS, block, x)

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def tiny(tiny_clip_files):
    config, weights = tiny_clip_files
    model, info = load_clip(config, weights)
    reference = open_clip.create_model(os.path.splitext(os.path.basename(config))[0], pretrained=weights).eval()
    return model, reference, Tokenizer(config)


def _inputs(tokenizer, seed=0):
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(3, 3, 32, 32, generator=generator)
    ids = tokenizer(["a photo of a dog.", "a red star", "itap of a very small striped hexagon."])
    return images, ids


def test_loader_returns_frozen_fp32_eval_model(tiny):
    model, _, _ = tiny
    assert not model.training
    assert all(not p.requires_grad and p.dtype == torch.float32 for p in model.parameters())


def test_empty_plan_equals_open_clip(tiny):
    model, reference, tokenizer = tiny
    runner = CLIPRunner(model)
    images, ids = _inputs(tokenizer)
    with torch.no_grad():
        torch.testing.assert_close(runner.encode_image(images), reference.encode_image(images), **TOL)
        torch.testing.assert_close(runner.encode_text(ids), reference.encode_text(ids), **TOL)


def test_attention_block_matches_open_clip_block(tiny):
    model, _, _ = tiny
    block = model.visual.transformer.resblocks[1]
    x = torch.randn(2, 17, 64)
    causal = torch.full((17, 17), float("-inf")).triu_(1)
    with torch.no_grad():
        torch.testing.assert_close(attention_block(block, x), block(x), **TOL)
        torch.testing.assert_close(attention_block(block, x, causal), block(x, attn_mask=causal), **TOL)


def test_per_head_mask_is_applied_per_head(tiny):
    """A [heads, L, L] mask equals running each head with its own [L, L] mask."""
    model, _, _ = tiny
    block = model.visual.transformer.resblocks[0]
    heads, length = block.attn.num_heads, 6
    mask = torch.zeros(heads, length, length)
    mask[0, :, 3:] = float("-inf")  # head 0: nobody sees tokens 3..5
    mask[2] = torch.full((length, length), float("-inf")).triu_(1)  # head 2: causal
    x = torch.randn(2, length, 64)
    with torch.no_grad():
        out = attention_block(block, x, mask)
        # Reference: manual multi-head attention with per-head masks.
        h = block.ln_1(x)
        q, k, v = torch.nn.functional.linear(h, block.attn.in_proj_weight, block.attn.in_proj_bias).chunk(3, -1)
        d = 64 // heads
        outs = []
        for i in range(heads):
            qi, ki, vi = (t[..., i * d:(i + 1) * d] for t in (q, k, v))
            scores = qi @ ki.transpose(1, 2) / d ** 0.5 + mask[i]
            outs.append(scores.softmax(-1) @ vi)
        attn = block.attn.out_proj(torch.cat(outs, -1))
        y = x + attn
        expected = y + block.mlp(block.ln_2(y))
    torch.testing.assert_close(out, expected, **TOL)


def test_inserted_tokens_nobody_attends_leave_original_outputs(tiny):
    """Vision: tokens appended at block 1 and blocked as keys for original queries."""
    model, _, tokenizer = tiny
    runner = CLIPRunner(model)
    images, _ = _inputs(tokenizer)
    n_orig, n_new = 17, 3
    mask = torch.zeros(n_orig + n_new, n_orig + n_new)
    mask[:n_orig, n_orig:] = float("-inf")
    extra = torch.randn(n_new, 64)
    plan = Plan(layers={1: InsertTokens(extra)}, masks={1: mask, 2: mask})
    with torch.no_grad():
        plain = runner.visual(images)
        prompted = runner.visual(images, plan)
    assert prompted.tokens.shape == (3, n_orig + n_new, 64)
    torch.testing.assert_close(prompted.tokens[:, :n_orig], plain.tokens, **TOL)
    torch.testing.assert_close(prompted.features, plain.features, **TOL)


def test_text_insertion_moves_eot_and_keeps_length(tiny):
    model, _, tokenizer = tiny
    runner = CLIPRunner(model)
    _, ids = _inputs(tokenizer)
    eot = ids.argmax(-1)
    plan = Plan(layers={1: InsertTokens(torch.randn(2, 32), at=1, keep_length=True)})
    out = runner.text(ids, plan, all_tokens=True)
    assert out.tokens.shape[1] == int(eot.max()) + 2 + 1  # positions 0..max(eot) are computed
    assert torch.equal(out.eot, eot + 2)
    # Causal: tokens after the insertion point are affected, the SOT token is not.
    plain = runner.text(ids, all_tokens=True)
    torch.testing.assert_close(out.tokens[:, 0], plain.tokens[:, 0], **TOL)
    assert not torch.allclose(out.features, plain.features)


def test_text_insertion_that_pushes_out_eot_is_an_error(tiny):
    model, _, tokenizer = tiny
    runner = CLIPRunner(model)
    ids = tokenizer(["word " * 28])
    with pytest.raises(ValueError, match="end-of-text"):
        runner.text(ids, Plan(layers={0: InsertTokens(torch.randn(4, 32), at=1, keep_length=True)}))


def test_text_prefix_cache_equals_recomputation_and_is_reused(tiny):
    model, _, tokenizer = tiny
    runner = CLIPRunner(model)
    _, ids = _inputs(tokenizer)
    first = runner.text.prefix(ids, 1)
    again = runner.text.prefix(ids.clone(), 1)
    assert again is first
    recomputed = runner.text._compute_prefix(ids, 1)
    torch.testing.assert_close(first, recomputed, rtol=0, atol=0)
    # A plan starting at block 1 uses the cache and still matches the full path.
    plan = Plan(layers={1: MapTokens(lambda x: x)})
    torch.testing.assert_close(runner.text(ids, plan).features, runner.text(ids).features, **TOL)


def test_frozen_prefix_runs_without_autograd_and_prompts_get_gradients(tiny):
    model, _, tokenizer = tiny
    runner = CLIPRunner(model)
    images, _ = _inputs(tokenizer)
    deep = torch.zeros(2, 64, requires_grad=True)
    hidden = runner.visual.run_prefix(images, 2)
    assert hidden.grad_fn is None
    out = runner.visual(images, Plan(layers={2: InsertTokens(deep)}))
    out.features.sum().backward()
    assert deep.grad is not None and deep.grad.abs().sum() > 0


def test_embed_edit_replace_equals_building_embeddings(tiny):
    """Replacing positions 1..2 of the token embeddings == passing edited embeddings."""
    model, _, tokenizer = tiny
    runner = CLIPRunner(model)
    _, ids = _inputs(tokenizer)
    ctx = torch.randn(2, 32)
    via_plan = runner.text(ids, Plan(embed=[ReplaceTokens(ctx, at=1)]))
    embeddings = runner.text.embed(ids).clone()
    embeddings[:, 1:3] = ctx
    via_embeddings = runner.text(embeddings=embeddings, eot=ids.argmax(-1))
    torch.testing.assert_close(via_plan.features, via_embeddings.features, **TOL)


def test_vision_embed_edit_appends_before_ln_pre(tiny):
    model, _, tokenizer = tiny
    runner = CLIPRunner(model)
    images, _ = _inputs(tokenizer)
    prompts = torch.randn(2, 64)
    out = runner.visual(images, Plan(embed=[InsertTokens(prompts)]))
    expected = torch.cat([runner.visual.embed(images), prompts.expand(3, -1, -1)], 1)
    expected = runner.visual.run_blocks(runner.visual.ln_pre(expected), 0, runner.visual.num_layers)
    torch.testing.assert_close(out.tokens, expected, **TOL)


@pytest.fixture
def traced(tmp_path, tiny):
    """(a TorchScript archive of the tiny CLIP, its model config with quick_gelu off, inputs)."""
    _, reference, tokenizer = tiny
    images, ids = _inputs(tokenizer)
    path = str(tmp_path / "traced.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.trace(reference, (images, ids), check_trace=False, strict=False).save(path)
    from vlprompt.testing import TINY_CLIP_CONFIG, write_tiny_clip
    config_path = write_tiny_clip(str(tmp_path), name="tiny-ts", config={**TINY_CLIP_CONFIG, "quick_gelu": False})[0]
    return path, config_path, images


def test_torchscript_file_loads_with_quick_gelu_when_trusted(traced, tiny):
    """A TorchScript archive the user trusts (trust_torchscript=True) loads through the same path."""
    path, config_path, images = traced
    loaded, info = load_clip(config_path, path, trust_torchscript=True)
    assert info["quick_gelu"] is True
    with torch.no_grad():
        torch.testing.assert_close(loaded.encode_image(images), tiny[1].encode_image(images), **TOL)


def test_an_unknown_torchscript_archive_is_refused_before_its_code_runs(traced, monkeypatch):
    """Only OpenAI's published archives (by SHA-256) or an explicit trust run torch.jit.load."""
    from vlprompt.clip import loading
    from vlprompt.export import file_sha256

    path, config_path, _ = traced
    jit_loads = []
    real_jit_load = torch.jit.load
    monkeypatch.setattr(torch.jit, "load", lambda *a, **k: jit_loads.append(a[0]) or real_jit_load(*a, **k))
    monkeypatch.delenv(loading.TRUST_TORCHSCRIPT_ENV, raising=False)
    sha256 = file_sha256(path)
    with pytest.raises(CLIPLoadError, match=rf'"{path}" is a TorchScript archive, and loading one runs the code it '
                                            rf"holds; its SHA-256 {sha256} is not one of OpenAI's published CLIP "
                                            r"archives \(RN50.pt, .*VLPROMPT_TRUST_TORCHSCRIPT=1"):
        load_clip(config_path, path)
    assert jit_loads == []

    monkeypatch.setenv(loading.TRUST_TORCHSCRIPT_ENV, "1")  # the explicit option of the command lines
    assert load_clip(config_path, path)[1]["quick_gelu"] is True
    monkeypatch.delenv(loading.TRUST_TORCHSCRIPT_ENV)
    # An archive whose hash is a published one loads without any option.
    monkeypatch.setitem(loading.OPENAI_ARCHIVE_SHA256, "tiny-ts.pt", sha256)
    assert load_clip(config_path, path)[1]["quick_gelu"] is True
    assert jit_loads == [path, path]


def test_the_published_archive_hashes_are_those_of_the_download_urls():
    """OPENAI_ARCHIVE_SHA256 holds the hash of every OpenAI URL open_clip knows, by file name."""
    from vlprompt.clip.loading import OPENAI_ARCHIVE_SHA256, OPENAI_MODELS

    published = {}
    for model, tag in open_clip.list_pretrained():
        url = open_clip.get_pretrained_cfg(model, tag).get("url", "")
        if "openaipublic" in url:
            published[url.rsplit("/", 1)[1]] = url.split("/")[-2]
    assert published == OPENAI_ARCHIVE_SHA256
    assert sorted(file for _, file in OPENAI_MODELS.values()) == sorted(OPENAI_ARCHIVE_SHA256)


def test_loader_errors_are_clear(tmp_path, tiny_clip_files):
    config, _ = tiny_clip_files
    with pytest.raises(CLIPLoadError, match="Unknown CLIP backbone 'ViT-Q/99'"):
        load_clip("ViT-Q/99")
    with pytest.raises(CLIPLoadError, match="does not exist"):
        load_clip(config, str(tmp_path / "missing.pt"))
    with pytest.raises(CLIPLoadError, match="No weights given"):
        load_clip(config, "")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CLIPLoadError, match="Cannot load CLIP weights"):
        load_clip(config, str(bad))


def test_offline_tag_error_says_how_to_pass_a_file(tmp_path, monkeypatch):
    """In offline mode, a pretrained tag with no downloaded copy (an empty home: no hub cache, no
    OpenAI cache) is refused at once, saying how to pass a file."""
    from huggingface_hub import constants

    from vlprompt.clip import loading

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(loading, "OPENAI_CACHE_DIR", str(tmp_path / ".cache" / "clip"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / ".cache" / "huggingface" / "hub"))
    with pytest.raises(CLIPLoadError) as error:
        load_clip("ViT-B/32")
    assert "HF_HUB_OFFLINE=1 is set (offline mode), and no downloaded copy is cached" in str(error.value)
    assert "MODEL.BACKBONE.WEIGHTS /path/to/ViT-B-32.pt" in str(error.value)


def test_tokenizer_rejects_too_long_sentences(tiny):
    _, _, tokenizer = tiny
    with pytest.raises(PromptTooLongError, match="at most 26 fit"):
        tokenizer(["word " * 27], reserve=4)
    assert tokenizer(["a photo of a dog."]).shape == (1, 32)


def test_a_model_config_file_is_registered_again_only_when_its_content_changes(tmp_path):
    """Loading by a config file does not grow open_clip's list of config paths (each addition
    re-reads every listed file); an edited file is registered again, and its tokenizer follows it."""
    import json

    from vlprompt.clip import resolve_model_name
    from vlprompt.testing import TINY_CLIP_CONFIG

    path = tmp_path / "tiny-clip-registered.json"
    path.write_text(json.dumps(TINY_CLIP_CONFIG))
    assert resolve_model_name(str(path)) == ("tiny-clip-registered", False)
    listed = len(open_clip.factory._MODEL_CONFIG_PATHS)
    first = Tokenizer(str(path))
    for _ in range(3):
        resolve_model_name(str(path))
    assert len(open_clip.factory._MODEL_CONFIG_PATHS) == listed
    assert Tokenizer(str(path))._tokenizer is first._tokenizer  # one tokenizer per config in a process
    path.write_text(json.dumps(dict(TINY_CLIP_CONFIG, text_cfg=dict(TINY_CLIP_CONFIG["text_cfg"], context_length=24))))
    resolve_model_name(str(path))
    assert open_clip.get_model_config("tiny-clip-registered")["text_cfg"]["context_length"] == 24
    assert Tokenizer(str(path)).context_length == 24 and first.context_length == 32


@pytest.mark.slow
def test_vit_b16_random_weights_equal_open_clip():
    """The runner reproduces open_clip on the real ViT-B/16 architecture (random weights)."""
    torch.manual_seed(0)
    model, info = load_clip("ViT-B/16", "random")
    assert info["quick_gelu"]
    reference = open_clip.create_model("ViT-B-16", pretrained=None, force_quick_gelu=True)
    reference.load_state_dict(model.state_dict())
    reference.eval()
    runner = CLIPRunner(model)
    images = torch.randn(1, 3, 224, 224)  # the batch dimension is checked on the tiny CLIP (2.5 s of CPU per image here)
    ids = Tokenizer("ViT-B/16")(["a photo of a cat.", "a centered satellite photo of Forest."])
    with torch.no_grad():
        torch.testing.assert_close(runner.encode_image(images), reference.encode_image(images), **TOL)
        torch.testing.assert_close(runner.encode_text(ids), reference.encode_text(ids), **TOL)


def test_known_projections_of_the_first_positions_equal_projecting_them(tiny):
    """attention_block with (q, k, v) of the first N positions given equals projecting all of
    them, for every row, some rows, and per-head masks; gradients reach the new positions."""
    model, _, _ = tiny
    block = model.visual.transformer.resblocks[1]
    base = torch.randn(2, 7, 64)
    added = torch.randn(2, 3, 64, requires_grad=True)
    x = torch.cat([base, added], 1)
    known = block_qkv(block, base)
    assert [t.shape for t in known] == [(2, 4, 7, 16)] * 3
    mask = torch.zeros(4, 10, 10)
    mask[0, :7, 7:] = float("-inf")
    mask[2, 7:, :7] = float("-inf")
    for attn_mask in (None, mask):
        torch.testing.assert_close(attention_block(block, x, attn_mask, known=known),
                                   attention_block(block, x, attn_mask), **TOL)
        for rows in ([0, 8], torch.tensor([[9, 0], [3, 7]])):
            torch.testing.assert_close(attention_block(block, x, attn_mask, rows=rows, known=known),
                                       attention_block(block, x, attn_mask, rows=rows), **TOL)
    attention_block(block, x, mask, known=known).sum().backward()
    assert added.grad is not None and added.grad.abs().sum() > 0


def test_shared_prefix_runs_equal_runs_from_hidden_states(tiny):
    """Two runs from one SharedPrefix (a plan appending tokens there, and the plain tower)
    equal the same runs from the hidden states; the shared part has no autograd."""
    model, _, tokenizer = tiny
    runner = CLIPRunner(model)
    images, _ = _inputs(tokenizer)
    extra = torch.randn(2, 64, requires_grad=True)
    mask = torch.zeros(4, 19, 19)
    mask[:2, :17, 17:] = float("-inf")
    plan = Plan(layers={1: InsertTokens(extra), 2: MapTokens(lambda x: 2 * x)}, masks={1: mask})
    prefix = runner.visual.shared_prefix(images, 1)
    assert isinstance(prefix, SharedPrefix) and prefix.start == 1
    assert prefix.hidden.grad_fn is None and all(t.grad_fn is None for t in prefix.qkv)
    hidden = runner.visual.run_prefix(images, 1)
    prompted = runner.visual(prefix=prefix, plan=plan, rows=[0, 17, 18])
    torch.testing.assert_close(prompted.tokens, runner.visual(hidden=hidden, start=1, plan=plan, rows=[0, 17, 18]).tokens,
                               **TOL)
    torch.testing.assert_close(runner.visual(prefix=prefix, rows=[0]).features, runner.visual(images).features, **TOL)
    prompted.features.sum().backward()
    assert extra.grad.abs().sum() > 0
    for edit in (MapTokens(lambda x: 2 * x), ReplaceTokens(extra, at=0), InsertTokens(extra, at=1)):
        with pytest.raises(ValueError, match="may only insert tokens after its 17 tokens"):
            runner.visual(prefix=prefix, plan=Plan(layers={1: edit}))
    with pytest.raises(ValueError, match="not both"):
        runner.visual(prefix=prefix, hidden=hidden)
    past_the_end = runner.visual.shared_prefix(images, runner.visual.num_layers)
    assert past_the_end.qkv is None
    torch.testing.assert_close(runner.visual(prefix=past_the_end).features, runner.visual(images).features, **TOL)


def test_rows_of_the_last_block_equal_the_full_computation(tiny):
    """Computing only some rows in the last block (keys/values from all) is exact for them."""
    model, _, tokenizer = tiny
    runner = CLIPRunner(model)
    images, _ = _inputs(tokenizer)
    extra = torch.randn(3, 64)
    mask = torch.zeros(4, 20, 20)
    mask[1, :17, 17:] = float("-inf")
    plan = Plan(layers={1: InsertTokens(extra)}, masks={2: mask})
    with torch.no_grad():
        full = runner.visual(images, plan)
        some = runner.visual(images, plan, rows=[0, 17, 19])
        pooled = runner.visual(images, rows=[0])
        block = model.visual.transformer.resblocks[0]
        x = torch.randn(2, 9, 64)
        torch.testing.assert_close(attention_block(block, x, rows=[4, 1]), attention_block(block, x)[:, [4, 1]], **TOL)
        per_sequence = torch.tensor([[8, 2], [3, 5]])  # rows of each sequence of the batch
        causal = torch.full((9, 9), float("-inf")).triu_(1)
        for block_mask in (causal, causal + torch.randn(4, 9, 9)):  # [L, L] and per-head [heads, L, L]
            every = attention_block(block, x, block_mask)
            expected = torch.stack([every[0, [8, 2]], every[1, [3, 5]]])
            torch.testing.assert_close(attention_block(block, x, block_mask, rows=per_sequence), expected, **TOL)
    assert some.tokens.shape == (3, 3, 64)
    torch.testing.assert_close(some.tokens, full.tokens[:, [0, 17, 19]], **TOL)
    torch.testing.assert_close(some.features, full.features, **TOL)
    torch.testing.assert_close(pooled.features, runner.visual(images).features, **TOL)
    with torch.no_grad():  # rows come back in the order asked, the class token among them or not
        torch.testing.assert_close(runner.visual(images, plan, rows=[19, 0]).tokens, full.tokens[:, [19, 0]], **TOL)


# ------------------------------------------------------------------ text-side truncation
# The text tower computes only positions 0..max(eot) of a batch. Reference: every block
# over all L positions with the causal mask (what open_clip does), edits made by hand.

def _full_length_text(tower, x, eot, edits=None, masks=None):
    """Features [N, E] of embeddings x [N, L, D] without truncation; ``edits``: {block: fn}."""
    edits, masks = edits or {}, masks or {}
    x = x + tower.positional_embedding[: x.shape[1]]
    for index, block in enumerate(tower.blocks):
        if index in edits:
            x = edits[index](x)
        length = x.shape[1]
        mask = torch.full((length, length), float("-inf")).triu_(1)
        if index in masks:
            mask = mask + masks[index]
        x = attention_block(block, x, mask)
    return tower.project(x[torch.arange(x.shape[0]), eot])


def test_truncated_text_equals_full_length_for_sentences_of_different_lengths(tiny):
    model, reference, tokenizer = tiny
    text = CLIPRunner(model).text
    _, ids = _inputs(tokenizer)
    eot = ids.argmax(-1)
    assert len(set(eot.tolist())) == 3 and int(eot.max()) + 1 < ids.shape[1]
    plan = Plan(layers={1: MapTokens(lambda x: x)})  # blocks 1.. run after the cached prefix
    with torch.no_grad():
        out = text(ids, plan)
        every = text(ids, plan, all_tokens=True)
        alone = torch.cat([text(ids[i : i + 1]).features for i in range(3)])
        full = _full_length_text(text, text.embed(ids), eot)
    assert every.tokens.shape == (3, int(eot.max()) + 1, 32)
    assert out.tokens.shape == (3, 1, 32)  # the last block computed the pooled tokens only
    torch.testing.assert_close(out.tokens[:, 0], every.tokens[torch.arange(3), eot], **TOL)
    torch.testing.assert_close(every.features, full, **TOL)
    torch.testing.assert_close(out.features, full, **TOL)
    torch.testing.assert_close(alone, full, **TOL)
    torch.testing.assert_close(out.features, reference.encode_text(ids), **TOL)


def test_truncated_text_equals_full_length_for_learned_context_and_deep_prompts(tiny):
    """CoOp-style embeddings (context at 1..2) plus IVLP/MaPLe deep prompts replacing 1..2 at block 1."""
    model, _, tokenizer = tiny
    text = CLIPRunner(model).text
    _, ids = _inputs(tokenizer)
    eot = ids.argmax(-1)
    context = torch.randn(2, 32, requires_grad=True)
    deep = torch.randn(2, 32)
    embeddings = torch.cat([text.embed(ids[:, :1]), context.expand(3, -1, -1), text.embed(ids[:, 3:])], 1)
    out = text(embeddings=embeddings, eot=eot, plan=Plan(layers={1: ReplaceTokens(deep, at=1)}))

    def replace(x):
        return torch.cat([x[:, :1], deep.expand(3, -1, -1), x[:, 3:]], 1)

    full = _full_length_text(text, embeddings, eot, edits={1: replace})
    torch.testing.assert_close(out.features, full, **TOL)
    (grad,) = torch.autograd.grad(out.features.square().sum(), context)
    (full_grad,) = torch.autograd.grad(full.square().sum(), context)
    torch.testing.assert_close(grad, full_grad, **TOL)


def test_truncated_text_equals_full_length_for_insertion_and_remixing(tiny):
    """DeAR-style: tokens inserted after the start token at block 1 (length kept), then
    re-mixed; the cached prefix of block 0 is truncated too."""
    model, _, tokenizer = tiny
    text = CLIPRunner(model).text
    _, ids = _inputs(tokenizer)
    raw = torch.randn(3, 32)

    def remix(x):
        return torch.cat([x[:, :1], 0.5 * x[:, 1:4] + 0.5 * raw, x[:, 4:]], 1)

    plan = Plan(layers={1: [InsertTokens(raw, at=1, keep_length=True), MapTokens(remix)]})
    with torch.no_grad():
        out = text(ids, plan)

        def insert(x):
            return remix(torch.cat([x[:, :1], raw.expand(3, -1, -1), x[:, 1:-3]], 1))

        full = _full_length_text(text, text.embed(ids), ids.argmax(-1) + 3, edits={1: insert})
    assert text.prefix(ids, 1).shape[1] == int(ids.argmax(-1).max()) + 1
    torch.testing.assert_close(out.features, full, **TOL)


def test_text_masks_and_positions_from_the_end_refer_to_the_full_sequence(tiny):
    """A [heads, L, L] mask for the full length is cut consistently; ReplaceTokens(at=-n)
    addresses the full sequence's padding, which cannot change any pooled feature."""
    model, _, tokenizer = tiny
    text = CLIPRunner(model).text
    _, ids = _inputs(tokenizer)
    eot = ids.argmax(-1)
    mask = torch.zeros(4, 32, 32)
    mask[1, :, 2] = float("-inf")  # head 1 never sees position 2
    mask[1, 2, 2] = 0.0
    padding = Plan(layers={1: ReplaceTokens(torch.randn(2, 32), at=-2)})
    with torch.no_grad():
        masked = text(ids, Plan(masks={0: mask, 1: mask}))
        full = _full_length_text(text, text.embed(ids), eot, masks={0: mask, 1: mask})
        torch.testing.assert_close(masked.features, full, **TOL)
        assert not torch.allclose(masked.features, text(ids).features)
        torch.testing.assert_close(text(ids, padding).features, text(ids).features, **TOL)


def test_encode_image_computes_the_class_token_only_in_the_last_block(tiny):
    """encode_image(_plain) skips the last block's other rows: equal to the full computation,
    also with prompts appended before ln_pre and replaced at the last block."""
    model, reference, tokenizer = tiny
    runner = CLIPRunner(model)
    images, _ = _inputs(tokenizer)
    plan = Plan(embed=[InsertTokens(torch.randn(2, 64))], layers={2: ReplaceTokens(torch.randn(2, 64), at=-2)})
    with torch.no_grad():
        torch.testing.assert_close(runner.encode_image(images, plan), runner.visual(images, plan).features, **TOL)
        torch.testing.assert_close(runner.encode_image_plain(images), reference.encode_image(images), **TOL)
