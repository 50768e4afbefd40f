"""FLYP: the contrastive loss and the zero-shot head computed independently, the (image, template)
row sampler, what trains, the per-iteration schedule and a trainer run on a toy OxfordPets."""
import math

import pytest
import torch
import torch.nn.functional as F
from baseline_setup import runner_and_tokenizer, toy_pets_cfg

from trainers.flyp import CaptionRows, CaptionRowSampler, DistributedCaptionRowSampler, FLYPCLIP, contrastive_loss
from vlprompt.clip import fill_template
from vlprompt.config import ConfigError
from vlprompt.data.samplers import ResumableRandomSampler
from vlprompt.engine import build_trainer
from vlprompt.engine.distributed import DistributedContext
from vlprompt.testing import OXFORD_PETS_TOY_CLASSES, write_oxford_pets_tree
from vlprompt.utils import load_checkpoint

CLASSES = ["red star", "blue circle", "green square"]
TEMPLATES = ["a photo of a {}.", "a drawing of a {}.", "itap of a {}."]


def build(clip_files):
    clip, tokenizer = runner_and_tokenizer(clip_files)
    return FLYPCLIP(clip, tokenizer, CLASSES, TEMPLATES), tokenizer


def images(batch=4):
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def test_contrastive_loss_is_the_symmetric_cross_entropy_with_same_class_rows_as_negatives():
    generator = torch.Generator().manual_seed(0)
    f = F.normalize(torch.randn(3, 5, generator=generator), dim=-1)
    g = F.normalize(torch.randn(3, 5, generator=generator), dim=-1)
    g[1] = g[0]  # rows 0 and 1: the same caption (same class and template), still each other's negative
    scale = torch.tensor(7.5)
    loss, logits = contrastive_loss(f, g, scale)
    by_hand = 0.0
    for b in range(3):
        image_row = [scale * f[b] @ g[k] for k in range(3)]
        text_row = [scale * g[b] @ f[k] for k in range(3)]
        by_hand += -torch.log(torch.exp(image_row[b]) / sum(torch.exp(v) for v in image_row)) / 6
        by_hand += -torch.log(torch.exp(text_row[b]) / sum(torch.exp(v) for v in text_row)) / 6
    torch.testing.assert_close(loss, by_hand)
    torch.testing.assert_close(logits, scale * f @ g.t())


def test_the_loss_uses_each_rows_caption_and_the_learned_scale(tiny_clip_files):
    model, tokenizer = build(tiny_clip_files)
    with torch.no_grad():
        model.clip.logit_scale.fill_(2.0)
    labels, templates = torch.tensor([0, 0, 2, 1]), torch.tensor([1, 2, 0, 1])
    loss, logits, terms = model.loss(images(), labels, templates)
    captions = [fill_template(TEMPLATES[t], CLASSES[y]) for y, t in zip(labels.tolist(), templates.tolist())]
    with torch.no_grad():
        f = F.normalize(model.clip.encode_image_plain(images()), dim=-1)
        g = F.normalize(model.clip.encode_text(tokenizer(captions)), dim=-1)
    expected, _ = contrastive_loss(f, g, torch.tensor(2.0).exp())
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    assert logits.shape == (4, 4) and terms["scale"] == pytest.approx(math.exp(2.0))
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(p.requires_grad for p in model.parameters())
    for name in ("clip.logit_scale", "clip.text.token_embedding.weight", "clip.visual.proj"):
        assert grads[name] is not None and grads[name].abs().sum() > 0, name


def test_the_head_is_the_template_mean_rebuilt_from_the_current_text_tower(tiny_clip_files):
    model, tokenizer = build(tiny_clip_files)
    model.eval()

    def head_by_hand():
        with torch.no_grad():
            per_template = [F.normalize(model.clip.encode_text(tokenizer([fill_template(t, c) for c in CLASSES])), dim=-1)
                            for t in TEMPLATES]
            return F.normalize(torch.stack(per_template).mean(dim=0), dim=-1)

    with torch.no_grad(), model.evaluation():
        f = F.normalize(model.clip.encode_image_plain(images()), dim=-1)
        torch.testing.assert_close(model(images()), model.logit_scale * f @ head_by_hand().t(), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        model.clip.text.token_embedding.weight.mul_(1.5)
        model.clip.logit_scale.fill_(1.0)
    with torch.no_grad(), model.evaluation():  # the next evaluation sees the changed tower and scale
        torch.testing.assert_close(model(images()), torch.tensor(1.0).exp() * f @ head_by_hand().t(),
                                   rtol=1e-5, atol=1e-5)


def test_row_sampler_draws_n_distinct_rows_per_epoch_and_resumes():
    sampler = CaptionRowSampler(num_images=10, num_templates=4)
    torch.manual_seed(3)
    rows = list(sampler)
    assert len(rows) == len(sampler) == 10 and len(set(rows)) == 10 and all(0 <= r < 40 for r in rows)
    assert len({r // 4 for r in rows}) < 10 or len({r % 4 for r in rows}) > 1  # rows, not one caption per image
    state = sampler.state_dict()
    sampler.resume_epoch(state, skip=6)
    assert list(sampler) == rows[6:]
    # with one template: the engine's RandomSampler order for the same global generator state
    torch.manual_seed(5)
    single = list(CaptionRowSampler(num_images=10, num_templates=1))
    torch.manual_seed(5)
    assert single == list(ResumableRandomSampler(range(10)))


def test_distributed_row_sampler_gives_each_process_its_share_of_every_global_batch():
    """22 images x 3 templates, global batch 8: 2 steps; per process 4 (W = 2) or 8 (W = 1) rows."""
    def shares(world, epoch):
        samplers = [DistributedCaptionRowSampler(22, 3, 8 // world, DistributedContext(r, world, r), seed=1)
                    for r in range(world)]
        for sampler in samplers:
            sampler.set_epoch(epoch)
        return [list(sampler) for sampler in samplers]

    (alone,) = shares(1, epoch=0)
    first, second = shares(2, epoch=0)
    assert len(alone) == 16 and len(first) == len(second) == 8
    assert first[:4] + second[:4] + first[4:] + second[4:] == alone  # step i: rank 0's rows, then rank 1's
    rows = [row for row, _ in alone]
    assert len(set(rows)) == 16 and all(0 <= r < 66 for r in rows)
    seed = alone[0][1] - rows[0]
    assert all(item_seed == (seed + row) % 2**63 for row, item_seed in alone)  # one epoch seed + the row
    assert [row for row, _ in shares(1, epoch=1)[0]] != rows  # a new order every epoch


def test_caption_rows_map_a_row_to_its_image_and_template():
    rows = CaptionRows([{"label": 7, "index": 0}, {"label": 8, "index": 1}], num_templates=3)
    assert len(rows) == 6
    assert rows[5] == {"label": 8, "index": 1, "template": 2} and rows[1] == {"label": 7, "index": 0, "template": 1}


# ----------------------------------------------------------------------------- trainer

@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("flyp_data"))
    write_oxford_pets_tree(root, classes=OXFORD_PETS_TOY_CLASSES[:4], train=4, val=1, test=2)
    return root


def flyp_cfg(data_root, output_dir, clip_files, *opts):
    return toy_pets_cfg("FLYP", "FLYP/synthetic.yaml", data_root, output_dir, clip_files,
                        "DATALOADER.TRAIN_X.BATCH_SIZE", "4", "OPTIM.MAX_EPOCH", "1", "TRAINER.FLYP.WARMUP_ITERS", "2",
                        "TRAINER.FLYP.TEMPLATE_ENSEMBLE", "True", *opts)


def test_trainer_fine_tunes_every_weight_on_template_rows(data_root, tiny_clip_files, tmp_path):
    trainer = build_trainer(flyp_cfg(data_root, tmp_path, tiny_clip_files))
    assert len(trainer.templates) == 80 and trainer.model.token_ids.shape[:2] == (80, 4)
    assert len(trainer.train_loader_x) == 4  # the image loader's length: 16 images / batch 4
    batch = next(iter(trainer.train_loader_x))
    assert batch["template"].shape == (4,) and int(batch["template"].max()) < 80
    before = {name: value.clone() for name, value in trainer.model.state_dict().items()}
    lrs, step = [], trainer.forward_backward

    def recording_step(batch):
        lrs.append(trainer.get_current_lr())
        return step(batch)

    trainer.forward_backward = recording_step
    trainer.train()
    # 4 iterations: 2 of linear warm-up, then a cosine over the remaining 2
    assert lrs == pytest.approx([0.5e-4, 1e-4, 1e-4, 0.5e-4])
    saved = load_checkpoint(str(tmp_path / "FLYP" / "model.pth.tar-1"))["state_dict"]
    assert set(saved) == set(before) and "token_ids" not in saved
    for name in ("clip.logit_scale", "clip.text.token_embedding.weight", "clip.visual.proj"):
        assert not torch.equal(saved[name], before[name]), name


def test_epoch_warm_up_or_another_scheduler_is_refused(data_root, tiny_clip_files, tmp_path):
    with pytest.raises(ConfigError, match="WARMUP_ITERS"):
        build_trainer(flyp_cfg(data_root, tmp_path, tiny_clip_files, "OPTIM.WARMUP_EPOCH", "1"))
    with pytest.raises(ConfigError, match="cosine"):
        build_trainer(flyp_cfg(data_root, tmp_path, tiny_clip_files, "OPTIM.LR_SCHEDULER", "single_step"))
