"""Our trainers' models against the recorded outputs of their official code (tests/fixtures/official/).

Each fixture was written by tools/official_equivalence.py (vlprompt_app.fidelity), which ran the
official repository (commit in the fixture) on a seeded random CLIP (ViT-B/16's towers at a 64 px
input), seeded learnable values (10x the official init std) and a seeded batch. For every fixture, our side is built once
from the same seeds (``Comparison``) and must give the recorded outputs within the contract's
relative max difference (3e-3); every misplacement its method's spec declares (``Mutation``: values
in the wrong place, a component one block off, another template...) must make the comparison fail;
the recorded values run again must give our first outputs.
"""
import pytest
import torch

from vlprompt_app.fidelity.harness import Comparison, load_fixture, relative_max_difference
from vlprompt_app.fidelity.methods import FIXTURES
from vlprompt_app.fidelity.spec import DEFAULT_BACKBONE, TOLERANCE, Mutation
from vlprompt_app.fidelity.weights import backbone_and_size, release_seeded_clips, seeded_clip

# The recorded runs: {fixture: (official commit, Dassl commit or None)}.
COMMITS = {
    "atprompt": ("86980a10", "86980a10"), "atprompt-maple": ("86980a10", "86980a10"),
    "coop": ("ff61507c", "c61a1b57"), "dept-coop": ("d4ff4168", "c61a1b57"), "dept-maple": ("d4ff4168", "c61a1b57"),
    "flyp": ("215d5bb6", None), "maple": ("d4ff4168", "c61a1b57"), "mma": ("547ee345", "c61a1b57"),
    "mma-scale0.1": ("547ee345", "c61a1b57"),
    "mmrl": ("27d8821f", "c61a1b57"), "mmrlpp": ("27d8821f", "c61a1b57"), "prograd": ("1b762036", "1b762036"),
    "promptalign": ("92905642", "c61a1b57"), "promptkd": ("ec244f78", "ec244f78"), "provp": ("837b8fb3", "837b8fb3"),
    "skiptuning": ("8c4636ed", "c61a1b57"), "tac": ("914c3067", "c61a1b57"), "tcp": ("bd97bec6", "c61a1b57"),
    "tpt": ("63ecbace", "c61a1b57"), "tpt-cocoop": ("63ecbace", "c61a1b57"), "wiseft": ("58b7a4b3", None),
}
# The number of mapped learnable values of each fixture.
MAPPED = {
    "coop": 1, "prograd": 1, "tcp": 1 + 4, "mma": 8 * (2 * 4 + 2), "mma-scale0.1": 8 * (2 * 4 + 2),
    "maple": 1 + 2 * 9 + 8,  # T_1, F_1..F_9 (weight, bias), T_2..T_9
    "atprompt": 3, "atprompt-maple": 3 + 2 * 9 + 8,
    "dept-maple": 1 + 2 * 9 + 8 + 4 + 2, "dept-coop": 1 + 4 + 2,  # the base's prompts, FiLM γ/β x2, head
    "mmrl": 2 + 2 * 7 * 2, "mmrlpp": 3 + 2 * (1 + 7 * 3),
    "promptalign": 1 + 2 * 3 + 2,  # T_1, F_1..F_3 (weight, bias), T_2, T_3
    "promptkd": 9 + 6 + 1 + 8 + 9,  # student V_1..V_9, projector, teacher T_1..T_9, V_1..V_9
    "provp": 1, "skiptuning": 0, "tac": 1 + 4 + 11 + 12,  # T_1, the two maps, T_2..T_12, V_1..V_12
    "flyp": 1, "tpt": 1, "tpt-cocoop": 5, "wiseft": 0,
}
# Mapping entries that name the official parameter of a value explicitly.
MAPPING_ENTRIES = {
    "atprompt": {"attributes.soft.0": "prompt_learner.ctx_att1", "attributes.soft.1": "prompt_learner.ctx_att2",
                 "base.prompt_learner.ctx": "prompt_learner.ctx"},
    "atprompt-maple": {"attributes.soft.0": "prompt_learner.ctx_att1", "attributes.soft.1": "prompt_learner.ctx_att2",
                       "base.prompt_learner.ctx": "prompt_learner.ctx"},
    "maple": {"prompt_learner.proj.weight": "prompt_learner.proj.weight"},
    "dept-maple": {"film_image.shift": "film_lp_img.bias", "head.weight": "linear_probe_proj.weight",
                   "base.prompt_learner.ctx": "prompt_learner.ctx",
                   "base.prompt_learner.compound_prompt_projections.7.bias":
                       "prompt_learner.compound_prompt_projections.7.bias"},
    "dept-coop": {"film_image.shift": "film_lp_img.bias", "head.weight": "linear_probe_proj.weight",
                  "base.prompt_learner.ctx": "prompt_learner.ctx"},
    "mmrl": {"representation.rep": "representation_learner.compound_rep_tokens",
             "representation.visual.6.bias": "representation_learner.compound_rep_tokens_r2vproj.6.bias",
             "representation.text.3.weight": "representation_learner.compound_rep_tokens_r2tproj.3.weight",
             "representation.proj_rep": "image_encoder.proj_rep"},
    "mmrlpp": {"representation.rep": "representation_learner.compound_rep_tokens",
               "representation.visual.residuals.4.a": "representation_learner.srra_r2vproj.srra.4.A",
               "representation.text.bias.2": "representation_learner.srra_r2tproj.srra.2.bias",
               "representation.proj_residual.b": "image_encoder.B"},
    "promptkd": {"student.projector.0.weight": "student.VPT_image_trans.conv1.0.weight"},
    "tac": {"text_map.weight": "VPT_topk_t.weight", "vision_prompts.0": "image_encoder.VPT"},
    "provp": {"prompt_learner.prompt_embeddings": "prompt_learner.prompt_embeddings"},
    "flyp": {"clip.logit_scale": "logit_scale"},
}
STEMS = sorted(FIXTURES)
MATCHES = "matches the official outputs"
_BUILT = {}


def comparison_of(stem):
    """Our side of one fixture, built once for all of its cases: the cases run fixture by fixture, and
    only the current fixture's model is kept (a ViT-B/16 each, at 64 px)."""
    if stem not in _BUILT:
        _BUILT.clear()
        _BUILT[stem] = Comparison(stem)
    return _BUILT[stem]


@pytest.fixture(scope="module", autouse=True)
def release_models():
    """After this module, the last fixture's model and the seeded CLIPs are dropped (they hold GBs)."""
    yield
    _BUILT.clear()
    release_seeded_clips()


def check_matches(comparison):
    assert comparison.labels.tolist() == comparison.fixture["labels"]
    for key, difference in comparison.differences(comparison.outputs).items():  # also fails on another shape
        assert difference <= TOLERANCE, key
    for key in comparison.spec.exact_outputs:
        assert comparison.outputs[key].tolist() == comparison.fixture["official_outputs"][key], key


def check_mutation_fails(comparison, mutation):
    ours = comparison.run(mutation)
    failed = {key: value > mutation.threshold for key, value in comparison.differences(ours, mutation.fails).items()}
    assert (any if mutation.any_fails else all)(failed.values()), failed
    for key, difference in comparison.differences(ours, mutation.still_match).items() if mutation.still_match else ():
        assert difference <= TOLERANCE, key
    for key in mutation.unchanged:
        torch.testing.assert_close(ours[key], comparison.outputs[key])


# --------------------------------------------------------------------------- what else a fixture shows

def prograd_batch_exercises_the_projection(comparison):
    """The fixture's batch has conflicting CE and KL gradients, so the compared update is not the CE gradient."""
    official = comparison.fixture["official_outputs"]["ctx_update"]
    assert relative_max_difference(comparison.outputs["ctx_grad_ce"], official) > 0.1


def dept_values_away_from_their_init_and_fusion_the_weighted_sum(comparison):
    learnables, outputs = comparison.learnables, comparison.outputs
    for name in ("film_image.scale", "film_text.scale"):
        assert (learnables[name] - 1.0).abs().max() > 0.05, name
    for name in ("film_image.shift", "film_text.shift", "head.bias", "base.prompt_learner.ctx"):
        assert learnables[name].abs().max() > 0.05, name
    fused = 0.3 * outputs["logits"] + 0.7 * outputs["head_logits"]
    assert relative_max_difference(outputs["fused_logits"], fused) < 1e-6


def mmrl_fusion_the_weighted_sum_and_values_drawn_on_their_own(comparison):
    outputs, learnables = comparison.outputs, comparison.learnables
    fused = 0.7 * outputs["cls_logits"] + 0.3 * outputs["rep_logits"]
    assert relative_max_difference(outputs["logits"], fused) < 1e-6
    for tower in ("visual", "text"):
        if comparison.spec.name == "MMRL":
            weights = [learnables[f"representation.{tower}.{i}.weight"] for i in range(7)]
            assert all(not torch.equal(weights[0], other) for other in weights[1:])  # upstream's copies start equal
        else:
            for i in range(7):
                assert learnables[f"representation.{tower}.residuals.{i}.b"].abs().max() > 0.05  # zero at init
    if comparison.spec.name == "MMRLpp":
        assert learnables["representation.proj_residual.b"].abs().max() > 0.05


# Checks of what else a fixture's run shows, {fixture: [check(comparison)]}.
EXTRA_CHECKS = {
    "prograd": [prograd_batch_exercises_the_projection],
    "dept-maple": [dept_values_away_from_their_init_and_fusion_the_weighted_sum],
    "dept-coop": [dept_values_away_from_their_init_and_fusion_the_weighted_sum],
    "mmrl": [mmrl_fusion_the_weighted_sum_and_values_drawn_on_their_own],
    "mmrlpp": [mmrl_fusion_the_weighted_sum_and_values_drawn_on_their_own],
}


def runs_again_as_recorded(comparison):
    """The recorded values run again (after the fixture's misplacements, in a file's order) give our
    first run's outputs: a run leaves nothing (statistics updated in training mode, features cached
    from other values) that the next run starts from, so a misplacement fails by what it misplaces."""
    spec = comparison.spec
    again = Mutation("the recorded values again", fails=(),
                     unchanged=tuple(key for key in spec.outputs if key not in spec.on_demand_outputs))
    ours = comparison.run(again)
    for key in again.unchanged:
        torch.testing.assert_close(ours[key], comparison.outputs[key], msg=lambda message: f"{key}: {message}")


def checks_of(stem):
    """What else the cases of fixture ``stem`` check, after its misplacements."""
    return [*EXTRA_CHECKS.get(stem, ()), runs_again_as_recorded]


CASES = [(stem, case) for stem in STEMS for case in (
    MATCHES, *(mutation.name for mutation in FIXTURES[stem].mutations),
    *(check.__name__ for check in checks_of(stem)))]


@pytest.mark.parametrize("stem, case", CASES, ids=[f"{stem}: {case}" for stem, case in CASES])
def test_against_the_official_fixture(stem, case):
    """Our outputs match the fixture's official ones; each declared misplacement fails (case = its name)."""
    comparison = comparison_of(stem)
    if case == MATCHES:
        check_matches(comparison)
        return
    mutation = next((m for m in comparison.spec.mutations if m.name == case), None)
    if mutation is not None:
        check_mutation_fails(comparison, mutation)
        return
    next(check for check in checks_of(stem) if check.__name__ == case)(comparison)


@pytest.mark.parametrize("stem", STEMS)
def test_fixture_records_the_official_run(stem):
    fixture, spec = load_fixture(stem), FIXTURES[stem]
    assert fixture["method"] == spec.name and fixture["official_repository"] == spec.repository
    commit, dassl = COMMITS[stem]
    assert len(fixture["official_commit"]) == 40 and fixture["official_commit"].startswith(commit)
    assert (fixture.get("dassl_commit") or "")[:8] == (dassl or "")
    assert fixture["seeds"] == dict(spec.seeds) and fixture["batch"] == spec.batch
    assert fixture["backbone"] == DEFAULT_BACKBONE
    assert set(fixture["official_outputs"]) == set(spec.outputs)
    assert all(value <= TOLERANCE for value in fixture["relative_max_difference"].values())
    mapping = fixture.get("parameter_mapping", {})
    assert mapping == spec.parameter_mapping() and len(mapping) == MAPPED[stem]
    assert MAPPING_ENTRIES.get(stem, {}).items() <= mapping.items()


def test_every_fixture_is_listed():
    assert set(COMMITS) == set(MAPPED) == set(FIXTURES)


def test_a_backbone_at_another_input_size_is_openais_spelling_of_it():
    assert backbone_and_size("ViT-B/16@64px") == ("ViT-B/16", 64)
    assert backbone_and_size("ViT-L/14@336px") == ("ViT-L/14@336px", None)  # OpenAI's own model
    assert backbone_and_size("ViT-B/16") == ("ViT-B/16", None)
    assert backbone_and_size("configs/clip/tiny.json") == ("configs/clip/tiny.json", None)


def test_a_shared_seeded_clip_reads_the_draw_and_a_write_into_it_is_refused(tiny_clip_files):
    """seeded_clip(shared=True): the draw's values in modules and parameters of the caller's own (its
    requires_grad flags, a swapped-in tensor stay its own); a write into the shared weights in place makes
    the next call raise, and the call after it draws again."""
    config = tiny_clip_files[0]
    release_seeded_clips()
    try:
        private, shared, other = seeded_clip(config, 3), seeded_clip(config, 3, shared=True), seeded_clip(config, 3, shared=True)
        first = dict(private.named_parameters())
        for name, parameter in shared.named_parameters():
            assert torch.equal(parameter, first[name]) and parameter is not dict(other.named_parameters())[name]
        shared.requires_grad_(True)
        assert not any(parameter.requires_grad for parameter in other.parameters())
        scale = shared.logit_scale
        torch.utils.swap_tensors(scale, torch.nn.Parameter(scale.detach().clone()))
        with torch.no_grad():
            scale.add_(1.0)  # memory of its own: the draw is unchanged
        assert torch.equal(seeded_clip(config, 3, shared=True).logit_scale, private.logit_scale)
        with torch.no_grad():
            shared.visual.conv1.weight.mul_(2.0)
        with pytest.raises(RuntimeError, match=r"was written in place by a model that shares its weights"):
            seeded_clip(config, 3)
        assert torch.equal(seeded_clip(config, 3).visual.conv1.weight, private.visual.conv1.weight)  # drawn again
    finally:
        release_seeded_clips()


def test_only_random_weights_take_another_input_size(tiny_clip_files):
    from vlprompt.clip import load_clip
    from vlprompt.clip.loading import CLIPLoadError

    config, weights = tiny_clip_files
    model, _ = load_clip(config, "random", image_size=48)
    assert tuple(model.visual.image_size) == (48, 48)
    with pytest.raises(CLIPLoadError, match=r"An image size \(48\) is only chosen for random weights"):
        load_clip(config, weights, image_size=48)


def test_relative_max_difference_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="Shapes differ"):
        relative_max_difference([[1.0, 2.0]], [[1.0], [2.0]])


def test_dept_coop_runs_coop_with_sixteen_shared_random_context_vectors():
    fixture = load_fixture("dept-coop")
    assert fixture["official_cfg"]["TRAINER.COOP"] == fixture["our_node"]
    node = fixture["our_node"]
    assert (node["N_CTX"], node["CSC"], node["CTX_INIT"]) == (16, False, "")


def test_provp_official_loss_is_ce_plus_the_re_formation_term():
    official = load_fixture("provp")["official_outputs"]
    assert official["loss"] == pytest.approx(official["xe_loss"] + official["ref_loss"], rel=1e-6)  # λ = 1


def test_promptkd_agrees_far_below_what_the_teacher_vision_mutation_moves():
    """The teacher-vision misplacement is caught at 1e-4 because the recorded agreement is below 1e-5."""
    assert load_fixture("promptkd")["relative_max_difference"]["teacher_logits"] < 1e-5


def test_mma_at_scale_0_1_agrees_far_below_half_precision_rounding():
    """At ADAPTER_SCALE 0.1 the fp32 sides agree below 1e-5, far below the ~1e-3 of fp16 rounding."""
    fixture = load_fixture("mma-scale0.1")
    assert fixture["our_node"]["ADAPTER_SCALE"] == fixture["official_cfg"]["TRAINER.MMADAPTER"]["ADAPTER_SCALE"] == 0.1
    assert fixture["relative_max_difference"]["logits"] < 1e-5


def test_fixture_settings_the_mutations_move_away_from():
    assert load_fixture("tcp")["our_node"]["INJECT_LAYER"] == 8
    mma = load_fixture("mma")["our_node"]
    assert (mma["ADAPTER_START"], mma["ADAPTER_END"]) == (5, 12)
    assert load_fixture("atprompt")["official_cfg"]["TRAINER.ATPROMPT"]["ATT_NUM"] == 2
    promptalign = load_fixture("promptalign")
    assert promptalign["batch"] == 4 + 8 and promptalign["our_node"]["ALIGN_LAYERS"] == [0, 1]
    assert load_fixture("skiptuning")["our_node"]["KEEP_MASK"] == [True, True, False]
    assert load_fixture("flyp")["our_node"]["ROW_TEMPLATES"] == [3, 41]
    assert load_fixture("wiseft")["our_node"]["ALPHA"] == 0.5
    for stem in ("tpt", "tpt-cocoop"):
        assert len(load_fixture(stem)["official_outputs"]["kept"]) == 6  # 10 % of 64 views


# --------------------------------------------------------------------------- runs kept by our side's towers

@pytest.fixture
def kept_runner(tiny_clip_files):
    """(a tiny CLIP's runner whose towers keep their runs, images [2, 3, 32, 32], token ids [2, L])."""
    from vlprompt.clip import CLIPRunner, Tokenizer, load_clip
    from vlprompt_app.fidelity.kept import keep_tower_runs

    config, weights = tiny_clip_files
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return keep_tower_runs(CLIPRunner(load_clip(config, weights)[0])), images, Tokenizer(config)(["a dog", "a cat"])


def hits_of(runner, encode):
    """(``encode()``, the number of kept runs it was given back)."""
    from vlprompt_app.fidelity.kept import kept_run_counts

    hits = kept_run_counts(runner)["hits"]
    result = encode()
    return result, kept_run_counts(runner)["hits"] - hits


def rerun(runner, encode):
    """(first, second result of ``encode()``, hits of the second run)."""
    return encode(), *hits_of(runner, encode)


def test_kept_runs_give_back_a_copy_of_an_equal_run_only(kept_runner):
    from vlprompt.clip import InsertTokens, Plan

    runner, images, ids = kept_runner
    first, second, hits = rerun(runner, lambda: runner.encode_image(images.clone()))  # equal, not the same tensor
    assert hits == 1 and torch.equal(first, second) and first is not second
    second.zero_()  # a caller changing what it got changes nothing kept
    assert torch.equal(runner.encode_image(images), first)
    assert rerun(runner, lambda: runner.encode_text(ids.clone()))[2] == 1
    tokens = torch.randn(2, runner.visual.width, generator=torch.Generator().manual_seed(1))
    plan = lambda tokens: Plan(embed=[InsertTokens(tokens)])  # noqa: E731
    prompted, again, hits = rerun(runner, lambda: runner.encode_image(images, plan(tokens.clone())))
    assert hits == 1 and torch.equal(prompted, again)
    moved = images.clone()
    moved[1, 2, 3, 4] += 1e-3
    other_tokens = tokens.clone()
    other_tokens[1, 5] += 1e-3
    for changed in (lambda: runner.encode_image(moved), lambda: runner.encode_image(images, plan(other_tokens))):
        assert rerun(runner, changed)[2] == 1  # computed (and kept) the first time: not the earlier run
    assert not torch.equal(runner.encode_image(moved), first)
    assert not torch.equal(runner.encode_image(images, plan(other_tokens)), prompted)
    hidden = runner.visual.run_prefix(images, 1)  # a run continued from block 1's input
    assert rerun(runner, lambda: runner.visual(hidden=hidden.clone(), start=1, rows=()).features)[2] == 1
    assert hits_of(runner, lambda: runner.visual(hidden=hidden, start=2, rows=()).features)[1] == 0


def test_kept_runs_are_run_again_after_a_change_of_the_tower(kept_runner):
    import copy

    from vlprompt.clip import MapTokens, Plan
    from vlprompt_app.fidelity.kept import kept_run_counts

    runner, images, _ = kept_runner
    first = runner.encode_image(images)
    copied = copy.deepcopy(runner)  # a copy starts with nothing kept and runs its own weights
    assert kept_run_counts(copied) == {"hits": 0, "misses": 0}
    with torch.no_grad():
        copied.visual.proj.mul_(2.0)
    torch.testing.assert_close(copied.encode_image(images), 2.0 * first)
    bias = runner.visual.ln_post.bias.detach().clone()
    with torch.no_grad():
        runner.visual.ln_post.bias.add_(0.5)  # an in-place write: a new version
    assert hits_of(runner, lambda: runner.encode_image(images))[1] == 0
    with torch.no_grad():
        runner.visual.ln_post.bias.copy_(bias)
    assert torch.equal(runner.encode_image(images), first)
    runner.visual.train()  # another module attribute
    assert hits_of(runner, lambda: runner.encode_image(images))[1] == 0
    runner.visual.eval()
    seen = []
    recording = Plan(embed=[MapTokens(lambda x: seen.append(1) or x)])
    assert rerun(runner, lambda: runner.encode_image(images, recording))[2] == 0 and len(seen) == 2
    handle = runner.visual.conv1.register_forward_hook(lambda *args: seen.append(1))
    assert rerun(runner, lambda: runner.encode_image(images))[2] == 0 and len(seen) == 4
    handle.remove()


def test_kept_runs_never_keep_a_run_that_needs_a_gradient(kept_runner):
    from vlprompt.clip import InsertTokens, Plan

    runner, images, _ = kept_runner
    tokens = torch.randn(2, runner.visual.width, requires_grad=True)
    first, second, hits = rerun(runner, lambda: runner.encode_image(images, Plan(embed=[InsertTokens(tokens)])))
    assert hits == 0 and first.requires_grad and second.requires_grad
    second.sum().backward()
    assert tokens.grad is not None and tokens.grad.abs().sum() > 0


def test_run_ours_asks_a_spec_with_on_demand_outputs_for_what_is_read():
    import dataclasses

    from torch import nn

    from vlprompt_app.fidelity.harness import run_ours
    from vlprompt_app.fidelity.spec import MethodSpec

    asked = []

    def run(model, node, images, labels, outputs):
        asked.append(outputs)
        return {"logits": images, **({"grad": 2 * images} if "grad" in outputs else {})}

    spec = MethodSpec(name="X", repository="x/y", run_ours=run, outputs=("logits", "grad"), on_demand_outputs=("grad",))
    model, images = nn.Linear(1, 1), torch.ones(1)
    assert set(run_ours(spec, model, None, {}, images, None)) == {"logits", "grad"}
    assert set(run_ours(spec, model, None, {}, images, None, outputs=("logits",))) == {"logits"}
    assert asked == [("logits", "grad"), ("logits",)]
    leaves_out = dataclasses.replace(spec, run_ours=lambda model, node, images, labels, outputs: {"logits": images})
    with pytest.raises(KeyError, match="grad"):
        run_ours(leaves_out, model, None, {}, images, None)
    assert Mutation("m", fails=("logits", "loss"), still_match=("loss", "x"), unchanged=("y",)).read == (
        "logits", "loss", "x", "y")
