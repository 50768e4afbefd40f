"""The prompt-tuning family: TPT's test-time episodes on a prompted CLIP (TPT, NeurIPS 2022).

Per test image, the prompt of TRAINER.TPT.PROMPT's model (CoOp's context, a trained CoCoOp's
image context or a trained MaPLe's prompts; ``PROMPTS``) takes AdamW steps on the entropy of the
averaged prediction of its most confident views, then predicts the test view and is reset
(``PromptTuning``); ``PromptTuningTrainer`` runs these episodes as a test-time trainer, its node
``TRAINER.TPT`` holding the episode's keys and the prompt. Introduced by TPT (``trainers/tpt.py``,
whose docstring gives the steps); PromptAlign adds its distribution alignment to the episode's
objective.
"""
import torch
import torch.nn.functional as F
from yacs.config import CfgNode as CN

from vlprompt.clip.deep_prompts import check_prompt_depth, tower_depths
from vlprompt.config import check_choice, register_cfg_extension
from vlprompt.engine.test_time import (
    TestTimeTrainer, add_episode_keys, average_prediction_entropy, episode_optimizer, select_confident,
)
from vlprompt.methods.conditional_context import CoCoOpCLIP
from vlprompt.methods.coupled_prompts import MaPLeCLIP
from vlprompt.methods.text_context import CoOpCLIP

__all__ = ["PROMPTS", "SOURCE_TRAINERS", "add_tpt_config", "PromptTuning", "PromptTuningTrainer"]


# prompt -> (model class, its config node, the registered name of the source run's checkpoint)
PROMPTS = {
    "coop": (CoOpCLIP, "COOP", "prompt_learner"),
    "cocoop": (CoCoOpCLIP, "COCOOP", "prompt_learner"),
    "maple": (MaPLeCLIP, "MAPLE", "MultiModalPromptLearner"),
}


# prompt -> the trainer whose runs --model-dir names (the source model)
SOURCE_TRAINERS = {"coop": "CoOp", "cocoop": "CoCoOp", "maple": "MaPLe"}


@register_cfg_extension
def add_tpt_config(cfg):
    node = cfg.TRAINER.TPT = CN()
    node.PREC = "fp16"  # autocast of the forward passes, fp32 prompts
    node.PROMPT = "coop"  # the tuned prompt: coop, cocoop or maple (model config in TRAINER.COOP/COCOOP/MAPLE)
    add_episode_keys(node, steps=1, lr=5e-3)


class PromptTuning:
    """TPT's episodes on a prompted CLIP, independent of the trainer (the official comparison runs it too).

    Args:
        model: CoOpCLIP, CoCoOpCLIP or MaPLeCLIP with every parameter frozen (the tuned ones are
            switched on during an episode).
        prompt: "coop", "cocoop" or "maple" (module docstring).
        node: the episode keys (SELECTION, STEPS, LR, WEIGHT_DECAY).
        autocast: factory of the forward passes' autocast context.
        grad_scaling: step through a gradient scaler made for each episode (fp16).

    Attributes:
        start: the prompt learner's state every episode starts from (``snapshot()``).
        last: of the last episode, "kept" (indices of the kept views, most confident first),
            "loss" (the objective at the first step) and "tuned" ({name: value after the steps}).
    """

    def __init__(self, model, prompt, node, autocast, grad_scaling=False):
        self.model, self.prompt, self.node = model, prompt, node
        self.autocast, self.grad_scaling = autocast, grad_scaling
        self.start, self.last = None, {}

    def snapshot(self):
        """Every episode starts from the current prompt learner (its init, or the source run's)."""
        self.start = {name: value.clone() for name, value in self.model.prompt_learner.state_dict().items()}

    def __call__(self, views):
        """Logits [K] of views[0] after one episode on views [V, 3, H, W]."""
        episode = {"coop": self.coop_episode, "cocoop": self.cocoop_episode, "maple": self.maple_episode}
        return episode[self.prompt](views)

    def episode_loss(self, logits):
        """TPT's objective on the kept views' logits [V', K]: the entropy of their averaged probability."""
        return average_prediction_entropy(logits.float())

    def tune(self, params, logits_of):
        """STEPS AdamW steps on ``params``, minimising ``episode_loss`` of the kept views.

        Args:
            params: {name: tensor tuned (a leaf with requires_grad)}.
            logits_of: kept -> logits [V', K] of the kept views (kept None: of every view, to select
                them at the first step; logits without gradient there make the kept views scored again).
        """
        optimizer = episode_optimizer(list(params.values()), self.node)
        device_type = next(iter(params.values())).device.type
        scaler = torch.amp.GradScaler(device_type, init_scale=1000.0) if self.grad_scaling else None
        kept, first_loss = None, None
        for _ in range(self.node.STEPS):
            with torch.enable_grad():
                if kept is None:
                    logits = logits_of(None)
                    kept = select_confident(logits, self.node.SELECTION)
                    logits = logits[kept] if logits.requires_grad else logits_of(kept)
                else:
                    logits = logits_of(kept)
                loss = self.episode_loss(logits)
                optimizer.zero_grad()
                if scaler is None:
                    loss.backward()
                    optimizer.step()
                else:
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
            first_loss = loss.detach() if first_loss is None else first_loss
        self.last = {"kept": kept, "loss": first_loss,
                     "tuned": {name: value.detach().clone() for name, value in params.items()}}

    def text_features(self):
        """Normalised class text features [C, E] of the current prompt (never the evaluation cache)."""
        return F.normalize(self.model.compute_text_features(), dim=-1)

    def coop_episode(self, views):
        model, prompts = self.model, self.model.prompt_learner
        prompts.load_state_dict(self.start)
        with self.autocast():
            features = F.normalize(model.unnormalised_image_features(views), dim=-1)  # frozen tower: once
        ctx = prompts.ctx.requires_grad_(True)

        def logits_of(kept):
            with self.autocast():
                return model.cosine_logits(features if kept is None else features[kept], self.text_features())

        self.tune({"prompt_learner.ctx": ctx}, logits_of)
        with self.autocast():
            logits = model.cosine_logits(features[:1], self.text_features())[0]
        ctx.requires_grad_(False)
        prompts.load_state_dict(self.start)
        return logits

    def cocoop_episode(self, views):
        model, prompts = self.model, self.model.prompt_learner
        with self.autocast():
            raw = model.clip.encode_image(views)
            context = prompts.conditioned(raw[:1])[0]  # ctx + π(f_0), f_0 unnormalised as upstream: [n, D]
        features = F.normalize(raw, dim=-1)
        context = context.float().clone().requires_grad_(True)
        classes = torch.arange(prompts.num_classes, device=views.device)

        def text_features():
            contexts = context.unsqueeze(0).expand(len(classes), -1, -1)
            return F.normalize(model.encode_pairs(contexts, classes), dim=-1)

        def logits_of(kept):
            with self.autocast():
                return model.cosine_logits(features if kept is None else features[kept], text_features())

        self.tune({"context": context}, logits_of)
        with self.autocast():
            return model.cosine_logits(features[:1], text_features())[0]

    def maple_episode(self, views):
        model, prompts = self.model, self.model.prompt_learner
        prompts.load_state_dict(self.start)
        tuned = {f"prompt_learner.{name}": parameter.requires_grad_(True)
                 for name, parameter in prompts.named_parameters()}

        def logits_of(kept):
            if kept is None:  # the selection pass: every view, no gradient
                with torch.no_grad(), self.autocast():
                    return model.cosine_logits(model.image_features(views), self.text_features())
            with self.autocast():
                return model.cosine_logits(model.image_features(views[kept]), self.text_features())

        self.tune(tuned, logits_of)
        with self.autocast():
            logits = model.cosine_logits(model.image_features(views[:1]), self.text_features())[0]
        for parameter in tuned.values():
            parameter.requires_grad_(False)
        prompts.load_state_dict(self.start)
        return logits


class PromptTuningTrainer(TestTimeTrainer):
    """TPT's trainer: test-time prompt tuning of TRAINER.TPT.PROMPT's model (``PromptTuning``
    episodes); the source model (``--model-dir``) is registered as its trainer does."""

    episode_node = "TPT"

    def check_cfg(self, cfg):
        node = cfg.TRAINER.TPT
        check_choice("TRAINER.TPT.PROMPT", node.PROMPT, list(PROMPTS))
        backbone = cfg.MODEL.BACKBONE.NAME
        if node.PROMPT == "maple" and backbone and tower_depths(backbone)[0] == 0:
            # MaPLe's prompts enter the image tower: one the runner does not drive (a ResNet) takes none
            check_prompt_depth("TRAINER.MAPLE.PROMPT_DEPTH", cfg.TRAINER.MAPLE.PROMPT_DEPTH, 0, 1, "image", backbone)
        super().check_cfg(cfg)

    @classmethod
    def source_trainers(cls, cfg):
        """The source model of TRAINER.TPT.PROMPT's trainer (None for an unknown PROMPT, which
        check_cfg refuses)."""
        source = SOURCE_TRAINERS.get(cfg.TRAINER.TPT.PROMPT)
        return None if source is None else (source,)

    def build_model(self):
        node = self.cfg.TRAINER.TPT
        model_class, node_name, checkpoint_name = PROMPTS[node.PROMPT]
        clip, tokenizer = self.build_clip()
        self.model = model_class(clip, tokenizer, self.classnames, self.cfg.TRAINER[node_name]).to(self.device).eval()
        for parameter in self.model.parameters():
            parameter.requires_grad_(False)
        registered = self.model if node_name == "MAPLE" else self.model.prompt_learner
        self.register_model(checkpoint_name, registered)
        self.tuning = PromptTuning(self.model, node.PROMPT, node, self.autocast, grad_scaling=self.amp.scaler is not None)

    def get_class_dependent_keys(self, name):
        # The source run's class embeddings belong to its classes, not to the target's.
        prefix = "prompt_learner." if self.cfg.TRAINER.TPT.PROMPT == "maple" else ""
        return [f"{prefix}token_prefix", f"{prefix}token_suffix"]

    def start_episodes(self):
        if self.cfg.TRAINER.TPT.PROMPT != "coop" and not self.run_info.get("model_dir"):
            print(f"Warning: TRAINER.TPT.PROMPT {self.cfg.TRAINER.TPT.PROMPT} tunes a trained model's prompt, "
                  "but no --model-dir was given: the episodes start from an untrained prompt learner")
        self.tuning.snapshot()

    def adapt_and_predict(self, views):
        return self.tuning(views)

    def episode_learnable(self):
        """The tuned prompt's values: the context (CoCoOp: the image's context, of the context's shape)
        or every prompt-learner parameter (MaPLe)."""
        prompts = self.model.prompt_learner
        if self.cfg.TRAINER.TPT.PROMPT == "maple":
            return sum(parameter.numel() for parameter in prompts.parameters())
        return prompts.ctx.numel()
