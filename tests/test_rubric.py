"""Tests of grader/rubric.py: rubric.yaml validation, inheritance, suite discovery."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from grader.rubric import (
    LabRubric,
    Rubric,
    RubricError,
    SuiteError,
    SuiteTest,
    TestRubric,
    Tolerance,
    check_rubric_against_suites,
    discover_suite_tests,
    load_rubric,
)

GOOD = """\
version: 1
defaults:
  time_limit_s: 5
  tolerance: {atol: 1.0e-6, rtol: 1.0e-5}
labs:
  lab1_attention:
    title: Scaled dot-product attention
    file: lab1_attention.py
    tolerance: {atol: 1.0e-4, rtol: 1.0e-3, why: float32 matmuls}
    time_limit_s: 8
    forbidden:
      - torch.nn.functional.scaled_dot_product_attention
      - torch.nn.functional.multi_head_attention_forward
    tests:
      test_matches_pytorch_float32: {points: 2, visibility: public}
      test_float64_dtype_kept:
        points: 1.5
        visibility: hidden
        tolerance: {atol: 1.0e-12, rtol: 1.0e-10, why: "float64 in and out"}
        time_limit_s: 20
  lab2_multihead:
    title: Multi-head attention
    file: lab2_multihead.py
    tests:
      test_split_heads: {points: 1, visibility: public}
      test_zero_points: {points: 0, visibility: hidden}
"""


def write(tmp_path: Path, text: str, name: str = "rubric.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def errors_of(tmp_path: Path, text: str) -> tuple[Path, list[str]]:
    path = write(tmp_path, text)
    with pytest.raises(RubricError) as info:
        load_rubric(path)
    assert str(info.value) == "\n".join(info.value.errors)
    return path, info.value.errors


def lab_rubric(tests: str = "test_a: {points: 1, visibility: public}\n", extra: str = "") -> str:
    """A valid one-lab rubric; *tests* are the lines under `tests:` (indented 6),
    *extra* lines go under the lab (indented 4) before `tests:`."""
    tests_block = textwrap.indent(textwrap.dedent(tests), " " * 6)
    extra_block = textwrap.indent(textwrap.dedent(extra), " " * 4) if extra else ""
    return (
        "version: 1\n"
        "labs:\n"
        "  lab1_attention:\n"
        "    title: Attention\n"
        "    file: lab1_attention.py\n"
        f"{extra_block}"
        "    tests:\n"
        f"{tests_block}"
    )


# --------------------------------------------------------------------------------------
# Happy path and inheritance
# --------------------------------------------------------------------------------------


def test_good_rubric_loads_with_inheritance(tmp_path):
    path = write(tmp_path, GOOD)
    rubric = load_rubric(path)
    assert isinstance(rubric, Rubric)
    assert rubric.path == path
    assert list(rubric.labs) == ["lab1_attention", "lab2_multihead"]

    lab1 = rubric.labs["lab1_attention"]
    assert lab1 == LabRubric(
        name="lab1_attention",
        title="Scaled dot-product attention",
        file="lab1_attention.py",
        tolerance=Tolerance(1e-4, 1e-3, "float32 matmuls"),
        time_limit_s=8.0,
        forbidden=(
            "torch.nn.functional.scaled_dot_product_attention",
            "torch.nn.functional.multi_head_attention_forward",
        ),
        tests={
            "test_matches_pytorch_float32": TestRubric(
                name="test_matches_pytorch_float32",
                points=2.0,
                visibility="public",
                tolerance=Tolerance(1e-4, 1e-3, "float32 matmuls"),  # from the lab
                time_limit_s=8.0,  # from the lab
                line=15,
            ),
            "test_float64_dtype_kept": TestRubric(
                name="test_float64_dtype_kept",
                points=1.5,
                visibility="hidden",
                tolerance=Tolerance(1e-12, 1e-10, "float64 in and out"),
                time_limit_s=20.0,
                line=16,
            ),
        },
    )
    assert list(lab1.tests) == ["test_matches_pytorch_float32", "test_float64_dtype_kept"]

    lab2 = rubric.labs["lab2_multihead"]
    assert lab2.tolerance == Tolerance(1e-6, 1e-5)  # from defaults
    assert lab2.time_limit_s == 5.0  # from defaults
    assert lab2.forbidden == ()
    t = lab2.tests["test_split_heads"]
    assert (t.tolerance, t.time_limit_s, t.line) == (Tolerance(1e-6, 1e-5), 5.0, 25)
    assert isinstance(t.points, float)

    assert lab1.max_points == 3.5
    assert lab2.max_points == 1.0
    assert rubric.max_points == 4.5


def test_builtin_defaults_without_defaults_section(tmp_path):
    rubric = load_rubric(write(tmp_path, lab_rubric()))
    lab = rubric.labs["lab1_attention"]
    assert lab.tolerance == Tolerance(atol=1e-5, rtol=1e-4, why=None)
    assert lab.time_limit_s == 10.0
    assert lab.tests["test_a"].tolerance == Tolerance(1e-5, 1e-4)
    assert lab.tests["test_a"].time_limit_s == 10.0


def test_exponent_without_dot_is_a_float(tmp_path):
    # PyYAML (YAML 1.1) would read 1e-5 as a string; the rubric loader reads a number.
    rubric = load_rubric(write(tmp_path, lab_rubric(extra="tolerance: {atol: 1e-5, rtol: 2E-3}\n")))
    assert rubric.labs["lab1_attention"].tolerance == Tolerance(1e-5, 2e-3)


def test_rubric_lookups(tmp_path):
    rubric = load_rubric(write(tmp_path, GOOD))
    assert rubric.lab_for_file("lab2_multihead.py").name == "lab2_multihead"
    assert rubric.lab_for_file(Path("submission") / "lab1_attention.py").name == "lab1_attention"
    assert rubric.lab_for_file("lab9_other.py") is None
    assert rubric.test("lab1_attention", "test_float64_dtype_kept").points == 1.5
    with pytest.raises(KeyError, match="no test 'test_nope' in labs.lab1_attention.tests"):
        rubric.test("lab1_attention", "test_nope")
    with pytest.raises(KeyError, match="no lab 'lab7_x'"):
        rubric.test("lab7_x", "test_a")


def test_dataclasses_are_frozen(tmp_path):
    rubric = load_rubric(write(tmp_path, GOOD))
    with pytest.raises(AttributeError):
        rubric.labs["lab1_attention"].tests["test_matches_pytorch_float32"].points = 5  # type: ignore[misc]


# --------------------------------------------------------------------------------------
# File-level problems
# --------------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(RubricError) as info:
        load_rubric(path)
    assert info.value.errors == [f"{path}: rubric file not found"]


def test_yaml_syntax_error_has_line(tmp_path):
    path, errors = errors_of(tmp_path, "version: 1\nlabs:\n  lab1_a: {title: x\n  lab2_b: 3\n")
    assert len(errors) == 1
    assert errors[0].startswith(f"{path}:4: invalid YAML: ")
    assert "flow mapping" in errors[0]


def test_tab_indentation_syntax_error(tmp_path):
    path, errors = errors_of(tmp_path, "version: 1\nlabs:\n\tlab1_a: 3\n")
    assert errors[0].startswith(f"{path}:3: invalid YAML: ")


def test_empty_file(tmp_path):
    path, errors = errors_of(tmp_path, "# nothing here\n")
    assert errors == [f"{path}:1: (top level): empty rubric; expected a mapping with keys version, defaults, labs"]


def test_top_level_not_a_mapping(tmp_path):
    path, errors = errors_of(tmp_path, "- version\n- labs\n")
    assert errors == [
        f"{path}:1: (top level): expected a mapping with keys version, defaults, labs, got a list"
    ]


# --------------------------------------------------------------------------------------
# Every validation rule, with the full error line
# --------------------------------------------------------------------------------------

A = "labs.lab1_attention"
T = f"{A}.tests.test_a"

CASES = {
    "unknown top-level key": (
        lab_rubric() + "lab: {}\n",
        ["{p}:8: lab: unknown key 'lab' (did you mean 'labs'?); allowed keys: version, defaults, lab_imports, output_mode, labs"],
    ),
    "unknown key without a close match": (
        lab_rubric() + "zzz: 1\n",
        ["{p}:8: zzz: unknown key 'zzz'; allowed keys: version, defaults, lab_imports, output_mode, labs"],
    ),
    "version missing": (
        lab_rubric().replace("version: 1\n", ""),
        ["{p}:1: version: missing; expected version: 1"],
    ),
    "version 2": (
        lab_rubric().replace("version: 1", "version: 2"),
        ["{p}:1: version: expected 1, got 2"],
    ),
    "version as a string": (
        lab_rubric().replace("version: 1", "version: '1'"),
        ["{p}:1: version: expected 1, got the string '1'"],
    ),
    "labs missing": (
        "version: 1\n",
        ["{p}:1: labs: missing; expected a mapping of labs (lab1_attention: ...)"],
    ),
    "labs empty": (
        "version: 1\nlabs: {}\n",
        ["{p}:2: labs: expected at least one lab, got an empty mapping"],
    ),
    "labs is a list": (
        "version: 1\nlabs:\n  - lab1_attention\n",
        ["{p}:3: labs: expected a mapping of labs (lab1_attention: ...), got a list"],
    ),
    "defaults unknown key": (
        "version: 1\ndefaults:\n  time_limit: 3\n" + lab_rubric().replace("version: 1\n", ""),
        [
            "{p}:3: defaults.time_limit: unknown key 'time_limit' (did you mean 'time_limit_s'?); "
            "allowed keys: time_limit_s, tolerance"
        ],
    ),
    "defaults time limit zero": (
        "version: 1\ndefaults:\n  time_limit_s: 0\n" + lab_rubric().replace("version: 1\n", ""),
        ["{p}:3: defaults.time_limit_s: expected a number > 0, got 0"],
    ),
    "defaults tolerance missing atol": (
        "version: 1\ndefaults:\n  tolerance: {rtol: 0.1}\n" + lab_rubric().replace("version: 1\n", ""),
        ["{p}:3: defaults.tolerance.atol: missing; expected a number >= 0"],
    ),
    "bad lab name": (
        lab_rubric().replace("  lab1_attention:", "  Lab1-Attention:").replace(
            "file: lab1_attention.py", "file: Lab1-Attention.py"
        ),
        [
            "{p}:3: labs.Lab1-Attention: lab name must match lab<N>_<name> "
            "(lowercase letters, digits, _), got 'Lab1-Attention'"
        ],
    ),
    "lab name without underscore part": (
        lab_rubric().replace("  lab1_attention:", "  lab1:").replace("file: lab1_attention.py", "file: lab1.py"),
        ["{p}:3: labs.lab1: lab name must match lab<N>_<name> (lowercase letters, digits, _), got 'lab1'"],
    ),
    "lab is null": (
        "version: 1\nlabs:\n  lab1_attention:\n",
        [
            "{p}:3: labs.lab1_attention: expected a mapping with keys title, file, tolerance, "
            "time_limit_s, forbidden, exports, tests, got nothing (null)"
        ],
    ),
    "unknown lab key": (
        lab_rubric(extra="titel: Typo\n"),
        [
            "{p}:6: labs.lab1_attention.titel: unknown key 'titel' (did you mean 'title'?); "
            "allowed keys: title, file, tolerance, time_limit_s, forbidden, exports, tests"
        ],
    ),
    "title missing": (
        lab_rubric().replace("    title: Attention\n", ""),
        [f"{{p}}:3: {A}.title: missing; expected a string"],
    ),
    "title not a string": (
        lab_rubric().replace("title: Attention", "title: [a, b]"),
        [f"{{p}}:4: {A}.title: expected a non-empty string, got a list"],
    ),
    "file missing": (
        lab_rubric().replace("    file: lab1_attention.py\n", ""),
        [f"{{p}}:3: {A}.file: missing; expected the file name 'lab1_attention.py'"],
    ),
    "file not .py": (
        lab_rubric().replace("file: lab1_attention.py", "file: lab1_attention.ipynb"),
        [f"{{p}}:5: {A}.file: expected a file name ending in .py, got 'lab1_attention.ipynb'"],
    ),
    "file stem differs": (
        lab_rubric().replace("file: lab1_attention.py", "file: lab1_attn.py"),
        [
            f"{{p}}:5: {A}.file: the file's stem must equal the lab name: "
            "expected 'lab1_attention.py', got 'lab1_attn.py'"
        ],
    ),
    "file not a string": (
        lab_rubric().replace("file: lab1_attention.py", "file: 12"),
        [f"{{p}}:5: {A}.file: expected the file name 'lab1_attention.py', got 12"],
    ),
    "lab time limit negative": (
        lab_rubric(extra="time_limit_s: -2\n"),
        [f"{{p}}:6: {A}.time_limit_s: expected a number > 0, got -2"],
    ),
    "forbidden not a list": (
        lab_rubric(extra="forbidden: torch.nn.MultiheadAttention\n"),
        [
            f"{{p}}:6: {A}.forbidden: expected a list of dotted names (torch.nn.X), "
            "got the string 'torch.nn.MultiheadAttention'"
        ],
    ),
    "forbidden item not a dotted name": (
        lab_rubric(extra="forbidden:\n  - torch.nn.Linear\n  - torch..nn\n  - 3\n"),
        [
            f"{{p}}:8: {A}.forbidden[1]: expected a dotted name like torch.nn.Linear, got the string 'torch..nn'",
            f"{{p}}:9: {A}.forbidden[2]: expected a dotted name like torch.nn.Linear, got 3",
        ],
    ),
    "forbidden item twice": (
        lab_rubric(extra="forbidden: [torch.nn.Linear, torch.nn.Linear]\n"),
        [f"{{p}}:6: {A}.forbidden[1]: 'torch.nn.Linear' is listed twice"],
    ),
    "tests missing": (
        lab_rubric().replace("    tests:\n      test_a: {points: 1, visibility: public}\n", ""),
        [f"{{p}}:3: {A}.tests: missing; expected a mapping of test names to {{points, visibility}}"],
    ),
    "tests empty": (
        lab_rubric().replace("    tests:\n      test_a: {points: 1, visibility: public}\n", "    tests: {}\n"),
        [f"{{p}}:6: {A}.tests: expected at least one test, got an empty mapping"],
    ),
    "bad test name": (
        lab_rubric("check_a: {points: 1, visibility: public}\n"),
        [f"{{p}}:7: {A}.tests.check_a: test name must match test_<name> (a pytest function name), got 'check_a'"],
    ),
    "test name with a dash": (
        lab_rubric("test-a: {points: 1, visibility: public}\n"),
        [f"{{p}}:7: {A}.tests.test-a: test name must match test_<name> (a pytest function name), got 'test-a'"],
    ),
    "test entry not a mapping": (
        lab_rubric("test_a: 2\n"),
        [f"{{p}}:7: {T}: expected a mapping like {{points: 1, visibility: public}}, got 2"],
    ),
    "unknown test key": (
        lab_rubric("test_a: {point: 1, visibility: public}\n"),
        [
            f"{{p}}:7: {T}.point: unknown key 'point' (did you mean 'points'?); "
            "allowed keys: points, visibility, tolerance, time_limit_s, budget",
            f"{{p}}:7: {T}.points: missing; expected a number >= 0",
        ],
    ),
    "points negative": (
        lab_rubric("test_a: {points: -1, visibility: public}\n"),
        [f"{{p}}:7: {T}.points: expected a number >= 0, got -1"],
    ),
    "points bool": (
        lab_rubric("test_a: {points: yes, visibility: public}\n"),
        [f"{{p}}:7: {T}.points: expected a number >= 0, got yes (a bool)"],
    ),
    "points string": (
        lab_rubric("test_a: {points: two, visibility: public}\n"),
        [f"{{p}}:7: {T}.points: expected a number >= 0, got the string 'two'"],
    ),
    "points nan": (
        lab_rubric("test_a: {points: .nan, visibility: public}\n"),
        [f"{{p}}:7: {T}.points: expected a number >= 0, got nan"],
    ),
    "visibility missing": (
        lab_rubric("test_a: {points: 1}\n"),
        [f"{{p}}:7: {T}.visibility: missing; expected public or hidden"],
    ),
    "visibility wrong": (
        lab_rubric("test_a:\n  points: 1\n  visibility: secret\n"),
        [f"{{p}}:9: {T}.visibility: expected public or hidden, got the string 'secret'"],
    ),
    "test time limit zero": (
        lab_rubric("test_a: {points: 1, visibility: public, time_limit_s: 0}\n"),
        [f"{{p}}:7: {T}.time_limit_s: expected a number > 0, got 0"],
    ),
    "test time limit string": (
        lab_rubric("test_a: {points: 1, visibility: public, time_limit_s: 10s}\n"),
        [f"{{p}}:7: {T}.time_limit_s: expected a number > 0, got the string '10s'"],
    ),
    "test tolerance override without why": (
        lab_rubric("test_a:\n  points: 1\n  visibility: public\n  tolerance: {atol: 0.1, rtol: 0.1}\n"),
        [
            f"{{p}}:10: {T}.tolerance.why: missing; a test's tolerance override must say why "
            "(the reason this test differs from its lab default)"
        ],
    ),
    "tolerance why empty": (
        lab_rubric("test_a:\n  points: 1\n  visibility: public\n  tolerance: {atol: 0.1, rtol: 0.1, why: ''}\n"),
        [f"{{p}}:10: {T}.tolerance.why: expected a non-empty string, got the string ''"],
    ),
    "tolerance negative atol": (
        lab_rubric(extra="tolerance: {atol: -1.0e-5, rtol: 1.0e-4}\n"),
        [f"{{p}}:6: {A}.tolerance.atol: expected a number >= 0, got -1e-05"],
    ),
    "tolerance infinite rtol": (
        lab_rubric(extra="tolerance: {atol: 0, rtol: .inf}\n"),
        [f"{{p}}:6: {A}.tolerance.rtol: expected a number >= 0, got inf"],
    ),
    "tolerance missing rtol (block style)": (
        lab_rubric(extra="tolerance:\n  atol: 1.0e-5\n"),
        [f"{{p}}:6: {A}.tolerance.rtol: missing; expected a number >= 0"],
    ),
    "tolerance unknown key": (
        lab_rubric(extra="tolerance: {atol: 0, rtol: 0, atoll: 1}\n"),
        [
            f"{{p}}:6: {A}.tolerance.atoll: unknown key 'atoll' (did you mean 'atol'?); "
            "allowed keys: atol, rtol, why"
        ],
    ),
    "tolerance not a mapping": (
        lab_rubric(extra="tolerance: 1.0e-5\n"),
        [f"{{p}}:6: {A}.tolerance: expected a mapping {{atol: ..., rtol: ...}}, got 1e-05"],
    ),
    "duplicate top-level key": (
        lab_rubric() + "version: 1\n",
        ["{p}:8: version: duplicate key 'version' (first defined at line 1)"],
    ),
    "duplicate lab": (
        lab_rubric() + "  lab1_attention: {}\n",
        [f"{{p}}:8: {A}: duplicate key 'lab1_attention' (first defined at line 3)"],
    ),
    "duplicate lab key": (
        lab_rubric(extra="title: Again\n"),
        [f"{{p}}:6: {A}.title: duplicate key 'title' (first defined at line 4)"],
    ),
    "duplicate test": (
        lab_rubric("test_a: {points: 1, visibility: public}\ntest_a: {points: 2, visibility: hidden}\n"),
        [f"{{p}}:8: {T}: duplicate key 'test_a' (first defined at line 7)"],
    ),
    "duplicate key in a test entry": (
        lab_rubric("test_a:\n  points: 1\n  visibility: public\n  points: 2\n"),
        [f"{{p}}:10: {T}.points: duplicate key 'points' (first defined at line 8)"],
    ),
    "duplicate key in a flow tolerance": (
        lab_rubric(extra="tolerance: {atol: 0, rtol: 0, atol: 1}\n"),
        [f"{{p}}:6: {A}.tolerance.atol: duplicate key 'atol' (first defined at line 6)"],
    ),
    "unknown YAML tag": (
        lab_rubric("test_a: {points: !!python/int 3, visibility: public}\n"),
        [
            f"{{p}}:7: {T}.points: cannot read this value: could not determine a constructor "
            "for the tag 'tag:yaml.org,2002:python/int'"
        ],
    ),
    "merge key is refused": (
        lab_rubric("test_a: {<<: {points: 1}, visibility: public}\n"),
        [
            f"{{p}}:7: {T}: expected a plain name as key, got <<",
            f"{{p}}:7: {T}.points: missing; expected a number >= 0",
        ],
    ),
}


@pytest.mark.parametrize("text, expected", list(CASES.values()), ids=list(CASES))
def test_validation_rule(tmp_path, text, expected):
    path, errors = errors_of(tmp_path, text)
    assert errors == [e.replace("{p}", str(path)) for e in expected]


def test_case_texts_are_valid_once_fixed(tmp_path):
    """Guard for the table above: the base text it edits is itself a valid rubric."""
    assert load_rubric(write(tmp_path, lab_rubric())).labs["lab1_attention"].tests["test_a"].line == 7


def test_all_problems_are_reported_in_line_order(tmp_path):
    text = """\
    version: 3
    labs:
      lab1_attention:
        title: Attention
        file: lab1_attn.py
        tests:
          test_a: {points: -1, visibility: public}
          test_b: {points: 1, visibility: secret}
      lab2_multihead:
        title: MHA
        file: lab2_multihead.py
        tests:
          test_c: {points: 1, visibility: hidden, tolerance: {atol: 0, rtol: 0}}
    extras: 1
    """
    path, errors = errors_of(tmp_path, text)
    assert errors == [
        f"{path}:1: version: expected 1, got 3",
        f"{path}:5: labs.lab1_attention.file: the file's stem must equal the lab name: "
        "expected 'lab1_attention.py', got 'lab1_attn.py'",
        f"{path}:7: labs.lab1_attention.tests.test_a.points: expected a number >= 0, got -1",
        f"{path}:8: labs.lab1_attention.tests.test_b.visibility: expected public or hidden, "
        "got the string 'secret'",
        f"{path}:13: labs.lab2_multihead.tests.test_c.tolerance.why: missing; a test's tolerance "
        "override must say why (the reason this test differs from its lab default)",
        f"{path}:14: extras: unknown key 'extras'; allowed keys: version, defaults, lab_imports, output_mode, labs",
    ]


def test_lab_level_tolerance_does_not_need_why(tmp_path):
    rubric = load_rubric(write(tmp_path, lab_rubric(extra="tolerance: {atol: 0.5, rtol: 0}\n")))
    assert rubric.labs["lab1_attention"].tests["test_a"].tolerance == Tolerance(0.5, 0.0)


def test_zero_tolerance_and_points_are_allowed(tmp_path):
    text = lab_rubric("test_a: {points: 0, visibility: hidden, tolerance: {atol: 0, rtol: 0, why: exact}}\n")
    t = load_rubric(write(tmp_path, text)).labs["lab1_attention"].tests["test_a"]
    assert (t.points, t.tolerance, t.visibility) == (0.0, Tolerance(0.0, 0.0, "exact"), "hidden")


# --------------------------------------------------------------------------------------
# Suites
# --------------------------------------------------------------------------------------


def make_suites(tmp_path: Path, files: dict[str, str]) -> Path:
    suites = tmp_path / "suites"
    for rel, text in files.items():
        p = suites / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text), encoding="utf-8")
    return suites


PUBLIC_LAB1 = """\
import pytest


def helper():
    pass


def test_a(student):
    def test_nested():  # not a test: nested
        pass


async def test_async(student):
    pass


class TestGroup:
    def test_method(self, student):
        pass

    def helper_method(self):
        pass

    class TestInner:
        def test_not_collected(self):
            pass


class Helper:
    def test_ignored(self):
        pass


test_assigned = 3
"""

HIDDEN_LAB1 = """\
def test_b(student):
    pass
"""


def test_discover_suite_tests(tmp_path):
    suites = make_suites(
        tmp_path,
        {
            "public/test_lab1_attention.py": PUBLIC_LAB1,
            "hidden/test_lab1_attention.py": HIDDEN_LAB1,
            "public/conftest.py": "def test_not_a_suite(): pass\n",
            "hidden/helpers.py": "def test_no(): pass\n",
        },
    )
    found = discover_suite_tests(suites)
    pub = suites / "public" / "test_lab1_attention.py"
    hid = suites / "hidden" / "test_lab1_attention.py"
    assert found == {
        "lab1_attention": {
            "test_a": SuiteTest("test_a", "public", pub, 8),
            "test_async": SuiteTest("test_async", "public", pub, 13),
            "test_method": SuiteTest("test_method", "public", pub, 18),
            "test_b": SuiteTest("test_b", "hidden", hid, 1),
        }
    }


def test_discover_missing_folders(tmp_path):
    suites = make_suites(tmp_path, {"hidden/test_lab2_multihead.py": HIDDEN_LAB1})
    assert discover_suite_tests(suites) == {
        "lab2_multihead": {
            "test_b": SuiteTest("test_b", "hidden", suites / "hidden" / "test_lab2_multihead.py", 1)
        }
    }
    assert discover_suite_tests(tmp_path / "nowhere") == {}


def test_discover_same_name_in_both_folders_is_an_error(tmp_path):
    suites = make_suites(
        tmp_path,
        {
            "public/test_lab1_attention.py": "def test_a():\n    pass\n",
            "hidden/test_lab1_attention.py": "\n\ndef test_a():\n    pass\n",
        },
    )
    with pytest.raises(SuiteError) as info:
        discover_suite_tests(suites)
    assert isinstance(info.value, RubricError)
    pub = suites / "public" / "test_lab1_attention.py"
    hid = suites / "hidden" / "test_lab1_attention.py"
    assert info.value.errors == [
        f"{hid}:3: test 'test_a' of lab1_attention is defined twice (also at {pub}:1); "
        "rubric keys are test names, so each must be unique within a lab"
    ]


def test_discover_same_name_twice_in_one_file_is_an_error(tmp_path):
    suites = make_suites(
        tmp_path,
        {"public/test_lab1_attention.py": "def test_a():\n    pass\n\nclass TestX:\n    def test_a(self):\n        pass\n"},
    )
    pub = suites / "public" / "test_lab1_attention.py"
    with pytest.raises(SuiteError) as info:
        discover_suite_tests(suites)
    assert info.value.errors == [
        f"{pub}:5: test 'test_a' of lab1_attention is defined twice (also at {pub}:1); "
        "rubric keys are test names, so each must be unique within a lab"
    ]


def test_discover_syntax_error(tmp_path):
    suites = make_suites(tmp_path, {"public/test_lab1_attention.py": "def test_a(:\n    pass\n"})
    with pytest.raises(SuiteError) as info:
        discover_suite_tests(suites)
    (err,) = info.value.errors
    assert err.startswith(f"{suites / 'public' / 'test_lab1_attention.py'}:1: cannot read the suite: ")


def test_discover_never_imports(tmp_path):
    marker = tmp_path / "imported"
    suites = make_suites(
        tmp_path,
        {"public/test_lab1_attention.py": f"open({str(marker)!r}, 'w').close()\n\ndef test_a():\n    pass\n"},
    )
    assert list(discover_suite_tests(suites)["lab1_attention"]) == ["test_a"]
    assert not marker.exists()


CHECK_RUBRIC = """\
version: 1
labs:
  lab1_attention:
    title: Attention
    file: lab1_attention.py
    tests:
      test_a: {points: 1, visibility: public}
      test_b: {points: 1, visibility: public}
      test_gone: {points: 1, visibility: hidden}
"""


def test_check_rubric_against_suites(tmp_path):
    rubric = load_rubric(write(tmp_path, CHECK_RUBRIC))
    suites = make_suites(
        tmp_path,
        {
            "public/test_lab1_attention.py": "def test_a():\n    pass\n\n\ndef test_new():\n    pass\n",
            "hidden/test_lab1_attention.py": "def test_b():\n    pass\n",
            "hidden/test_lab5_extra.py": "def test_x():\n    pass\n",
        },
    )
    pub = suites / "public" / "test_lab1_attention.py"
    hid = suites / "hidden" / "test_lab1_attention.py"
    p = rubric.path
    assert check_rubric_against_suites(rubric, suites) == [
        f"{suites / 'hidden' / 'test_lab5_extra.py'}:1: suite for lab 'lab5_extra', which is not in {p} "
        "(labs there: lab1_attention)",
        f"{pub}:5: test 'test_new' has no rubric entry; add labs.lab1_attention.tests.test_new "
        f"(visibility: public) to {p}",
        f"{p}:8: labs.lab1_attention.tests.test_b: visibility is 'public' but the test is in the "
        f"hidden suite ({hid}:1)",
        f"{p}:9: labs.lab1_attention.tests.test_gone: no test function 'test_gone' in {hid}; "
        f"did you mean 'test_new' ({pub}:5)?",
    ]


def test_check_rubric_against_matching_suites_is_clean(tmp_path):
    rubric = load_rubric(write(tmp_path, CHECK_RUBRIC))
    suites = make_suites(
        tmp_path,
        {
            "public/test_lab1_attention.py": "class TestA:\n    def test_a(self):\n        pass\n\n"
            "def test_b():\n    pass\n",
            "hidden/test_lab1_attention.py": "def test_gone():\n    pass\n",
        },
    )
    assert check_rubric_against_suites(rubric, suites) == []


def test_check_reports_suite_errors_too(tmp_path):
    rubric = load_rubric(write(tmp_path, CHECK_RUBRIC))
    suites = make_suites(
        tmp_path,
        {
            "public/test_lab1_attention.py": "def test_a():\n    pass\n\ndef test_b():\n    pass\n",
            "hidden/test_lab1_attention.py": "def test_gone():\n    pass\n\ndef test_a():\n    pass\n",
        },
    )
    pub = suites / "public" / "test_lab1_attention.py"
    hid = suites / "hidden" / "test_lab1_attention.py"
    assert check_rubric_against_suites(rubric, suites) == [
        f"{hid}:4: test 'test_a' of lab1_attention is defined twice (also at {pub}:1); "
        "rubric keys are test names, so each must be unique within a lab"
    ]
