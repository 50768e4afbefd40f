"""tools/benchmark.py official (vlprompt_app.fidelity.cost): the report's structure, and its ratios
computed from the two sides' measured figures (our side measured for real on a tiny CLIP, the
official side a stand-in result); no timing is asserted. Also the command lines of the harness."""
import dataclasses
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from yacs.config import CfgNode as CN

from vlprompt_app.commands import benchmark
from vlprompt_app.fidelity import cli
from vlprompt_app.fidelity import cost as official_benchmark
from vlprompt_app.fidelity.export import export
from vlprompt_app.fidelity.methods import METHODS
from vlprompt_app.fidelity.spec import CostSpec, MethodSpec
from vlprompt_app.fidelity.weights import write_weights

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A stand-in official result: its step 3x its frozen forward on the CPU clock, 5x on the wall clock.
OFFICIAL = {"train": {"wall": 0.5, "cpu": 0.6}, "frozen": {"wall": 0.1, "cpu": 0.2}, "learnable": 512,
            "peak_memory_mib": 800.0}


def inherited_pythonpath():
    """The entries of this process's PYTHONPATH, which a side's environment keeps after ours."""
    return [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]


@pytest.fixture
def official_git(tmp_path):
    """A git repository with one commit, exported in place of the official code."""
    repo = tmp_path / "official"
    repo.mkdir()
    (repo / "README").write_text("stand-in\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for command in (["init", "-q"], ["add", "README"], ["commit", "-q", "-m", "stand-in"]):
        subprocess.run(git + command, check=True)
    return str(repo)


def test_report_on_the_tiny_clip(tiny_clip_files, official_git, tmp_path, monkeypatch, capsys):
    config, _ = tiny_clip_files
    real_run_side, sides = official_benchmark.run_side, []

    def run_side(side, method, workdir, official_paths, clock, limit=None):
        sides.append((side, method, official_paths))
        return OFFICIAL if side == "official" else real_run_side(side, method, workdir, official_paths, clock)

    monkeypatch.setattr(official_benchmark, "run_side", run_side)
    path = tmp_path / "official.json"
    argv = ["official", "--methods", "CoOp", "--backbone", config, "--batch", "2", "--classes", "3", "--rounds", "1",
            "--warmup", "0", "--threads", "1", "--clock", "cpu", "--official-git", f"KaiyangZhou/CoOp={official_git}",
            "--dassl-git", official_git, "--json", str(path)]
    assert benchmark.main(argv) == 0
    printed = capsys.readouterr().out
    report = json.loads(path.read_text())
    assert report["benchmark"] == "official"
    assert report["settings"]["methods"] == ["CoOp"] and report["settings"]["image_size"] == 32
    assert [side for side, _, _ in sides] == ["ours", "official"]
    assert sides[0][2] == [] and len(sides[1][2]) == 2  # ours: no official tree; official: its tree and Dassl's
    env = official_benchmark.side_environment(sides[1][2])
    # the official trees first, ours next, then what the caller's PYTHONPATH holds
    assert env["PYTHONPATH"].split(os.pathsep) == [*sides[1][2], ROOT, *inherited_pythonpath()]
    commit = subprocess.run(["git", "-C", official_git, "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    record, = report["results"]
    assert record["case"] == "CoOp" and record["official_code"] == f"KaiyangZhou/CoOp@{commit[:8]}"
    assert record["ours_learnable"] == 16 * 32  # CoOp's 16 context vectors of the tiny text width
    assert record["ours_train_ms"] == record["ours_train_cpu_ms"] > 0
    assert record["ours_ratio"] == record["ours_train_cpu_ms"] / record["ours_frozen_cpu_ms"]
    assert record["official_ratio"] == pytest.approx(3.0)
    assert record["ours_over_official"] == record["ours_ratio"] / record["official_ratio"]
    assert record["ours_over_official_train_ms"] == record["ours_train_cpu_ms"] / 600.0
    assert record["over_contract"] == (record["ours_over_official"] > 0.5)
    assert record["batch"] == 2 and report["settings"]["batches"] == {"CoOp": 2}
    assert record["ours_peak_mib"] > 0  # our side's process measured its peak RSS over one step
    assert record["ours_over_official_peak"] == record["ours_peak_mib"] / 800.0
    assert "CoOp" in printed and official_benchmark.summary_lines(report)[0] in printed


@pytest.mark.parametrize("clock, ratio, over", [("cpu", 1 / 3, False), ("wall", 0.6, True)])
def test_record_compares_the_two_cost_ratios(clock, ratio, over):
    """Ours: step 1x its frozen forward on the CPU clock, 3x on the wall clock; the official 3x and 5x."""
    ours = {"train": {"wall": 0.3, "cpu": 0.25}, "frozen": {"wall": 0.1, "cpu": 0.25}, "learnable": 512,
            "peak_memory_mib": 300.0}
    record = official_benchmark.method_record("CoOp", "KaiyangZhou/CoOp@ff61507c", ours, OFFICIAL, clock)
    assert record["ours_over_official"] == pytest.approx(ratio)
    assert record["over_contract"] is over
    assert record["official_train_ms"] == 1000 * OFFICIAL["train"][clock]
    assert record["ours_over_official_peak"] == pytest.approx(0.375)
    row, = official_benchmark.table_rows([record])
    cells = dict(zip(official_benchmark.HEADERS, row))
    assert row[0] == "CoOp" and cells["train ms ours / official"] == f"{record['ours_over_official_train_ms']:.2f}"
    assert cells["> 0.5"] == ("yes" if over else "") and cells["peak ours / official"] == "0.38"


def test_recipe_batch_is_the_case_config_batch():
    """--batch 0 gives each method the batch of its recipe: CoOp's config trains at 32, MaPLe's, PromptSRC's
    and MMRL's at 4."""
    assert {method: official_benchmark.recipe_batch(method) for method in ("CoOp", "MaPLe", "PromptSRC", "MMRL")} == {
        "CoOp": 32, "MaPLe": 4, "PromptSRC": 4, "MMRL": 4}


def test_tool_names_what_is_missing(tmp_path, capsys):
    with pytest.raises(SystemExit, match="unknown method"):
        benchmark.main(["official", "--methods", "Foo"])
    with pytest.raises(SystemExit, match="need --official-git for KaiyangZhou/CoOp"):
        benchmark.main(["official", "--methods", "CoOp"])
    with pytest.raises(SystemExit, match="OWNER/NAME=PATH"):
        benchmark.main(["official", "--methods", "CoOp", "--official-git", str(tmp_path)])
    with pytest.raises(SystemExit, match="--dassl-git is needed"):
        benchmark.main(["official", "--methods", "CoOp", "--official-git", f"KaiyangZhou/CoOp={tmp_path}"])


def test_a_failed_side_is_a_row_and_the_exit_status(official_git, monkeypatch, capsys):
    """A side that fails is reported in its method's row (the others are still measured) and main returns 1."""
    def run_side(side, method, workdir, official_paths, clock, limit=None):
        raise official_benchmark.SideFailed(f"the {side} side of {method} failed (exit status 1): ...\ntraceback")

    monkeypatch.setattr(official_benchmark, "run_side", run_side)
    monkeypatch.setattr(official_benchmark, "write_weights", lambda backbone, seed, path: (32, 32))
    argv = ["official", "--methods", "CoOp", "MMA", "--official-git", f"KaiyangZhou/CoOp={official_git}",
            "--official-git", f"ZjjConan/Multi-Modal-Adapter={official_git}", "--dassl-git", official_git,
            "--batch", "1", "--classes", "2"]
    assert benchmark.main(argv) == 1
    printed = capsys.readouterr().out
    for method in ("CoOp", "MMA"):
        assert f"the ours side of {method} failed (exit status 1): ..." in printed
    assert "not measured (the row gives the error): CoOp, MMA" in printed


def test_a_side_past_its_limit_fails_naming_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(official_benchmark, "side_command", lambda argv: [sys.executable, "-c", "import time; "
                                                                          "time.sleep(30)"])
    with pytest.raises(official_benchmark.SideFailed, match="the ours side of CoOp did not finish within its limit "
                                                             "of 0.5 s"):
        official_benchmark.run_side("ours", "CoOp", str(tmp_path), [], "wall", limit=0.5)


def test_batches_are_what_the_loader_gives():
    """K_TRANSFORMS views (the same images) and "img0" with RETURN_IMG0, as a Dassl loader's batch."""
    images, labels = torch.randn(2, 3, 4, 4), torch.tensor([0, 1])
    plain = official_benchmark.loader_batch(images, labels, SimpleNamespace(K_TRANSFORMS=1, RETURN_IMG0=False))
    assert set(plain) == {"img", "label"} and plain["img"] is images and plain["label"] is labels
    views = official_benchmark.loader_batch(images, labels, SimpleNamespace(K_TRANSFORMS=4, RETURN_IMG0=True))
    assert len(views["img"]) == 4 and all(view is images for view in views["img"]) and views["img0"] is images


def test_official_train_cfg_sets_keys_and_new_nodes():
    cfg = CN({"OPTIM": CN({"LR": 0.1}), "TRAINER": CN({"X": CN({"A": 1})})})
    official_benchmark._set_official_train_cfg(cfg, {"OPTIM.LR": 0.5, "OPTIM.USE_REF": True, "LOSS": {"T": 2.0},
                                                     "TRAINER.X.A": 3})
    assert cfg.OPTIM.LR == 0.5 and cfg.OPTIM.USE_REF is True and cfg.TRAINER.X.A == 3
    assert isinstance(cfg.LOSS, CN) and cfg.LOSS.T == 2.0


def test_our_side_takes_the_spec_hooks_and_the_loader_batch(tiny_clip_files, tmp_path, monkeypatch):
    """``our_nodes`` over the case's config, ``our_after_build`` on the built trainer, and a step fed
    the batch a loader of that config gives (here 2 views and img0)."""
    config, _ = tiny_clip_files
    size, _ = write_weights(config, 0, str(tmp_path / "weights.pt"))
    images, labels = torch.randn(3, 3, size, size), torch.tensor([0, 1, 0])
    torch.save({"images": images, "labels": labels}, tmp_path / "inputs.pt")
    (tmp_path / "settings.json").write_text(json.dumps({"backbone": config, "threads": 1, "classes": 2, "rounds": 1,
                                                         "warmup": 0, "device": "cpu", "prec": "fp32"}))
    seen = {}

    def our_after_build(trainer):
        seen["views"] = trainer.cfg.DATALOADER.K_TRANSFORMS
        trainer.forward_backward = lambda batch: seen.setdefault("batch", batch)

    coop = METHODS["CoOp"]
    spec = dataclasses.replace(coop, cost=dataclasses.replace(
        coop.cost, our_after_build=our_after_build, our_nodes={"DATALOADER": {"K_TRANSFORMS": 2, "RETURN_IMG0": True}}))
    monkeypatch.setitem(METHODS, "CoOp", spec)
    monkeypatch.setattr(official_benchmark, "_timed", lambda frozen, train, settings, learnable, peak: train() or {})
    official_benchmark.our_side(str(tmp_path), "CoOp")
    assert seen["views"] == 2
    batch = seen["batch"]
    assert len(batch["img"]) == 2 and all(torch.equal(view, images) for view in batch["img"])
    assert torch.equal(batch["img0"], images) and torch.equal(batch["label"], labels)


def test_skip_tuning_benchmark_mask_keeps_the_expected_ranks():
    """Both sides' keep mask: the n_top first ranks and the mean number of tail ranks the drawn mask keeps."""
    from vlprompt_app.fidelity.methods.skip_tuning import NODE, benchmark_keep_mask
    from trainers.skip_tuning import keep_probabilities, num_top_classes

    for classes in (3, 10, 50, 120):
        top = num_top_classes(classes, NODE["TOP_RATIO"], NODE["MAX_TOP"])
        kept = top + round(float(keep_probabilities(classes, top, NODE["LAMBDA"])[top:].sum()))
        assert torch.equal(benchmark_keep_mask(classes), torch.arange(classes) < kept)
    assert int(benchmark_keep_mask(50).sum()) == 27 and benchmark_keep_mask(3).tolist() == [True, True, False]


def _side_workdir(tmp_path, config, size, views=None, method=None):
    """A side's working folder: settings, the seeded batch (and a test-time method's views)."""
    inputs = {"images": torch.randn(2, 3, size, size), "labels": torch.tensor([0, 1])}
    if views:
        inputs["views"] = torch.randn(views + 2, 3, size, size)  # more than the method's (the largest of a run)
    torch.save(inputs, tmp_path / "inputs.pt")
    (tmp_path / "settings.json").write_text(json.dumps({"backbone": config, "threads": 1, "classes": 3, "rounds": 1,
                                                         "warmup": 0, "device": "cpu", "prec": "fp32",
                                                         "classnames": ["a", "b", "c"],
                                                         "views": {method: views} if views else {}}))
    return inputs


def test_official_step_side_times_the_hook_step(tiny_clip_files, tmp_path, monkeypatch):
    """A spec's ``official_step_side`` gives the timed step and its optimizer; the learnable count is the
    optimizer's parameters that got a gradient; a test-time spec's step gets its ``views`` views."""
    config, _ = tiny_clip_files
    inputs = _side_workdir(tmp_path, config, 8, views=4, method="Episodic")
    seen = {}

    def official_step_side(request, weights_path, step_inputs):
        seen.update(request=request, weights=weights_path, images=step_inputs["images"])
        used, unused = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)  # unused: in the optimizer, never a gradient
        optimizer = torch.optim.AdamW(list(used.parameters()) + list(unused.parameters()))

        def step():
            optimizer.zero_grad()
            used(torch.ones(1, 3)).sum().backward()
            optimizer.step()
            seen["steps"] = seen.get("steps", 0) + 1

        return step, optimizer

    class PlainCLIP:
        def encode_image(self, images):
            seen["frozen"] = images

    spec = MethodSpec(name="Episodic", repository="x/y", dassl=False,
                      cost=CostSpec(step_side=official_step_side, views=4))
    monkeypatch.setitem(METHODS, "Episodic", spec)
    monkeypatch.setattr(official_benchmark, "_plain_official_clip", lambda official_clip, state_dict, spec: PlainCLIP())
    monkeypatch.setitem(sys.modules, "clip", SimpleNamespace(clip=None))  # the official tree's clip package
    # the stand-ins (an empty torch.utils.tensorboard, ...) are for the side's own process, not this one
    monkeypatch.setattr(official_benchmark, "install_stand_ins", lambda: seen.update(stand_ins=True))
    monkeypatch.setattr(official_benchmark.torch, "load", lambda path, weights_only: inputs if "inputs" in str(path)
                        else {})
    result = official_benchmark.official_side(str(tmp_path), "Episodic")
    assert result["learnable"] == 3 * 2 + 2 and seen["steps"] == 2  # the peak's step, then the timed round
    assert seen["request"] == {"method": "Episodic", "backbone": config, "classnames": ["a", "b", "c"]}
    assert seen["weights"] == str(tmp_path / "weights.pt")
    assert torch.equal(seen["images"], inputs["views"][:4]) and seen["frozen"] is seen["images"]
    assert set(result) == {"train", "frozen", "learnable", "peak_memory_mib"} and result["train"]["cpu"] > 0
    assert result["peak_memory_mib"] > 0
    assert spec.needs_dassl is False and seen["stand_ins"]


@pytest.mark.parametrize("method, views, learnable", [("TPT", 10, 4 * 32), ("LP", None, 3 * 32 + 3)])
def test_our_side_times_an_episode_or_a_cached_step(tiny_clip_files, tmp_path, monkeypatch, method, views, learnable):
    """TPT's step is one episode (adapt_and_predict) on the views, its count the tuned context (4 tokens of
    the tiny text width); LP's a step from the batch's cached features, its count the head [3, 32] + bias."""
    config, _ = tiny_clip_files
    size, _ = write_weights(config, 0, str(tmp_path / "weights.pt"))
    inputs = _side_workdir(tmp_path, config, size, views=views, method=method)
    steps = []

    def timed(frozen, train, settings, learnable, peak):
        train()
        steps.append(learnable)
        return {}

    monkeypatch.setattr(official_benchmark, "_timed", timed)
    if views:
        from trainers.tpt import TPT

        original = TPT.adapt_and_predict
        monkeypatch.setattr(TPT, "adapt_and_predict", lambda self, images: steps.append(images) or original(self, images))
    else:
        from trainers.lp import LP

        monkeypatch.setattr(LP, "forward_backward", lambda self, batch: steps.append(batch))
    official_benchmark.our_side(str(tmp_path), method)
    if views:
        assert torch.equal(steps[0], inputs["views"][:views])
    else:
        assert set(steps[0]) == {"features", "label"} and steps[0]["features"].shape == (2, 32)
    assert steps[-1] == learnable


def test_official_episode_resets_reloads_tunes_then_predicts_every_call():
    """The official per-image loop body (vlprompt_app/fidelity/methods/common.official_episode): every
    call starts from the reset prompts and the optimizer's initial state, whatever the previous
    episode left."""
    from vlprompt_app.fidelity.methods.common import official_episode

    class Prompted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ctx = torch.nn.Parameter(torch.ones(3))
            self.calls = []

        def reset(self):
            self.calls.append("reset")
            self.ctx.copy_(torch.ones(3))

        def forward(self, images):
            self.calls.append(("predict", images.shape[0]))
            return images.flatten(1)[:, :3] @ self.ctx

    def tune(model, views, optimizer, scaler, args):
        model.calls.append(("tune", len(optimizer.state), views.shape[0], args))
        optimizer.zero_grad()
        model(views).sum().backward()
        optimizer.step()

    model, views = Prompted(), torch.randn(8, 3, 2, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    episode = official_episode(model, tune, views, optimizer, None, "args")
    episode()
    first = model.ctx.detach().clone()
    episode()
    assert torch.equal(model.ctx, first) and not torch.equal(first, torch.ones(3))  # same step from the same start
    assert model.calls[:4] == ["reset", ("tune", 0, 8, "args"), ("predict", 8), ("predict", 1)]
    assert model.calls[4:] == model.calls[:4]  # the optimizer's moments were dropped before the second tuning


# --------------------------------------------------------------------------- the harness's command lines

def test_equivalence_tool_names_what_is_missing(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["Foo"])
    assert "unknown method 'Foo'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["CoOp", "--official-git", str(tmp_path)])
    assert "CoOp needs --official-git and --dassl-git" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="is not a git repository"):
        cli.main(["ProGrad", "--official-git", str(tmp_path)])
    with pytest.raises(SystemExit, match="only times its official step"):
        cli.main(["FT", "--official-git", str(tmp_path)])


def test_export_leaves_out_the_files_a_repository_copy_lacks(tmp_path, capsys):
    """A stored copy of zhengli97/ATPrompt lacks its large checkpoint files, which git archive
    refuses: HEAD is then exported file by file without them, named."""
    repo, target = tmp_path / "repo", tmp_path / "export"
    (repo / "trainers").mkdir(parents=True)
    (repo / "trainers" / "coop_atp.py").write_text("N_ATT = 2\n")
    (repo / "weights.pth").write_bytes(b"large")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for command in (["init", "-q"], ["add", "."], ["commit", "-qm", "c"]):
        subprocess.run(git + command, check=True)
    blob = subprocess.run(git + ["rev-parse", "HEAD:weights.pth"], check=True, capture_output=True, text=True).stdout
    os.remove(repo / ".git" / "objects" / blob[:2] / blob.strip()[2:])
    commit = export(str(repo), str(target))
    assert len(commit) == 40
    assert (target / "trainers" / "coop_atp.py").read_text() == "N_ATT = 2\n"
    assert not (target / "weights.pth").exists()
    assert "leaving out the files it lacks (1): weights.pth" in capsys.readouterr().out


def test_the_official_side_runs_as_a_module_on_the_official_trees(tmp_path):
    """``python -P -m vlprompt_app.fidelity.side``: the working folder is not on sys.path, the official
    trees come first and the repository last."""
    command = official_benchmark.side_command(["official", str(tmp_path), "CoOp"])
    assert command[1:4] == ["-P", "-m", "vlprompt_app.fidelity.side"]
    env = official_benchmark.side_environment([str(tmp_path / "official")])
    assert env["PYTHONPATH"] == os.pathsep.join([str(tmp_path / "official"), ROOT, *inherited_pythonpath()])
    done = subprocess.run(command[:4] + ["--help"], capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert done.returncode == 0 and "cost-official" in done.stdout, done.stderr
