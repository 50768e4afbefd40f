"""Head-role discovery maths: exact decomposition, TEXTSPAN, Concept Entropy, quantile roles, corpora."""
import copy
import math
import os

import numpy as np
import pytest
import torch

from vlprompt.clip import CLIPRunner, Tokenizer, load_clip
from vlprompt.clip.head_roles import HeadRole
from vlprompt.interpret import (
    ConceptError, CorpusError, build_concept_space, clip_text_embeddings, concept_distribution, concept_entropy,
    decompose_image_features, dominant_concept, load_corpus, name_clusters, phrase_concepts,
    quantile_roles, textspan,
)
from vlprompt.interpret.corpus import GENERIC_CORPUS_PATH
from vlprompt.testing import TINY_CLIP_CONFIG, write_tiny_clip

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def tiny_runner(tiny_clip_files):
    model, _ = load_clip(*tiny_clip_files)
    return model, CLIPRunner(model)


# ----------------------------------------------------------------------------- decomposition

@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_decomposition_reconstructs_image_features(tiny_runner, num_layers):
    model, runner = tiny_runner
    images = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(num_layers))
    parts = decompose_image_features(runner.visual, images, num_layers)
    assert parts.heads.shape == (6, num_layers, 4, 32)
    assert parts.layers == tuple(range(3 - num_layers, 3))
    expected = model.encode_image(images)  # open_clip's own forward, not the runner's
    assert torch.allclose(parts.total(), expected, atol=1e-4)
    # the terms are not trivially one big residual: heads carry a real share of the feature
    assert parts.heads.sum(dim=(1, 2)).norm() > 0.05 * expected.norm()


def test_decomposition_is_exact_with_layer_scale(tmp_path):
    config = {**TINY_CLIP_CONFIG, "vision_cfg": {**TINY_CLIP_CONFIG["vision_cfg"], "ls_init_value": 0.5}}
    model, _ = load_clip(*write_tiny_clip(str(tmp_path), name="tiny-clip-ls", config=config))
    with torch.no_grad():  # make the layer scales differ per channel
        for block in model.visual.transformer.resblocks:
            block.ls_1.gamma.uniform_(0.2, 1.5)
            block.ls_2.gamma.uniform_(0.2, 1.5)
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    parts = decompose_image_features(CLIPRunner(model).visual, images, 3)
    assert torch.allclose(parts.total(), model.encode_image(images), atol=1e-4)


def test_each_head_term_belongs_to_its_head(tiny_runner):
    """Reconstruction cannot see a permutation of heads; ablation can. With the last
    block's MLP switched off, zeroing head 1's slice of the output projection removes
    exactly head 1's term (up to ln_post's per-image rescaling)."""
    model = copy.deepcopy(tiny_runner[0])
    block = model.visual.transformer.resblocks[2]
    with torch.no_grad():
        block.mlp.c_proj.weight.zero_()
        block.mlp.c_proj.bias.zero_()
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    parts = decompose_image_features(CLIPRunner(model).visual, images, 1)
    for head in range(4):
        ablated_model = copy.deepcopy(model)
        with torch.no_grad():
            ablated_model.visual.transformer.resblocks[2].attn.out_proj.weight[:, 16 * head : 16 * (head + 1)] = 0
        ablated = ablated_model.encode_image(images) - parts.constant
        for other in range(4):
            without = parts.total() - parts.heads[:, 0, other] - parts.constant
            cosine = torch.nn.functional.cosine_similarity(ablated, without, dim=-1)
            assert (cosine.min() > 1 - 1e-5) == (other == head)


def test_decomposition_rejects_bad_layer_count(tiny_runner):
    with pytest.raises(ValueError, match=r"num_layers must be in 1..3"):
        decompose_image_features(tiny_runner[1].visual, torch.zeros(1, 3, 32, 32), 4)


# ----------------------------------------------------------------------------- TEXTSPAN

def _unit(vector):
    return vector / vector.norm()


def test_textspan_picks_the_text_the_head_writes_along_first():
    gen = torch.Generator().manual_seed(0)
    texts = torch.nn.functional.normalize(torch.randn(50, 16, generator=gen), dim=-1)
    known = 17
    coefficients = torch.randn(200, 1, generator=gen) * 3.0
    noise = 0.05 * torch.randn(200, 16, generator=gen)
    contributions = 5.0 + coefficients * texts[known] + noise  # an offset is centred away
    result = textspan(contributions, texts, num_texts=5)
    assert result.indices[0] == known
    assert result.explained[0] > 0.95
    assert len(set(result.indices)) == 5
    assert sum(result.explained) <= 1 + 1e-9


def test_textspan_matches_explicit_projection_reference():
    """The rank-one bookkeeping equals recomputing everything with explicit projections."""
    gen = torch.Generator().manual_seed(1)
    contributions = torch.randn(80, 12, generator=gen) @ torch.randn(12, 12, generator=gen)
    texts = torch.randn(40, 12, generator=gen)
    result = textspan(contributions, texts, num_texts=8)

    data = contributions.double() - contributions.double().mean(0)
    pool = texts.double().clone()
    total = float(data.pow(2).sum())
    picked, explained = [], []
    for _ in range(8):
        variance = [
            -math.inf if i in picked else float((data @ _unit(pool[i])).pow(2).sum()) for i in range(len(pool))
        ]
        best = int(np.argmax(variance))
        direction = _unit(pool[best])
        picked.append(best)
        explained.append(variance[best] / total)
        data = data - (data @ direction)[:, None] * direction
        pool = pool - (pool @ direction)[:, None] * direction
    assert result.indices == picked
    assert np.allclose(result.explained, explained, rtol=1e-9, atol=1e-12)


def test_textspan_stops_when_no_usable_text_is_left():
    texts = torch.tensor([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    contributions = torch.randn(30, 3, generator=torch.Generator().manual_seed(2))
    result = textspan(contributions, texts, num_texts=5)
    # text 1 is parallel to text 0: once one is picked the other has no direction left
    assert len(result.indices) == 2
    assert set(result.indices) in ({0, 2}, {1, 2})


# ----------------------------------------------------------------------------- concepts and entropy

def test_concept_entropy_by_hand():
    distribution = concept_distribution([0, 0, 1, 2], 4)
    assert distribution.tolist() == [0.5, 0.25, 0.25, 0.0]
    assert concept_entropy(distribution) == pytest.approx(-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))
    assert concept_entropy(concept_distribution([3] * 20, 4)) == 0.0
    assert concept_entropy(concept_distribution(list(range(4)) * 5, 4)) == pytest.approx(math.log(4))
    weighted = concept_distribution([0, 0, 1, 2], 3, weights=[0.4, 0.2, 0.3, 0.1])
    assert weighted.tolist() == pytest.approx([0.6, 0.3, 0.1])


def test_dominant_concept_breaks_count_ties_by_similarity():
    assert dominant_concept([2, 2, 1], [0.1, 0.1, 0.9]) == 2
    assert dominant_concept([2, 1, 2, 1], [0.3, 0.5, 0.3, 0.5]) == 1
    assert dominant_concept([0, 1], [0.5, 0.5]) == 0


def test_weighted_dominant_concept_is_the_one_with_the_largest_variance_share():
    assert dominant_concept([2, 2, 1], [0.1, 0.1, 0.9], weights=[0.1, 0.1, 0.6]) == 1
    assert dominant_concept([2, 2, 1], [0.1, 0.1, 0.9], weights=[0.3, 0.3, 0.6]) == 2  # tie: the count


def test_concept_space_merges_clusters_by_name_and_assigns_nearest():
    phrases = ["red", "crimson", "blue", "paris", "tokyo", "odd"]
    embeddings = torch.tensor([
        [1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [0.8, -0.1, 0.0],  # two colour clusters
        [0.0, 1.0, 0.0], [0.0, 0.9, 0.1],  # location
        [0.0, 0.0, 1.0],  # noise
    ])
    cluster_ids = np.array([0, 0, 2, 1, 1, -1])
    space = build_concept_space(phrases, embeddings, cluster_ids, {0: "color", 1: "location", 2: "color"})
    assert space.names == ("color", "location")
    assert space.members == (("red", "crimson", "blue"), ("paris", "tokyo"))
    colour = torch.nn.functional.normalize(torch.nn.functional.normalize(embeddings[:3], dim=-1).mean(0), dim=0)
    assert torch.allclose(space.centroids[0], colour)
    nearest, similarity = phrase_concepts(space, torch.tensor([[0.2, 1.0, 0.0], [1.0, 0.1, 0.0]]))
    assert nearest == [1, 0]
    assert similarity[1] > 0.99
    with pytest.raises(ConceptError, match="No concept was found"):
        build_concept_space(phrases, embeddings, np.full(6, -1), {})


def test_name_clusters_by_labels_and_by_name_embeddings():
    embeddings = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9], [0.7, 0.7]])
    cluster_ids = np.array([0, 0, 1, 1, -1])
    by_label = name_clusters(cluster_ids, embeddings, phrase_labels=["color", "color", "text", "color", "x"])
    assert by_label == {0: "color", 1: "color"}  # cluster 1: tie text/color -> sorted first
    by_name = name_clusters(cluster_ids, embeddings, names=["shape", "number"],
                            name_embeddings=torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
    assert by_name == {0: "number", 1: "shape"}


# ----------------------------------------------------------------------------- roles

def test_quantile_roles_by_hand():
    entropies = [0.0, 1.2, 0.5, 0.0, 2.0, 1.9, 0.9, 1.0, 0.3, 2.0]
    tie_breaks = [0.2, 0.0, 0.0, 0.1, 1.5, 0.0, 0.0, 0.0, 0.0, 1.4]
    dominants = ["color", "style", "animal", "location", "style", "text", "shape", "object", "number", "emotion"]
    roles = quantile_roles(entropies, dominants, ["color", "shape", "texture", "object", "location"], 0.2, tie_breaks)
    # k = floor(0.2 * 10 + 0.5) = 2: lowest (0.0, tie 0.1) head 3 and (0.0, 0.2) head 0;
    # highest (2.0, 1.5) head 4 and (2.0, 1.4) head 9; all others mixed
    expected = ["A color", "M", "M", "A location", "G style", "M", "M", "M", "M", "G emotion"]
    assert [str(r) for r in roles] == expected
    # q = 0.3: k = 3 adds head 8 (O number: not a core attribute) and head 5 (G text)
    roles = quantile_roles(entropies, dominants, ["color", "shape", "texture", "object", "location"], 0.3, tie_breaks)
    assert [str(r) for r in roles] == ["A color", "M", "M", "A location", "G style", "G text", "M", "M", "O number", "G emotion"]
    assert roles[8] == HeadRole("O", "number")


def test_quantile_roles_ties_without_scores_follow_head_order_and_half_caps_the_tails():
    roles = quantile_roles([1.0] * 5, ["color"] * 5, ["color"], 0.5)
    assert [r.kind for r in roles] == ["A", "A", "M", "G", "G"]  # k = min(3, 5 // 2) = 2
    with pytest.raises(ValueError, match=r"quantile must be in \(0, 0.5\]"):
        quantile_roles([1.0], ["color"], ["color"], 0.6)


# ----------------------------------------------------------------------------- corpora

def test_shipped_generic_corpus_is_the_generator_output():
    from vlprompt_app.commands import make_description_corpus

    with open(GENERIC_CORPUS_PATH, encoding="utf-8") as f:
        assert f.read() == make_description_corpus.corpus_text(make_description_corpus.build_corpus())


def test_generic_corpus_covers_twelve_concepts_and_fits_small_contexts(tiny_clip_files):
    corpus = load_corpus("generic")
    assert 2500 <= len(corpus) <= 4000
    counts = {label: corpus.labels.count(label) for label in set(corpus.labels)}
    assert set(counts) == {"location", "object", "color", "shape", "texture", "animal", "human", "text",
                           "number", "style", "emotion", "action"}
    assert min(counts.values()) >= 150
    tokenizer = Tokenizer(tiny_clip_files[0])  # context length 32
    assert max(tokenizer.num_tokens(text) for text in corpus.texts) <= 16


def test_corpus_files(tmp_path):
    tsv = tmp_path / "c.tsv"
    tsv.write_text("# comment\ncolor\tA red thing\n\nanimal\tA  dog\ncolor\tA red thing\n")
    corpus = load_corpus(str(tsv))
    assert corpus.texts == ("A red thing", "A dog") and corpus.labels == ("color", "animal")
    txt = tmp_path / "c.txt"
    txt.write_text("one\ntwo\n")
    assert load_corpus(str(txt)).labels is None
    tsv.write_text("color\tA red thing\nno tab here\n")
    with pytest.raises(CorpusError, match=r"line 2: expected \"concept<TAB>description\""):
        load_corpus(str(tsv))
    with pytest.raises(CorpusError, match="neither a built-in corpus"):
        load_corpus(str(tmp_path / "missing.tsv"))


def test_synthetic_corpus_describes_single_attributes():
    pytest.importorskip("vlprompt.synthetic.world")
    corpus = load_corpus("synthetic")
    assert set(corpus.labels) == {"shape", "color", "texture", "location", "size", "background"}
    assert "a red shape" in corpus.texts and "a star" in corpus.texts
    assert len(set(corpus.texts)) == len(corpus.texts)


@pytest.mark.slow
def test_decomposition_is_exact_on_vit_b16_architecture():
    """The paper's setting: the last 4 of 12 layers, 12 heads each (random weights)."""
    torch.manual_seed(0)
    model, _ = load_clip("ViT-B/16", "random")
    images = torch.randn(1, 3, 224, 224)  # the batch dimension is checked on the tiny CLIP
    parts = decompose_image_features(CLIPRunner(model).visual, images, 4)
    assert parts.heads.shape == (1, 4, 12, 512)
    assert torch.allclose(parts.total(), model.encode_image(images), atol=1e-4)


def test_clip_text_embeddings_equal_full_context_features(tiny_runner, tiny_clip_files):
    """Cutting the causal text tower's input after the last end-of-text token is exact."""
    model, runner = tiny_runner
    tokenizer = Tokenizer(tiny_clip_files[0])
    texts = ["a red star", "a photo of a dog in the snow", "x"]
    full = torch.nn.functional.normalize(model.encode_text(tokenizer(texts)), dim=-1)
    assert torch.allclose(clip_text_embeddings(runner, tokenizer, texts, batch_size=2), full, atol=1e-5)
