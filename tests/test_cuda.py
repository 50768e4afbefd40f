"""On a CUDA GPU (skipped without one): trainers train under AMP on the device, and what they
write there loads on the CPU. Run by tools/gpu_acceptance.py with the other tests marked ``gpu``."""
import pytest
import torch

from vlprompt_app.benchmarking.trainer_cases import build_trainer, case_named, training_batch
from vlprompt_app.gpu_acceptance.parity import tiny_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SETTINGS = {"backbone": "configs/clip/tiny-synthetic-clip.json", "weights": "random", "image_size": 32, "batch": 4,
            "opts": [], "classes": 6}


def _case(name):
    return tiny_case(case_named(name))


def _batch(trainer, case, generator):
    images = torch.randn(4, 3, 32, 32, generator=generator).cuda()
    return training_batch(case, trainer, images, torch.arange(4).cuda() % SETTINGS["classes"])


@pytest.mark.parametrize("name", ["CoOp", "ProGrad", "MaPLe", "DeAR", "RAda", "CLIPAdapter", "PromptSRC", "TAC"])
def test_amp_steps_on_cuda_change_only_learnables_and_load_on_the_cpu(name, tmp_path):
    case = _case(name)
    trainer = build_trainer(case, dict(SETTINGS, device="cuda", prec="amp"), str(tmp_path / "cuda"))
    assert trainer.device.type == "cuda" and trainer.amp.scaler is not None
    before = {key: value.detach().clone() for key, value in trainer.model.named_parameters()}
    generator = torch.Generator().manual_seed(0)
    trainer.batch_idx, trainer.num_batches = 0, len(trainer.train_loader_x)
    for _ in range(2):
        trainer.set_model_mode("train")
        summary = trainer.forward_backward(_batch(trainer, case, generator))
        assert torch.isfinite(torch.as_tensor(summary["loss"]))
    changed = {key for key, value in trainer.model.named_parameters() if not torch.equal(value, before[key])}
    learnable = {key for key, value in trainer.model.named_parameters() if value.requires_grad}
    assert changed and changed <= learnable
    trainer.save_model(0, str(tmp_path / "run"))
    on_cpu = build_trainer(case, dict(SETTINGS, device="cpu", prec="fp32"), str(tmp_path / "cpu"))
    on_cpu.load_model(str(tmp_path / "run"), epoch=1)
    loaded = dict(on_cpu.model.named_parameters())
    for key in learnable:
        torch.testing.assert_close(loaded[key], trainer.model.state_dict()[key].cpu(), rtol=0, atol=0)
