"""Campaign files, statistics over seeds and aggregation, checked against values computed by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from chaos.campaign.campaign import bundled_names, fingerprint, load, parse, parse_seeds
from chaos.campaign.runner import MARKER, plan
from chaos.campaign.stats import summarize, t_quantile_975
from chaos.campaign.summary import aggregate, fmt, run_metrics
from chaos.scenario import ScenarioError
from tests.helpers.campaigns import TINY

pytestmark = pytest.mark.timeout(60)


def test_summary_of_four_values_matches_the_hand_computation() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0])
    # mean 2.5; squared deviations 2.25+0.25+0.25+2.25 = 5 → std √(5/3); t(0.975, 3) = 3.182; √4 = 2
    assert s.n == 4 and s.mean == 2.5
    assert s.std == pytest.approx(math.sqrt(5 / 3))
    assert s.ci95_low == pytest.approx(2.5 - 3.182 * 1.2909944 / 2, abs=1e-6)
    assert s.ci95_high == pytest.approx(2.5 + 2.0539722, abs=1e-6)  # 3.182 · 1.2909944 = 4.1079444


def test_two_seeds_use_the_wide_t_quantile_and_missing_values_are_left_out() -> None:
    s = summarize([10.0, None, 14.0])
    # std = √((4 + 4) / 1) = 2√2; half = 12.706 · 2√2 / √2 = 25.412
    assert (s.n, s.mean) == (2, 12.0)
    assert s.std == pytest.approx(2 * math.sqrt(2))
    assert (s.ci95_low, s.ci95_high) == (pytest.approx(12 - 25.412), pytest.approx(12 + 25.412))
    assert fmt(s.to_dict(), "goodput") == "12.000 ± 25.412 (n=2)"


def test_one_or_no_value_has_no_interval() -> None:
    one = summarize([3.0])
    assert (one.n, one.mean, one.std, one.ci95_low) == (1, 3.0, None, None)
    assert fmt(one.to_dict(), "restarts") == "3.00 (n=1)"
    assert summarize([None, None]).mean is None and fmt(summarize([]).to_dict(), "goodput") == "—"


def test_t_quantiles_between_table_rows_round_towards_the_wider_interval() -> None:
    assert t_quantile_975(1) == 12.706 and t_quantile_975(30) == 2.042
    assert t_quantile_975(35) == 2.042 and t_quantile_975(1000) == 1.96
    with pytest.raises(ValueError):
        t_quantile_975(0)


def _report(verdict: str, steps_per_s: float, ref: float, restarts: int, recover: list[float | None]) -> dict:
    return {"verdict": verdict, "goodput": {"steps_per_s": steps_per_s, "reference_steps_per_s": ref,
                                            "ratio": round(steps_per_s / ref, 4)},
            "restarts": restarts, "in_process_restarts": 1, "replayed_steps": 3,
            "faults": [{"recover_s": r} for r in recover], "checkpoint": {"stall_s_total": 0.5},
            "divergence": {"param_l2": 0.0, "loss_abs_diff_auc": 0.0, "loss_max_diff": 0.0}}


def test_run_metrics_take_the_change_against_the_reference_and_the_mean_recovery() -> None:
    m = run_metrics(_report("pass", 7.5, 10.0, 2, [0.2, None, 0.4]))
    assert m["goodput_delta_pct"] == pytest.approx(-25.0)
    assert m["recovery_s"] == pytest.approx(0.3) and m["pass_rate"] == 1.0 and m["restarts"] == 2
    assert run_metrics(_report("fail", 5.0, 10.0, 0, []))["recovery_s"] is None


def test_aggregate_over_seeds_from_finished_run_directories(tmp_path: Path) -> None:
    campaign = parse(TINY, "tiny.toml")
    planned = plan([campaign], tmp_path, None, None)
    reports = {("reference", 1): _report("pass", 10.0, 10.0, 0, []),
               ("reference", 2): _report("pass", 12.0, 12.0, 0, []),
               ("kill", 1): _report("pass", 9.0, 10.0, 2, [0.1, 0.3]),
               ("kill", 2): _report("fail", 9.0, 12.0, 2, [0.5])}
    for p in planned:
        p.directory.mkdir(parents=True)
        (p.directory / "report.json").write_text(json.dumps(reports[(p.run.name, p.seed)]))
        (p.directory / MARKER).write_text(json.dumps({"fingerprint": fingerprint(p.scenario)}))
    [summary] = aggregate(planned)
    kill = next(r for r in summary["runs"] if r["name"] == "kill")
    # seed 1: 9/10 → -10 %; seed 2: 9/12 → -25 %; mean -17.5, std √((7.5² + 7.5²) / 1) = 10.6066
    delta = kill["metrics"]["goodput_delta_pct"]
    assert delta["values"] == [pytest.approx(-10.0), pytest.approx(-25.0)]
    assert delta["mean"] == pytest.approx(-17.5) and delta["std"] == pytest.approx(10.6066, abs=1e-4)
    assert delta["ci95_high"] == pytest.approx(-17.5 + 12.706 * 10.6066 / math.sqrt(2), abs=1e-3)
    assert kill["metrics"]["pass_rate"]["mean"] == 0.5
    assert kill["metrics"]["recovery_s"]["values"] == [pytest.approx(0.2), pytest.approx(0.5)]
    assert sorted(kill["recoveries_s"]) == [0.1, 0.3, 0.5]
    assert kill["published"] == {"goodput_delta_pct": -7.98, "restarts": 1.0}
    assert kill["seeds"] == [1, 2]


def test_a_finished_run_made_with_another_configuration_is_refused(tmp_path: Path) -> None:
    planned = plan([parse(TINY, "tiny.toml")], tmp_path, (1,), None)
    first = planned[0]
    first.directory.mkdir(parents=True)
    (first.directory / "report.json").write_text("{}")
    (first.directory / MARKER).write_text(json.dumps({"fingerprint": "0123456789abcdef"}))
    with pytest.raises(ScenarioError, match="another configuration") as exc:
        first.finished()
    assert str(first.directory) in str(exc.value) and "new\n--out" not in str(exc.value)
    changed = plan([parse(TINY, "tiny.toml")], tmp_path, (1,), "synthetic:128")[0]
    assert fingerprint(changed.scenario) != fingerprint(first.scenario)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t.replace("reference = true", "reference = false"), "exactly one run must have reference"),
    (lambda t: t.replace('name = "kill"', 'name = "reference"'), "run names must be unique"),
    (lambda t: t.replace("goodput_delta_pct", "goodput_drop"), r"unknown key\(s\) \['goodput_drop'\]"),
    (lambda t: t.replace("seeds = [1, 2]", "seeds = []"), "seeds = \\[\\]: must be a non-empty list"),
    (lambda t: t.replace("steps = 14", "stepz = 14"), r"\[\[runs\]\] 'reference' \(seed 1\) \[job\]: unknown key"),
    (lambda t: t.replace("step = 5", "step = 50"), "step = 50 is beyond the run"),
    (lambda t: t.replace('name = "kill"', 'name = "Kill Run"'), "must be lower-case"),
    (lambda t: t + "\n[[runs]]\nname = 'x'\njob = { model = 'vgg' }\n", "model = 'vgg'"),
    (lambda t: t.replace("[[runs]]", "[[runz]]", 1), "unknown key"),
    (lambda t: t.replace('experiment = "Tiny', "experiment = [", 1), "not valid TOML"),
])
def test_malformed_campaigns_name_the_key_and_the_fix(edit, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse(edit(TINY), "tiny.toml")


def test_bundled_campaigns_load_with_quick_variants_and_the_reports_shapes() -> None:
    names = bundled_names()
    for name in ("ecrl-exp1", "ecrl-exp2", "ecrl-exp3"):
        assert name in names and f"{name}-quick" in names
        full, quick = load(name), load(name, quick=True)
        assert quick.name == f"{name}-quick" and quick.job["steps"] < full.job["steps"]
        assert [r.name for r in quick.runs] == [r.name for r in full.runs]
    exp1 = load("ecrl-exp1")
    assert exp1.job["steps"] == 1000 and [f["step"] for f in exp1.runs[1].faults] == [200, 600]
    assert exp1.runs[1].published["goodput_delta_pct"] == -7.98
    exp3 = load("ecrl-exp3")
    assert exp3.job["model"] == "resnet18" and exp3.job["dataset"].startswith("fakedata100")
    assert "FakeData" in exp3.stand_in and exp3.seeds == (1337, 2027)


def test_quick_needs_a_bundled_campaign_and_seeds_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(TINY)
    assert load(str(path)).name == "tiny"
    with pytest.raises(ScenarioError, match="--quick picks the short variant"):
        load(str(path), quick=True)
    with pytest.raises(ScenarioError, match="not one of the bundled"):
        load("ecrl-exp9")
    assert parse_seeds("1337, 2027") == (1337, 2027)
    for bad in ("", "1,1", "a,b", "-1"):
        with pytest.raises(ScenarioError, match="--seeds"):
            parse_seeds(bad)


def test_runs_can_be_narrowed_but_the_reference_always_runs(tmp_path: Path) -> None:
    campaign = parse(TINY, "tiny.toml")
    assert [(p.run.name, p.seed) for p in plan([campaign], tmp_path, (3,), None, ("kill",))] == [
        ("reference", 3), ("kill", 3)]
    with pytest.raises(ScenarioError, match=r"--runs kil: no run named \['kil'\]"):
        plan([campaign], tmp_path, None, None, ("kil",))
