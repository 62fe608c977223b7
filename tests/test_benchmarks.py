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
# lab 5's generate (student, reference); lab 6: 2 lengths for each of the two memory tests
# by length, 1 for the 65,536-key one, 1 short + 1 long + 1 reference for the work test.
MEASURED_CALLS = 2 + (2 + 2 + 1 + 3)


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
    assert len(labs) == len(rubric.labs) + MEASURED_CALLS
    assert bare_zygote.handler_s > 0


def test_floor_measures_both_ways_in_alternation(floor, rubric, zygote):
    bare = floor.InProcessZygote()
    got = floor.measure({"sandboxed": zygote, "in_process": bare}, rubric, 2)
    assert got["same_report"] is True
    assert got["sandboxed"]["score"] == got["in_process"]["score"] == rubric.max_points
    assert got["sandboxed"]["lab_code_per_submission_s"] is None   # the workers' own time
    lab_code = got["in_process"]["lab_code_per_submission_s"]
    assert 0 < lab_code < got["in_process"]["cpu_per_submission_s"]
    # The sandboxed figure counts the zygote and its reaped workers, which run the lab code.
    assert got["sandboxed"]["cpu_per_submission_s"] > got["in_process"]["cpu_per_submission_s"] - lab_code
    # Two warm-ups and two rounds, each a fresh worker per lab (the solutions kill none)
    # and per measured call.
    assert len(bare.workers) == (2 + 2) * (len(rubric.labs) + MEASURED_CALLS)


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
    case; it prints (and writes) the figures. No timing is asserted: only that every run
    graded as expected and every phase of the timeline was seen, in a possible order."""
    import json
    import subprocess
    figures = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "bench_check.py"), "--repeat", "1",
                           "--breakdown", "1", "--cases", "solutions,stubs,buggy",
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
    figures = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "bench_check.py"), "--cases",
                           "lab3_positional", "--repeat", "1", "--breakdown", "1",
                           "--json", str(figures)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(figures.read_text())["cases"]["lab3_positional"]
    assert got["median_s"] > 0 and got["timeline"]["output_end"] > got["timeline"]["tests_end"]
