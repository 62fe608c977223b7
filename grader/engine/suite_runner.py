"""One pytest session that stays up and grades submission after submission.

``pytest.main`` per submission pays pytest's start-up every time: configuration, plugin
registration, importing and collecting the suites (about a sixth of a submission's grading
time in a batch). ``SuiteRunner`` starts pytest once, on a thread of its own, with the
suites of every lab, and keeps its session open: its ``pytest_runtestloop`` hook waits for
a submission, runs that submission's tests through pytest's own per-test protocol
(``pytest_runtest_protocol``: fixtures, setup, call, teardown, reports, our
``GradingPlugin`` hooks), hands the outcomes back, and waits for the next. This is how
pytest-xdist's workers run the items their controller sends them.

Only the trusted suites run on that thread; student code runs in sandbox workers, as
always, reached through the ``Session`` given with each submission.
"""

from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from grader import paths
from grader.engine.plugin import GradingPlugin, lab_of
from grader.engine.reference import use_solutions
from grader.results import TestResult
from grader.rubric import Rubric
from grader.engine.student import Session
from grader.errors import RunnerError

# Built-in pytest plugins that grading never uses but that cost time on every run or test:
# the unraisable-exception hook ends each run with two full gc.collect() passes (0.1-0.3 s
# each once torch is loaded); threadexception/logging/faulthandler wrap every test, and
# capture swaps file descriptors around each test phase. Outcomes do not depend on them
# (warnings are off already; the suites use no caplog or capsys).
QUIET_PLUGINS = ("-p", "no:unraisableexception", "-p", "no:threadexception",
                 "-p", "no:logging", "-p", "no:faulthandler", "-p", "no:capture")


# pytest reads these from the environment when it parses its command line. They belong to
# whoever runs pytest for their own tests (an instructor's --durations, a CI's plugins):
# in the grading session they stopped it with a usage error, every test a grader fault.
PYTEST_ENVIRONMENT = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")
# One session parses its command line at a time while those are set aside (os.environ is
# the process's).
_PARSING = threading.Lock()


def suite_files(lab: str, visibility: tuple[str, ...]) -> list[str]:
    """The suite files of ``lab`` for the given visibilities (public, hidden), in order."""
    return [str(f) for v in visibility
            if (f := paths.SUITES / v / f"test_{lab}.py").is_file()]


def pytest_args(files: list[str]) -> list[str]:
    """How the grader runs pytest: our ini file only, no third-party plugins, no output."""
    # No third-party plugin autoload: scanning entry points costs ~1 s per start, and only
    # our plugin belongs in a grading session.
    return [*files, "-c", str(paths.SUITES / "pytest.ini"), "--rootdir", str(paths.SUITES),
            "--import-mode=importlib", "--disable-plugin-autoload", "-p", "no:terminal",
            "-p", "no:cacheprovider", "-p", "no:warnings", *QUIET_PLUGINS]


@dataclass
class _Job:
    session: Session
    labs: list[str]
    done: threading.Event = field(default_factory=threading.Event)
    outcomes: list[TestResult] = field(default_factory=list)
    collection_errors: list[str] = field(default_factory=list)
    error: BaseException | None = None


class SuiteRunner:
    """The suites of ``labs`` collected once; ``run`` grades one submission's labs.

    Use as a context manager, or call ``close``. Not for concurrent use: one submission at
    a time (a batch runs one runner per grading process).
    """

    def __init__(self, *, rubric: Rubric, labs: list[str] | None = None,
                 visibility: tuple[str, ...] = ("public", "hidden"), secret: bytes = b"",
                 solutions: str | Path | None = None):
        """``secret``: the course secret that hidden tests' inputs derive from (none: the
        test's name alone); ``solutions``: the course's reference solutions, which suites
        load by lab (``engine.reference``)."""
        self.solutions = solutions
        self.rubric = rubric
        self.labs = list(labs or rubric.labs)
        self.visibility = tuple(visibility)
        self.files = [f for lab in self.labs for f in suite_files(lab, self.visibility)]
        self.plugin = GradingPlugin(rubric=rubric, session=None, secret=secret)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._stopped = threading.Event()
        self._exit: object = None
        self._thread: threading.Thread | None = None

    # -- the caller's side ----------------------------------------------------------------
    def start(self) -> "SuiteRunner":
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name="grader-suites",
                                            daemon=True)
            self._thread.start()
        return self

    def run(self, session: Session, labs: list[str]) -> tuple[list[TestResult], list[str]]:
        """Run the tests of ``labs`` against ``session``: (outcomes, collection errors)."""
        unknown = [lab for lab in labs if lab not in self.labs]
        if unknown:
            raise ValueError(f"this runner has no suites for {', '.join(unknown)}")
        if not labs or not self.files:
            return [], []
        self.start()
        job = _Job(session=session, labs=list(labs))
        self._jobs.put(job)
        while not job.done.wait(0.5):
            if self._stopped.is_set():
                raise RunnerError(f"the pytest session stopped: {self._exit!r}")
        if job.error is not None:
            raise RunnerError(f"the pytest session failed: {job.error!r}") from job.error
        return job.outcomes, job.collection_errors

    def close(self, *, wait: bool = True) -> None:
        """End the session after the submission it is running; ``wait`` for it to end."""
        if self._thread is not None and not self._stopped.is_set():
            self._jobs.put(None)
            if wait:
                self._thread.join()
        self._thread = None

    def __enter__(self) -> "SuiteRunner":
        return self.start()

    def __exit__(self, exc_type, *exc) -> None:
        # Leaving on an error (Ctrl-C, say): do not wait for the tests still running; the
        # thread is a daemon and ends with the process.
        self.close(wait=exc_type is None)

    # -- the environment pytest reads -------------------------------------------------------
    _set_aside: dict | None = None

    def _restore_environment(self) -> None:
        """Put back what ``_main`` set aside, once, and let the next session parse."""
        if self._set_aside is None:
            return
        os.environ.update(self._set_aside)
        self._set_aside = None
        _PARSING.release()

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config) -> None:
        """The command line is parsed: the caller's environment is theirs again."""
        self._restore_environment()

    # -- the pytest thread ----------------------------------------------------------------
    def _main(self) -> None:
        try:
            use_solutions(self.solutions)
            _PARSING.acquire()
            self._set_aside = {name: os.environ.pop(name) for name in PYTEST_ENVIRONMENT
                               if name in os.environ}
            self._exit = pytest.main(pytest_args(self.files), plugins=[self.plugin, self])
        except BaseException as exc:  # noqa: BLE001 - reported to the waiting caller
            self._exit = exc
        finally:
            self._restore_environment()       # if the session stopped before configuring
            self._stopped.set()
            # A job still queued (or one that arrived as the session stopped) never runs.
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job.error = RunnerError(f"the pytest session stopped: {self._exit!r}")
                    job.done.set()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session) -> bool:
        """Replaces pytest's loop: wait for a submission, run its labs' items, repeat."""
        by_lab: dict[str, list] = {}
        for item in session.items:
            by_lab.setdefault(lab_of(item), []).append(item)
        while (job := self._jobs.get()) is not None:
            try:
                use_solutions(self.solutions)
                self.plugin.session = job.session
                self.plugin.outcomes, self.plugin.ambiguous = [], []
                items = [item for lab in job.labs for item in by_lab.get(lab, [])]
                for i, item in enumerate(items):
                    nextitem = items[i + 1] if i + 1 < len(items) else None
                    item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
                self.plugin.settle_diagnoses()
                job.outcomes = self.plugin.outcomes
                job.collection_errors = [e for e in self.plugin.collection_errors
                                         if any(f"test_{lab}.py" in e for lab in job.labs)]
            except BaseException as exc:  # noqa: BLE001 - this job fails, the session stays
                job.error = exc
            finally:
                self.plugin.session = None
                job.done.set()
        return True
