"""What the CI bundles carry: templates (``setup.sh``, ``run_autograder``, the student README,
the GitHub Classroom workflow) and the Gradescope runner (``grader.autograder.gradescope``)."""

from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent
