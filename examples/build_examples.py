"""Build the example class in examples/submissions/ (zips, one per student).

Each example is made from the reference solutions overlaid with one of the grader's test
fixtures (tests/fixtures/submissions/), so the examples cover the outcomes a real class
shows: correct work in other styles, one-bug work, a missing lab, a syntax error, untouched
stubs and a zip with the files in a subfolder. The zips are byte-for-byte reproducible:
run `python examples/build_examples.py` after changing solutions or fixtures.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from helpers import make_submission  # noqa: E402

# student id -> (fixture overlaid on the solutions | "exercises", folder inside the zip)
CLASS = {
    "ada_einsum": ("ok_einsum", ""),
    "ben_softmax_dim": ("bug_softmax_dim", ""),
    "cy_missing_lab3": ("missing_lab3", ""),
    "dee_syntax_error": ("broken_syntax", ""),
    "eli_untouched_stubs": ("exercises", ""),
    "fay_manual_softmax": ("ok_manual_softmax", "homework/"),
    "gus_norm_first_ignored": ("bug_norm_first_ignored", ""),
}
FIXED_TIME = (2026, 1, 1, 0, 0, 0)


def build(out: Path = ROOT / "examples" / "submissions") -> list[Path]:
    import tempfile

    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for student, (fixture, prefix) in CLASS.items():
            folder = (ROOT / "exercises") if fixture == "exercises" else make_submission(
                fixture, Path(tmp) / student)
            target = out / f"{student}.zip"
            with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
                for f in sorted(folder.glob("lab*.py")):
                    info = zipfile.ZipInfo(prefix + f.name, FIXED_TIME)
                    info.external_attr = 0o644 << 16
                    info.compress_type = zipfile.ZIP_DEFLATED
                    zf.writestr(info, f.read_bytes())
            written.append(target)
    return written


if __name__ == "__main__":
    for path in build():
        print(f"wrote {path.relative_to(ROOT)}")
