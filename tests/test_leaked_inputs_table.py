"""A table built from one graded run's feedback earns nothing in another (issue #44).

The two-step attack, played on every route that shows feedback: submission 1
(``atk_lut_leak_inputs``) has no attention code and raises, from each call, an exception
whose type name and message carry the call's inputs; the attacker decodes them from the
graded output, computes the answers offline and ships them as a table in submission 2
(``atk_lut_answer_from_table``), again with no attention code. On main at 05f2c21 the
table scored lab 1 well above the honest stub (public inputs were the same in every run).
Now graded routes draw public inputs from the course secret and the submission, and
strip what the student's code chose of anything input-sized: submission 2 earns the
stub's points, and each of the two defences alone is enough (the last tests).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import shutil
import zlib
from pathlib import Path

import pytest
import torch

from grader import paths
from grader.course import Course
from grader.grading import Grader
from grader.outputs.classroom import classroom_payload
from grader.outputs.gradescope import write_gradescope
from grader.outputs.html import write_feedback_html
from tests.helpers import run_cli

LAB = "lab1_attention"
SECRET = bytes(range(1, 33))
ATTACKS = Path(__file__).parent / "fixtures" / "attacks"
LEAK = ATTACKS / "atk_lut_leak_inputs" / "lab1_attention.py"
TABLE_TEMPLATE = ATTACKS / "atk_lut_answer_from_table" / "lab1_attention.py.tmpl"
LEAKED = re.compile(r"LUTLEAK([A-Za-z0-9_=-]+).*?: ([A-Za-z0-9_=-]*)~", re.S)

STUB = '''
import torch


def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0, training=False):
    raise NotImplementedError("Lab 1: scaled_dot_product_attention")


def causal_mask(seq_q, seq_k=None, device=None):
    seq_k = seq_q if seq_k is None else seq_k
    return torch.ones(seq_q, seq_k, dtype=torch.bool, device=device).tril(seq_k - seq_q)
'''


# ------------------------------------------------------------------------------ the attacker

def leaked_inputs(texts: list[str]) -> list[list[torch.Tensor]]:
    """Every call's inputs that the outputs ``texts`` carry (what the attacker decodes)."""
    found = []
    for text in texts:
        for head, tail in LEAKED.findall(html.unescape(text)):
            try:
                raw = zlib.decompress(base64.urlsafe_b64decode(head + tail))
                header, data = raw.split(b"\n", 1)
                meta = json.loads(header)
            except Exception:  # noqa: BLE001 - what does not decode is no entry
                continue
            tensors, offset = [], 0
            for shape, dtype in zip(meta["shapes"], meta["dtypes"], strict=True):
                dt = getattr(torch, dtype)
                size = torch.Size(shape).numel() * torch.empty((), dtype=dt).element_size()
                chunk = bytearray(data[offset:offset + size])
                offset += size
                tensors.append(torch.frombuffer(chunk, dtype=dt).reshape(shape).clone())
            found.append(tensors)
    return found


def _key(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(str(tuple(t.shape)).encode() + t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _entry(t: torch.Tensor) -> dict:
    t = t.float().contiguous()
    return {"shape": list(t.shape), "bytes": base64.b64encode(t.numpy().tobytes()).decode()}


def table_submission(inputs: list[list[torch.Tensor]], dest: Path) -> Path:
    """Submission 2: answers to the leaked inputs, computed offline, as a table."""
    from grader.suites._inputs import attention_output64, attention_weights64
    table = {}
    for tensors in inputs:
        q, k, v, *rest = tensors
        mask = rest[0] if rest else None
        table[_key(tensors)] = {"out": _entry(attention_output64(q, k, v, mask)),
                                "weights": _entry(attention_weights64(q, k, mask))}
    encoded = base64.b64encode(json.dumps(table).encode()).decode()
    dest.mkdir(parents=True)
    (dest / "lab1_attention.py").write_text(TABLE_TEMPLATE.read_text().replace("__TABLE__", encoded))
    return dest


def submission(source: str, dest: Path) -> Path:
    dest.mkdir(parents=True)
    (dest / "lab1_attention.py").write_text(source)
    return dest


# ------------------------------------------------------------------------------ the routes
# Each grades one submission as the route does and gives (every text it shows, lab 1's points).

def route_grade(sub: Path, tmp: Path, course: Course, zygote) -> tuple[list[str], float]:
    """``grader grade --html``: results.json and feedback.html."""
    with Grader(course, zygote=zygote) as grader:
        result = grader.grade(sub, labs=[LAB])
    write_gradescope(result, tmp / "results.json")
    write_feedback_html(result, tmp / "feedback.html")
    return [(tmp / "results.json").read_text(), (tmp / "feedback.html").read_text()], result.score


def route_classroom(sub: Path, tmp: Path, course: Course, zygote) -> tuple[list[str], float]:
    """``grader classroom``: the payload the GitHub Classroom reporter posts."""
    with Grader(course, zygote=zygote) as grader:
        result = grader.grade(sub, labs=[LAB])
    payload = classroom_payload(result)
    return [json.dumps(payload)], sum(t["score"] for t in payload["tests"])


def route_batch(sub: Path, tmp: Path, course: Course, zygote) -> tuple[list[str], float]:
    """``grader batch``: the student's results.json and feedback."""
    from grader.batch import grade_batch
    root = tmp / "class"
    shutil.copytree(sub, root / "s1")
    grade_batch(root, out=tmp / "out", jobs=1, progress=False, labs=[LAB], course=course)
    texts = [p.read_text(errors="replace") for p in sorted((tmp / "out").rglob("*"))
             if p.is_file() and p.suffix in (".json", ".html", ".csv", ".xml", ".txt")]
    payload = json.loads((tmp / "out" / "s1" / "results.json").read_text())
    return texts, payload["score"]


def route_gradescope(sub: Path, tmp: Path, course: Course, zygote) -> tuple[list[str], float]:
    """The Gradescope runner, in an /autograder-like folder holding the course secret."""
    from grader.autograder.gradescope import RunnerConfig, run
    root = tmp / "autograder"
    (root / "results").mkdir(parents=True)
    shutil.copytree(paths.KIT, root / "source", ignore=shutil.ignore_patterns(
        ".git", ".venv", "tests", "docs", "benchmarks", "__pycache__", "*.egg-info",
        ".grader-secret"))
    (root / "source" / ".grader-secret").write_text(SECRET.hex() + "\n")
    shutil.copytree(sub, root / "submission")
    assert run(RunnerConfig(root=root, labs=[LAB], timeout_s=600)) == 0
    text = (root / "results" / "results.json").read_text()
    return [text], json.loads(text)["score"]


ROUTES = {"grade": route_grade, "classroom": route_classroom, "batch": route_batch,
          "gradescope": route_gradescope}


@pytest.fixture(scope="module")
def course(rubric) -> Course:
    return Course(paths.KIT, rubric, secret=SECRET)


@pytest.fixture(scope="module")
def stub_points(course, zygote, tmp_path_factory) -> float:
    """What the honest stub (causal_mask only) earns on lab 1: the bar."""
    tmp = tmp_path_factory.mktemp("stub")
    _, points = route_grade(submission(STUB, tmp / "sub"), tmp, course, zygote)
    assert points == 2, points           # the two causal-mask tests
    return points


@pytest.mark.parametrize("route", ROUTES)
def test_a_table_from_one_graded_run_earns_nothing_in_the_next(route, course, zygote,
                                                                stub_points, tmp_path):
    play = ROUTES[route]
    texts, leak_points = play(submission(LEAK.read_text(), tmp_path / "leak"),
                              tmp_path / "r1", course, zygote)
    (tmp_path / "r1").mkdir(exist_ok=True)
    assert leak_points == stub_points
    table = table_submission(leaked_inputs(texts), tmp_path / "table")
    (tmp_path / "r2").mkdir()
    _, table_points = play(table, tmp_path / "r2", course, zygote)
    assert table_points <= stub_points, (
        f"{route}: a table built from one graded run's feedback scored {table_points} on "
        f"lab 1 (the stub earns {stub_points})")


def test_graded_feedback_shows_nothing_input_sized_of_what_the_students_code_chose(
        course, zygote, tmp_path):
    """The leak's type names and messages do not reach graded feedback, though the
    message still says the code raised (with a capped, stripped name)."""
    texts, _ = route_grade(submission(LEAK.read_text(), tmp_path / "leak"), tmp_path, course,
                           zygote)
    assert not leaked_inputs(texts)
    for test in json.loads(texts[0])["tests"]:
        assert not re.search(r"LUTLEAK[A-Za-z0-9_=-]{24}", test.get("output", "")), test


def test_the_students_own_check_still_shows_the_students_messages(rubric, zygote, tmp_path):
    """``grader check`` (public suites, the kit's fixed inputs) keeps the messages whole:
    the attack decodes there, and its table scores there, on inputs the kit holds anyway."""
    course = Course(paths.KIT, rubric, secret=SECRET)
    with Grader(course, zygote=zygote, visibility=("public",)) as grader:
        result = grader.grade(submission(LEAK.read_text(), tmp_path / "leak"), labs=[LAB])
        inputs = leaked_inputs([t.message for lab in result.labs for t in lab.tests])
        assert len(inputs) >= 5, [t.message[:120] for lab in result.labs for t in lab.tests]
        again = grader.grade(table_submission(inputs, tmp_path / "table"), labs=[LAB])
    assert again.score > 2, again.score


def test_fresh_graded_inputs_alone_make_the_table_worthless(course, zygote, stub_points,
                                                            tmp_path, monkeypatch):
    """With graded feedback showing the student's messages whole (the stripping undone),
    the table decoded from run 1 still earns only the stub's points in run 2: its inputs
    are drawn from the secret and submission 2's own files."""
    from grader.engine import plugin
    monkeypatch.setattr(plugin, "shown_when_graded", lambda text, cap=0: text)
    monkeypatch.setattr(plugin, "type_name_when_graded", lambda name: name)
    with Grader(course, zygote=zygote) as grader:
        leak = grader.grade(submission(LEAK.read_text(), tmp_path / "leak"), labs=[LAB])
        inputs = leaked_inputs([t.message for lab in leak.labs for t in lab.tests])
        assert len(inputs) >= 5       # the leak works when nothing is stripped
        table = grader.grade(table_submission(inputs, tmp_path / "table"), labs=[LAB])
    assert table.score <= stub_points, table.score


def _classroom_public_only(sub: Path, out: Path) -> tuple[list[str], float]:
    """``grader classroom --public-only``: public tests only, and still points."""
    got = run_cli("classroom", sub, "--public-only", "--lab", LAB, "--out", out, "--quiet",
                  cwd=paths.KIT)
    assert got.returncode == 0, got.stderr
    text = out.read_text()
    return [text, got.stderr], sum(t["score"] for t in json.loads(text)["tests"])


@pytest.mark.slow
def test_a_route_that_gives_points_on_public_tests_alone_is_a_graded_run(tmp_path):
    """Classroom with --public-only writes points: its inputs are drawn per run too, so the
    table from one run's feedback earns no more than the stub's public causal-mask test."""
    _, stub = _classroom_public_only(submission(STUB, tmp_path / "stub"), tmp_path / "s.json")
    texts, leak = _classroom_public_only(submission(LEAK.read_text(), tmp_path / "leak"),
                                         tmp_path / "l.json")
    assert leak == stub
    table = table_submission(leaked_inputs(texts), tmp_path / "table")
    _, table_points = _classroom_public_only(table, tmp_path / "t.json")
    assert table_points <= stub, (table_points, stub)
