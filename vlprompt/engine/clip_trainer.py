"""TrainerX for CLIP methods: the frozen runner, the class names, the training step.

A method trainer only says which model to build and which module holds its learnable
parameters; this class does the rest the CoOp-family trainers repeat:

* builds the frozen CLIP runner and tokenizer from ``MODEL.BACKBONE.{NAME,WEIGHTS}``; a method
  that declares ``vit_required_for`` refuses, before any data loads, a backbone whose image
  tower no runner adapter drives;
* gives the class sentence of the dataset (``dataset_template``);
* gives the class names of the current split with "_" replaced by " ";
* ``forward_backward``: autocast forward of ``model.loss(images, labels)``, (scaled)
  backward and step, the ``loss``/``acc`` summary (plus the method's named terms), and
  the once-per-epoch ``update_lr()`` of the Dassl contract;
* ``register_learner``: optimizer + scheduler for a module, optional MODEL.INIT_WEIGHTS;
* with FEATURE_CACHE.ENABLED (trainers whose image encoder is frozen), training and
  evaluation read image features from :mod:`vlprompt.data.feature_cache`: the model then
  provides ``encode_image_features(images)``, ``forward_features(features)`` and, to train,
  ``loss_features(features, labels)``.
"""
from vlprompt.clip import CLIPRunner, Tokenizer, UnsupportedBackboneError, load_clip
from vlprompt.clip.families import describe_backbone
from vlprompt.clip.templates import dataset_template
from vlprompt.config import ConfigError
from vlprompt.data.feature_cache import FeatureCache
from vlprompt.metrics import compute_accuracy
from vlprompt.optim import build_lr_scheduler, build_optimizer
from vlprompt.utils import count_num_param, load_pretrained_weights

from .eval_scope import eval_scope
from .steps import step_summary
from .trainer import TrainerX

__all__ = ["ClipTrainer"]


class ClipTrainer(TrainerX):
    """Base trainer of every CLIP method (see module docstring).

    Subclasses implement ``build_model()``, usually as::

        clip, tokenizer = self.build_clip()
        self.model = MyModel(clip, tokenizer, self.classnames, cfg.TRAINER.MY).to(self.device)
        self.register_learner("prompt_learner", self.model.prompt_learner)

    Attributes:
        frozen_image_encoder (bool, class attribute): the model never changes its image
            encoder, so FEATURE_CACHE may be enabled (override ``uses_frozen_image_encoder``
            when it depends on the config).
        vit_required_for (str, class attribute): what the method needs a prompted image tower
            for (e.g. "representation tokens"); when set, ``check_declared_cfg`` refuses a
            backbone whose image tower no runner adapter drives (a ResNet, a ConvNeXt).
        exports_class_text_features (bool, class attribute): the model's logits are
            ``logit_scale * normalize(clip.encode_image(images)) @ class_text_features().T`` (plain
            CLIP image tower, classifier = class text features), so an export holds the text
            features and loads with the library alone (:mod:`vlprompt.export`).
        feature_cache (FeatureCache or None): set when FEATURE_CACHE.ENABLED.
    """

    frozen_image_encoder = False
    vit_required_for = ""
    exports_class_text_features = False

    def __init__(self, cfg):
        self.feature_cache = None
        if cfg.FEATURE_CACHE.ENABLED:
            self._check_feature_cache_cfg(cfg)
        super().__init__(cfg)
        if cfg.FEATURE_CACHE.ENABLED:
            # Models that inherit the same encode_image_features share cached features.
            encoder_id = type(self.model).encode_image_features.__qualname__
            self.feature_cache = FeatureCache(
                cfg, self.model.encode_image_features, encoder_id, self.device, self.autocast, str(self.amp.dtype)
            )

    @classmethod
    def check_declared_cfg(cls, cfg):
        """Also refuse, before any data or weights load, a backbone whose image tower the method
        cannot prompt (``vit_required_for``); its family comes from ``describe_backbone``."""
        super().check_declared_cfg(cfg)
        if cls.vit_required_for and cfg.MODEL.BACKBONE.NAME:  # an empty name is load_clip's error
            info = describe_backbone(cfg.MODEL.BACKBONE.NAME)
            if info.image_adapter is None:
                raise UnsupportedBackboneError(
                    f"{cfg.TRAINER.NAME} needs an image tower the prompted runner drives ({cls.vit_required_for}); "
                    f"MODEL.BACKBONE.NAME {cfg.MODEL.BACKBONE.NAME} has none: {info.image_error} Use a ViT "
                    "backbone (OpenAI, LAION, MetaCLIP, DFN, SigLIP, SigLIP2, EVA02 or PE-Core)."
                )

    @classmethod
    def uses_frozen_image_encoder(cls, cfg):
        """Whether this trainer, with this config, keeps its image encoder frozen."""
        return cls.frozen_image_encoder

    def _check_feature_cache_cfg(self, cfg):
        if not self.uses_frozen_image_encoder(cfg):
            raise ConfigError(
                f"FEATURE_CACHE.ENABLED is True, but {type(self).__name__} changes what its image encoder "
                "computes (prompts, fine-tuning or test-time views), so its image features cannot be cached; "
                "set FEATURE_CACHE.ENABLED False."
            )
        if cfg.DATALOADER.K_TRANSFORMS != 1:
            raise ConfigError(
                f"FEATURE_CACHE.ENABLED needs one view per image and step (DATALOADER.K_TRANSFORMS 1), "
                f"got K_TRANSFORMS {cfg.DATALOADER.K_TRANSFORMS}."
            )
        if cfg.FEATURE_CACHE.BATCH_SIZE < 1:
            raise ConfigError(f"FEATURE_CACHE.BATCH_SIZE must be >= 1, got {cfg.FEATURE_CACHE.BATCH_SIZE}.")

    def build_clip(self):
        """Load the frozen CLIP of ``MODEL.BACKBONE`` onto the device.

        Returns:
            (CLIPRunner, Tokenizer)

        """
        backbone = self.cfg.MODEL.BACKBONE
        print(f"Loading CLIP (backbone: {backbone.NAME})")
        model, info = load_clip(backbone.NAME, backbone.WEIGHTS, device=self.device)
        print(f"CLIP weights: {info['weights']} (open_clip config {info['model_name']}, QuickGELU {info['quick_gelu']})")
        return CLIPRunner(model), Tokenizer(backbone.NAME)

    def dataset_template(self, template=""):
        """The class sentence with "{}": ``template`` when given, else the dataset class's
        ``template`` attribute, else DEFAULT_TEMPLATE ("a photo of a {}.")."""
        return dataset_template(self.dm.dataset, template)

    @property
    def eval_scope(self):
        """The evaluation scope, "base", "new", "source" or "target" (:mod:`vlprompt.engine.eval_scope`);
        known from construction on, so ``build_model`` may choose the inference by it."""
        return eval_scope(self.cfg)

    @property
    def classnames(self):
        """Class names the model scores, "_" replaced by " ": the current split's, ordered by label,
        or, for a dataset scored through another's classes, its ``prediction_map.classnames``."""
        prediction_map = self.dm.dataset.prediction_map
        names = self.dm.dataset.classnames if prediction_map is None else prediction_map.classnames
        return [name.replace("_", " ") for name in names]

    def register_learner(self, name, module, params=None):
        """Freeze everything but ``module``'s trainable parameters, build its optimizer and
        scheduler, load MODEL.INIT_WEIGHTS into it if set, and register it under ``name``.

        Args:
            name: checkpoint folder name (e.g. "prompt_learner", as the references).
            module: nn.Module whose state is checkpointed.
            params: parameters to optimise (default: those of ``module`` with grad), or
                param-group dicts ({"params": [...], "lr": ...}) for per-group learning rates.
        """
        if self.cfg.MODEL.INIT_WEIGHTS:
            load_pretrained_weights(module, self.cfg.MODEL.INIT_WEIGHTS)
        params = list(module.parameters() if params is None else params)
        if params and isinstance(params[0], dict):
            params = [dict(group, params=[p for p in group["params"] if p.requires_grad]) for group in params]
            count = sum(count_num_param(params=group["params"]) for group in params)
        else:
            params = [p for p in params if p.requires_grad]
            count = count_num_param(params=params)
        print(f"Learnable parameters of {name}: {count:,}")
        optim = build_optimizer(params, self.cfg.OPTIM)
        sched = build_lr_scheduler(optim, self.cfg.OPTIM)
        self.register_model(name, module, optim, sched)

    def before_train(self):
        super().before_train()
        if self.feature_cache is not None and self.start_epoch < self.max_epoch:
            # no epoch left (resumed from the last checkpoint: only the final evaluation runs): nothing to cache
            self.train_loader_x = self.feature_cache.train_epochs(
                self.dm.train_loader_x, self.start_epoch, self.max_epoch, lambda: self.epoch
            )

    def test(self, split=None):
        if self.feature_cache is not None:
            split = self.cfg.TEST.SPLIT if split is None else split
            if split == "val" and self.val_loader is not None:
                if self.val_loader is self.dm.val_loader:
                    self.val_loader = self.feature_cache.eval_loader(self.dm.val_loader, "val")
            elif self.test_loader is self.dm.test_loader:
                self.test_loader = self.feature_cache.eval_loader(self.dm.test_loader, "test")
        with self.model.evaluation():  # class text features once per evaluation, not per batch
            return super().test(split)

    def _inputs(self, batch):
        """Cached features when the feature cache is on, else the images."""
        return batch["features" if self.feature_cache is not None else "img"].to(self.device)

    def parse_batch_train(self, batch):
        return self._inputs(batch), batch["label"].to(self.device)

    def parse_batch_test(self, batch):
        return self._inputs(batch), batch["label"].to(self.device)

    def model_inference(self, input):
        if self.feature_cache is None:
            return super().model_inference(input)
        with self.autocast():
            return self.model.forward_features(input)

    def forward_backward(self, batch):
        images, labels = self.parse_batch_train(batch)
        model_loss = self.model.loss if self.feature_cache is None else self.model.loss_features
        with self.autocast():
            loss, logits, terms = model_loss(images, labels)
        self.model_backward_and_update(loss, terms=terms)
        summary = step_summary(loss, terms, compute_accuracy(logits, labels)[0])
        if (self.batch_idx + 1) == self.num_batches:
            self.update_lr()
        return summary
