"""Tests of grader/authoring/stubs.py: solution regions -> student stubs."""

from __future__ import annotations

import ast
import os
import stat
import textwrap
from pathlib import Path

import pytest

from grader.authoring.stubs import (
    Region,
    StubError,
    leaked_solution_lines,
    solution_regions,
    strip_solutions,
    stub_drift,
    write_stubs,
)

SOLUTION = '''\
"""Lab 1: scaled dot-product attention.

Lesson text stays in the stub.
"""
import math

import torch
from torch import nn


def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0, training=False):
    """q: (..., seq_q, d_k) -> (output, weights)."""
    # BEGIN SOLUTION
    # hint: scores = q @ k^T / sqrt(d_k); blocked positions get -inf before the softmax.
    # hint: a row with every key blocked must give zeros, not NaN.
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v, weights
    # END SOLUTION


def causal_mask(seq_q, seq_k=None, device=None):
    """bool (seq_q, seq_k)."""
    seq_k = seq_q if seq_k is None else seq_k
    # BEGIN SOLUTION
    i = torch.arange(seq_q, device=device)[:, None]
    j = torch.arange(seq_k, device=device)[None, :]
    return j <= i + (seq_k - seq_q)
    # END SOLUTION


class Scale(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.d_model = d_model

    @torch.no_grad()
    def forward(self, x):
        if x.dim() == 3:
            # BEGIN SOLUTION
            # hint: multiply by sqrt(d_model).
            return x * math.sqrt(self.d_model)
            # END SOLUTION
        return x


async def fetch(x):
    # BEGIN SOLUTION
    return await x.fetch_all_of_it()
    # END SOLUTION


def outer(x):
    def inner(y):
        # BEGIN SOLUTION
        return y + 1
        # END SOLUTION

    return inner(x)
'''

HEADER = "# Generated from solutions/lab1_attention.py by `grader stubs`. Fill in the TODOs; keep the given code.\n"

STUB = HEADER + '''\
"""Lab 1: scaled dot-product attention.

Lesson text stays in the stub.
"""
import math

import torch
from torch import nn


def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0, training=False):
    """q: (..., seq_q, d_k) -> (output, weights)."""
    # TODO(Lab 1): scores = q @ k^T / sqrt(d_k); blocked positions get -inf before the softmax.
    # TODO(Lab 1): a row with every key blocked must give zeros, not NaN.
    raise NotImplementedError("Lab 1: scaled_dot_product_attention")


def causal_mask(seq_q, seq_k=None, device=None):
    """bool (seq_q, seq_k)."""
    seq_k = seq_q if seq_k is None else seq_k
    # TODO(Lab 1): implement causal_mask.
    raise NotImplementedError("Lab 1: causal_mask")


class Scale(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.d_model = d_model

    @torch.no_grad()
    def forward(self, x):
        if x.dim() == 3:
            # TODO(Lab 1): multiply by sqrt(d_model).
            raise NotImplementedError("Lab 1: Scale.forward")
        return x


async def fetch(x):
    # TODO(Lab 1): implement fetch.
    raise NotImplementedError("Lab 1: fetch")


def outer(x):
    def inner(y):
        # TODO(Lab 1): implement outer.inner.
        raise NotImplementedError("Lab 1: outer.inner")

    return inner(x)
'''

PATH = "solutions/lab1_attention.py"


def test_strip_solutions_exact_output():
    assert strip_solutions(SOLUTION, path=PATH) == STUB


def test_stub_header_names_the_file_not_its_folder():
    stub = strip_solutions(SOLUTION, path="/some/where/else/lab1_attention.py")
    assert stub == STUB


def test_stub_is_valid_python_and_keeps_signatures():
    tree = ast.parse(strip_solutions(SOLUTION, path=PATH))
    names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert names == {"scaled_dot_product_attention", "causal_mask", "__init__", "forward", "fetch", "outer", "inner"}


def test_solution_regions():
    regions = solution_regions(SOLUTION, path=PATH)
    assert [(r.start_line, r.end_line, r.func_name) for r in regions] == [
        (13, 22, "scaled_dot_product_attention"),
        (28, 32, "causal_mask"),
        (43, 46, "Scale.forward"),
        (51, 53, "fetch"),
        (58, 60, "outer.inner"),
    ]
    first = regions[0]
    assert first == Region(
        start_line=13,
        end_line=22,
        func_name="scaled_dot_product_attention",
        hints=(
            "scores = q @ k^T / sqrt(d_k); blocked positions get -inf before the softmax.",
            "a row with every key blocked must give zeros, not NaN.",
        ),
        code_lines=(
            "    d_k = q.size(-1)",
            "    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)",
            "    if mask is not None:",
            '        scores = scores.masked_fill(~mask, float("-inf"))',
            "    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)",
            "    return weights @ v, weights",
        ),
        indent="    ",
        lab=1,
    )
    assert regions[2].hints == ("multiply by sqrt(d_model).",)
    assert regions[2].indent == " " * 12
    assert regions[1].hints == ()


def test_no_regions_copies_the_file_under_the_header():
    source = "import torch\n\n\ndef given():\n    return 1\n"
    assert solution_regions(source, path="lab3_positional.py") == []
    assert strip_solutions(source, path="lab3_positional.py") == (
        "# Generated from solutions/lab3_positional.py by `grader stubs`. Fill in the TODOs; keep the given code.\n"
        + source
    )


def test_lab_number_from_file_name():
    source = "def f(x):\n    # BEGIN SOLUTION\n    return x + 1000000\n    # END SOLUTION\n"
    stub = strip_solutions(source, path="lab12_big.py")
    assert stub.splitlines()[1:] == [
        "def f(x):",
        "    # TODO(Lab 12): implement f.",
        '    raise NotImplementedError("Lab 12: f")',
    ]


def test_hints_only_directly_after_begin_and_empty_region():
    source = textwrap.dedent(
        """\
        def f(x):
            # BEGIN SOLUTION
            # Hint: capitalised is fine
            y = x * 2

            # hint: not a hint any more, it follows code
            return y
            # END SOLUTION


        def g(x):
            '''An empty region (the docstring keeps the solution valid).'''
            # BEGIN SOLUTION
            # END SOLUTION
        """
    )
    (rf, rg) = solution_regions(source, path="lab2_multihead.py")
    assert rf.hints == ("capitalised is fine",)
    assert rf.code_lines == ("    y = x * 2", "", "    # hint: not a hint any more, it follows code", "    return y")
    assert rg.hints == () and rg.code_lines == ()
    assert strip_solutions(source, path="lab2_multihead.py").splitlines()[1:] == [
        "def f(x):",
        "    # TODO(Lab 2): capitalised is fine",
        '    raise NotImplementedError("Lab 2: f")',
        "",
        "",
        "def g(x):",
        "    '''An empty region (the docstring keeps the solution valid).'''",
        "    # TODO(Lab 2): implement g.",
        '    raise NotImplementedError("Lab 2: g")',
    ]


def test_crlf_line_endings_are_kept():
    source = "def f(x):\r\n    # BEGIN SOLUTION\r\n    return x + 123456789\r\n    # END SOLUTION\r\n"
    assert strip_solutions(source, path="lab1_attention.py") == (
        HEADER.replace("\n", "\r\n")
        + "def f(x):\r\n"
        + "    # TODO(Lab 1): implement f.\r\n"
        + '    raise NotImplementedError("Lab 1: f")\r\n'
    )


def test_marker_text_inside_a_string_is_not_a_marker():
    source = 'def f():\n    """\n    # BEGIN SOLUTION\n    """\n    return 1\n'
    assert solution_regions(source, path="lab1_attention.py") == []


# --------------------------------------------------------------------------------------
# Refusals, each with its exact path:line
# --------------------------------------------------------------------------------------

REFUSALS = {
    "nested BEGIN": (
        """\
        def f(x):
            # BEGIN SOLUTION
            y = 1
            # BEGIN SOLUTION
            return y
            # END SOLUTION
            # END SOLUTION
        """,
        "lab1_attention.py:4: nested BEGIN SOLUTION (the region opened at line 2 is not closed yet); "
        "regions may not nest",
    ),
    "END without BEGIN": (
        """\
        def f(x):
            return x
            # END SOLUTION
        """,
        "lab1_attention.py:3: END SOLUTION without a BEGIN SOLUTION",
    ),
    "unclosed BEGIN": (
        """\
        def f(x):
            # BEGIN SOLUTION
            return x


        def g():
            pass
        """,
        "lab1_attention.py:2: BEGIN SOLUTION has no matching END SOLUTION",
    ),
    "different indentation": (
        """\
        def f(x):
            if x:
                # BEGIN SOLUTION
                return x
            # END SOLUTION
        """,
        "lab1_attention.py:5: END SOLUTION is indented with 4 spaces, its BEGIN SOLUTION (line 3) "
        "with 8 spaces; a pair must have the same indentation",
    ),
    "module level region": (
        """\
        import math

        # BEGIN SOLUTION
        X = math.pi * 2
        # END SOLUTION
        """,
        "lab1_attention.py:3: solution region (lines 3-5) is not inside a function or method body",
    ),
    "class body region": (
        """\
        class A:
            def m(self):
                return 1

            # BEGIN SOLUTION
            x = 1
            # END SOLUTION
        """,
        "lab1_attention.py:5: solution region (lines 5-7) is not inside a function or method body",
    ),
    "region after the function at its indentation": (
        """\
        def f():
            return 1
        # BEGIN SOLUTION
        # END SOLUTION
        """,
        "lab1_attention.py:3: solution region (lines 3-4) is not inside a function or method body",
    ),
    "region running out of the function": (
        """\
        def f():
            # BEGIN SOLUTION
            return 1
        x = 2
            # END SOLUTION
        """,
        "lab1_attention.py:2: solution region (lines 2-5) is not inside a function or method body",
    ),
    "malformed marker": (
        """\
        def f():
            # BEGIN SOLUTIONS
            return 1
            # END SOLUTION
        """,
        "lab1_attention.py:2: malformed solution marker '# BEGIN SOLUTIONS'; "
        "write '# BEGIN SOLUTION' or '# END SOLUTION'",
    ),
    "lowercase marker": (
        """\
        def f():
            # begin solution
            return 1
        """,
        "lab1_attention.py:2: malformed solution marker '# begin solution'; "
        "write '# BEGIN SOLUTION' or '# END SOLUTION'",
    ),
    "marker after code": (
        """\
        def f():
            x = 1  # BEGIN SOLUTION
            return x
            # END SOLUTION
        """,
        "lab1_attention.py:2: '# BEGIN SOLUTION' must be a comment line of its own, not after code",
    ),
    "solution not valid Python": (
        """\
        def f(:
            pass
        """,
        "lab1_attention.py:1: not valid Python: invalid syntax",
    ),
    "code less indented than BEGIN": (
        """\
        def f(x):
            if x:
                y = 1
                # BEGIN SOLUTION
            z = 2
                # END SOLUTION
            return z
        """,
        "lab1_attention.py:5: code in the solution region (lines 4-6) is indented less than its "
        "BEGIN SOLUTION (8 spaces)",
    ),
    "marker inside a statement": (
        """\
        def f(x):
            y = max(
                # BEGIN SOLUTION
                x,
                # END SOLUTION
                0,
            )
            return y
        """,
        "lab1_attention.py:3: solution marker inside the statement at line 2; a region must hold whole statements",
    ),
    "END inside a compound statement that starts in the region": (
        """\
        def f(x):
            # BEGIN SOLUTION
            for i in x:
                y = i
            # END SOLUTION
                z = i
            return 1
        """,
        "lab1_attention.py:5: END SOLUTION is inside the statement at line 3; a region must hold whole statements",
    ),
    "else clause in a region": (
        """\
        def f(x):
            if x:
                y = 1
            # BEGIN SOLUTION
            else:
                y = 2
            # END SOLUTION
            return y
        """,
        "lab1_attention.py:5: this line of the solution region (lines 4-7) belongs to a statement that "
        "starts before BEGIN SOLUTION (an else:/except:/finally: clause?); a region must hold whole statements",
    ),
    "elif starting a region": (
        """\
        def f(x):
            if x:
                y = 1
            # BEGIN SOLUTION
            elif x is None:
                y = 2
            # END SOLUTION
            return y
        """,
        "lab1_attention.py:5: an elif branch cannot start a solution region; put the whole if statement, "
        "or the branch's body, in the region",
    ),
    "region whose stub is not valid Python": (
        """\
        def f(x):
            if x:
            # BEGIN SOLUTION
                return 1
            # END SOLUTION
            return 0
        """,
        "lab1_attention.py:3: the generated stub would not be valid Python "
        "(expected an indented block after 'if' statement on line 3 at stub line 5)",
    ),
}


@pytest.mark.parametrize("source, message", list(REFUSALS.values()), ids=list(REFUSALS))
def test_refusals(source, message):
    with pytest.raises(StubError) as info:
        strip_solutions(textwrap.dedent(source), path="lab1_attention.py")
    assert str(info.value) == message
    assert info.value.errors == [message]


def test_file_name_without_lab_number_is_refused():
    source = "def f():\n    pass\n\n\ndef g():\n    # BEGIN SOLUTION\n    return 1\n    # END SOLUTION\n"
    with pytest.raises(StubError) as info:
        solution_regions(source, path="solutions/attention.py")
    assert str(info.value) == (
        "solutions/attention.py:6: file name 'attention.py' does not start with lab<N>_, "
        "so the lab number for the TODOs is unknown"
    )
    # without any region the name does not matter
    assert solution_regions("def f():\n    pass\n", path="solutions/attention.py") == []


def test_refusal_names_the_given_path():
    with pytest.raises(StubError, match=r"^solutions/lab4_transformer_block\.py:1: END SOLUTION without"):
        strip_solutions("# END SOLUTION\n", path="solutions/lab4_transformer_block.py")


# --------------------------------------------------------------------------------------
# Files: write_stubs, stub_drift, leaked_solution_lines
# --------------------------------------------------------------------------------------

LAB2 = textwrap.dedent(
    """\
    import torch


    def split_heads(x, num_heads):
        batch, seq, d_model = x.shape
        # BEGIN SOLUTION
        # hint: view as (batch, seq, heads, d_head), then swap seq and heads.
        d_head = d_model // num_heads
        return x.view(batch, seq, num_heads, d_head).transpose(1, 2)
        # END SOLUTION
    """
)


@pytest.fixture
def course(tmp_path):
    solutions = tmp_path / "solutions"
    exercises = tmp_path / "exercises"
    solutions.mkdir()
    (solutions / "lab1_attention.py").write_text(SOLUTION, encoding="utf-8")
    (solutions / "lab2_multihead.py").write_text(LAB2, encoding="utf-8")
    (solutions / "README.md").write_text("not a lab\n", encoding="utf-8")
    return solutions, exercises


def test_write_stubs_round_trip(course):
    solutions, exercises = course
    assert stub_drift(solutions_dir=solutions, exercises_dir=exercises) == [
        f"{exercises / 'lab1_attention.py'}: missing stub for {solutions / 'lab1_attention.py'} (run `grader stubs`)",
        f"{exercises / 'lab2_multihead.py'}: missing stub for {solutions / 'lab2_multihead.py'} (run `grader stubs`)",
    ]
    written = write_stubs(solutions_dir=solutions, exercises_dir=exercises)
    assert written == [exercises / "lab1_attention.py", exercises / "lab2_multihead.py"]
    assert sorted(p.name for p in exercises.iterdir()) == ["lab1_attention.py", "lab2_multihead.py"]
    assert (exercises / "lab1_attention.py").read_text(encoding="utf-8") == STUB
    assert stat.S_IMODE((exercises / "lab1_attention.py").stat().st_mode) == 0o644
    assert stub_drift(solutions_dir=solutions, exercises_dir=exercises) == []
    assert leaked_solution_lines(solutions_dir=solutions, exercises_dir=exercises) == []
    # idempotent
    assert write_stubs(solutions_dir=solutions, exercises_dir=exercises) == written
    assert (exercises / "lab1_attention.py").read_text(encoding="utf-8") == STUB


def test_write_stubs_replaces_atomically_and_keeps_mode(course, monkeypatch):
    solutions, exercises = course
    exercises.mkdir()
    target = exercises / "lab1_attention.py"
    target.write_text("old\n", encoding="utf-8")
    target.chmod(0o664)
    replaced = []
    real_replace = os.replace

    def spy(src, dst):
        replaced.append((Path(src).parent, Path(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    write_stubs(solutions_dir=solutions, exercises_dir=exercises)
    assert replaced == [(exercises, target), (exercises, exercises / "lab2_multihead.py")]
    assert target.read_text(encoding="utf-8") == STUB
    assert stat.S_IMODE(target.stat().st_mode) == 0o664
    assert not [p for p in exercises.iterdir() if p.name.endswith(".tmp")]


def test_write_stubs_writes_nothing_when_a_solution_is_bad(course):
    solutions, exercises = course
    (solutions / "lab3_positional.py").write_text("def f():\n    # BEGIN SOLUTION\n    return 1\n", encoding="utf-8")
    (solutions / "lab4_block.py").write_text("# END SOLUTION\n", encoding="utf-8")
    with pytest.raises(StubError) as info:
        write_stubs(solutions_dir=solutions, exercises_dir=exercises)
    assert info.value.errors == [
        f"{solutions / 'lab3_positional.py'}:2: BEGIN SOLUTION has no matching END SOLUTION",
        f"{solutions / 'lab4_block.py'}:1: END SOLUTION without a BEGIN SOLUTION",
    ]
    assert not exercises.exists()


def test_stub_drift_stale_and_extra(course):
    solutions, exercises = course
    write_stubs(solutions_dir=solutions, exercises_dir=exercises)
    stub2 = exercises / "lab2_multihead.py"
    stub2.write_text(stub2.read_text(encoding="utf-8").replace("view as", "reshape to"), encoding="utf-8")
    (exercises / "lab9_extra.py").write_text("x = 1\n", encoding="utf-8")
    (exercises / "notes.py").write_text("not a lab stub\n", encoding="utf-8")
    problems = stub_drift(solutions_dir=solutions, exercises_dir=exercises)
    assert problems == [
        f"{stub2}: stale stub, differs from what {solutions / 'lab2_multihead.py'} generates (run `grader stubs`):\n"
        f"    --- {stub2}\n"
        f"    +++ generated from {solutions / 'lab2_multihead.py'}\n"
        "    @@ -6,3 +6,3 @@\n"
        "         batch, seq, d_model = x.shape\n"
        "    -    # TODO(Lab 2): reshape to (batch, seq, heads, d_head), then swap seq and heads.\n"
        "    +    # TODO(Lab 2): view as (batch, seq, heads, d_head), then swap seq and heads.\n"
        '         raise NotImplementedError("Lab 2: split_heads")',
        f"{exercises / 'lab9_extra.py'}: extra stub, there is no {solutions / 'lab9_extra.py'}",
    ]


def test_stub_drift_long_diff_is_cut(course):
    solutions, exercises = course
    write_stubs(solutions_dir=solutions, exercises_dir=exercises)
    (exercises / "lab1_attention.py").write_text("\n".join(f"x{i} = {i}" for i in range(100)) + "\n")
    (problem,) = stub_drift(solutions_dir=solutions, exercises_dir=exercises)
    lines = problem.splitlines()
    assert len(lines) == 1 + 20 + 1
    assert lines[-1].startswith("    ... (") and lines[-1].endswith(" more diff lines)")


def test_stub_drift_line_endings_only(course):
    solutions, exercises = course
    write_stubs(solutions_dir=solutions, exercises_dir=exercises)
    stub = exercises / "lab2_multihead.py"
    stub.write_bytes(stub.read_bytes().replace(b"\n", b"\r\n"))
    assert stub_drift(solutions_dir=solutions, exercises_dir=exercises) == [
        f"{stub}: stale stub, differs from what {solutions / 'lab2_multihead.py'} generates "
        "(run `grader stubs`):\n    (only line endings differ)"
    ]


def test_stub_drift_reports_unstubbable_solution(course):
    solutions, exercises = course
    write_stubs(solutions_dir=solutions, exercises_dir=exercises)
    (solutions / "lab2_multihead.py").write_text("# BEGIN SOLUTION\n", encoding="utf-8")
    assert stub_drift(solutions_dir=solutions, exercises_dir=exercises) == [
        f"{solutions / 'lab2_multihead.py'}:1: BEGIN SOLUTION has no matching END SOLUTION"
    ]


def test_leaked_solution_lines(course):
    solutions, exercises = course
    write_stubs(solutions_dir=solutions, exercises_dir=exercises)
    stub = exercises / "lab1_attention.py"
    lines = stub.read_text(encoding="utf-8").splitlines()
    # a careless edit pastes solution code back into the stub
    at = lines.index('    raise NotImplementedError("Lab 1: scaled_dot_product_attention")')
    lines[at:at] = [
        "    d_k = q.size(-1)",  # 16 chars: long enough to count
        "    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)",
        "    return x",  # short: ignored
        "    # weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)",  # a comment, not the code line
    ]
    stub.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert leaked_solution_lines(solutions_dir=solutions, exercises_dir=exercises) == [
        f"{stub}:{at + 1}: contains solution code: `d_k = q.size(-1)`",
        f"{stub}:{at + 2}: contains solution code: `scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)`",
    ]


def test_region_lines_also_outside_regions_are_not_leaks(tmp_path):
    solutions, exercises = tmp_path / "solutions", tmp_path / "exercises"
    solutions.mkdir()
    (solutions / "lab3_positional.py").write_text(
        textwrap.dedent(
            """\
            def given(x):
                out = x.clone().float()
                return out


            def todo(x):
                # BEGIN SOLUTION
                out = x.clone().float()
                out = out.cumsum(dim=-1).flip(0)
                return out
                # END SOLUTION
            """
        ),
        encoding="utf-8",
    )
    write_stubs(solutions_dir=solutions, exercises_dir=exercises)
    assert leaked_solution_lines(solutions_dir=solutions, exercises_dir=exercises) == []
    stub = exercises / "lab3_positional.py"
    stub.write_text(stub.read_text(encoding="utf-8") + "out = out.cumsum(dim=-1).flip(0)\n", encoding="utf-8")
    n = len(stub.read_text(encoding="utf-8").splitlines())
    assert leaked_solution_lines(solutions_dir=solutions, exercises_dir=exercises) == [
        f"{stub}:{n}: contains solution code: `out = out.cumsum(dim=-1).flip(0)`"
    ]


def test_leak_check_skips_missing_stubs(course):
    solutions, exercises = course
    exercises.mkdir()
    assert leaked_solution_lines(solutions_dir=solutions, exercises_dir=exercises) == []
