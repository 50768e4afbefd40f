"""ATPrompt: attribute-anchored textual prompts (Li et al., ICCV 2025), on CoOp or MaPLe.

ATPrompt keeps a base prompt-learning method (TRAINER.ATPROMPT.BASE: "CoOp" or "MaPLe", built
from its own node TRAINER.COOP / TRAINER.MAPLE, composed here, not copied) and anchors its
text prompt on K universal attribute words w_1..w_K of the dataset (e.g. "color", "shape" for
ImageNet). Each attribute gets m learnable soft tokens A_k ∈ R^{m×D} in front of its (frozen)
word embedding e(w_k) ∈ R^{1×D}; the block of all attributes goes right after [SOS]:

    [SOS] [A_1] e(w_1) [A_2] e(w_2) ... [A_K] e(w_K) [base prompt: ctx ×n, class name, "."] [EOS]

i.e. the attribute block [K(m+1), D] is inserted at position 1 of the base method's prompt
embeddings (the base prompt's padding shrinks by K(m+1) positions; the end-of-text position
moves with it). A_k ~ N(0, 0.01); CoOp's context ~ N(0, 0.02). With MaPLe, its deep text
prompts of layers 2..J replace the n context slots, which now start after the attribute block
(position 1 + K(m+1)); the attribute tokens pass through the deeper layers, as upstream.
Loss: cross-entropy of the base method's logits s·f̂·t̂ᵀ; inference is the base method's, the
same for every evaluation scope (the attributes describe the dataset, not its classes). On another
dataset (a cross-dataset or domain-generalization target) the prompt takes that dataset's K'
words and the trained A_1..A_min(K, K'), as upstream's evaluation does; loading the source's
checkpoint reports the tokens left unused (K > K') or at their init (K' > K).

Each attribute word must be ONE BPE token (a word of several tokens would not fit the single
slot the method gives it): the words of a dataset come from a YAML data file
(TRAINER.ATPROMPT.ATTRIBUTES_FILE, DATASET.NAME -> list of words; the shipped
configs/resources/atprompt_attributes.yaml holds upstream's lists and the synthetic
benchmark's), checked against the backbone's tokenizer when the model is built.

Read from the official code, zhengli97/ATPrompt @ 86980a10: trainers/coop_atp.py and
maple_atp.py (the prompt "X X attr1 X X attr2 X X {name}." tokenized whole; soft attribute
tokens N(0, 0.01), ctx N(0, 0.02); token_middle_k is ONE token per attribute), clip/model_atp.py
(MaPLe's deep text prompts at 1 + K(n+1), upstream assuming m = n), train.py
(choose_attribute_for_atprompt: the per-dataset words, hard-coded there) and
scripts/coop/atprompt_base2new_train.sh (CoOp's vit_b16.yaml with 100 epochs, N_CTX 2, 2 tokens
per attribute). Both upstream prompt learners ignore CTX_INIT ("if False:"): the context is
random, N(0, 0.02), for MaPLe too (configs/trainers/ATPrompt/vit_b16_maple.yaml: CTX_INIT "").
Differences: upstream's OxfordPets word "playfulness" is two BPE tokens
("playful", "ness"); its fixed slicing then takes "playful" as the first word and a
placeholder "X" as the second, drops "ness" and "energy" and leaves another "X" before the
class name, without a message; here that word is an error naming the word, the dataset and
the file. Upstream always creates
three attribute parameter tensors (unused ones receive no gradient); here exactly K.

Run side by side with the official code (tools/official_equivalence.py ATPrompt and
ATPrompt-MaPLe, zhengli97/ATPrompt @ 86980a10 with its own Dassl.pytorch, on a seeded random
ViT-B/16 with "color" and "shape", 2 soft tokens each, every learnable value at 10x its init std
and upstream's unused third attribute tensor set to NaN; fixtures
tests/fixtures/official/atprompt{,-maple}.json, test tests/test_fidelity.py):
logits and CE agree on CoOp and on MaPLe (prompt depth 9); the recorded relative max differences
are in the table of docs/fidelity.md.
"""
import os

import torch
import torch.nn.functional as F
import yaml
from torch import nn
from yacs.config import CfgNode as CN

from vlprompt.clip import InsertTokens, Plan, PromptedCLIP, ReplaceTokens
from vlprompt.config import ConfigError, check_choice, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.methods.coupled_prompts import MaPLeCLIP, check_maple_cfg
from vlprompt.methods.text_context import CoOpCLIP
from vlprompt.paths import repository_root

# TRAINER.ATPROMPT.BASE -> (the check of the base node, None: CoOp's has none; base model; its node).
BASES = {"CoOp": (None, CoOpCLIP, "COOP"), "MaPLe": (check_maple_cfg, MaPLeCLIP, "MAPLE")}
ATTRIBUTE_INIT_STD = 0.01


@register_cfg_extension
def add_atprompt_config(cfg):
    cfg.TRAINER.ATPROMPT = CN()
    cfg.TRAINER.ATPROMPT.BASE = "CoOp"  # base method: CoOp or MaPLe (its prompts from TRAINER.COOP / TRAINER.MAPLE)
    cfg.TRAINER.ATPROMPT.PREC = "fp16"  # fp16 = autocast with fp32 master weights on CUDA (the base node's PREC is unused)
    cfg.TRAINER.ATPROMPT.N_ATT = 2  # m, soft tokens in front of each attribute word (N_ATT1..3 upstream)
    # YAML file: DATASET.NAME -> attribute words (each one BPE token); relative paths: from the
    # working directory, else from the repository root.
    cfg.TRAINER.ATPROMPT.ATTRIBUTES_FILE = "configs/resources/atprompt_attributes.yaml"


def resolve_attributes_file(path):
    """The attributes file ``path`` as given if it exists, else relative to the repository root.

    Raises:
        ConfigError: neither exists (names both places and how to make the file).
    """
    if os.path.isfile(path):
        return path
    in_repository = os.path.join(str(repository_root()), path)
    if not os.path.isabs(path) and os.path.isfile(in_repository):
        return in_repository
    raise ConfigError(
        f"TRAINER.ATPROMPT.ATTRIBUTES_FILE {path!r} does not exist (nor {in_repository!r}). It is a YAML "
        "mapping DATASET.NAME -> list of attribute words, e.g. 'ImageNet: [color, shape]'; the project "
        "ships configs/resources/atprompt_attributes.yaml."
    )


def load_attribute_words(path, dataset):
    """The attribute words of ``dataset`` (a DATASET.NAME) in the YAML file ``path``.

    Returns:
        list of K >= 1 words, in prompt order.

    Raises:
        ConfigError: the file is missing or not a mapping, has no entry ``dataset``, or the entry
            is not a non-empty list of words.
    """
    path = resolve_attributes_file(path)
    with open(path) as f:
        table = yaml.safe_load(f)
    if not isinstance(table, dict):
        raise ConfigError(f"The ATPrompt attributes file {path} must be a YAML mapping DATASET.NAME -> list of words.")
    if dataset not in table:
        raise ConfigError(
            f"The ATPrompt attributes file {path} has no entry {dataset!r} (DATASET.NAME); it has "
            f"{', '.join(map(str, table))}. Add a line '{dataset}: [word, ...]' (attribute words of the "
            "dataset, each one BPE token), or point TRAINER.ATPROMPT.ATTRIBUTES_FILE to a file that has one."
        )
    words = table[dataset]
    if not isinstance(words, list) or not words or not all(isinstance(w, str) and w.strip() for w in words):
        raise ConfigError(
            f"The entry {dataset!r} of the ATPrompt attributes file {path} must be a non-empty list of words, "
            f"got {words!r}."
        )
    return [word.strip() for word in words]


def check_single_tokens(words, tokenizer, dataset, path):
    """ConfigError unless every attribute word is exactly one BPE token of ``tokenizer``."""
    for word in words:
        n = tokenizer.num_tokens(word)
        if n != 1:
            raise ConfigError(
                f"ATPrompt attribute word {word!r} of dataset {dataset!r} (in {path}) is {n} BPE tokens for "
                "this backbone's tokenizer; each attribute fills exactly one token slot of the prompt. Replace "
                "it by a single-token word in that file, or set TRAINER.ATPROMPT.ATTRIBUTES_FILE to a file of "
                "your own."
            )


class AttributeTokens(nn.Module):
    """ATPrompt's attribute block: K attributes, m soft tokens and one frozen word token each.

    Args:
        text_tower: the runner's TextTower (its frozen token embedding gives e(w_k)).
        tokenizer: vlprompt.clip.Tokenizer of the backbone.
        words: K attribute words, each one BPE token (checked: ValueError otherwise).
        n_tokens: m, soft tokens per attribute.

    Attributes:
        soft: ParameterList of K tensors A_k [m, D], N(0, 0.01).
        word_ids: buffer [K], the token id of each word (not saved; rebuilt from the words).
    """

    def __init__(self, text_tower, tokenizer, words, n_tokens):
        super().__init__()
        if n_tokens < 1:
            raise ValueError(f"ATPrompt needs at least one soft token per attribute, got {n_tokens}.")
        if any(tokenizer.num_tokens(word) != 1 for word in words):
            raise ValueError(f"Every attribute word must be one BPE token, got {list(words)}.")
        ids = tokenizer(list(words))  # [K, L]: the start token (CLIP's SOS; none on SigLIP), the word, EOS, padding
        object.__setattr__(self, "_text_tower", text_tower)  # frozen, owned by the runner
        self.words = list(words)
        self.n_tokens = n_tokens
        width = text_tower.width
        self.soft = nn.ParameterList(
            nn.Parameter(torch.empty(n_tokens, width).normal_(std=ATTRIBUTE_INIT_STD)) for _ in self.words
        )
        device = text_tower.token_embedding.weight.device
        self.start = tokenizer.start_tokens
        self.register_buffer("word_ids", ids[:, self.start].to(device), persistent=False)

    def __len__(self):
        """Number of positions of the block, K(m + 1)."""
        return len(self.words) * (self.n_tokens + 1)

    def forward(self):
        """The block [K(m+1), D] = [A_1; e(w_1); ...; A_K; e(w_K)]."""
        with torch.no_grad():
            word_embeddings = self._text_tower.embed(self.word_ids).float()  # [K, D]
        rows = []
        for soft, word in zip(self.soft, word_embeddings):
            rows += [soft, word.unsqueeze(0)]
        return torch.cat(rows, dim=0)


class ATPromptCLIP(PromptedCLIP):
    """A base method's model (CoOpCLIP or MaPLeCLIP) whose text prompts carry the attribute block.

    Args:
        base: the base method's model; its ``prompt_learner`` (a TextContext) gives the prompt
            embeddings [C, L, D] and end-of-text positions [C]; ``unnormalised_image_features``
            gives the image features [B, E].
        attributes: AttributeTokens.
    """

    def __init__(self, base, attributes):
        super().__init__(base.clip)
        self.base = base
        self.attributes = attributes

    def text_plan(self):
        """The text tower's plan: the attribute block inserted after [SOS] (first where the tokenizer
        has no start token; the sequence keeps its length L), and, with MaPLe, its deep text prompts
        replacing the context slots, which start at 1 + K(m+1), at the inputs of blocks 1..J-1."""
        first = self.attributes.start
        insert = InsertTokens(self.attributes(), at=first, keep_length=True)
        deep = getattr(self.base.prompt_learner, "compound_prompts_text", ())
        start = first + len(self.attributes)
        layers = {index: ReplaceTokens(prompts, at=start) for index, prompts in enumerate(deep, start=1)}
        return Plan(embed=[insert], layers=layers)

    def compute_text_features(self):
        prompts = self.base.prompt_learner
        return self.clip.text(embeddings=prompts(), eot=prompts.eot, plan=self.text_plan()).features

    def forward(self, images):
        image_features = F.normalize(self.base.unnormalised_image_features(images), dim=-1)
        return self.cosine_logits(image_features, self.class_text_features())


@TRAINER_REGISTRY.register()
class ATPrompt(ClipTrainer):
    """ATPrompt trainer; the whole model ("ATPrompt": the base method's learnable part and the
    attributes' soft tokens) is registered and checkpointed."""

    # The attribute words are per dataset: the benchmark's stand-in classes take ImageNet's ("color", "shape").
    benchmark_cases = (
        Case("ATPrompt/vit_b16.yaml", TRAIN, opts=("DATASET.NAME", "ImageNet")),
        Case("ATPrompt/vit_b16_maple.yaml", TRAIN, name="ATPrompt+MaPLe", opts=("DATASET.NAME", "ImageNet"),
             synthetic_opts=("TRAINER.ATPROMPT.BASE", "MaPLe", "TRAINER.MAPLE.PROMPT_DEPTH", "3")),
    )

    def check_cfg(self, cfg):
        node = cfg.TRAINER.ATPROMPT
        check_choice("TRAINER.ATPROMPT.BASE", node.BASE, list(BASES))
        if node.N_ATT < 1:
            raise ConfigError(f"TRAINER.ATPROMPT.N_ATT (soft tokens per attribute) must be >= 1, got {node.N_ATT!r}.")
        if node.BASE == "CoOp" and cfg.TRAINER.COOP.CLASS_TOKEN_POSITION != "end":
            raise ConfigError(
                "ATPrompt puts the class name at the end of its prompt: TRAINER.COOP.CLASS_TOKEN_POSITION must "
                f"be 'end', got {cfg.TRAINER.COOP.CLASS_TOKEN_POSITION!r}."
            )
        check_base = BASES[node.BASE][0]
        if check_base is not None:
            check_base(cfg)  # the base node (prompt sizes, init phrase)

    def build_model(self):
        clip, tokenizer = self.build_clip()
        node, dataset = self.cfg.TRAINER.ATPROMPT, self.cfg.DATASET.NAME
        words = load_attribute_words(node.ATTRIBUTES_FILE, dataset)
        check_single_tokens(words, tokenizer, dataset, node.ATTRIBUTES_FILE)
        _, base_model, base_key = BASES[node.BASE]
        base = base_model(clip, tokenizer, self.classnames, self.cfg.TRAINER[base_key])
        attributes = AttributeTokens(clip.text, tokenizer, words, node.N_ATT)
        print(f"ATPrompt on {node.BASE}: attributes {words} of {dataset}, {node.N_ATT} soft tokens each")
        self.model = ATPromptCLIP(base, attributes).to(self.device)
        self.register_learner("ATPrompt", self.model)
