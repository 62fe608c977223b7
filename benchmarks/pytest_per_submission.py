"""A pytest plugin for the baseline of bench_batch.py: one ``pytest`` process per submission.

    GRADER_BENCH_SUBMISSION=path/to/student GRADER_BENCH_RESULT=out.json \\
    PYTHONPATH=benchmarks python -m pytest -p pytest_per_submission grader/suites/...

It runs the same suites through the same grading plugin and sandbox as ``grader grade``, so
every submission pays what a fresh process pays: interpreter start, ``import torch`` (in
pytest and in the sandbox zygote), collection. It does not probe the labs first (a lab that
does not import fails test by test instead), which gives the same points. The total is
written to GRADER_BENCH_RESULT so that the benchmark can check it against the batch's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from grader import paths
from grader.grading import score
from grader.intake import sanitize
from grader.engine.plugin import GradingPlugin
from grader.rubric import load_rubric
from grader.sandbox import Zygote, make_scratch
from grader.engine.reference import use_solutions
from grader.engine.student import Session

_STATE: dict = {}


def pytest_configure(config):
    rubric = load_rubric((paths.KIT / "rubric.yaml"))
    labs = list(rubric.labs)
    clean = sanitize(Path(os.environ["GRADER_BENCH_SUBMISSION"]), rubric, labs)
    zygote = Zygote(forbidden=rubric.all_forbidden).start()
    scratch = make_scratch(clean.files)
    # Calls into earlier labs answered as ``grading.Grader`` answers them (by the course's
    # reference, in reference workers): without them lab 2 could not import lab 1 at all.
    references = make_scratch({f.name: f.read_bytes()
                               for f in sorted((paths.KIT / "solutions").glob("lab*.py"))})
    session = Session(zygote=zygote, submission_dir=scratch.name,
                      forbidden={lab: spec.forbidden for lab, spec in rubric.labs.items()},
                      importable={lab: rubric.importable(lab) for lab in rubric.labs},
                      reference_dir=(references.name if rubric.lab_imports == "reference"
                                     else None),
                      imports_when_graded=rubric.lab_imports,
                      solutions=str(paths.KIT / "solutions"))
    use_solutions(paths.KIT / "solutions")      # what the suites' load_reference reads
    plugin = GradingPlugin(rubric=rubric, session=session)
    config.pluginmanager.register(plugin, "grading")
    _STATE.update(rubric=rubric, labs=labs, clean=clean, zygote=zygote, scratch=scratch,
                  references=references, session=session, plugin=plugin)


def pytest_unconfigure(config):
    if not _STATE:
        return
    s = _STATE
    s["session"].close()
    s["scratch"].cleanup()
    s["references"].cleanup()
    s["zygote"].close()
    problems = {lab: (p.kind, p.message) for lab, p in s["clean"].problems.items()}
    result = score("bench", s["rubric"], s["labs"], ("public", "hidden"), s["plugin"].outcomes,
                   problems, s["plugin"].collection_errors)
    Path(os.environ["GRADER_BENCH_RESULT"]).write_text(json.dumps({"total": result.score}))
