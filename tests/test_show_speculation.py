"""`kiln show`'s speculation line: the configuration a recipe chose, visible."""

from __future__ import annotations

from kiln.commands.recipes.show import _speculation

DT = {"KILN_FEATURES": "draft-trunc", "KILN_DRAFT_TRUNC": "1"}


def test_no_speculation():
    assert _speculation(None, {}) == "none"


def test_fixed_k_without_draft_trunc():
    assert _speculation({"method": "mtp", "num_speculative_tokens": 3}, {}) == "mtp, 3 drafts"


def test_schedule_and_draft_trunc_with_depth():
    spec = {
        "method": "draft_model",
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 1, 4], [2, 4, 3], [5, 1024, 2]],
    }
    env = {**DT, "KILN_DRAFT_TRUNC_DRAFT_COST": "1:0.1", "KILN_DRAFT_TRUNC_DEPTH": "1"}
    assert _speculation(spec, env) == (
        "draft_model, drafts by batch size 1: 4, 2-4: 3, 5-1024: 2 (at most 4); "
        "draft-trunc: cost-aware, drafting priced, decides how far to draft"
    )


def test_draft_trunc_switched_off_or_fixed_tau():
    spec = {"method": "draft_model", "num_speculative_tokens": 4}
    assert _speculation(spec, {**DT, "KILN_DRAFT_TRUNC": "0"}) == "draft_model, 4 drafts"
    assert _speculation(spec, {"KILN_DRAFT_TRUNC": "1"}) == "draft_model, 4 drafts"  # feature not baked in
    assert _speculation(spec, {**DT, "KILN_DRAFT_TRUNC_TAU": "0.3"}).endswith("draft-trunc: fixed tau 0.3")


def test_adaptive_verification_and_its_calibration():
    spec = {"method": "draft_model", "num_speculative_tokens": 4, "enable_adaptive_verification": True}
    env = {**DT, "KILN_DRAFT_TRUNC_WITH_AV": "1", "KILN_DRAFT_TRUNC_AV_CALIBRATE": "1"}
    assert _speculation(spec, env) == (
        "draft_model, 4 drafts; vLLM adaptive verification; draft-trunc: cost-aware, calibrates adaptive verification"
    )


def test_a_flag_the_knob_refuses_counts_as_off_here():
    """`kiln show` reads flags with the engine knob's own parser; a value it refuses is
    the engine check's to name, not a switch turned on."""
    spec = {"method": "draft_model", "num_speculative_tokens": 4}
    assert (
        _speculation(spec, {**DT, "KILN_DRAFT_TRUNC_DEPTH": "maybe"})
        == "draft_model, 4 drafts; draft-trunc: cost-aware"
    )
    assert _speculation(spec, {**DT, "KILN_DRAFT_TRUNC_DEPTH": " On "}).endswith("decides how far to draft")


def test_served_names_each_run_newest_first_or_says_nothing_did():
    from kiln.commands.recipes.show import served

    assert served([]) == "nothing here has served this speculation configuration"
    runs = [
        {
            "by": "a GPU run",
            "date": "2026-11-01",
            "device": "H200",
            "configuration": "K 4",
            "result": "ok",
            "record": "x.json",
        },
        {
            "by": "the scale twin",
            "date": "2026-12-07",
            "device": "H100",
            "configuration": "GQA for MLA",
            "result": "lossless",
            "record": "y.json",
        },
    ]
    assert served(runs) == (
        "the scale twin, 2026-12-07, H100, GQA for MLA: lossless (y.json); "
        "a GPU run, 2026-11-01, H200, K 4: ok (x.json)"
    )


def test_every_recorded_run_points_at_a_record_in_the_checkout():
    from kiln.basics.paths import repo_root
    from kiln.domain.patching.series import load_recipe
    from kiln.domain.recipes.recipe import recipe_names

    records = [(name, run.record) for name in recipe_names() for run in load_recipe(name).recipe.served]
    assert ("glm53-kindling", "benchmarks/gpu_twin/results/gpu-twin-2026-12-07-glm53-kindling.json") in records
    for name, record in records:
        assert (repo_root() / record).is_file(), f"{name}: served.record {record} is not in the checkout"
