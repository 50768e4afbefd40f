"""WiSE-FT (Wortsman et al., CVPR 2022): the weight-space ensemble of a zero-shot and a fine-tuned
model (mlfoundations/wise-ft @ 58b7a4b3, src/wise_ft.py).

With θ_zs the zero-shot model (pretrained image encoder + zero-shot head, FT's model of
vlprompt/methods/zero_shot_head.py as built) and θ_ft a fine-tuned one, every trained weight (image encoder, head
weight and bias) is

    θ_α = (1 - α) θ_zs + α θ_ft,

and θ_α is evaluated like any FT model. Training a WiSEFT run is FT (same keys and recipe,
configs/trainers/WiSEFT), and its checkpoints hold θ_ft; every evaluation (the test after
training, and ``--eval-only`` runs on the OOD targets) evaluates the sweep ALPHAS (default 0, 0.1,
..., 1, as upstream's README), writes it to ``wiseft_alphas.json`` in the run folder (α and
accuracy of each point; ``tools/plot_results.py wiseft`` draws ID against OOD accuracy) and reports
α = ALPHA (0.5) last, so the run's result (results.json, the table row) is WiSE-FT at 0.5.
The fine-tuned end can be any FT-model run: ``--eval-only --model-dir`` a run folder of FT,
LPFT (stage 2) or L2SP (their checkpoint folder is used when the folder has no WiSEFT one); the
zero-shot end is always the model built from MODEL.BACKBONE and the head's templates.

Compared with the official code (tools/official_wiseft.py): upstream's ``_merge`` over wise-ft's
ImageClassifier state dicts and our ``interpolate`` give the same logits at α = 0.5 (fixture
tests/fixtures/official/wiseft.json).
"""
import torch
from yacs.config import CfgNode as CN

from vlprompt.config import ConfigError, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.engine.distributed import is_main_process
from vlprompt.engine.run_folder import RunFolder
from vlprompt.methods.zero_shot_head import ZeroShotHeadTrainer, add_ft_keys

FINE_TUNED_FOLDERS = ("FT", "LPFT", "L2SP")  # --model-dir folders of other FT-model trainers


@register_cfg_extension
def add_wiseft_config(cfg):
    node = cfg.TRAINER.WISEFT = CN()
    add_ft_keys(node)
    node.ALPHA = 0.5  # the mixing coefficient reported as the run's result
    node.ALPHAS = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]  # the sweep evaluated with it


def interpolate(theta_zs, theta_ft, alpha):
    """{name: (1 - alpha) * theta_zs[name] + alpha * theta_ft[name]} over the names of two state
    dicts with the same keys (ValueError otherwise)."""
    if set(theta_zs) != set(theta_ft):
        raise ValueError(f"The zero-shot and fine-tuned weights differ in their names: "
                         f"{sorted(set(theta_zs) ^ set(theta_ft))[:5]}")
    return {name: (1 - alpha) * theta_zs[name] + alpha * theta_ft[name] for name in theta_zs}


@TRAINER_REGISTRY.register()
class WiSEFT(ZeroShotHeadTrainer):
    """FT training; evaluation of the weight-space ensemble with the zero-shot model."""

    benchmark_cases = (Case("WiSEFT/vit_b16.yaml", TRAIN, opts=("TRAINER.WISEFT.TEMPLATE_ENSEMBLE", "False")),)

    node_name = "WISEFT"

    def check_cfg(self, cfg):
        super().check_cfg(cfg)
        node = cfg.TRAINER.WISEFT
        if not all(0.0 <= alpha <= 1.0 for alpha in [node.ALPHA, *node.ALPHAS]):
            raise ConfigError(f"TRAINER.WISEFT.ALPHA and ALPHAS must lie in [0, 1], got {node.ALPHA} and "
                              f"{list(node.ALPHAS)}.")

    def record_pretrained(self, model):
        self.zero_shot = {name: param.detach().to(self.device, copy=True)
                          for name, param in model.named_parameters() if param.requires_grad}

    def checkpoint_folder(self, directory, name):
        """WiSEFT's folder, else that of the one FT-model trainer whose run ``directory`` is."""
        run = RunFolder(directory)
        if run.model_dir(name).is_dir():
            return name
        found = [folder for folder in FINE_TUNED_FOLDERS if run.model_dir(folder).is_dir()]
        return found[0] if len(found) == 1 else name

    def test(self, split=None):
        """Evaluate θ_α for every α of ALPHAS, then ALPHA (returned and recorded last); the model
        holds θ_ft again afterwards."""
        node = self.node
        parameters = dict(self.model.named_parameters())
        fine_tuned = {name: parameters[name].detach().clone() for name in self.zero_shot}
        points = {}
        try:
            for alpha in [a for a in node.ALPHAS if a != node.ALPHA] + [node.ALPHA]:
                self.set_weights(interpolate(self.zero_shot, fine_tuned, alpha))
                print(f"WiSE-FT: alpha = {alpha}")
                points[alpha] = super().test(split)
                if alpha == node.ALPHA:
                    reported = self.last_test
        finally:
            self.set_weights(fine_tuned)
        self.last_test = reported
        self.save_sweep(points)
        return points[node.ALPHA]

    def set_weights(self, values):
        parameters = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in values.items():
                parameters[name].copy_(value)

    def save_sweep(self, points):
        if not is_main_process():
            return
        record = {"dataset": self.cfg.DATASET.NAME, "split": self.last_test["split"], "alpha": self.node.ALPHA,
                  "points": [{"alpha": alpha, "accuracy": points[alpha]} for alpha in sorted(points)]}
        RunFolder(self.output_dir).write_wiseft_sweep(record)

