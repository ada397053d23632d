"""The benchmark runner works; the ledger benchmark's ratios are exactly 1 (the analytic rules
account for every FLOP and saved byte)."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
# the encoder each SSL objective trains, stated here apart from the benchmark's own _family
SSL_FAMILY = {"simclr": "resnet", "moco": "resnet", "simsiam": "resnet", "mae": "vit"}


def load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ledger_benchmark_quick():
    result = load("bench_ledger").run(quick=True)
    assert result["summary"]["configurations"] >= 8
    assert result["summary"]["worst_abs(ratio-1)"] == 0.0


def test_gpu_preset_script_runs_its_smoke_mode(tmp_path):
    import json
    import math
    bench = load("gpu_simclr_cifar10")
    out = tmp_path / "smoke.json"
    assert bench.main(["--smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    steps_per_epoch = result["config"]["train_limit"] // result["config"]["batch"]
    assert result["steps"] == result["config"]["epochs"] * steps_per_epoch
    assert math.isfinite(result["final_loss"]) and 0.0 <= result["knn_top1"] <= 1.0
    assert [c["epoch"] for c in result["knn_curve"]] == list(range(1, result["config"]["epochs"] + 1))
    assert result["images_per_s"] > 0 and result["target_met"] is False


def test_gpu_preset_script_stops_at_its_time_limit():
    import torch
    bench = load("gpu_simclr_cifar10")
    cfg = dict(bench.SMOKE, epochs=50, minutes=1e-6)
    result = bench.run(cfg, torch.device("cpu"))
    assert result["steps"] == 1, "the time limit is checked after every step"


def test_gpu_preset_script_without_cuda_says_what_to_do(capsys):
    import pytest
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert load("gpu_simclr_cifar10").main([]) == 2
    assert "--smoke" in capsys.readouterr().err


def test_ssl_calibration_times_the_training_loop_and_budgets_what_the_time_bought(monkeypatch):
    """calibrate: per objective, the steps ``fit`` made in the timed core-seconds after the warm-up,
    scaled to TARGET_CORE_SECONDS (one dataset and two objectives here, a fraction of a second each)."""
    import itertools
    bench = load("bench_ssl_quality")
    monkeypatch.setattr(bench, "AUGMENT", {"shapes": bench.AUGMENT["shapes"]})
    monkeypatch.setattr(bench, "OBJECTIVES", ("simclr", "mae"))
    steps = []
    real_build = bench._build

    def counted_build(name, augment, seed):   # counts the steps each objective takes
        model, step = real_build(name, augment, seed)
        return model, lambda batch: (steps.append(name), step(batch))[1]
    monkeypatch.setattr(bench, "_build", counted_build)
    # a clock that moves a quarter core-second per reading: the timer reads it once at its start
    # and once per step, calibrate once more at the end, so 1 core-second buys exactly 4 timed
    # steps over 5 readings' worth of time (1.25), whatever this machine's speed
    ticks = itertools.count()
    monkeypatch.setattr(bench, "core_seconds", lambda: next(ticks) * 0.25)
    got = bench.calibrate(seconds=1.0, warmup=2)
    assert steps == ["simclr"] * (2 + 4) + ["mae"] * (2 + 4)   # the warm-up is not timed
    assert got["steps_per_core_second"]["shapes"] == {"simclr": 4 / 1.25, "mae": 4 / 1.25}
    assert got["step_budget"]["shapes"] == {n: round(bench.TARGET_CORE_SECONDS * 3.2) for n in ("simclr", "mae")}
    with pytest.raises(ValueError, match="warmup"):
        bench.calibrate(seconds=1.0, warmup=0)


def test_ssl_quality_probes_the_floors_of_the_objectives_families_only(monkeypatch):
    """quality_on for MAE alone probes the ViT floors, not the ResNets' (a rerun or replication of
    one objective has no use for the other family's)."""
    bench = load("bench_ssl_quality")
    families = []
    real_encoder = bench._encoder
    monkeypatch.setattr(bench, "_encoder", lambda family, seed: (families.append(family), real_encoder(family, seed))[1])
    monkeypatch.setattr(bench, "probe_encoder", lambda encoder, train, test: {"linear": 0.25, "knn": 0.25})
    monkeypatch.setattr(bench, "map_runs", lambda fn, keys, desc=None: {
        key: {"steps": 1, "linear": 0.5, "knn": 0.5, "train_cpu_seconds": 1.0, "curve": []} for key in keys})
    rows = bench.quality_on("shapes", {"mae": 1}, True, (0, 1, 2), ("mae",))
    assert set(families) == {"vit"} and set(rows["random_init"]) == {"vit"}
    assert rows["mae"]["linear_gain_points"] == pytest.approx(25.0)


def test_ssl_quality_benchmark_reports_every_objective_on_both_datasets():
    """Every row is its seeds' mean gain over the same seed's untouched random init, and meets the
    goal only where the kit's one rule (course_utils.compare) resolves it above +15."""
    from course_utils.compare import compare_paired
    bench = load("bench_ssl_quality")
    result = bench.run(quick=True, seeds=(0, 1, 2))
    assert result["config"]["step_budget"] == {d: {n: bench.QUICK_STEPS for n in bench.OBJECTIVES}
                                               for d in ("shapes", "textures-recoloured")}
    for dataset in ("shapes", "textures-recoloured"):
        rows = result["datasets"][dataset]
        for family in ("resnet", "vit"):   # each seed its own initial weights
            assert len({(r["linear"], r["knn"]) for r in rows["random_init"][family].values()}) > 1
        for name in ("simclr", "moco", "simsiam", "mae"):
            row = rows[name]
            assert set(row["seeds"]) == {0, 1, 2}
            family = SSL_FAMILY[name]
            for seed, run in row["seeds"].items():
                assert run["floor_linear"] == rows["random_init"][family][seed]["linear"]
                assert abs(run["linear_gain_points"] - 100 * (run["linear"] - run["floor_linear"])) < 1e-9
                # every run trains the budget's steps, probed on the way at the checkpoints
                assert run["steps"] == bench.QUICK_STEPS and run["train_cpu_seconds"] > 0
                assert [c["steps"] for c in run["curve"]] == bench.checkpoints(bench.QUICK_STEPS)[:-1]
                for c in run["curve"]:
                    assert c["linear_gain_points"] == pytest.approx(100 * (c["linear"] - run["floor_linear"]))
            for i, point in enumerate(row["by_checkpoint"]):
                at = [run["curve"][i]["linear_gain_points"] for run in row["seeds"].values()]
                assert point["linear_gain_points"] == pytest.approx(sum(at) / len(at))
            gains = [run["linear_gain_points"] for run in row["seeds"].values()]
            expected = compare_paired(gains, [15] * 3, names=("gain", "+15 goal"),
                                      resolution=100 / rows["test_images"])
            assert row["linear_gain_points"] == pytest.approx(expected.mean + 15)
            assert row["gain_interval_points"] == pytest.approx([x + 15 for x in expected.interval])
            assert row["goal_verdict"] == expected.verdict
            assert row["goal_met"] == (expected.verdict == "gain > +15 goal")
    listed = {(s["dataset"], s["objective"]) for s in result["shortfalls"]}
    assert listed == {(d, n) for d in ("shapes", "textures-recoloured") for n in ("simclr", "moco", "simsiam", "mae")
                      if not result["datasets"][d][n]["goal_met"]}, "every row short of a resolved pass is listed"
    assert all("95% interval" in s["why"] for s in result["shortfalls"])


def test_ssl_quality_pairs_each_trained_encoder_with_its_own_initial_weights():
    """The floor of seed s is the trained encoder's own starting point: the same weights, and
    another seed's are different."""
    import torch
    from course_utils.augment import SimCLRAugment
    bench = load("bench_ssl_quality")
    augment = SimCLRAugment(16)
    for name in bench.OBJECTIVES:
        family = SSL_FAMILY[name]
        start = bench._build(name, augment, seed=1)[0].encoder.state_dict()
        for other, same in ((1, True), (2, False)):
            floor = bench._encoder(family, other).state_dict()
            assert all(torch.equal(start[k], floor[k]) for k in floor) == same, (name, other)


def test_ssl_quality_probing_on_the_way_leaves_the_run_as_it_would_be_unprobed(monkeypatch):
    """A run probed at its checkpoints ends bit for bit where the same run probed only at its end
    does: the probes draw nothing the training draws and put BatchNorm's flags back."""
    from course_utils.augment import SimCLRAugment
    from course_utils.data import load_dataset
    bench = load("bench_ssl_quality")
    train = load_dataset("shapes", "train", image_size=16)
    probe_train, test = train.subset(64, seed=1), train.subset(64, seed=2)
    augment = SimCLRAugment(16, **bench.AUGMENT["shapes"])
    for name in ("moco", "mae"):   # a queue and a momentum encoder; a mask drawn per step
        probed = bench.train_and_probe(name, 0, 4, augment, train, probe_train, test)
        monkeypatch.setattr(bench, "CHECKPOINTS", ())
        unprobed = bench.train_and_probe(name, 0, 4, augment, train, probe_train, test)
        monkeypatch.undo()
        assert [c["steps"] for c in probed["curve"]] == [1, 2] and unprobed["curve"] == []
        assert (probed["linear"], probed["knn"]) == (unprobed["linear"], unprobed["knn"]), name


def test_committed_ssl_quality_verdicts_follow_from_its_runs():
    """The committed result's verdicts, flags and shortfalls are what this file's rules make of
    its stored per-seed measurements, each seed paired with its own floor."""
    import json
    bench = load("bench_ssl_quality")
    stored = json.loads((ROOT / "benchmarks" / "results" / "ssl_quality.json").read_text())
    assert stored["config"]["seeds"] == list(range(len(stored["config"]["seeds"])))
    assert len(stored["config"]["seeds"]) >= 3 and stored["config"]["train_core_seconds"] == 180
    for dataset, rows in stored["datasets"].items():
        for name in bench.OBJECTIVES:
            family = SSL_FAMILY[name]
            for seed, run in rows[name]["seeds"].items():
                assert run["floor_linear"] == rows["random_init"][family][seed]["linear"]
                assert abs(run["linear_gain_points"] - 100 * (run["linear"] - run["floor_linear"])) < 1e-9
    again = bench.summarise_again(stored)
    assert again["summary"] == stored["summary"] and again["shortfalls"] == stored["shortfalls"]
    assert again["datasets"] == stored["datasets"]


def test_ssl_quality_says_why_a_row_fell_short_by_where_its_mean_lies():
    """A mean below zero (features made worse) is not explained by a slow start; a mean between 0
    and the goal cites the objective's known limit; a mean above the goal asks for seeds."""
    bench = load("bench_ssl_quality")

    def row(gains):
        return bench.summarise_row({s: {"linear_gain_points": g} for s, g in enumerate(gains)}, 512)
    rows = {"simsiam": row([-19.5, -17.4, -4.1]), "mae": row([9.0, 11.0, 10.0]),
            "moco": row([20.9, 33.6, 37.1])}
    assert "worse" in bench.why_short(rows, "simsiam") and "start slowly" not in bench.why_short(rows, "simsiam")
    assert bench.KNOWN_LIMITS["mae"] in bench.why_short(rows, "mae")
    assert "more seeds" in bench.why_short(rows, "moco")


def test_fake_ledger_benchmark_quick():
    result = load("bench_fake_ledger").run(quick=True)
    assert all(result["summary"]["goals_met"].values()), result["summary"]
    layers = result["growth_with_layers"]
    assert layers[1]["tflops"] > layers[0]["tflops"] and layers[1]["resident_gb"] > layers[0]["resident_gb"]
    ranks = result["growth_with_ranks"]
    assert ranks[1]["resident_gb"] < ranks[0]["resident_gb"]   # FSDP2 shards over more ranks


def test_committed_results_are_full_runs():
    """benchmarks/results/ is what the README and the goals quote: a quick run's figures are
    not those (benchmarks/run.py --quick no longer writes there)."""
    import json
    quick = [p.name for p in sorted((BENCH / "results").glob("*.json"))
             if json.loads(p.read_text()).get("quick", False)]
    assert not quick, f"quick runs committed as results: {quick}; rerun them in full " \
                      "(python benchmarks/run.py NAME)"


def test_ssl_quality_refuses_too_few_seeds(capsys):
    bench = load("bench_ssl_quality")
    with pytest.raises(SystemExit) as exited:
        bench.main(["--seeds", "2"])
    assert exited.value.code == 2 and "fewer seeds cannot resolve" in capsys.readouterr().err


def test_ssl_quality_rerun_replaces_only_its_rows_and_needs_the_same_floors(monkeypatch):
    """--rerun: the rerun objective's rows are replaced and every derived field recomputed; the
    other rows stay as stored; floors that differ from the stored ones refuse the merge."""
    import copy
    import json
    bench = load("bench_ssl_quality")
    stored = json.loads((ROOT / "benchmarks" / "results" / "ssl_quality.json").read_text())
    if "step_budget" not in stored["config"]:   # a run with a budget of core-seconds: refused
        with pytest.raises(ValueError, match="step budget"):
            bench.rerun(stored, ("simsiam",), "a test")
        stored["config"]["step_budget"] = {d: {n: 100 for n in bench.OBJECTIVES} for d in stored["datasets"]}
    shift = {"floors": 0.0}

    def quality_on(dataset, budget, quick, seeds, objectives):
        assert budget == stored["config"]["step_budget"][dataset]
        kept = stored["datasets"][dataset]
        rows = {"random_init": {f: {int(s): {**v, "linear": v["linear"] + shift["floors"]}
                                    for s, v in by_seed.items()}
                                for f, by_seed in kept["random_init"].items()
                                if f in {SSL_FAMILY[n] for n in objectives}}}   # as quality_on probes
        for name in objectives:
            per_seed = {}
            for s in seeds:
                floor = kept["random_init"][SSL_FAMILY[name]][str(s)]["linear"]
                per_seed[s] = {"steps": 1, "linear": floor + 0.2 + 0.01 * s, "knn": 0.5,
                               "floor_linear": floor,
                               "linear_gain_points": 100 * (0.2 + 0.01 * s),
                               "probe_standard_error_points": 1.0}
            rows[name] = bench.summarise_row(per_seed, kept["test_images"])
        return rows

    monkeypatch.setattr(bench, "quality_on", quality_on)
    before = copy.deepcopy(stored)
    out = bench.rerun(stored, ("simsiam",), "a test")
    assert stored == before  # the stored result is not changed in place
    for dataset, rows in out["datasets"].items():
        assert {n: rows[n] for n in bench.OBJECTIVES if n != "simsiam"} == \
            {n: stored["datasets"][dataset][n] for n in bench.OBJECTIVES if n != "simsiam"}
        seeds = stored["config"]["seeds"]
        assert rows["simsiam"]["linear_gain_points"] == pytest.approx(20.0 + sum(seeds) / len(seeds))
        assert set(rows["simsiam"]["seeds"]) == {str(s) for s in seeds}
        assert out["rows_rerun"][-1]["rerun_rows"][f"{dataset}_simsiam"] == rows["simsiam"]
    assert out["rows_rerun"][-1]["objectives"] == ["simsiam"] and out["rows_rerun"][-1]["why"] == "a test"
    again = bench.summarise_again(out)
    assert again["summary"] == out["summary"] and again["shortfalls"] == out["shortfalls"]
    shift["floors"] = 0.01
    with pytest.raises(ValueError, match="floors"):
        bench.rerun(stored, ("simsiam",), "a test")
    with pytest.raises(ValueError, match="among"):
        bench.rerun(stored, ("byol",), "a test")


def test_ssl_quality_replicates_an_unresolved_row_on_fresh_seeds_once(monkeypatch):
    """--replicate: only a row its seeds left not resolved, decided by fresh seeds alone (the
    first run's row kept, not pooled), the stored floors checked first; refused a second time."""
    import copy
    import json
    bench = load("bench_ssl_quality")
    from course_utils.compare import NOT_RESOLVED
    stored = json.loads((ROOT / "benchmarks" / "results" / "ssl_quality.json").read_text())
    stored.pop("replications", None)
    dataset, name = "textures-recoloured", "mae"
    row = stored["datasets"][dataset][name]
    if row["goal_verdict"] != NOT_RESOLVED:   # the committed row may be decided by now: undecide it
        gains = [15.0 + d for d in (-6, 2, 9, 3)]
        row = bench.summarise_row({str(s): {**r, "linear_gain_points": g} for (s, r), g in
                                   zip(list(row["seeds"].items())[:4], gains)}, 512)
        stored["datasets"][dataset][name] = row
    assert row["goal_verdict"] == NOT_RESOLVED
    floors = stored["datasets"][dataset]["random_init"]["vit"]
    shift = {"floor": 0.0}
    monkeypatch.setattr(bench, "probe_encoder", lambda encoder, train, test: {
        "linear": floors[str(int(encoder.seed))]["linear"] + shift["floor"],
        "knn": floors[str(int(encoder.seed))]["knn"]})
    monkeypatch.setattr(bench, "_encoder", lambda family, seed: type("E", (), {"seed": seed})())
    monkeypatch.setattr(bench, "_splits", lambda dataset, quick: (None, None, None))
    asked = []

    def quality_on(dataset, budget, quick, seeds, objectives):
        asked.append((seeds, objectives, quick))
        assert budget == stored["config"]["step_budget"][dataset]
        per_seed = {s: {"steps": 1, "linear": 0.5, "knn": 0.5, "floor_linear": 0.25,
                        "linear_gain_points": 25.0 + s % 2, "probe_standard_error_points": 1.0}
                    for s in seeds}
        return {"random_init": {f: {s: {"linear": 0.25, "knn": 0.2} for s in seeds} for f in ("resnet", "vit")},
                name: bench.summarise_row(per_seed, 512)}

    monkeypatch.setattr(bench, "quality_on", quality_on)
    before = copy.deepcopy(stored)
    out = bench.replicate(stored, dataset, name, 6, "a test")
    assert stored == before
    used = max(int(s) for by_seed in stored["datasets"][dataset]["random_init"].values() for s in by_seed)
    assert asked == [(tuple(range(used + 1, used + 7)), (name,), False)]
    new = out["datasets"][dataset][name]
    assert sorted(new["seeds"]) == [str(s) for s in range(used + 1, used + 7)]   # the fresh seeds alone
    assert new["goal_met"] and new["linear_gain_points"] == pytest.approx(25.5)
    assert out["replications"][-1]["first_row"] == row and out["replications"][-1]["why"] == "a test"
    kept_floors = out["datasets"][dataset]["random_init"]["vit"]
    assert all(kept_floors[s] == f for s, f in floors.items()) and len(kept_floors) == len(floors) + 6
    assert out["summary"]["goal_met_everywhere"] == (not out["shortfalls"])
    again = bench.summarise_again(out)
    assert again["summary"] == out["summary"] and again["datasets"] == out["datasets"]
    with pytest.raises(ValueError, match="replicated once"):
        bench.replicate({**out, "datasets": stored["datasets"]}, dataset, name, 6, "again")
    with pytest.raises(ValueError, match="decided"):
        bench.replicate(out, dataset, name, 6, "a decided row")
    with pytest.raises(ValueError, match="replicated row"):
        bench.rerun(out, (name,), "a recipe change")
    with pytest.raises(ValueError, match="int >= 3"):
        bench.replicate(stored, dataset, name, 2, "too few")
    shift["floor"] = 0.01
    with pytest.raises(ValueError, match="floor"):
        bench.replicate(stored, dataset, name, 6, "the code has changed")


def test_lessons_read_committed_results_where_the_repository_is():
    """course_utils.report.committed_result, which lessons 05 and 13 check their pointers to the
    SSL benchmark with: the committed file in a checkout, None for a result that is not there."""
    import json
    from course_utils.report import committed_result, ssl_quality_gains
    stored = json.loads((BENCH / "results" / "ssl_quality.json").read_text())
    assert committed_result("ssl_quality") == stored
    assert committed_result("no_such_benchmark") is None
    gains = ssl_quality_gains(stored, "shapes", ("simsiam",))
    assert gains == {("simsiam", int(s)): r["linear_gain_points"]
                     for s, r in stored["datasets"]["shapes"]["simsiam"]["seeds"].items()}


def test_a_rerun_keeps_the_rows_it_replaced_and_their_paired_verdict():
    """The committed result's rows_rerun: each record holds the rows it replaced, and its verdict
    of the new recipe against the old is the kit's rule on the stored per-seed gains. The module
    docstring's reading of the SimSiam change: below AdamW on shapes, above it on textures."""
    import json
    from course_utils.compare import compare_paired
    stored = json.loads((BENCH / "results" / "ssl_quality.json").read_text())
    for record in stored["rows_rerun"]:
        for key, old in record["superseded_rows"].items():
            dataset, name = key.rsplit("_", 1)
            new = record["rerun_rows"][key]      # the rows the rerun made, on the seeds it was made on
            seeds = sorted(new["seeds"])
            again = compare_paired([new["seeds"][s]["linear_gain_points"] for s in seeds],
                                   [old["seeds"][s]["linear_gain_points"] for s in seeds],
                                   names=("rerun", "superseded"),
                                   resolution=100 / stored["datasets"][dataset]["test_images"])
            assert record["rerun_versus_superseded"][key]["verdict"] == again.verdict
            assert record["rerun_versus_superseded"][key]["mean_points"] == pytest.approx(again.mean)
    versus = stored["rows_rerun"][-1]["rerun_versus_superseded"]
    assert versus["shapes_simsiam"]["verdict"] == "superseded > rerun"
    assert versus["textures-recoloured_simsiam"]["verdict"] == "rerun > superseded"


def test_a_full_run_keeps_the_run_it_replaces_and_the_recipe_changes_rows():
    """with_superseded_run: the new run's rows and verdicts are its own; the replaced run is kept
    whole with why it was run again; a recipe change recorded in the old run keeps its own rows
    (filled from the old run's rows where the record predates rerun_rows)."""
    import copy
    import json
    bench = load("bench_ssl_quality")
    stored = json.loads((ROOT / "benchmarks" / "results" / "ssl_quality.json").read_text())
    old = copy.deepcopy(stored)
    old.pop("superseded_runs", None)
    for record in old.get("rows_rerun", []):
        record.pop("rerun_rows", None)
    new = {"config": {**old["config"], "seeds": [0, 1, 2, 3]}, "datasets": {}, "summary": {"x": 1},
           "shortfalls": []}
    merged = bench.with_superseded_run(new, old, "more seeds")
    assert merged["summary"] == {"x": 1} and merged["datasets"] == {}
    kept = merged["superseded_runs"][-1]
    assert kept["why"] == "more seeds" and kept["datasets"] == old["datasets"]
    assert "rows_rerun" not in kept
    for record in merged["rows_rerun"]:
        assert record["seeds"] == old["config"]["seeds"]
        for key in record["superseded_rows"]:
            dataset, name = key.rsplit("_", 1)
            assert record["rerun_rows"][key] == old["datasets"][dataset][name]
    # a record that holds its rows keeps their seeds, whatever the replaced run's seed count
    later = bench.with_superseded_run(new, stored, "again")
    for record in later["rows_rerun"]:
        assert record["seeds"] == sorted({int(s) for row in record["rerun_rows"].values() for s in row["seeds"]})
    for record in stored["rows_rerun"]:   # and the committed records say so
        assert record["seeds"] == sorted({int(s) for row in record["rerun_rows"].values() for s in row["seeds"]})


def test_the_runner_leaves_a_benchmark_that_keeps_history_to_its_own_command(monkeypatch, capsys):
    """benchmarks/run.py in full skips the SSL benchmark (its full run must keep the run it
    replaces, with why), says how to run it, and writes nothing; --quick still runs it."""
    runner = load("run")
    ran = []
    monkeypatch.setattr(runner, "run_one", lambda path, quick, **_: ran.append((path.stem, quick)) or {})
    assert runner.main(["ssl_quality"]) == 0
    assert ran == [] and "bench_ssl_quality.py --seeds N --why" in capsys.readouterr().out
    assert runner.main(["ssl_quality", "--quick"]) == 0 and ran == [("bench_ssl_quality", True)]
