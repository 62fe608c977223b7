"""grader batch --scheduler: the same batch on a real Dask cluster of separate processes.

A scheduler and two workers (``--nthreads 1`` each, under their nannies, as a user runs
them) are started on 127.0.0.1 by the module's fixture and stopped by pid. A small class
(a correct student, a bug, a zip, a missing lab, a hostile student, a stray file and a slow
one), one lab, is graded locally and on the cluster; one worker is killed (SIGKILL, by its
pid) while it grades, and the gradebook must still be the local one, every student written
once. A worker with another course secret is refused before anyone is graded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from helpers import make_submission

pytest.importorskip("distributed")

from distributed import Client

from grader import paths
from grader.course import Course
from grader.batch import grade_batch
from grader.batch.cluster import (course_difference, course_identity,
                                  write_student_files)
from grader.errors import BatchError, CourseMismatch
from grader.rubric import load_rubric
from grader.secret import course_secret

REPO = Path(__file__).resolve().parent.parent
LAB = "lab1_attention"
START_TIMEOUT_S = 300          # a loaded 2-core machine: interpreters, imports, torch
HOSTILE_LAB1 = """\
import os, signal
# Kill every process this code can see, then leave without a word.
for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) != os.getpid():
        try:
            os.kill(int(entry), signal.SIGKILL)
        except OSError:
            pass
os._exit(3)
"""
SLOW_STUDENT = "sam_slow"      # the student a worker is killed while grading


def _env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


class Cluster:
    """A dask scheduler and workers, each a process of its own, stopped by pid."""

    def __init__(self, folder: Path, workers: int, env: dict):
        self.folder, self.env = folder, env
        self.procs: list[subprocess.Popen] = []
        file = folder / "scheduler.json"
        self._start("scheduler", [sys.executable, "-m", "distributed.cli.dask_scheduler",
                                  "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                  "--scheduler-file", str(file)])
        deadline = time.monotonic() + START_TIMEOUT_S
        while not file.exists() or not file.read_text().strip().endswith("}"):
            if time.monotonic() > deadline or self.procs[0].poll() is not None:
                raise RuntimeError(f"the scheduler did not start: {self.log('scheduler')}")
            time.sleep(0.2)
        self.address = json.loads(file.read_text())["address"]
        for i in range(workers):
            self._start(f"worker{i}", [
                sys.executable, "-m", "distributed.cli.dask_worker", self.address,
                "--nworkers", "1", "--nthreads", "1", "--host", "127.0.0.1",
                "--no-dashboard", "--memory-limit", "0", "--death-timeout", "120"])
        self.client = Client(self.address, timeout=60, set_as_default=False)
        self.client.wait_for_workers(workers, timeout=START_TIMEOUT_S)

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.folder / f"{name}.log", "wb")       # noqa: SIM115 - closed with the process
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                           env=self.env, cwd=self.folder))
        log.close()

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")[-2000:]

    def worker_pids(self) -> dict[str, int]:
        return self.client.run(os.getpid)

    def close(self) -> None:
        workers = {}
        with contextlib.suppress(Exception):     # stop the processes all the same
            workers = {pid: _started(pid) for pid in self.worker_pids().values()}
            self.client.close(timeout=10)
        for proc in reversed(self.procs):          # nannies first, then the scheduler
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for pid, started in workers.items():      # a worker its nanny left behind
            if started is not None and _started(pid) == started:     # the same process
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = Cluster(tmp_path_factory.mktemp("dask"), workers=2, env=_env())
    try:
        yield running
    finally:
        running.close()


def build_class(root: Path) -> Path:
    make_submission("ok_einsum", root / "alice")
    make_submission("bug_no_scale", root / "bob")
    correct = make_submission("ok_einsum", root.parent / f"{root.name}-zip")
    with zipfile.ZipFile(root / "carol.zip", "w") as zf:
        for f in sorted(correct.iterdir()):
            zf.write(f, f"carol/{f.name}")
    dan = make_submission("ok_einsum", root / "dan")
    (dan / f"{LAB}.py").rename(dan / f"{LAB} (1).py")          # "did you mean ...?"
    make_submission("ok_einsum", root / "mallory").joinpath(f"{LAB}.py").write_text(HOSTILE_LAB1)
    slow = make_submission("ok_einsum", root / SLOW_STUDENT).joinpath(f"{LAB}.py")
    slow.write_text("import time\ntime.sleep(4)\n" + slow.read_text())   # within the limit
    make_submission("ok_einsum", root / "zoe")
    (root / "notes.txt").write_text("not a submission\n")
    return root


def without_timings(results: dict) -> dict:
    results = dict(results)
    results.pop("execution_time", None)
    return results


def assert_same_gradebook(local: Path, remote: Path) -> None:
    """Every file the local batch wrote, the same in the cluster's (timings aside)."""
    names = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(remote).as_posix()
                           for p in remote.rglob("*") if p.is_file())
    for name in names:
        a, b = (local / name).read_bytes(), (remote / name).read_bytes()
        if name.endswith("results.json"):
            assert without_timings(json.loads(a)) == without_timings(json.loads(b)), name
        else:
            assert a == b, name


def executing(client: Client, prefix: str) -> list[str]:
    """The workers now running a task whose key starts with ``prefix``."""
    def keys(dask_worker):
        return [str(ts.key) for ts in dask_worker.state.executing]
    return [addr for addr, running in client.run(keys).items()
            if any(k.startswith(prefix) for k in running)]


def sandbox_pid(client: Client, worker: str) -> int | None:
    """The sandbox zygote's pid of the worker's grader (our plugin's service)."""
    def pid(dask_worker):
        for plugin in dask_worker.plugins.values():
            service = getattr(plugin, "service", None)
            if service is not None and service.grader is not None:
                return service.grader.sandbox_pid
        return None
    return client.run(pid, workers=[worker])[worker]


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot), None if there is none: with
    the pid, it names one process (a pid alone may be reused)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# ------------------------------------------------------------------------- the cluster

@pytest.mark.slow
def test_cluster_batch_matches_local_and_survives_a_killed_worker(cluster, tmp_path):
    root = build_class(tmp_path / "class")
    local = tmp_path / "local"
    grade_batch(root, out=local, jobs=1, progress=False, course=Course(paths.KIT), labs=[LAB])
    rows = (local / "grades.csv").read_text()
    assert re.search(rf'^"mallory",0,0,\d+,"{LAB}: import_error"$', rows, re.M), rows
    assert "did you mean" in (local / "dan" / "results.json").read_text()

    remote = tmp_path / "remote"
    batch = subprocess.Popen(
        [sys.executable, "-m", "grader.cli", "batch", str(root), "--out", str(remote),
         "--lab", LAB, "--scheduler", cluster.address],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=tmp_path)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(batch.stdout), daemon=True)
    reader.start()
    # Kill the worker that grades the slow student, a second into it.
    deadline, victim = time.monotonic() + START_TIMEOUT_S, None
    while victim is None and time.monotonic() < deadline and batch.poll() is None:
        busy = executing(cluster.client, f"grade-{SLOW_STUDENT}-")
        if busy:
            victim = busy[0]
        else:
            time.sleep(0.1)
    assert victim is not None, "the slow student was never seen on a worker: " + "".join(output)
    time.sleep(1.0)
    zygote = sandbox_pid(cluster.client, victim)
    pid = cluster.worker_pids()[victim]
    os.kill(pid, signal.SIGKILL)
    try:
        assert batch.wait(timeout=START_TIMEOUT_S) == 0, "".join(output)
    finally:
        if batch.poll() is None:
            batch.kill()
    reader.join(timeout=10)
    text = "".join(output)

    assert_same_gradebook(local, remote)
    students = len(list(root.iterdir()))
    # Every student written once: the batch counts each as it writes them.
    assert f"{students} students ({students} graded now, 0 up to date)" in text, text
    # The killed worker's sandbox went with it (the zygote dies with its grading thread).
    assert zygote is not None
    end = time.monotonic() + 30
    while _alive(zygote) and time.monotonic() < end:
        time.sleep(0.2)
    assert not _alive(zygote), "the killed worker's sandbox zygote is still running"

    # Resumable: nothing changed, nothing is graded again; one edit, one student.
    again = grade_batch(root, out=remote, progress=False, course=Course(paths.KIT), labs=[LAB], scheduler=cluster.address)
    assert (again.graded, again.up_to_date) == (0, students)
    (root / "bob" / f"{LAB}.py").write_text((root / "alice" / f"{LAB}.py").read_text())
    fixed = grade_batch(root, out=remote, progress=False, course=Course(paths.KIT), labs=[LAB], scheduler=cluster.address)
    assert (fixed.graded, fixed.up_to_date) == (1, students - 1)
    full = load_rubric((paths.KIT / "rubric.yaml")).labs[LAB].max_points
    assert re.search(rf'^"bob",{full:g},{full:g},', (remote / "grades.csv").read_text(), re.M)


@pytest.mark.slow
def test_worker_with_another_course_is_refused_before_grading(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    shutil.copy((paths.KIT / "rubric.yaml"), course / "rubric.yaml")
    shutil.copytree((paths.KIT / "solutions"), course / "solutions")
    (course / ".grader-secret").write_text("ab" * 32 + "\n")        # not the client's
    course_secret(paths.KIT)                                         # the client's exists
    other = Cluster(tmp_path, workers=1, env=_env())
    try:
        root = tmp_path / "class"
        make_submission("ok_einsum", root / "alice")
        with pytest.raises(CourseMismatch, match=r"the suites or the course secret"):
            grade_batch(root, out=tmp_path / "out", progress=False, course=Course(paths.KIT),
                        labs=[LAB], scheduler=other.address, worker_course=course)
        assert not (tmp_path / "out" / "alice").exists()
    finally:
        other.close()


# ------------------------------------------------------------------------- no cluster

def test_course_difference_names_what_differs(rubric):
    mine = course_identity(Course(paths.KIT, rubric, secret=b"s" * 32))
    assert course_difference(mine, dict(mine)) == []
    theirs = course_identity(Course(paths.KIT, rubric, secret=b"t" * 32))
    assert course_difference(mine, theirs) == [
        "the suites or the course secret (.grader-secret: hidden inputs derive from it)"]
    assert course_difference(mine, {**mine, "grader": "0"}) == [
        "the grader's code (install the same version everywhere)"]


def test_client_writes_a_workers_files_in_order_and_refuses_odd_names(tmp_path):
    (tmp_path / "ada").mkdir()
    (tmp_path / "ada" / "fingerprint.json").write_text("old")
    write_student_files(tmp_path, "ada", {"results.json": b"{}", "feedback.html": b"<p>"})
    assert not (tmp_path / "ada" / "fingerprint.json").exists()    # a fault: regraded
    assert (tmp_path / "ada" / "results.json").read_bytes() == b"{}"
    with pytest.raises(BatchError, match="a file named '../x'"):
        write_student_files(tmp_path, "ada", {"../x": b""})


def test_without_scheduler_nothing_imports_dask(tmp_path):
    code = ("import sys\n"
            "from grader.cli import main\n"
            "try:\n"
            "    main(['batch', '--help'])\n"
            "except SystemExit:\n"
            "    pass\n"
            "import grader.batch\n"
            "print('DASK', sorted(m for m in ('dask', 'distributed') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert "--scheduler ADDRESS" in proc.stdout
    assert "DASK []" in proc.stdout, proc.stdout[-300:]


class _Finished:
    """A finished Dask future, as ``ClusterPool._finish`` reads one."""

    def __init__(self, value=None, error: BaseException | None = None):
        self.value, self.error = value, error

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value


def test_a_student_whose_workers_keep_dying_is_a_grader_fault_not_a_score(tmp_path, rubric):
    from distributed.scheduler import KilledWorker

    from grader.batch.cluster import ClusterPool
    done = []
    pool = object.__new__(ClusterPool)           # no scheduler: only the bookkeeping
    pool.out, pool.scored, pool.on_done = tmp_path, rubric.only([LAB]), done.append
    (tmp_path / "ada").mkdir()
    (tmp_path / "ada" / "fingerprint.json").write_text("{}")
    task = {"student": "ada", "submitted": time.monotonic()}
    pool._finish(_Finished(error=KilledWorker("grade-ada-1", None, 3)), task)
    status = "grading failed: the Dask workers grading it died 4 times"
    assert [d["status"] for d in done] == [status]
    results = json.loads((tmp_path / "ada" / "results.json").read_text())
    assert results["score"] == 0 and results["extra_data"]["status"] == status
    assert not (tmp_path / "ada" / "fingerprint.json").exists()       # graded again next run
    # A worker that cannot start its sandbox stops the batch, as a local process does.
    with pytest.raises(BatchError, match="could not start"):
        pool._finish(_Finished(error=BatchError("Dask worker x could not start its sandbox")),
                     task)


def test_each_worker_process_on_a_machine_gets_a_sandbox_slot_of_its_own():
    from grader.batch.cluster import SLOT_BASE, claim_slot
    first, held = claim_slot()
    try:
        second, also_held = claim_slot()          # another holder while the first is held
        os.close(also_held)
        assert first >= SLOT_BASE and second >= SLOT_BASE and first != second
    finally:
        os.close(held)


class _StuckService:
    """A worker's grading service that never answers (a grader hung on a student)."""
    made = 0

    def __init__(self, course, labs):
        import queue
        type(self).made += 1
        self.course = course
        self.ready, self.failure, self.jobs = threading.Event(), "", queue.Queue()
        self.ready.set()
        self.abandoned = False

    def abandon(self):
        self.abandoned = True


def test_a_student_past_the_budget_is_stopped_and_the_grader_replaced(monkeypatch):
    from grader.batch import cluster
    monkeypatch.setattr(cluster, "GradingService", _StuckService)
    plugin = cluster.GradingPlugin(name="p", expected={}, course=str(paths.KIT), labs=None)
    plugin.lock, plugin.service = threading.Lock(), _StuckService(None, None)
    stuck = plugin.service
    reply = plugin.grade({"student": "ada"}, budget_s=0.2)
    # The local pool's words; no files: the client writes a zero result, no fingerprint.
    assert reply["status"] == "grading failed: took longer than 0.2 s and was stopped"
    assert "files" not in reply
    assert stuck.abandoned and plugin.service is not stuck and _StuckService.made == 2
