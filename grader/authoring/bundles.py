"""What leaves the course repository: the student release, the Gradescope autograder zip,
and the GitHub Classroom result (``grader release``, ``grader gradescope``, ``grader classroom``).

- ``build_release``: exercises, public suites, the grader without its hidden suites, a rubric
  of the public tests only, a pyproject and a README. It is scanned before it is published:
  a hidden test name, a line of a solution region or a line of a hidden suite anywhere in it
  refuses the build.
- ``build_gradescope``: ``setup.sh`` and ``run_autograder`` at the zip's root, the whole
  grader (hidden suites too), ``solutions/`` (references), ``rubric.yaml``, and the runner's
  settings. The same zip is the private grader bundle of the GitHub Classroom workflow.

See docs/ci-autograding.md.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from grader import paths
from grader.autograder import TEMPLATES
from grader.authoring.stubs import solution_regions, strip_solutions
from grader.course import Course
from grader.errors import BundleError
from grader.outputs.atomic import atomic_open
from grader.authoring.student_text import student_contract, student_stub
from grader.secret import SECRET_FILE

DEFAULT_DEPENDENCIES = ["torch==2.13.0", "numpy", "pytest>=8", "pyyaml>=6", "rich>=13"]
SKIP_NAMES = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".DS_Store"}
SKIP_SUFFIXES = (".pyc", ".pyo", ".egg-info")
MIN_SECRET_LINE = 12            # shorter lines are too generic to call a leak (as grader.authoring.stubs)
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: the same course gives the same zip
EXECUTABLES = {"setup.sh", "run_autograder"}
CHECK_WORKFLOW = "check.yml"       # the release's `grader check` on three OSes


# --------------------------------------------------------------------------------------
# Pieces shared by both bundles
# --------------------------------------------------------------------------------------


def _skipped(path: Path) -> bool:
    return path.name in SKIP_NAMES or path.name.endswith(SKIP_SUFFIXES)


def _files_under(root: Path, *, exclude: tuple[Path, ...] = ()) -> list[Path]:
    """Regular files under ``root`` (sorted, relative), without caches and ``exclude`` trees."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames
                             if not _skipped(here / d) and (here / d) not in exclude)
        for name in sorted(filenames):
            path = here / name
            if not _skipped(path) and path.is_file() and not path.is_symlink():
                found.append(path.relative_to(root))
    return found


def course_dependencies(pyproject: Path | None = None) -> list[str]:
    """The grader's runtime dependencies, from the course's pyproject.toml when readable."""
    pyproject = pyproject or paths.PACKAGE.parent / "pyproject.toml"
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        return list(DEFAULT_DEPENDENCIES)
    try:
        with open(pyproject, "rb") as fh:
            deps = tomllib.load(fh)["project"]["dependencies"]
    except (OSError, KeyError, ValueError):
        return list(DEFAULT_DEPENDENCIES)
    return [str(d) for d in deps] or list(DEFAULT_DEPENDENCIES)


def pyproject_text(*, name: str, description: str, dependencies: list[str],
                   hidden_suites: bool) -> str:
    """A pyproject.toml that installs this grader (``pip install -e .`` or ``pip install .``)."""
    data = ["suites/*.py", "suites/pytest.ini", "suites/public/*.py", "autograder/*"]
    if hidden_suites:
        data.append("suites/hidden/*.py")
    deps = "".join(f"    {json.dumps(d)},\n" for d in dependencies)
    return (
        "[build-system]\n"
        'requires = ["setuptools>=68"]\n'
        'build-backend = "setuptools.build_meta"\n\n'
        "[project]\n"
        f"name = {json.dumps(name)}\n"
        'version = "0.1.0"\n'
        f"description = {json.dumps(description)}\n"
        'requires-python = ">=3.10"\n'
        f"dependencies = [\n{deps}]\n\n"
        "[project.scripts]\n"
        'grader = "grader.cli:main"\n\n'
        "[tool.setuptools.packages.find]\n"
        'include = ["grader*"]\n\n'
        "[tool.setuptools.package-data]\n"
        f"grader = {json.dumps(data)}\n"
    )


def public_rubric_text(course: Course) -> str:
    """The course's rubric.yaml with the hidden tests removed (their names, points and
    settings)."""
    import yaml

    rubric = course.rubric
    raw = yaml.safe_load(Path(course.rubric_path).read_text(encoding="utf-8"))
    for lab_name, lab in raw["labs"].items():
        public = [n for n, t in rubric.labs[lab_name].tests.items() if t.visibility == "public"]
        lab["tests"] = {n: lab["tests"][n] for n in public}
    header = ("# The public tests and their points (generated by `grader release`). The\n"
              "# autograder's own rubric also lists hidden tests; they are not in this file.\n")
    return header + yaml.safe_dump(raw, sort_keys=False, allow_unicode=False, width=100)


# --------------------------------------------------------------------------------------
# What must never reach students
# --------------------------------------------------------------------------------------


@dataclass
class Secrets:
    """What a student bundle may not contain."""
    hidden_names: set[str] = field(default_factory=set)
    solution_lines: set[str] = field(default_factory=set)
    hidden_suite_lines: set[str] = field(default_factory=set)
    # The code of every reference function (``_inputs.py``'s ``@reference`` ones and the
    # helpers only they use), as ``ast.dump`` of the body without its docstring: a release
    # may hold none of them, under any name.
    reference_functions: dict[str, str] = field(default_factory=dict)   # dump -> name


_IMPORT_RE = re.compile(r"(import|from)\s+[\w.]+")
_WORD_RE = re.compile(r"[A-Za-z_]\w*")


def distinctive(line: str) -> bool:
    """Whether a stripped line says enough to be a secret: not an import, not a separator,
    not a short generic statement (at least MIN_SECRET_LINE characters and two words)."""
    return (len(line) >= MIN_SECRET_LINE and not _IMPORT_RE.match(line)
            and len(_WORD_RE.findall(line)) >= 2)


def _stripped_lines(text: str) -> set[str]:
    return {line.strip() for line in text.splitlines()}


def course_secrets(course: Course, suites_dir: Path | None = None) -> Secrets:
    """Hidden test names, solution-region lines and hidden-suite lines of the course.

    A line that students get anyway (the stubs' given code, the public suites and their
    shared helpers) is not a secret, nor is a hidden test name that is also a public one.
    """

    solutions_dir, suites_dir = course.solutions, Path(suites_dir or course.suites)
    rubric = course.rubric
    public_names = {n for lab in rubric.labs.values() for n, t in lab.tests.items()
                    if t.visibility == "public"}
    secrets = Secrets(hidden_names={n for lab in rubric.labs.values()
                                    for n, t in lab.tests.items()
                                    if t.visibility == "hidden"} - public_names)
    given: set[str] = set()
    for f in sorted(list(suites_dir.glob("*.py")) + list((suites_dir / "public").glob("*.py"))):
        given |= _stripped_lines(f.read_text(encoding="utf-8"))
    for f in sorted(Path(solutions_dir).glob("lab*.py")):
        source = f.read_text(encoding="utf-8")
        given |= _stripped_lines(strip_solutions(source, path=str(f)))
        for region in solution_regions(source, path=str(f)):
            secrets.solution_lines |= {s for line in region.code_lines
                                       if distinctive(s := line.strip())}
    for f in sorted((suites_dir / "hidden").glob("*.py")):
        secrets.hidden_suite_lines |= {s for s in _stripped_lines(f.read_text(encoding="utf-8"))
                                       if distinctive(s)}
    secrets.solution_lines -= given
    secrets.hidden_suite_lines -= given
    inputs = suites_dir / "_inputs.py"
    if inputs.is_file():
        tree = ast.parse(inputs.read_text(encoding="utf-8"))
        kept = set(_release_inputs(tree, _public_imports(suites_dir))[1])
        secrets.reference_functions = {
            _body_dump(node): node.name for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name not in kept}
    return secrets


# --------------------------------------------------------------------------------------
# The public suites' references, replaced by stored values in a release
# --------------------------------------------------------------------------------------

def _is_reference(node: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "reference" for d in node.decorator_list)


def _body_dump(node: ast.FunctionDef) -> str:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]                            # the docstring says nothing of the code
    return ast.dump(ast.Module(body=body, type_ignores=[]))


def _public_imports(suites_dir: Path) -> set[str]:
    """The names the public suites import from ``grader.suites._inputs``."""
    names: set[str] = set()
    for f in sorted((suites_dir / "public").glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "grader.suites._inputs":
                names |= {a.name for a in node.names}
    return names


def _release_inputs(tree: ast.Module, public: set[str]) -> tuple[str, list[str]]:
    """``_inputs.py`` for a release: what the public suites use, with every ``@reference``
    a lookup of the stored values (no code behind it) and every helper only references
    use left out. Returns the source and the names of the functions it keeps."""
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    keep, todo = set(), [n for n in public if n in functions]
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep.add(name)
        if not _is_reference(functions[name]):
            todo += [n.id for n in ast.walk(functions[name])
                     if isinstance(n, ast.Name) and n.id in functions]
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            if node.name not in keep:
                continue
            if _is_reference(node):
                node = ast.parse(
                    f"def {node.name}(*args, **kwargs):\n"
                    f"    \"\"\"Expected values stored when this release was built.\"\"\"\n"
                    f"    return _snapshot.lookup({node.name!r}, args, kwargs)\n").body[0]
        body.append(node)
    body.insert(1, ast.parse("from grader.suites import _snapshot").body[0])
    header = ('"""Input builders for the public suites. The references they compare with '
              'are values stored\nwhen this release was built (grader/suites/_expected.json): '
              'no reference code is here.\n"""\n')
    module = ast.Module(body=[n for n in body if not (
        isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))], type_ignores=[])
    return header + ast.unparse(module) + "\n", sorted(keep - {n for n in keep
                                                              if _is_reference(functions[n])})


def record_public_expected(course: Course) -> dict:
    """Grade the solutions with the public suites, keeping every value a ``@reference``
    gives: the release's ``_expected.json``. BundleError unless they score full marks."""
    from grader.grading import Grader
    from grader.suites._snapshot import recording

    with recording() as values, Grader(course, visibility=("public",)) as grader:
        result = grader.grade(course.solutions, name="solutions")
    failing = [f"{lab.name}::{t.name}" for lab in result.labs for t in lab.tests if not t.passed]
    if failing:
        raise BundleError("the solutions fail public tests, so no expected values can be "
                          f"stored: {', '.join(failing[:10])}")
    return values


def find_leaks(folder: Path, secrets: Secrets) -> list[str]:
    """``file:line: what`` for every secret found in any file under ``folder``."""
    names = re.compile(r"\b(" + "|".join(sorted(map(re.escape, secrets.hidden_names))) + r")\b") \
        if secrets.hidden_names else None
    leaks = []
    for rel in _files_under(folder):
        text = (folder / rel).read_bytes().decode("utf-8", errors="replace")
        if rel.suffix == ".py" and secrets.reference_functions:
            try:
                tree = ast.parse(text)
            except (SyntaxError, ValueError):
                tree = None
            for node in ast.walk(tree) if tree is not None else ():
                if isinstance(node, ast.FunctionDef) and \
                        _body_dump(node) in secrets.reference_functions:
                    leaks.append(f"{rel}:{node.lineno}: reference code "
                                 f"({secrets.reference_functions[_body_dump(node)]} of "
                                 f"grader/suites/_inputs.py)")
        for number, line in enumerate(text.splitlines(), 1):
            stripped = line.strip()
            if names and (m := names.search(line)):
                leaks.append(f"{rel}:{number}: hidden test name {m.group(1)}")
            if stripped in secrets.solution_lines:
                leaks.append(f"{rel}:{number}: solution code: {stripped[:80]}")
            if stripped in secrets.hidden_suite_lines:
                leaks.append(f"{rel}:{number}: hidden suite line: {stripped[:80]}")
    return leaks


def public_suites_needing_solutions(suites_dir: Path) -> list[str]:
    """``file:line`` of public suites that import grader.engine.reference (it loads solutions/,
    which a release does not have: those tests would fail for every student)."""
    found = []
    for f in sorted((suites_dir / "public").glob("*.py")):
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"), filename=str(f))
        except SyntaxError:
            continue  # `grader validate` reports it
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(n == "grader.engine.reference" or n.startswith("grader.engine.reference.") for n in names):
                found.append(f"{f.name}:{node.lineno}")
    return found


# --------------------------------------------------------------------------------------
# grader release
# --------------------------------------------------------------------------------------


def _fresh_output_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BundleError(f"{out}: already exists and is not an empty folder; choose a new one")


def build_release(out: str | Path, course: Course, *, package: Path = paths.PACKAGE,
                  classroom_workflow: bool = False, title: str = "Attention labs") -> Path:
    """Write ``course``'s student bundle to the new folder ``out`` (built aside, then
    renamed)."""
    out = Path(out).resolve()
    _fresh_output_dir(out)
    rubric = course.rubric
    exercises = course.exercises
    if not exercises.is_dir():
        raise BundleError(f"{exercises}: no exercises folder (run `grader stubs` first)")
    needing = public_suites_needing_solutions(package / "suites")
    if needing:
        raise BundleError(
            "public suites that students get import grader.engine.reference, which loads solutions/ "
            f"(not in a release): {', '.join(needing)}. Compute their expected values in the "
            "suite or in grader/suites/_inputs.py instead, or make those tests hidden.")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        # Not for students: the hidden suites, and the mistake catalogue (wrong variants of
        # the reference code, close enough to the solutions to give them away).
        for rel in _files_under(package, exclude=(package / "suites" / "hidden",
                                                  package / "mistakes")):
            _copy(package / rel, staging / "grader" / rel)
        # The public suites' references are the labs' answers: stored values instead.
        inputs = package / "suites" / "_inputs.py"
        if inputs.is_file():
            source, _ = _release_inputs(ast.parse(inputs.read_text(encoding="utf-8")),
                                        _public_imports(package / "suites"))
            _write(staging / "grader" / "suites" / "_inputs.py", source)
            expected = record_public_expected(course)
            _write(staging / "grader" / "suites" / "_expected.json",
                   json.dumps(expected, sort_keys=True) + "\n")
        for rel in _files_under(exercises):
            if rel.suffix == ".py":     # a stub's first line speaks to the student
                _write(staging / "exercises" / rel, student_stub(
                    (exercises / rel).read_text(encoding="utf-8"), rel.name))
            else:
                _copy(exercises / rel, staging / "exercises" / rel)
        contract = course.folder / "docs" / "LAB_CONTRACT.md"
        if contract.is_file():      # without the instructor notes
            _write(staging / "docs" / "LAB_CONTRACT.md",
                   student_contract(contract.read_text(encoding="utf-8")))
        _write(staging / "rubric.yaml", public_rubric_text(course))
        deps = course_dependencies()
        _write(staging / "pyproject.toml", pyproject_text(
            name="attention-labs-student", description=f"{title}: exercises and public tests",
            dependencies=deps, hidden_suites=False))
        _write(staging / "requirements.txt", "".join(f"{d}\n" for d in deps))
        _write(staging / "README.md", _student_readme(rubric, title))
        _write(staging / ".gitignore", ".venv/\n__pycache__/\n*.egg-info/\n")
        # `grader check` on Linux, macOS and Windows, pushed as it is (always: it grades
        # nothing, it shows that a student's set-up works on each OS).
        _copy(TEMPLATES / CHECK_WORKFLOW, staging / ".github" / "workflows" / CHECK_WORKFLOW)
        if classroom_workflow:
            _copy(TEMPLATES / "classroom.yml", staging / ".github" / "workflows" / "classroom.yml")
        leaks = find_leaks(staging, course_secrets(course, package / "suites"))
        secret_file = course.secret_path
        if secret_file.is_file():
            secret = secret_file.read_text(encoding="ascii").strip()
            leaks += [f"{p.relative_to(staging)}: the course secret" for p in staging.rglob("*")
                      if p.is_file() and (p.name == SECRET_FILE or secret.encode()
                                          in p.read_bytes())]
        if leaks:
            shown = "\n".join(f"  {leak}" for leak in leaks[:20])
            more = f"\n  ... and {len(leaks) - 20} more" if len(leaks) > 20 else ""
            raise BundleError(f"the release would leak {len(leaks)} secret(s); nothing was "
                              f"written:\n{shown}{more}")
        if out.exists():
            out.rmdir()
        os.replace(staging, out)
        os.chmod(out, 0o755)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return out


def _example_summary(rubric) -> str:
    """A summary line ``grader check`` can print for the first lab: all but one of its
    public tests passing (``grader.outputs.text.lab_summary``'s own words)."""
    from grader.outputs.text import lab_summary
    from grader.results import LabResult, TestResult

    name, spec = next(iter(rubric.labs.items()))
    public = [t for t, test in spec.tests.items() if test.visibility == "public"]
    lab = LabResult(name=name, title=spec.title, file=spec.file, tests=[
        TestResult(lab=name, name=t, description="", visibility="public", max_score=1,
                   passed=i > 0) for i, t in enumerate(public)])
    return lab_summary(lab)


def _student_readme(rubric, title: str) -> str:
    from string import Template

    template = Template((TEMPLATES / "README.student.md").read_text(encoding="utf-8"))
    return template.safe_substitute(
        title=title, example=_example_summary(rubric),
        labs=", ".join(f"`{name}` ({lab.title})" for name, lab in rubric.labs.items()),
        files=", ".join(f"`{lab.file}`" for lab in rubric.labs.values()))


def _copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    os.chmod(dest, 0o755 if os.access(src, os.X_OK) and dest.name in EXECUTABLES else 0o644)


def _write(dest: Path, text: str) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text, encoding="utf-8")


# --------------------------------------------------------------------------------------
# grader gradescope
# --------------------------------------------------------------------------------------


@dataclass
class ZipPlan:
    """Archive name -> (bytes, executable) of everything the autograder zip holds."""
    entries: dict[str, tuple[bytes, bool]] = field(default_factory=dict)

    def add_file(self, name: str, path: Path) -> None:
        self.entries[name] = (path.read_bytes(), name in EXECUTABLES)

    def add_text(self, name: str, text: str) -> None:
        self.entries[name] = (text.encode("utf-8"), name in EXECUTABLES)

    def write(self, out: Path) -> None:
        """Write atomically: a temporary file in the same folder, then a rename."""
        with atomic_open(out, "wb", file_mode=0o644) as fh, \
                zipfile.ZipFile(fh, "w", zipfile.ZIP_DEFLATED) as zf:
            for name in sorted(self.entries):
                data, executable = self.entries[name]
                info = zipfile.ZipInfo(name, date_time=ZIP_DATE)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = ((0o100755 if executable else 0o100644) << 16)
                zf.writestr(info, data)


def build_gradescope(out: str | Path, course: Course, *, package: Path = paths.PACKAGE,
                     labs: list[str] | None = None, timeout_s: float = 600.0,
                     worker_memory_mb: int = 256, torch_index_url: str | None = None,
                     wheels: Path | None = None) -> Path:
    """Write ``course``'s Gradescope autograder zip (also the Classroom grader bundle) to
    ``out``."""
    rubric_path = course.rubric_path
    out = Path(out).resolve()
    if out.suffix != ".zip":
        raise BundleError(f"{out}: the autograder must be a .zip file")
    rubric = course.rubric
    labs = list(labs or [])
    unknown = [lab for lab in labs if lab not in rubric.labs]
    if unknown:
        raise BundleError(f"unknown lab(s) {', '.join(unknown)}; the labs are "
                          f"{', '.join(rubric.labs)}")
    if timeout_s <= 0 or worker_memory_mb <= 0:
        raise BundleError("the timeout and the worker memory must be positive")
    if torch_index_url is not None and not re.fullmatch(r"https?://\S+", torch_index_url):
        raise BundleError(f"{torch_index_url!r}: the torch index must be an http(s) URL")
    solutions = course.solutions
    if not solutions.is_dir():
        raise BundleError(f"{solutions}: no solutions folder (the suites need its references)")

    plan = ZipPlan()
    plan.add_file("setup.sh", TEMPLATES / "setup.sh")
    plan.add_file("run_autograder", TEMPLATES / "run_autograder")
    for rel in _files_under(package):
        plan.add_file(f"grader/{rel.as_posix()}", package / rel)
    for rel in _files_under(solutions):
        plan.add_file(f"solutions/{rel.as_posix()}", solutions / rel)
    plan.add_file("rubric.yaml", Path(rubric_path))
    # The course secret (made now if there is none): Gradescope's hidden inputs are the
    # course's own, the same as `grader grade` and `grader batch` give (grader.secret).
    plan.add_text(SECRET_FILE, course.secret.hex() + "\n")
    deps = course_dependencies()
    plan.add_text("requirements.txt", "".join(f"{d}\n" for d in deps))
    plan.add_text("pyproject.toml", pyproject_text(
        name="attention-labs-autograder", description="Attention labs autograder",
        dependencies=deps, hidden_suites=True))
    plan.add_text("autograder.json", json.dumps({
        "labs": labs or None, "timeout_s": timeout_s, "worker_memory_mb": worker_memory_mb,
        "sandbox_mode": "auto"}, indent=2) + "\n")
    if torch_index_url:
        plan.add_text("setup.env", f"TORCH_INDEX_URL={shlex.quote(torch_index_url)}\n")
    if wheels is not None:
        found = sorted(Path(wheels).glob("*.whl"))
        if not found:
            raise BundleError(f"{wheels}: no .whl files to ship")
        for whl in found:
            plan.add_file(f"wheels/{whl.name}", whl)
    plan.write(out)
    return out


# --------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------
