"""The --budget plan (bertkit.train.recipe): what plan_recipe chooses for a few budgets, presets and shards, and
that a flag the user gives wins (command line -> PretrainConfig -> plan). Pure functions: no data, no training."""

from __future__ import annotations

import re

import pytest

from bertkit.commands.pretrain import config_from_argv
from bertkit.errors import ConfigError
from bertkit.train.recipe import (PLANNED, RecipePlan, apply_plan, given_settings, load_plan, plan_recipe)


def manifest(seq_len=64, mode="token", prob=0.4, dynamic=True, task="nsp", examples=17000, tokens=1_060_000):
    return {"seq_len": seq_len, "task": task, "counts": {"examples": examples, "tokens": tokens},
            "masking": {"mode": mode, "mask_prob": prob, "dynamic": dynamic, "max_predictions": None,
                        "mask_token_prob": 0.8, "random_token_prob": 0.1, "max_ngram": 3}}


def test_twelve_minutes_on_the_recipes_shards_is_the_measured_recipe():
    plan = plan_recipe(720, "mini", 0.25, manifest(), heldout_rows=2400)
    s = {k: c.value for k, c in plan.choices.items()}
    assert s["masking"] == "token" and s["mask_prob"] == 0.4
    assert s["batch_size"] == 16 and s["dropout"] == 0.0 and s["lr"] == 1e-3
    assert s["schedule"] == "wsd" and s["decay_fraction"] == 0.1
    assert plan.steps >= 2000 and s["warmup"] == 1000
    assert s["eval_batches"] == 64                                     # 64 x 16 x 64 = 65,536 held-out tokens
    assert 0 < plan.eval_s <= 0.1 * 720 and s["eval_every_steps"] == plan.steps // 10
    assert plan.steps == int((720 - plan.eval_s) / 0.25)
    assert plan.tokens == int(plan.steps * 16 * 1_060_000 / 17000)
    assert any("fit the plan" in n for n in plan.notes)
    assert not any(c.flag for c in plan.choices.values())
    assert all(c.reason for c in plan.choices.values())


def test_short_budget_on_default_prepare_shards():
    """`bertkit prepare` defaults: rows of 128, static token 15% masks -> 8 rows a step, re-masked at 40%,
    warmup 30% of the steps."""
    plan = plan_recipe(360, "mini", 0.3, manifest(128, prob=0.15, dynamic=False, examples=8000))
    s = {k: c.value for k, c in plan.choices.items()}
    assert s["batch_size"] == 8 and "--seq-len 64" in plan.choices["batch_size"].reason
    assert plan.steps == 1200 and s["warmup"] == 360
    assert "eval_every_steps" not in s and "eval_batches" not in s    # no held-out shards
    assert any("static token 15%" in n and "re-masked" in n and "dynamic token 40%" in n for n in plan.notes)
    block = plan.block()
    assert "~1,200 steps" in block and "warmup" in block and "re-masked" in block


@pytest.mark.parametrize("preset, lr", [("tiny", 1e-3), ("mini", 1e-3), ("small", 5e-4), ("base", 1e-4),
                                        (None, 1e-4)])
def test_lr_by_preset(preset, lr):
    assert plan_recipe(900, preset, 1.0, manifest()).value("lr") == lr


def test_warmup_rule():
    steps = lambda plan: plan.value("warmup")                           # noqa: E731
    assert steps(plan_recipe(2000 * 0.5, "mini", 0.5, manifest())) == 1000       # 2,000 steps: the full warmup
    assert steps(plan_recipe(1999 * 0.5, "mini", 0.5, manifest())) == round(0.3 * 1999)
    assert steps(plan_recipe(10, "mini", 0.5, manifest())) == 6
    assert steps(plan_recipe(0.5, "mini", 1.0, manifest())) == 1                   # never below one step


def test_without_a_step_time_the_step_count_choices_wait():
    plan = plan_recipe(600, "mini", None, manifest(), heldout_rows=100)
    assert plan.steps is None and "warmup" not in plan.choices and "eval_every_steps" not in plan.choices
    assert plan.value("batch_size") == 16 and plan.value("eval_batches") == 64


def test_given_settings_win_and_shape_what_depends_on_them():
    given = {"lr": 3e-4, "schedule": "linear", "batch_size": 4, "warmup": 50.0}
    plan = plan_recipe(600, "mini", 0.1, manifest(), given, heldout_rows=1000)
    for name, value in given.items():
        assert plan.choices[name].value == value and plan.choices[name].flag
    assert "decay_fraction" not in plan.choices                          # wsd only
    assert plan.value("eval_batches") == 256                             # 65,536 tokens in batches of 4 x 64
    plan = plan_recipe(600, "mini", 0.1, manifest(), {"masking": "shards"})
    assert plan.value("masking") == "shards" and plan.value("mask_prob") is None
    assert any("the shards' own" in n for n in plan.notes)
    plan = plan_recipe(600, "mini", 0.1, manifest(), {"global_batch": 12})
    assert plan.value("batch_size") == 4                                 # divides the global batch


def test_packed_rows_are_flagged():
    plan = plan_recipe(600, "mini", 0.1, manifest(task="none"))
    assert any("--task nsp" in n for n in plan.notes)


def test_plan_json_round_trip(tmp_path):
    import json
    plan = plan_recipe(720, "mini", 0.25, manifest(), {"lr": 5e-4}, heldout_rows=2400)
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_dict()))
    back = load_plan(tmp_path)
    assert isinstance(back, RecipePlan) and back.to_dict() == plan.to_dict() and back.choices["lr"].flag
    assert load_plan(tmp_path / "nope") is None


@pytest.mark.parametrize("spoil,field", [
    (lambda d: [d], "expected a JSON object"), (lambda d: {**d, "budget_s": None}, "budget_s None"),
    (lambda d: {**d, "step_s": float("nan")}, "step_s nan"), (lambda d: {**d, "settings": "x"}, "settings 'x'"),
    (lambda d: {**d, "settings": {**d["settings"], "batch_size": "16"}}, "batch_size '16'"),
    (lambda d: {**d, "settings": {**d["settings"], "lr": None}}, "lr None"),
    (lambda d: {**d, "settings": {**d["settings"], "schedule": 3}}, "settings.schedule 3"),
    (lambda d: {**d, "preset": ["mini"]}, "preset")])
def test_a_spoiled_plan_json_is_one_error_naming_the_field(spoil, field, tmp_path):
    """A resumed run builds its schedule from plan.json: a field of the wrong type is refused by name, not a
    TypeError in the middle of the schedule."""
    import json
    plan = plan_recipe(720, "mini", 0.25, manifest(), heldout_rows=2400)
    (tmp_path / "plan.json").write_text(json.dumps(spoil(plan.to_dict())))
    with pytest.raises(ConfigError, match=re.escape(field)):
        load_plan(tmp_path)


def test_command_line_flags_override_the_plan(tmp_path):
    """argparse defaults of None tell given from not given: --lr 1e-4 (the old default) is still the user's."""
    pc = config_from_argv(["shards/", "--preset", "mini", "--budget", "6m", "--out", str(tmp_path), "--lr", "1e-4",
                           "--warmup", "100", "--masking", "wwm", "--eval-shards", "held/"])
    assert set(pc.set_fields) == {"lr", "warmup", "masking"}
    assert given_settings(pc) == {"lr": 1e-4, "warmup": 100.0, "masking": "wwm"}
    plan = plan_recipe(pc.train.budget_s, pc.preset, 0.2, manifest(128, dynamic=False), given_settings(pc),
                       heldout_rows=500)
    run = apply_plan(pc, plan)
    assert (run.train.lr, run.train.warmup, run.masking) == (1e-4, 100.0, "wwm")        # the user's
    assert (run.mask_prob, run.batch_size, run.dropout, run.train.schedule) == (0.4, 8, 0.0, "wsd")  # the plan's
    assert run.train.decay_fraction == 0.1 and run.train.eval_every_steps == plan.value("eval_every_steps")
    assert "yours: --lr" in plan.block()


def test_without_budget_the_defaults_stand(tmp_path):
    pc = config_from_argv(["shards/", "--preset", "mini", "--steps", "10", "--out", str(tmp_path)])
    assert pc.set_fields == ()
    assert (pc.train.lr, pc.train.warmup, pc.train.schedule, pc.batch_size, pc.eval_batches) == (1e-4, 0.01,
                                                                                                  "linear", 32, 50)
    assert pc.masking == "shards" and pc.mask_prob is None and pc.dropout is None
    assert set(PLANNED) >= {"lr", "warmup", "schedule", "decay_fraction", "batch_size", "dropout", "masking",
                            "mask_prob"}


def test_evaluations_fit_their_share_of_the_budget():
    """Measured evaluation batches: up to 9 evaluations during the run in <= 10% of it (and the final one after);
    when one evaluation costs more than that share, only the final one."""
    plan = plan_recipe(600, "mini", 0.2, manifest(), heldout_rows=5000, eval_batch_s=0.05)
    cost = 64 * 0.05
    assert plan.eval_s == pytest.approx(9 * cost) and plan.steps == int((600 - 9 * cost) / 0.2)
    assert plan.value("eval_every_steps") == plan.steps // 10
    plan = plan_recipe(60, "mini", 0.2, manifest(), heldout_rows=5000, eval_batch_s=0.5)      # 32 s an evaluation
    assert plan.eval_s == 0 and plan.value("eval_every_steps") is None and plan.steps == 300
    assert "one held-out evaluation, at the end" in plan.choices["eval_every_steps"].reason
    plan = plan_recipe(600, "mini", 0.2, manifest(), {"eval_every_steps": 100}, heldout_rows=5000, eval_batch_s=0.05)
    assert plan.value("eval_every_steps") == 100 and plan.eval_s == pytest.approx(int(600 / (20 + cost)) * cost)
    few = plan_recipe(600, "mini", 0.2, manifest(), heldout_rows=40, eval_batch_s=0.05)   # 2 batches of 16 rows
    assert few.eval_s == pytest.approx(9 * 2 * 0.05)


def test_a_config_model_gets_the_lr_of_its_width_and_no_local_start_without_a_position_table():
    """A --config model has no preset: the lr follows its width, and a family without a learned position table
    (ModernBERT's rotary, DeBERTa-v3's relative positions) is not planned a local start it cannot take."""
    from bertkit.config import BertConfig
    bert = BertConfig.from_dict({"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4})
    modern = BertConfig.from_dict({"model_type": "modernbert", "hidden_size": 256, "num_hidden_layers": 2,
                                   "num_attention_heads": 4, "intermediate_size": 384})
    plan = plan_recipe(900, None, 1.0, manifest(), model=bert)
    assert (plan.value("lr"), plan.value("attention_init")) == (1e-3, "local")
    assert "mini's width" in plan.choices["lr"].reason
    plan = plan_recipe(900, None, 1.0, manifest(), model=modern)
    assert (plan.value("lr"), plan.value("attention_init")) == (1e-3, "random")
    assert "no learned position table" in plan.choices["attention_init"].reason
