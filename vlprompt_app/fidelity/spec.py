"""The typed contract of a method's comparison with its official code (see the package docstring).

``MethodSpec`` says how both sides are built and run, which learnable values they share
(``Learnable``) and which misplacements of them must break the agreement (``Mutation``);
``CostSpec`` says how ``tools/benchmark.py official`` times one step of each side.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

# Contract tolerance: relative max difference max|ours - official| / max|official| of an output.
TOLERANCE = 3e-3
# Learnable values are drawn with this many times the official init std.
LEARNABLE_SCALE = 10.0
# The seeded random CLIP of a comparison: ViT-B/16's towers (the widths and depths official code
# builds its learnables for) at a 64 px input, a 4 x 4 patch grid (weights.backbone_and_size).
DEFAULT_BACKBONE = "ViT-B/16@64px"
DEFAULT_SEEDS = {"weights": 1, "learnable": 2, "images": 3}
DEFAULT_CLASSNAMES = ("golden retriever", "sunflower", "fire truck")
DEFAULT_BATCH = 2
DEFAULT_LEARNABLE_PREFIXES = ("prompt_learner.", "adapter_learner.")


@dataclass(frozen=True)
class Learnable:
    """One learnable value both sides share: our parameter name is its key in ``MethodSpec.learnables``.

    Attributes:
        official: the official model's parameter name (a value is copied into an official parameter
            of the same number of elements but another shape with ``view_as``, e.g. a Linear's
            weight into a 1x1 convolution's).
        init_std: the official init std; the value is drawn at ``LEARNABLE_SCALE`` times it.
        shape: dims, ints or the symbols "n_ctx" (our node's N_CTX), "width" (text width),
            "vision_width" (768), "embed" (512), "classes" (C).
        init_mean: the centre of the draw (e.g. 1 for a FiLM scale).
        fp16: draw an fp16-representable value (for official code that casts it to fp16).
    """
    official: str
    init_std: float
    shape: Tuple[Any, ...] = ("n_ctx", "width")
    init_mean: float = 0.0
    fp16: bool = False


@dataclass(frozen=True)
class Mutation:
    """A named misplacement on our side that must make the comparison fail.

    Attributes:
        name: what is misplaced (the test id).
        values: {our name: tensor} -> the misplaced learnable values (a new dict; the input is not
            changed). Alone, it is applied to the already built model (then the values are restored).
        node: changes of our config node (the model is rebuilt, unless ``node_read_at_run``).
        node_read_at_run: only ``run_ours`` reads the changed keys, so the built model is reused.
        patch: a zero-argument callable giving a context manager held while the model is rebuilt
            and run (e.g. another template table).
        fails: the outputs whose relative max difference to the official ones must exceed ``threshold``.
        any_fails: only one of ``fails`` needs to (default: every one).
        threshold: the difference that counts as failing (default the contract's tolerance).
        unchanged: outputs that must stay equal to our unmutated ones (the mutation is local).
        still_match: outputs that must still agree with the official ones within the tolerance.
    """
    name: str
    values: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None
    node: Mapping[str, Any] = field(default_factory=dict)
    node_read_at_run: bool = False
    patch: Optional[Callable[[], Any]] = None
    fails: Sequence[str] = ("logits",)
    any_fails: bool = False
    threshold: float = TOLERANCE
    unchanged: Sequence[str] = ()
    still_match: Sequence[str] = ()

    @property
    def read(self):
        """The outputs a check of this mutation reads: ``fails``, ``still_match`` and ``unchanged``."""
        return tuple(dict.fromkeys((*self.fails, *self.still_match, *self.unchanged)))

    @property
    def rebuilds(self):
        """Whether the model must be rebuilt (a node change or a patch), not only given other values."""
        return (bool(self.node) and not self.node_read_at_run) or self.patch is not None


def swap(first, second):
    """A ``Mutation.values`` that exchanges the values of two learnables (pairs of names: each pair swapped)."""
    pairs = list(zip(first, second)) if isinstance(first, (list, tuple)) else [(first, second)]

    def values(learnables):
        moved = dict(learnables)
        for a, b in pairs:
            moved[a], moved[b] = learnables[b], learnables[a]
        return moved

    return values


def flip(name):
    """A ``Mutation.values`` that reverses the rows (tokens) of one learnable."""
    return lambda learnables: dict(learnables, **{name: learnables[name].flip(0)})


@dataclass(frozen=True)
class CostSpec:
    """How ``tools/benchmark.py official`` times one step of each side (vlprompt_app.fidelity.cost).

    The official side is either a Dassl trainer class (``trainer``) whose own ``build_model`` and
    ``forward_backward`` run, or ``step_side(request, weights_path, inputs)`` -> (the official
    recipe's step, a zero-argument callable; its optimizer), for code without such a class or a
    test-time method (request: method, backbone, classnames; inputs: {"images", "labels"}).

    Attributes:
        trainer: the official trainer class in the spec's ``official_module``.
        train_cfg: {dotted Dassl key: value (a dict: a new node)} the official train.py adds and
            build_model or forward_backward reads.
        before_build(module, cfg): before build_model (files it reads, loaders to cast).
        after_build(trainer): what the official ``before_train`` sets up.
        step(trainer, batch): the official step when it is more than ``forward_backward``.
        step_side: see above.
        views: a test-time method's views of one test image (its episode is the unit).
        plain_design: the design dict under which the official clip package's ``build_model``
            gives the unprompted CLIP timed as the official frozen unit (IVLP-derived packages).
        case: the name of the benchmark case our trainer declares (default the method's name).
        our_nodes: {our config node: values} set over the case's config (default
            {"TRAINER.<the case's trainer>": the spec's our_node}).
        our_prepare(workdir, image size): files our trainer reads; returns more KEY VALUE options.
        our_after_build(trainer): e.g. a value both sides must share.
        official_prec: the official recipe's TRAINER.<X>.PREC (what its train.py or config sets),
            set on the official side by ``--prec recipe`` (ours then keeps its config file's).
        recipe_only: the official step runs only in ``official_prec`` (``--prec fp32`` is refused).
        gpu_acceptance: measured by the official stage of the GPU acceptance run (``tools/gpu_acceptance.py
            run``), both sides on the device in their recipes' precision.
    """
    trainer: Optional[str] = None
    train_cfg: Mapping[str, Any] = field(default_factory=dict)
    before_build: Optional[Callable] = None
    after_build: Optional[Callable] = None
    step: Optional[Callable] = None
    step_side: Optional[Callable] = None
    views: Optional[int] = None
    plain_design: Optional[Mapping[str, Any]] = None
    case: Optional[str] = None
    our_nodes: Optional[Mapping[str, Mapping[str, Any]]] = None
    our_prepare: Optional[Callable] = None
    our_after_build: Optional[Callable] = None
    official_prec: str = "fp16"
    recipe_only: bool = False
    gpu_acceptance: bool = False


@dataclass(frozen=True)
class MethodSpec:
    """A method compared with its official code (one module of vlprompt_app/fidelity/methods/).

    Official tree:
        name: the method's name on the command line; fixture: the stem of its fixture in
        tests/fixtures/official/ (default the name in lower case; "" for a spec that is only timed).
        repository: owner/name on GitHub; code_dir: the folder of its code ("" = the root);
        dassl_dir: its own Dassl fork's folder (else ``--dassl-git``); dassl: False for code that
        runs without Dassl; archive_exclude: paths left out of the export (files a copy may lack).

    Official side (in ``python -m vlprompt_app.fidelity.official``, the trees on PYTHONPATH):
        official_module: defines ``load_clip_to_cpu`` and ``CustomCLIP``; official_cfg: {dotted
        Dassl node: values}; dataset: ``DATASET.NAME``; prepare_official(cfg, weights_path):
        before the module is imported (the working folder is the run's); build_official(module,
        cfg, classnames, clip_model) -> the official model (default ``CustomCLIP`` in fp32, eval);
        run_official(module, cfg, request, model, images, labels) -> {output: tensor};
        prepare_official_model(model): what the built model needs on the CPU in fp32.
        The official parameters under official_learnable_prefixes (or those official_learnable(name)
        accepts), less official_unused, must be exactly the mapped ones.
        official_side(request, weights_path, inputs) -> {output: tensor}: instead of all the above,
        for code without Dassl (request: method, backbone, classnames, seeds, batch; inputs:
        {"learnables", "images", "labels"}).

    Our side:
        our_node: our trainer's config node; learnables: {our parameter name: Learnable};
        build_ours(clip, tokenizer, classnames, node, spec) -> our model; run_ours(model, node,
        images [B, 3, R, R], labels [B]) -> {output: tensor} (it must leave the learnable values as
        they are or the harness rewrites them: it writes every value before each run);
        on_demand_outputs: outputs that cost a run much more than the others (a gradient), which
        ``run_ours`` then computes only when asked: it takes ``outputs``, the names the run needs
        (every output for the recorded values, a mutation's ``read`` for a mutation), and may leave
        out those of ``on_demand_outputs`` not among them;
        options: method-specific values build_ours reads.

    Compared:
        outputs: the names compared (empty: the spec is only timed, ``compared_by`` says where it
        is compared); exact_outputs: outputs that must be equal, not only close; batch: images
        (a test-time method's views); labels: the batch's labels (default 0, 1, ... modulo C);
        seeds: the seeds of the inputs; mutations: the misplacements that must fail.

    Timing: cost (a CostSpec, or None when the method is not timed).
    """
    name: str
    repository: str
    build_ours: Optional[Callable] = None
    run_ours: Optional[Callable] = None
    our_node: Mapping[str, Any] = field(default_factory=dict)
    learnables: Mapping[str, Learnable] = field(default_factory=dict)
    outputs: Tuple[str, ...] = ()
    exact_outputs: Tuple[str, ...] = ()
    on_demand_outputs: Tuple[str, ...] = ()
    mutations: Tuple[Mutation, ...] = ()
    fixture: Optional[str] = None
    code_dir: str = ""
    dassl_dir: Optional[str] = None
    dassl: bool = True
    archive_exclude: Tuple[str, ...] = ()
    official_module: str = ""
    official_cfg: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    dataset: str = ""
    prepare_official: Optional[Callable] = None
    build_official: Optional[Callable] = None
    run_official: Optional[Callable] = None
    prepare_official_model: Optional[Callable] = None
    official_learnable_prefixes: Tuple[str, ...] = DEFAULT_LEARNABLE_PREFIXES
    official_learnable: Optional[Callable[[str], bool]] = None
    official_unused: Tuple[str, ...] = ()
    official_side: Optional[Callable] = None
    options: Mapping[str, Any] = field(default_factory=dict)
    batch: int = DEFAULT_BATCH
    labels: Optional[Sequence[int]] = None
    seeds: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_SEEDS))
    compared_by: str = ""
    cost: Optional[CostSpec] = None

    @property
    def fixture_name(self):
        """The fixture's file stem (tests/fixtures/official/<stem>.json)."""
        return self.name.lower() if self.fixture is None else self.fixture

    @property
    def compared(self):
        """Whether this spec's outputs are compared with a fixture (not only timed)."""
        return bool(self.outputs)

    @property
    def needs_dassl(self):
        """Whether the official side needs a Dassl clone (--dassl-git): not when the repository holds
        its own fork, or the code runs without Dassl."""
        return self.dassl_dir is None and self.official_side is None and self.dassl

    def parameter_mapping(self):
        """{our parameter name: official parameter name}."""
        return {name: entry.official for name, entry in self.learnables.items()}

    def is_official_learnable(self, name):
        """Whether the official parameter ``name`` is one of the method's learnable values."""
        if self.official_learnable is not None:
            return self.official_learnable(name)
        return name.startswith(tuple(self.official_learnable_prefixes))
