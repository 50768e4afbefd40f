"""Learnable text context: the "prefix / context / suffix" construction of the CoOp family.

For every class the sentence ``phrase + " " + classname + "."`` is tokenized; its frozen
token embeddings are split into the tokenizer's start tokens (prefix, [C, s, D]: CLIP's
start-of-text token, s = 1; none for tokenizers that add no start token, such as SigLIP's,
s = 0, so the context opens the sentence), the n context positions (replaced by learnable
vectors) and the rest (suffix: class name, ".", end-of-text, padding; [C, L-s-n, D]). Prefix, suffix and end-of-text positions depend on
the class list only: they are non-persistent buffers, rebuilt by ``set_classnames`` and
never saved in or loaded from a checkpoint.

Two initialisation conventions exist, and each method keeps its own reference's:

* ``coop`` (CoOp, CoCoOp, KgCoOp): with an init phrase, n := its number of words and the
  context starts from the phrase's embeddings (a line says so when N_CTX differs); otherwise
  n = N_CTX random N(0, 0.02) vectors with an "X X ... X" placeholder.
* ``ivlp`` (IVLP, MaPLe, PromptSRC): n = N_CTX always; with an init phrase and n <= 4 the
  context starts from the phrase's first n token embeddings and the whole phrase stays in
  the template (``[SOT][ctx1][ctx2] of a <class> . [EOT]`` for n = 2); otherwise random.
"""
import torch
from torch import nn

__all__ = ["TextContext", "CLASS_TOKEN_POSITIONS"]

CLASS_TOKEN_POSITIONS = ("end", "middle", "front")


class TextContext(nn.Module):
    """Learnable context vectors plus the class-dependent frozen embeddings around them.

    Args:
        text_tower: the runner's TextTower (token embedding, context length).
        tokenizer: vlprompt.clip.Tokenizer of the backbone.
        classnames: list of C class names.
        n_ctx: number of context vectors (ignored in ``coop`` mode with an init phrase).
        ctx_init: init phrase ("" = random init).
        class_specific: one context per class (CoOp's CSC), shape [C, n, D].
        class_token_position: "end", "middle" or "front" (CoOp).
        init_mode: "coop" or "ivlp" (see module docstring).

    Attributes:
        ctx: Parameter [n, D] or [C, n, D].
        token_prefix: buffer [C, s, D]; token_suffix: buffer [C, L-s-n, D] (s: the
            tokenizer's start tokens).
        token_ids: buffer [C, L] tokenized templates; eot: buffer [C] pooled positions.
        name_lens: buffer [C] number of BPE tokens of each class name.
    """

    def __init__(self, text_tower, tokenizer, classnames, n_ctx, ctx_init="", class_specific=False,
                 class_token_position="end", init_mode="coop"):
        super().__init__()
        if class_token_position not in CLASS_TOKEN_POSITIONS:
            raise ValueError(
                f"CLASS_TOKEN_POSITION must be one of {list(CLASS_TOKEN_POSITIONS)}, got '{class_token_position}'."
            )
        if init_mode not in ("coop", "ivlp"):
            raise ValueError(f"init_mode must be 'coop' or 'ivlp', got '{init_mode}'.")
        self.tokenizer = tokenizer
        # The frozen tower belongs to the runner: keep a reference, not a submodule.
        object.__setattr__(self, "_text_tower", text_tower)
        self.class_token_position = class_token_position
        width = text_tower.width

        ctx_init = ctx_init.replace("_", " ").strip() if ctx_init else ""
        if ctx_init and init_mode == "coop":
            words = len(ctx_init.split(" "))
            if words != n_ctx:
                print(f'N_CTX {n_ctx} is not used: CTX_INIT "{ctx_init}" gives {words} context vector(s), one per '
                      "word (CoOp's rule)")
            n_ctx = words
        use_words = bool(ctx_init) and (init_mode == "coop" or n_ctx <= 4)
        if n_ctx < 1:
            raise ValueError(f"The number of context vectors must be at least 1, got {n_ctx}.")
        if use_words and not class_specific:
            with torch.no_grad():
                ids = tokenizer([ctx_init]).to(self._device())
                start = tokenizer.start_tokens
                vectors = text_tower.embed(ids)[0, start: start + n_ctx].clone().float()
            self.phrase = ctx_init
        else:
            shape = (len(classnames), n_ctx, width) if class_specific else (n_ctx, width)
            vectors = torch.empty(shape).normal_(std=0.02)
            self.phrase = " ".join(["X"] * n_ctx)
        self.n_ctx = n_ctx
        self.init_phrase = ctx_init
        self.class_specific = class_specific
        self.ctx = nn.Parameter(vectors)
        self.set_classnames(classnames)

    def set_classnames(self, classnames):
        """(Re)build the class-dependent buffers for a new class list."""
        if self.class_specific and hasattr(self, "token_prefix") and len(classnames) != self.ctx.shape[0]:
            raise ValueError(
                "Class-specific contexts (CSC) are tied to the training classes and cannot be "
                f"used for {len(classnames)} other classes."
            )
        device = self._device()
        names = [name.replace("_", " ") for name in classnames]
        sentences = [self.sentence(name) for name in names]
        token_ids = self.tokenizer(sentences).to(device)
        with torch.no_grad():
            embedded = self._text_tower.embed(token_ids).float()
        start = self.tokenizer.start_tokens
        self.register_buffer("token_ids", token_ids, persistent=False)
        self.register_buffer("eot", self._text_tower.eot_positions(token_ids), persistent=False)
        self.register_buffer("token_prefix", embedded[:, :start], persistent=False)
        self.register_buffer("token_suffix", embedded[:, start + self.n_ctx:], persistent=False)
        lens = [self.tokenizer.num_tokens(name) for name in names]
        self.register_buffer("name_lens", torch.tensor(lens, device=device), persistent=False)
        self.classnames = list(classnames)

    def sentence(self, name):
        """The tokenized sentence of class ``name``: the context placeholder phrase, the name, "."."""
        return f"{self.phrase} {name}."

    def _device(self):
        return self._text_tower.token_embedding.weight.device

    @property
    def start(self):
        """Position of the first context vector: the tokenizer's start tokens (1 for CLIP, 0 for SigLIP)."""
        return self.tokenizer.start_tokens

    @property
    def num_classes(self):
        return self.token_prefix.shape[0]

    def forward(self, ctx=None):
        """Prompt embeddings for all classes.

        Args:
            ctx: context to use instead of ``self.ctx`` (e.g. CoCoOp's image-shifted
                context): [n, D] shared by all classes or [C, n, D].

        Returns:
            [C, L, D] token embeddings (before positional embedding).
        """
        ctx = self.ctx if ctx is None else ctx
        prefix, suffix = self.token_prefix, self.token_suffix
        ctx = ctx.to(prefix.dtype)
        if ctx.dim() == 2:
            ctx = ctx.unsqueeze(0).expand(self.num_classes, -1, -1)
        if self.class_token_position == "end":
            return torch.cat([prefix, ctx, suffix], dim=1)
        half = self.n_ctx // 2
        rows = []
        for c in range(self.num_classes):
            name_len = int(self.name_lens[c])
            name, rest = suffix[c : c + 1, :name_len], suffix[c : c + 1, name_len:]
            if self.class_token_position == "middle":
                parts = [prefix[c : c + 1], ctx[c : c + 1, :half], name, ctx[c : c + 1, half:], rest]
            else:
                parts = [prefix[c : c + 1], name, ctx[c : c + 1], rest]
            rows.append(torch.cat(parts, dim=1))
        return torch.cat(rows, dim=0)
