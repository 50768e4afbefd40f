"""TrainerX for CLIP methods: the frozen runner, the class names, the training step.

A method trainer only says which model to build and which module holds its learnable
parameters; this class does the rest the CoOp-family trainers repeat:

* builds the frozen CLIP runner and tokenizer from ``MODEL.BACKBONE.{NAME,WEIGHTS}``;
* gives the class names of the current split with "_" replaced by " ";
* ``forward_backward``: autocast forward of ``model.loss(images, labels)``, (scaled)
  backward and step, the ``loss``/``acc`` summary (plus the method's named terms), and
  the once-per-epoch ``update_lr()`` of the Dassl contract;
* ``register_learner``: optimizer + scheduler for a module, optional MODEL.INIT_WEIGHTS.
"""
from vlprompt.clip import CLIPRunner, Tokenizer, load_clip
from vlprompt.metrics import compute_accuracy
from vlprompt.optim import build_lr_scheduler, build_optimizer
from vlprompt.utils import count_num_param, load_pretrained_weights

from .trainer import TrainerX

__all__ = ["ClipTrainer"]


class ClipTrainer(TrainerX):
    """Base trainer of every CLIP method (see module docstring).

    Subclasses implement ``build_model()``, usually as::

        clip, tokenizer = self.build_clip()
        self.model = MyModel(clip, tokenizer, self.classnames, cfg.TRAINER.MY).to(self.device)
        self.register_learner("prompt_learner", self.model.prompt_learner)
    """

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

    @property
    def classnames(self):
        """Class names of the current split, ordered by label, "_" replaced by " "."""
        return [name.replace("_", " ") for name in self.dm.dataset.classnames]

    def register_learner(self, name, module, params=None):
        """Freeze everything but ``module``'s trainable parameters, build its optimizer and
        scheduler, load MODEL.INIT_WEIGHTS into it if set, and register it under ``name``.

        Args:
            name: checkpoint folder name (e.g. "prompt_learner", as the references).
            module: nn.Module whose state is checkpointed.
            params: parameters to optimise (default: those of ``module`` with grad).
        """
        if self.cfg.MODEL.INIT_WEIGHTS:
            load_pretrained_weights(module, self.cfg.MODEL.INIT_WEIGHTS)
        params = [p for p in (module.parameters() if params is None else params) if p.requires_grad]
        print(f"Learnable parameters of {name}: {count_num_param(params=params):,}")
        optim = build_optimizer(params, self.cfg.OPTIM)
        sched = build_lr_scheduler(optim, self.cfg.OPTIM)
        self.register_model(name, module, optim, sched)

    def parse_batch_train(self, batch):
        return batch["img"].to(self.device), batch["label"].to(self.device)

    def forward_backward(self, batch):
        images, labels = self.parse_batch_train(batch)
        with self.autocast():
            loss, logits, terms = self.model.loss(images, labels)
        self.model_backward_and_update(loss)
        summary = {"loss": loss.item()}
        summary.update({name: float(value) for name, value in terms.items()})
        summary["acc"] = compute_accuracy(logits, labels)[0].item()
        if (self.batch_idx + 1) == self.num_batches:
            self.update_lr()
        return summary
