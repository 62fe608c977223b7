"""The benchmark's floor (benchmarks/in_process_floor.py) measures the same grading.

The floor answers the suites' requests in the grading process, on the reference solutions,
with no sandbox: it is only a fair floor if it grades exactly as the sandbox does.
"""

import importlib.util
import sys

import pytest

from helpers import grade
from grader import paths
from grader.sandbox import wire

BENCHMARKS = paths.KIT / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# Resource tests measure each call in a fresh worker (the course reference's runs too):
# lab 5's generate (the student's asked for 1 and for 33 new tokens on one prompt, both
# checked by one reference forward; the reference's generate of 33); lab 6: 2 lengths for each of the two memory tests
# by length, 1 for the 65,536-key one, 1 short + 1 long + 1 reference for the work test.
MEASURED_CALLS = {"lab5_decoder": 2 + 1 + 1, "lab6_efficient_attention": 2 + 2 + 1 + 3}
# A measured call ends the lab's own worker first (Session.end_student_workers): the tests
# after it that call the lab start another (lab 5: once after its work test; lab 6: after
# three of its four resource tests; lab 8's tests after its training call no module).
RESTARTED = {"lab5_decoder": 1, "lab6_efficient_attention": 3}


def extra_workers(rubric) -> int:
    """Workers beyond one a lab: one per measured call, and the restarts after them."""
    return sum(MEASURED_CALLS.get(lab, 0) + RESTARTED.get(lab, 0) for lab in rubric.labs)


@pytest.fixture(scope="module")
def floor():
    return _load("in_process_floor")


def test_in_process_floor_grades_the_solutions_as_the_sandbox_does(floor, rubric, zygote):
    boxed = grade((paths.KIT / "solutions"), rubric=rubric, zygote=zygote)
    bare_zygote = floor.InProcessZygote()
    bare = grade((paths.KIT / "solutions"), rubric=rubric, zygote=bare_zygote)
    assert boxed.score == rubric.max_points
    assert bare.to_dict_without_timings() == boxed.to_dict_without_timings()
    # Every lab was answered in this process, by the worker's own handler: one worker a
    # lab, and one more for each measured call of a resource test (a fresh one each).
    labs = [w.server.lab for w in bare_zygote.workers]
    assert sorted(set(labs)) == sorted(rubric.labs)
    assert len(labs) == len(rubric.labs) + extra_workers(rubric)
    assert bare_zygote.handler_s > 0


def test_floor_measures_both_ways_in_alternation(floor, rubric, zygote):
    """On three labs (eight gradings of them: two warm-ups and two rounds, each way): one
    without resource tests, one with measured calls, and lab 8, which trains."""
    labs = ["lab1_attention", "lab5_decoder", "lab8_train_transformer"]
    bare = floor.InProcessZygote()
    got = floor.measure({"sandboxed": zygote, "in_process": bare}, rubric, 2, labs=labs)
    rubric = rubric.only(labs)
    assert got["same_report"] is True
    assert got["sandboxed"]["score"] == got["in_process"]["score"] == rubric.max_points
    assert got["sandboxed"]["lab_code_per_submission_s"] is None   # the workers' own time
    lab_code = got["in_process"]["lab_code_per_submission_s"]
    assert 0 < lab_code < got["in_process"]["cpu_per_submission_s"]
    # The sandboxed figure counts the zygote and its reaped workers, which run the lab code.
    assert got["sandboxed"]["cpu_per_submission_s"] > got["in_process"]["cpu_per_submission_s"] - lab_code
    # Two warm-ups and two rounds, each a fresh worker per lab (the solutions kill none)
    # and per measured call.
    assert len(bare.workers) == (2 + 2) * (len(rubric.labs) + extra_workers(rubric))
    # Per lab (#31): every lab, both ways; the labs and what is outside them add up to the
    # whole, and so does the lab code's part of each lab.
    for way in ("sandboxed", "in_process"):
        fig = got[way]
        assert set(fig["by_lab"]) == set(rubric.labs), way
        assert all(v["cpu_s"] > 0 for v in fig["by_lab"].values()), (way, fig["by_lab"])
        parts = sum(v["cpu_s"] for v in fig["by_lab"].values()) + fig["outside_labs_cpu_s"]
        assert parts == pytest.approx(fig["cpu_per_submission_s"], abs=1e-9), way
        # The costliest tests of a lab are its tests (or its import probe), costliest first.
        top = fig["top_tests"]["lab1_attention"]
        assert 0 < len(top) <= floor.TOP_TESTS
        assert [t["cpu_s"] for t in top] == sorted((t["cpu_s"] for t in top), reverse=True)
        assert all(t["test"] == "import" or "test_lab1_attention.py::" in t["test"] for t in top)
    bare_labs = got["in_process"]["by_lab"]
    assert all(0 < v["lab_code_s"] < v["cpu_s"] for v in bare_labs.values()), bare_labs
    code_parts = sum(v["lab_code_s"] for v in bare_labs.values()) \
        + got["in_process"]["outside_labs_lab_code_s"]
    assert code_parts == pytest.approx(lab_code, abs=1e-9)
    # Lab 8's training as its worker's accounting gave it: only sandboxed (in-process the
    # worker's reading is of an idle process). Not compared with lab 8's time: in these
    # tests one training serves every grading of the same lab file (conftest's
    # trainings_shared_across_identical_labs).
    assert got["sandboxed"]["training_cpu_s"] > 0
    assert got["in_process"]["training_cpu_s"] is None


def test_in_process_worker_reports_a_missing_name_as_the_worker_does(floor):
    worker = floor.InProcessWorker("lab1_attention")

    worker.send_ahead(wire.encode({"op": "call", "target": "no_such_function",
                                   "args": [], "kwargs": {}}), count=1)
    reply = worker.receive(timeout_s=5)
    assert reply["error"]["type"] == "AttributeError"
    assert "lab1_attention.py has no no_such_function" in reply["error"]["message"]


def test_floor_report_states_the_budget_and_the_multiples(capsys):
    bench = _load("bench_batch")
    floor = {"repeat": 3, "max_score": 100.0, "same_report": True,
             "sandboxed": {"cpu_per_submission_s": 0.45, "score": 100.0},
             "in_process": {"cpu_per_submission_s": 0.36, "score": 100.0,
                            "lab_code_per_submission_s": 0.12}}
    bench.print_floor(floor, cores=2, batch_cpu=0.48)
    out = capsys.readouterr().out
    assert "1000 in 2.0 min on 2 cores leaves 0.24 CPU-s per submission" in out
    assert "isolation costs 0.090 CPU-s per submission" in out
    assert "1000 would take at least 3.0 min on 2 idle cores (1.5x the target's budget; " \
           "the batch: 2.0x)" in out


def test_bench_check_runs_grader_check_cold_and_prints_its_figures(tmp_path):
    """``benchmarks/bench_check.py`` in quick mode: one plain and one timed cold run of each
    case, on labs 1 and 2 (lab 8's public test trains: ~15 CPU-s a run); it prints (and
    writes) the figures. No timing is asserted: only that every run
    graded as expected and every phase of the timeline was seen, in a possible order."""
    import json
    import subprocess
    figures = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "bench_check.py"), "--repeat", "1",
                           "--breakdown", "1", "--cases", "solutions,stubs,buggy",
                           "--labs", "lab1_attention,lab2_multihead", "--backends", "jail",
                           "--json", str(figures)],
                          # a hang guard, not a speed limit: six cold `grader check` runs
                          # took 93 s at load 6, and scale with the load
                          capture_output=True, text=True, timeout=1800)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(figures.read_text())
    assert set(got["cases"]) == {"solutions", "stubs", "buggy"}
    for case, fig in got["cases"].items():
        assert len(fig["runs_s"]) == 1 and fig["median_s"] == fig["min_s"] > 0, case
        assert f"\n{case:<10} " in proc.stdout and f"{case}: where the time goes" in proc.stdout
        t = fig["timeline"]
        # The zygote is launched before this process's torch import ends, and is ready
        # before the first test runs; the table is printed after the tests.
        assert 0 < t["command_start"] <= t["zygote_start"] < t["torch_end"], (case, t)
        assert t["zygote_start"] < t["zygote_end"] <= t["tests_start"] < t["tests_end"], (case, t)
        # (The tests are handed to the pytest thread, which may still be collecting.)
        assert t["pytest_start"] < t["pytest_collected"] < t["tests_end"], (case, t)
        assert t["tests_end"] <= t["output_start"] < t["output_end"] <= t["main_end"], (case, t)
        assert t["main_end"] < t["exit_end"], (case, t)
        z = t["zygote_timings"]
        assert 0 < z["imports_s"] <= z["ready_s"], (case, z)
    # Only failed tests are diagnosed: none for the solutions, some for the bug.
    assert got["cases"]["solutions"]["timeline"]["diagnoses"] == 0
    assert got["cases"]["buggy"]["timeline"]["diagnoses"] > 0
    for phase in ("cli", "import torch", "zygote", "pytest", "grading", "tests", "output",
                  "exit"):
        assert f"\n  {phase:<14}" in proc.stdout, phase


def test_bench_check_covers_a_one_lab_check_of_every_lab(tmp_path):
    """bench_check.py has a one-lab case for each of the course's labs (#29: it had labs
    1-4 only), and runs one: ``grader check FOLDER --lab LAB``."""
    import importlib.util
    import json
    import subprocess
    spec = importlib.util.spec_from_file_location("bench_check", BENCHMARKS / "bench_check.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    labs = sorted(p.stem for p in (paths.KIT / "solutions").glob("lab*.py"))
    assert len(labs) == 8 and set(labs) <= set(bench.CASES)
    assert bench.check_args("lab5_decoder", tmp_path) == [str(tmp_path), "--lab", "lab5_decoder"]
    assert bench.check_args("buggy", tmp_path, ["lab1_attention", "lab2_multihead"]) == \
        [str(tmp_path), "--lab", "lab1_attention,lab2_multihead"]
    assert bench.check_args("solutions", tmp_path) == [str(tmp_path)]
    figures = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "bench_check.py"), "--cases",
                           "lab3_positional", "--repeat", "1", "--breakdown", "1",
                           "--json", str(figures)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(figures.read_text())["cases"]["lab3_positional"]
    assert got["median_s"] > 0 and got["timeline"]["output_end"] > got["timeline"]["tests_end"]
    # Both backends, side by side in one run (#40): the jail by default, then portable.
    by_backend = json.loads(figures.read_text())["backends"]
    assert list(by_backend) == ["jail", "portable"]
    assert by_backend["jail"]["cases"]["lab3_positional"] == got
    portable = by_backend["portable"]["cases"]["lab3_positional"]
    assert portable["median_s"] > 0 and portable["timeline"]["output_end"] > 0
    header = next(line for line in proc.stdout.splitlines() if line.startswith("case "))
    assert "jail median" in header and "portable median" in header and "portable/jail" in header
    assert "lab3_positional (portable): where the time goes" in proc.stdout
    assert "portable one-lab checks (labs 1-7) over 5 s wall:" in proc.stdout


# ------------------------------------------------------------------------- per lab (#31)

LABS_1_3 = ["lab1_attention", "lab3_positional"]


def test_a_batch_reply_splits_its_cpu_by_lab_and_the_parts_add_up(rubric, zygote, tmp_path):
    """A grading process's reply (``pool.grade_task``) carries its CPU seconds by lab and
    outside any lab, adding up to ``cpu_s``; one clock over two students charges every
    CPU-second between them to one of them."""
    from grader.batch.pool import grade_task
    from grader.course import Course
    from grader.engine.lab_clock import LabClock
    from grader.grading import Grader
    from helpers import make_submission

    course = Course(paths.KIT, rubric)
    folder = make_submission("bug_softmax_dim", tmp_path / "alice")
    with Grader(course, zygote=zygote) as grader:
        clock = LabClock(grader.sandbox_pid)
        before = clock.reading()
        replies = [grade_task({"student": name, "path": str(folder), "kind": "folder",
                               "fingerprint": {}}, rubric=rubric.only(LABS_1_3),
                              out=tmp_path / "out", grader=grader, labs=LABS_1_3, clock=clock)
                   for name in ("alice", "alice2")]
        after = clock.reading()
    for reply in replies:
        assert reply["status"] == "ok" and not reply["restart"]
        assert set(reply["cpu_by_lab_s"]) == set(LABS_1_3)
        assert all(s > 0 for s in reply["cpu_by_lab_s"].values()), reply
        assert reply["cpu_outside_labs_s"] >= 0
        assert sum(reply["cpu_by_lab_s"].values()) + reply["cpu_outside_labs_s"] == \
            pytest.approx(reply["cpu_s"], abs=1e-9)
    # Nothing between the two students (nor after the first reading) is left out.
    assert sum(r["cpu_s"] for r in replies) == pytest.approx(after - before, abs=0.05)


def test_a_batch_summary_has_its_cpu_by_lab_adding_up_to_its_cpu(tmp_path):
    """``grade_batch``'s summary: CPU seconds by graded lab and outside the labs, which add
    up to its ``cpu_seconds`` within the rounding of each (1 ms)."""
    import shutil

    from grader.batch import grade_batch
    from grader.course import Course

    root = tmp_path / "class"
    for student in ("s1", "s2"):
        (root / student).mkdir(parents=True)
        for lab in LABS_1_3:
            shutil.copyfile(paths.KIT / "solutions" / f"{lab}.py", root / student / f"{lab}.py")
    summary = grade_batch(root, out=tmp_path / "out", course=Course(paths.KIT), jobs=1,
                          progress=False, labs=LABS_1_3)
    assert summary.graded == 2 and summary.not_ok == 0
    assert set(summary.cpu_seconds_by_lab) == set(LABS_1_3)
    assert all(s > 0 for s in summary.cpu_seconds_by_lab.values()), summary
    parts = sum(summary.cpu_seconds_by_lab.values()) + summary.cpu_seconds_outside_labs
    assert parts == pytest.approx(summary.cpu_seconds, abs=0.002)
    assert summary.to_dict()["cpu_seconds_by_lab"] == summary.cpu_seconds_by_lab


def _figures(*, lab8_batch: float, lab_code: float, boxed_labs: dict | None = None) -> dict:
    """bench_batch's figures for two labs (lab 1, lab 8), as measured, made up."""
    labs = {"lab1_attention": 0.5, "lab8_train_transformer": lab8_batch}
    boxed = boxed_labs or {"lab1_attention": 0.4, "lab8_train_transformer": 11.0}
    return {
        "batch": {"by_lab": labs, "outside_labs_cpu_s": 0.1,
                  "cpu_per_submission_s": sum(labs.values()) + 0.1,
                  "training": {"cpu_per_submission_s": 10.0, "mean_of_reported_s": 10.0,
                               "reported": 4, "students": 4}},
        "floor": {"repeat": 2, "max_score": 50.0, "same_report": True,
                  "sandboxed": {"by_lab": {lab: {"cpu_s": v, "lab_code_s": None}
                                           for lab, v in boxed.items()},
                                "outside_labs_cpu_s": 0.05,
                                "cpu_per_submission_s": sum(boxed.values()) + 0.05,
                                "training_cpu_s": 10.0,
                                "top_tests": {"lab8_train_transformer": [
                                    {"test": "public/test_lab8_train_transformer.py::"
                                             "test_train_returns_a_trained_model_within_budget",
                                     "cpu_s": 10.5, "lab_code_s": None},
                                    {"test": "import", "cpu_s": 0.2, "lab_code_s": None}]}},
                  "in_process": {"by_lab": {"lab1_attention": {"cpu_s": 0.3, "lab_code_s": lab_code},
                                            "lab8_train_transformer": {"cpu_s": 9.0,
                                                                       "lab_code_s": 8.0}},
                                 "outside_labs_cpu_s": 0.02, "outside_labs_lab_code_s": 0.0,
                                 "cpu_per_submission_s": 9.32,
                                 "lab_code_per_submission_s": lab_code + 8.0,
                                 "training_cpu_s": None,
                                 "top_tests": {"lab1_attention": [
                                     {"test": "hidden/test_lab1_attention.py::test_gradients_match_pytorch",
                                      "cpu_s": 0.2, "lab_code_s": 0.15}]}}},
        "nbgrader": {"per_submission_s": 30.0, "cpu_per_submission_s": 40.0, "samples": 1,
                     "by_lab": {"lab1_attention": {"wall_s": 10.0, "cpu_s": 15.0},
                                "lab8_train_transformer": {"wall_s": 20.0, "cpu_s": 25.0}}},
        "pytest_per_process": {"per_submission_s": 20.0, "cpu_per_submission_s": 24.0,
                               "samples": 1, "score_mismatches": []},
    }


LABS_1_8 = ["lab1_attention", "lab8_train_transformer"]


def test_bench_prints_each_lab_and_checks_the_parts_add_up(capsys):
    bench = _load("bench_batch")
    figures = _figures(lab8_batch=10.5, lab_code=0.1)
    assert bench.print_per_lab(figures, LABS_1_8) < 1e-9
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("lab "))
    for column in ("batch", "floor boxed", "floor bare", "lab code", "nbgrader", "nbgrader/batch"):
        assert column in header, column
    # batch, floor sandboxed, bare, lab code, nbgrader; nbgrader's CPU over the batch's
    assert "lab1_attention" + " " * 16 + "       0.500       0.400       0.300       0.100" \
        "      15.000           30.0x" in out
    assert "\ntotal " in out and "\noutside any lab " in out
    assert "add up to its total (largest difference 0.0000 CPU-s)" in out
    assert "24.00 CPU-s per submission (2.2x the batch's CPU-s" in out
    assert "no per-lab ratio" in out
    assert "10.000 CPU-s per student of the class (4 of 4 students' reports give it" in out
    # A lab missing from a column's breakdown: its parts no longer add up, and it says so.
    del figures["batch"]["by_lab"]["lab8_train_transformer"]
    assert bench.print_per_lab(figures, LABS_1_8) > bench.ADDS_UP_S
    assert "WARNING: a column's parts miss its total by 10.5000 CPU-s" in capsys.readouterr().out


def test_bench_checks_the_goals_and_says_where_the_seconds_go(capsys):
    bench = _load("bench_batch")
    held = bench.check_goals(_figures(lab8_batch=10.5, lab_code=0.1), LABS_1_8)
    out = capsys.readouterr().out
    assert held["a_lab_code_labs_1_7"]["holds"] and held["b_beyond_training"]["holds"]
    assert "(a) labs 1-7 together, in the lab code: 0.10 CPU-s" in out and "vs at most 3: holds" in out
    assert "0.50 CPU-s (the batch's lab 8, 10.50, less the training its workers reported, 10.00) " \
           "= 5.0% of the training vs at most 10%: holds" in out
    assert "where the seconds go" not in out
    missed = bench.check_goals(_figures(lab8_batch=12.0, lab_code=3.5), LABS_1_8)
    out = capsys.readouterr().out
    assert not missed["a_lab_code_labs_1_7"]["holds"] and not missed["b_beyond_training"]["holds"]
    assert "3.50 CPU-s (the floor, in-process" in out and "DOES NOT HOLD" in out
    assert "where the seconds go: lab1_attention costs most (3.50 CPU-s of lab code)" in out
    assert "hidden test_gradients_match_pytorch" in out
    assert "2.00 CPU-s (the batch's lab 8, 12.00" in out and "= 20.0% of the training" in out
    assert "where the seconds go: lab8_train_transformer's costliest tests" in out
    assert "public test_train_returns_a_trained_model_within_budget" in out
    assert "import probe" in out
    assert missed["b_beyond_training"]["floor_sandboxed"] == {"lab8_s": 11.0, "training_s": 10.0}


def test_bench_reads_the_training_as_the_students_report_gives_it(tmp_path):
    """The figure is read back from what ``training_figures`` writes to the student."""
    import json

    from grader.suites._training import training_figures
    bench = _load("bench_batch")
    text = training_figures({"cpu_s": 12.34, "budget_s": 40.0}, 2.5, 0.01, 0.99, 256)
    report = tmp_path / "results.json"
    report.write_text(json.dumps({"tests": [
        {"name": "lab1_attention: test_x", "output": "fine"},
        {"name": "lab8_train_transformer: test_train", "output": "desc\n" + text}]}))
    assert bench.reported_training_s(report) == pytest.approx(12.3)
    report.write_text(json.dumps({"tests": [{"name": "lab1_attention: test_x", "output": ""}]}))
    assert bench.reported_training_s(report) is None
