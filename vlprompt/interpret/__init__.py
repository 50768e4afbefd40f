"""Interpreting CLIP's image tower: which attention heads do what (DeAR's head roles).

``decomposition`` splits image features into exact per-head direct contributions,
``textspan`` describes each head with texts, ``concepts`` groups the texts into concepts
and computes Concept Entropy, ``roles`` turns entropies into a role map, ``report``
writes Markdown/CSV/PNG. ``tools/head_roles.py`` is the command line.
"""
from .concepts import (
    ConceptError, ConceptSpace, build_concept_space, cluster_phrases, concept_distribution,
    concept_entropy, dominant_concept, name_clusters, phrase_concepts,
)
from .corpus import GENERIC_CORPUS_PATH, Corpus, CorpusError, load_corpus, synthetic_world_corpus
from .decomposition import ImageDecomposition, block_head_terms, decompose_image_features
from .discovery import (
    CONCEPT_NAMES, DEAR_ATTRIBUTES, SCORINGS, HeadSummary, RoleDiscovery, collect_head_contributions, discover_roles,
)
from .embedders import PACKAGED_MINILM, OptionalDependencyError, clip_text_embeddings, load_sentence_embedder
from .report import role_counts, write_csv, write_heatmap, write_markdown
from .roles import quantile_roles
from .textspan import SpanResult, textspan
