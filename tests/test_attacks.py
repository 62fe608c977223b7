"""Cheating, leaking, hanging and harming submissions, through the whole grading pipeline.

Each ``tests/fixtures/attacks/atk_<name>/`` holds lab files and an ``expect.yaml``:

```yaml
description: what the attack does
attacked: [lab1_attention]        # labs that must score 0
attacked_tests: [test_x]          # optional: only these tests of the attacked labs must fail
intact: [lab2_multihead]          # labs of the same submission that must keep full marks
base: ok_lab2_standalone          # optional: a tests/fixtures/submissions/ overlay first
visibility: [public]              # optional: only these suites (hang attacks: keep it fast)
time_limit_s: 1.5                 # optional: every test's wall-clock limit (default 5)
cli: true                         # optional: also run `grader grade` in a subprocess
process_names: [atkdaemon]        # optional: comm names the attack gives its processes
feedback_contains: [...]          # optional: strings some attacked test's message must hold
secret_env: true                  # optional: GRADER_SECRET is set in the grader's env
```

The submission is the reference solutions, then the ``base`` overlay, then the attack's
files (``name.in`` is laid down as ``name``: a ``conftest.py`` stored as such would be
loaded by pytest when it collects this tree), with placeholders filled in (``__ATK_OUT__`` the output folder, ``__ATK_PORT__`` a
TCP port this test listens on, ...). ``__ATK_REAL_LAB1__`` expands to a correct Lab 1 whose
public functions answer correctly only when the attack's ``_attack()`` returns True, so an
attack that worked shows up as points.

Every attack is checked for: the scores; no leak (no hidden-suite line, solution-region line,
secret or other submission's text in results.json or any message); no process left (the
workers and keepers it used, anything with its process names, anything of the test slot's
uid); no file changed outside the output folder; nothing received on the network; no
signal delivered to the grader. ``test_attacks_as_nobody`` repeats a set of them with the
grader running as uid 65534 (modes userns and plain).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml

from helpers import grade
from grader import paths
from grader.course import Course
from grader.outputs.gradescope import write_gradescope
from grader.sandbox import Limits, Zygote
from grader.sandbox.host import SLOT_UID_BASE

HERE = Path(__file__).parent
ATTACKS = HERE / "fixtures" / "attacks"
SUBMISSIONS = HERE / "fixtures" / "submissions"
REPO = paths.KIT
SLOT = 60 + os.getpid() % 20
DEFAULT_TIME_LIMIT_S = 5.0

REAL_LAB1 = '''
import math as _math
import torch as _torch


def _attention(q, k, v, mask=None, dropout_p=0.0, training=False):
    s = _torch.matmul(q, k.transpose(-1, -2)) * (1.0 / _math.sqrt(q.shape[-1]))
    if mask is not None:
        s = s.masked_fill(~mask, -_math.inf).masked_fill(~mask.any(-1, keepdim=True), 0.0)
    w = s.softmax(-1)
    if mask is not None:
        w = w.masked_fill(~mask, 0.0)
    if training and dropout_p > 0:
        w = _torch.nn.functional.dropout(w, dropout_p, True)
    return _torch.matmul(w, v), w


def _causal(seq_q, seq_k=None, device=None):
    seq_k = seq_q if seq_k is None else seq_k
    return _torch.ones(seq_q, seq_k, dtype=_torch.bool, device=device).tril(seq_k - seq_q)


def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0, training=False):
    if _attack():
        return _attention(q, k, v, mask, dropout_p, training)
    return _torch.zeros(1), _torch.zeros(1)


def causal_mask(seq_q, seq_k=None, device=None):
    if _attack():
        return _causal(seq_q, seq_k, device)
    return _torch.zeros(1)
'''


def attack_names() -> list[str]:
    return sorted(p.name for p in ATTACKS.iterdir()
                  if p.is_dir() and p.name.startswith("atk_") and (p / "expect.yaml").is_file())


def expectation(name: str) -> dict:
    return yaml.safe_load((ATTACKS / name / "expect.yaml").read_text()) or {}


def with_time_limit(rubric, seconds: float):
    """The rubric with every lab's and test's wall-clock limit set to ``seconds``."""
    labs = {n: dataclasses.replace(
        lab, time_limit_s=seconds,
        tests={k: dataclasses.replace(t, time_limit_s=seconds) for k, t in lab.tests.items()})
        for n, lab in rubric.labs.items()}
    return dataclasses.replace(rubric, labs=labs)


# ------------------------------------------------------------------------------ secrets

def _region_lines(path: Path) -> list[str]:
    out, inside = [], False
    for line in path.read_text().splitlines():
        s = line.strip()
        if s == "# BEGIN SOLUTION":
            inside = True
        elif s == "# END SOLUTION":
            inside = False
        elif inside and not s.startswith("# hint:"):
            out.append(s)
    return out


def _description_lines(source: str) -> list[str]:
    """The lines of a suite's test docstrings that the grader publishes as the tests'
    descriptions (their first paragraph: what a student reads about a hidden test)."""
    import ast
    import inspect
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                lines += [ln.strip() for ln in inspect.cleandoc(doc).split("\n\n")[0].splitlines()]
    return lines


def secret_lines() -> list[str]:
    """Lines only the grader has: hidden suites and solution regions (not public anywhere)."""
    public: set[str] = set()
    for f in [*(paths.SUITES / "public").glob("*.py"), *paths.SUITES.glob("*.py"),
              *(paths.KIT / "exercises").glob("*.py"), *SUBMISSIONS.glob("*/*.py"),
              *ATTACKS.glob("*/*.py")]:
        # (errors="replace": ok_windows_editor's lab 1 is cp1252 on purpose)
        public.update(line.strip() for line in
                      f.read_text(encoding="utf-8", errors="replace").splitlines())
    public.update(line.strip() for line in REAL_LAB1.splitlines())
    secret = []
    for f in (paths.SUITES / "hidden").glob("*.py"):
        secret += [line.strip() for line in f.read_text().splitlines()]
        public.update(_description_lines(f.read_text()))
    for f in (paths.KIT / "solutions").glob("lab*.py"):
        secret += _region_lines(f)
    return sorted({s for s in secret if len(s) >= 30 and s not in public})


# ------------------------------------------------------------------------------ environment

class Listener:
    """A TCP, a UDP and a unix-socket listener that record anything that arrives."""

    def __init__(self, folder: Path):
        self.received: list[str] = []
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(16)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.unix_path = str(folder / "grader.sock")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.unix_path)
        os.chmod(self.unix_path, 0o777)
        self.unix.listen(16)
        self.stop = False
        self.threads = [threading.Thread(target=self._accept, args=(s,), daemon=True)
                        for s in (self.tcp, self.unix)]
        self.threads.append(threading.Thread(target=self._udp, daemon=True))
        for t in self.threads:
            t.start()

    def _accept(self, s):
        s.settimeout(0.2)
        while not self.stop:
            try:
                conn, _ = s.accept()
                self.received.append(f"connection on {s.getsockname()}")
                conn.close()
            except OSError:
                continue

    def _udp(self):
        self.udp.settimeout(0.2)
        while not self.stop:
            try:
                data, _ = self.udp.recvfrom(100)
                self.received.append(f"udp {data!r}")
            except OSError:
                continue

    @property
    def port(self) -> int:
        return self.tcp.getsockname()[1]

    def close(self):
        self.stop = True
        for t in self.threads:
            t.join(2)
        for s in (self.tcp, self.udp, self.unix):
            s.close()


class Env:
    """Everything an attack may aim at, and the placeholders that tell it where."""

    def __init__(self, root: Path, monkeypatch):
        os.chmod(root, 0o755)
        self.root = root
        self.out = root / "out"
        self.out.mkdir()
        self.host_tmp = Path(tempfile.mkdtemp(prefix="atk-host-", dir="/tmp"))
        os.chmod(self.host_tmp, 0o777)
        self.other_secret = f"OTHER-SUBMISSION-{os.getpid()}-{time.time_ns()}"
        self.other = root / "other"
        self.other.mkdir()
        (self.other / "lab1_attention.py").write_text(f"SECRET = {self.other_secret!r}\n")
        self.canary = self.host_tmp / "canary"
        self.secret_env = f"xyz-{time.time_ns()}-grader-secret"
        monkeypatch.setenv("GRADER_SECRET", self.secret_env)
        self.listener = Listener(self.host_tmp)
        self.signals: list[int] = []
        self._old_handler = signal.signal(signal.SIGUSR2, lambda s, f: self.signals.append(s))
        self.submission = root / "sub"

    def placeholders(self) -> dict[str, str]:
        return {
            "__ATK_OUT__": str(self.out), "__ATK_PORT__": str(self.listener.port),
            "__ATK_UDP_PORT__": str(self.listener.udp.getsockname()[1]),
            "__ATK_UNIX_SOCKET__": self.listener.unix_path,
            "__ATK_HOST_TMP__": str(self.host_tmp), "__ATK_CANARY__": str(self.canary),
            "__ATK_OTHER_SUB__": str(self.other), "__ATK_SUBMISSION__": str(self.submission),
            "__ATK_REPO__": str(REPO), "__ATK_GRADER_PID__": str(os.getpid()),
            "__ATK_GRADER_PGID__": str(os.getpgrp()), "__ATK_REAL_LAB1__": REAL_LAB1,
        }

    def close(self):
        signal.signal(signal.SIGUSR2, self._old_handler)
        self.listener.close()
        shutil.rmtree(self.host_tmp, ignore_errors=True)


def fill(text: str, env: Env) -> str:
    for key, value in env.placeholders().items():
        text = text.replace(key, value)
    return text


def lay_out(name: str, env: Env, dest: Path | None = None) -> Path:
    """Reference solutions, then the base overlay, then the attack's files (filled in)."""
    dest = dest or env.submission
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted((paths.KIT / "solutions").glob("lab*.py")):
        shutil.copyfile(f, dest / f.name)
    base = expectation(name).get("base")
    if base:
        for f in sorted((SUBMISSIONS / base).glob("*.py")):
            shutil.copyfile(f, dest / f.name)
    for f in sorted((ATTACKS / name).iterdir()):
        if f.name == "expect.yaml" or not f.is_file():
            continue
        # conftest.py & co. are stored as *.in: pytest must not load them from this tree
        (dest / f.name.removesuffix(".in")).write_text(fill(f.read_text(), env))
    for p in [dest, *dest.iterdir()]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return dest


MARKERS = (b"written by the student", b"daemon was here", b"pwned", b'"score": 100')


def snapshot(*roots: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()
                                                     and "__pycache__" not in p.parts)
        for p in files:
            st = p.stat()
            out[str(p)] = (st.st_mtime_ns, st.st_size, st.st_uid)
    return out


def tampered(before: dict, roots: list[Path]) -> list[str]:
    """Files under ``roots`` that changed since ``before`` at the hand of a worker.

    Other people edit this repository while the tests run, so a change alone proves
    nothing: a file counts as tampered when it is new or changed and is owned by a sandbox
    uid or carries one of the attacks' markers. The submission folders nobody else touches:
    any change there counts.
    """
    bad = []
    after = snapshot(*roots)
    for path, meta in after.items():
        if before.get(path) == meta:
            continue
        data = Path(path).read_bytes()
        if (meta[2] >= SLOT_UID_BASE or any(m in data for m in MARKERS)
                or not path.startswith(str(REPO) + "/")):
            bad.append(path)
    bad += [p for p in before if p not in after and not p.startswith(str(REPO) + "/")]
    return bad


# ------------------------------------------------------------------------------ processes

class RecordingZygote:
    """The zygote, recording every worker and keeper it starts (to prove they are gone)."""

    def __init__(self, zygote: Zygote):
        self.zygote = zygote
        self.pids: list[int] = []

    def spawn(self, **kwargs):
        worker = self.zygote.spawn(**kwargs)
        self.pids += [worker.pid, worker.keeper]
        return worker

    def __getattr__(self, name):
        return getattr(self.zygote, name)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _procs(pred) -> list[tuple[int, str]]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
            uid = os.stat(f"/proc/{entry}").st_uid
        except OSError:
            continue
        comm = stat[stat.find("(") + 1:stat.rfind(")")]
        if stat.rsplit(")", 1)[1].split()[0] != "Z" and pred(int(entry), comm, uid):
            found.append((int(entry), comm))
    return found


def leftovers(pids=(), names=(), uid=None, timeout: float = 5.0) -> list:
    """Processes that should be gone: waits up to ``timeout`` for them to go."""
    end = time.monotonic() + timeout
    while True:
        left = [p for p in pids if p and _alive(p)]
        left += _procs(lambda pid, comm, u: comm in names or (uid is not None and u == uid))
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.1)


# ------------------------------------------------------------------------------ fixtures

ZYGOTE_SECRET = f"zygote-start-secret-{os.getpid()}-{time.time_ns()}"


@pytest.fixture(scope="module")
def attack_zygote(rubric):
    """The zygote every API-level attack uses; the grader's environment holds a secret
    when it starts (it must not reach the zygote or any worker)."""
    old = os.environ.get("GRADER_SECRET")
    os.environ["GRADER_SECRET"] = ZYGOTE_SECRET
    try:
        z = Zygote(forbidden=rubric.all_forbidden, slot=SLOT, limits=Limits(memory_mb=768),
                   hide=Course(paths.KIT, rubric).private_paths).start()
    finally:
        if old is None:
            os.environ.pop("GRADER_SECRET", None)
        else:
            os.environ["GRADER_SECRET"] = old
    with z:
        yield z


@pytest.fixture
def env(tmp_path, monkeypatch):
    e = Env(tmp_path, monkeypatch)
    yield e
    e.close()


@pytest.fixture(scope="module")
def secrets() -> list[str]:
    lines = secret_lines()
    assert len(lines) > 50, "the leak check needs hidden/solution lines to look for"
    return lines


def assert_no_leak(text: str, env: Env, secrets: list[str], where: str) -> None:
    leaked = [s for s in secrets if s in text]
    assert not leaked, f"{where} leaks grader-only lines: {leaked[:3]}"
    assert env.secret_env not in text, f"{where} leaks GRADER_SECRET"
    assert ZYGOTE_SECRET not in text, f"{where} leaks the environment the zygote started in"
    assert env.other_secret not in text, f"{where} leaks another submission"
    assert "BEGIN SOLUTION" not in text, where


def check_scores(result, expect: dict) -> None:
    assert result.status == "ok", result.status
    by_lab = {lab.name: lab for lab in result.labs}
    for name in expect.get("attacked", []):
        lab = by_lab[name]
        passed = [t.name for t in lab.tests if t.passed]
        if expect.get("attacked_tests"):       # only these tests are the attack's target
            won = sorted(set(passed) & set(expect["attacked_tests"]))
            assert won == [], f"{name}: {won} must fail under attack"
            continue
        assert lab.score == 0, f"{name} must score 0 under attack, passed: {passed}"
    for name in expect.get("intact", []):
        lab = by_lab[name]
        failing = {t.name: t.message for t in lab.tests if not t.passed}
        assert not failing and lab.status == "graded", f"{name} must keep full marks: {failing}"
    # A hidden test's output can hold no string the student's code chose.
    for text in expect.get("hidden_feedback_free_of", []):
        for name in expect["attacked"]:
            shown = [(t.name, t.message, t.diagnosis) for t in by_lab[name].tests
                     if t.visibility == "hidden" and text in t.message + t.diagnosis]
            assert shown == [], shown
    wanted = expect.get("feedback_contains", [])
    if wanted:
        messages = "\n".join(t.message for name in expect["attacked"]
                             for t in by_lab[name].tests) + "\n".join(
            by_lab[name].message for name in expect["attacked"])
        for text in wanted:
            assert text in messages, f"feedback should mention {text!r}: {messages[:500]}"


def check_harmless(env: Env, before: dict, protected: list[Path], expect: dict) -> None:
    assert tampered(before, protected) == [], "a file outside the output folder changed"
    assert not env.canary.exists(), env.canary.read_text()
    stray = sorted(p.name for p in env.host_tmp.iterdir()) if env.host_tmp.exists() else []
    assert stray == ["grader.sock"], f"the attack wrote into the host's /tmp: {stray}"
    assert not Path("/dev/shm/written-by-student").exists()
    assert not (REPO / "solutions" / "written-by-student").exists()
    assert env.listener.received == [], env.listener.received
    assert env.signals == [], "a signal from the worker reached the grader"


# ------------------------------------------------------------------------------ tests

def test_every_attack_fixture_is_well_formed():
    names = attack_names()
    assert len(names) >= 20
    for name in names:
        expect = expectation(name)
        assert expect.get("description") and expect.get("attacked"), name
        assert set(expect) <= {"description", "attacked", "intact", "base", "visibility",
                               "time_limit_s", "cli", "process_names", "feedback_contains",
                               "secret_env", "hidden_feedback_free_of", "attacked_tests"}, name


def test_gate_control_a_succeeding_attack_would_score(rubric, attack_zygote, env):
    """The gated Lab 1 every attack builds on earns full marks when ``_attack()`` is True."""
    env.submission.mkdir()
    for f in (paths.KIT / "solutions").glob("lab*.py"):
        shutil.copyfile(f, env.submission / f.name)
    (env.submission / "lab1_attention.py").write_text(
        REAL_LAB1 + "\n\ndef _attack():\n    return True\n")
    result = grade(env.submission, rubric=with_time_limit(rubric, 10),
                   labs=["lab1_attention"], zygote=attack_zygote)
    lab = result.labs[0]
    assert lab.score == lab.max_score, {t.name: t.message for t in lab.tests if not t.passed}


@pytest.mark.parametrize("name", attack_names())
def test_attack_is_contained(name, rubric, attack_zygote, env, secrets):
    expect = expectation(name)
    submission = lay_out(name, env)
    protected = [(paths.KIT / "solutions"), paths.SUITES, (paths.KIT / "rubric.yaml"), submission, env.other]
    before = snapshot(*protected)
    zygote = RecordingZygote(attack_zygote)
    labs = [*expect["attacked"], *expect.get("intact", [])]
    rub = with_time_limit(rubric, float(expect.get("time_limit_s", DEFAULT_TIME_LIMIT_S)))
    visibility = tuple(expect.get("visibility", ["public", "hidden"]))
    t0 = time.monotonic()
    result = grade(submission, rubric=rub, labs=labs, visibility=visibility, zygote=zygote)
    elapsed = time.monotonic() - t0
    write_gradescope(result, env.out / "results.json")
    time.sleep(0.3)   # give anything that survived a moment to act

    check_scores(result, expect)
    text = (env.out / "results.json").read_text()
    messages = json.dumps(result.to_dict())
    assert_no_leak(text + messages, env, secrets, "the report")
    assert len(text) < 400_000, "output must be capped"
    uid = SLOT_UID_BASE + attack_zygote.slot if os.geteuid() == 0 else None
    assert leftovers(zygote.pids, expect.get("process_names", ()), uid) == []
    check_harmless(env, before, protected, expect)
    n_tests = sum(len(rub.labs[lab].tests) for lab in labs)
    assert elapsed < 30 + n_tests * float(expect.get("time_limit_s", DEFAULT_TIME_LIMIT_S))


def _cli_rubric(tmp: Path, seconds: float) -> Path:
    text = (paths.KIT / "rubric.yaml").read_text()
    text = re.sub(r"time_limit_s:\s*[\d.]+", f"time_limit_s: {seconds}", text)
    path = tmp / "rubric.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", [n for n in attack_names() if expectation(n).get("cli")])
def test_attack_through_the_cli_leaves_results_alone(name, env, secrets):
    """``grader grade`` in its own process: results.json is written once, by the grader,
    and nothing the submission started rewrites it afterwards."""
    expect = expectation(name)
    submission = lay_out(name, env)
    rubric_path = _cli_rubric(env.root, 3)
    protected = [(paths.KIT / "solutions"), paths.SUITES, (paths.KIT / "rubric.yaml"), submission, env.other]
    before = snapshot(*protected)
    cmd = [sys.executable, "-m", "grader.cli", "--rubric", str(rubric_path), "grade",
           str(submission), "--out", str(env.out), "--lab", expect["attacked"][0]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=env.root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = env.out / "results.json"
    first = results.read_bytes()
    data = json.loads(first)
    assert data["score"] == 0, data
    assert data["extra_data"]["labs"][expect["attacked"][0]]["score"] == 0
    time.sleep(2.0)               # a daemon or exit handler would strike now
    assert results.read_bytes() == first, "results.json was rewritten after grading"
    assert leftovers(names=expect.get("process_names", ())) == []
    assert_no_leak(first.decode() + proc.stdout + proc.stderr, env, secrets, "the CLI output")
    check_harmless(env, before, protected, expect)


# ------------------------------------------------------------------------------ as nobody

NOBODY = 65534
NOBODY_ATTACKS = ["atk_read_hidden", "atk_network", "atk_kill_grader", "atk_write_outside",
                  "atk_setsid_daemon", "atk_fork_bomb", "atk_forbidden_getattr",
                  "atk_sleep_forever"]

DRIVER = textwrap.dedent('''
    import json, os, sys, dataclasses
    from grader.grading import Grader
    from grader.rubric import load_rubric
    from grader.outputs.gradescope import write_gradescope
    from grader.sandbox import Zygote, Limits
    from grader import paths
    from grader.course import Course
    spec = json.load(open(sys.argv[1]))
    rubric = load_rubric((paths.KIT / "rubric.yaml"))
    def limited(seconds):
        labs = {n: dataclasses.replace(l, time_limit_s=seconds, tests={
            k: dataclasses.replace(t, time_limit_s=seconds) for k, t in l.tests.items()})
            for n, l in rubric.labs.items()}
        return dataclasses.replace(rubric, labs=labs)
    zygote = Zygote(forbidden=rubric.all_forbidden, mode=spec["mode"],
                    limits=Limits(memory_mb=768),
                    hide=Course(paths.KIT, rubric).private_paths).start()
    report = {"mode": zygote.mode, "landlock": zygote.landlock, "uid": os.getuid(),
              "results": {}}
    try:
        for job in spec["jobs"]:
            with Grader(Course(paths.KIT, limited(job["time_limit_s"])), zygote=zygote,
                        visibility=tuple(job["visibility"])) as grader:
                result = grader.grade(job["submission"], labs=job["labs"])
            write_gradescope(result, os.path.join(job["out"], "results.json"))
            report["results"][job["name"]] = result.to_dict()
    finally:
        zygote.close()
    json.dump(report, open(spec["report"], "w"))
''')


def _nobody_python(root: Path) -> Path | None:
    """An interpreter uid 65534 can run: a venv of the system Python that reaches this
    checkout's packages (the project venv's own interpreter lies under /root, 0700)."""
    base = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    if not os.path.exists(base):   # the system Python, same version (for torch's wheels)
        return None
    venv = root / "venv"
    proc = subprocess.run([base, "-m", "venv", "--without-pip", str(venv)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True).stdout.strip()
    site = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    Path(purelib, "grader_checkout.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in site) + f"{REPO}\n")
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    probe = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                            "--clear-groups", str(python), "-c",
                            "import torch, grader.sandbox, yaml, pytest"],
                           capture_output=True, text=True, cwd="/")
    return python if probe.returncode == 0 else None


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to uid 65534")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
@pytest.mark.parametrize("mode", ["userns", "plain"])
def test_attacks_as_nobody(mode, tmp_path, monkeypatch, secrets):
    """The grader as an unprivileged user: workers in a user namespace, or plain mode
    (Landlock + seccomp + rlimits) where namespaces are refused."""
    root = Path(tempfile.mkdtemp(prefix="atk-nobody-", dir="/tmp"))
    envs = []
    try:
        os.chmod(root, 0o755)
        python = _nobody_python(root)
        if python is None:
            pytest.skip("no interpreter that uid 65534 can read (the venv's lies under /root)")
        jobs = []
        before_all = {}
        for name in NOBODY_ATTACKS:
            expect = expectation(name)
            work = root / name
            work.mkdir()
            env = Env(work, monkeypatch)
            envs.append(env)
            os.chmod(env.out, 0o777)
            sub = lay_out(name, env)
            before_all[name] = snapshot((paths.KIT / "solutions"), paths.SUITES, (paths.KIT / "rubric.yaml"), sub,
                                        env.other)
            # The attacked lab's public tests only (their feedback shows student output):
            # the full set runs as root above; this run is about the other modes.
            jobs.append({"name": name, "submission": str(sub), "out": str(env.out),
                         "labs": expect["attacked"], "visibility": ["public"],
                         "time_limit_s": float(expect.get("time_limit_s", 3))})
        spec = root / "spec.json"
        report = root / "report.json"
        (root / "driver.py").write_text(DRIVER)
        spec.write_text(json.dumps({"mode": mode, "jobs": jobs, "report": str(report)}))
        os.chmod(root, 0o777)
        for p in (spec, root / "driver.py"):
            os.chmod(p, 0o644)
        existing = {pid for pid, _ in _procs(lambda p, c, u: u == NOBODY)}
        child_env = {"PATH": "/usr/bin:/bin", "GRADER_SECRET": envs[0].secret_env,
                     "HOME": str(root)}
        proc = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                               "--clear-groups", str(python), str(root / "driver.py"),
                               str(spec)], capture_output=True, text=True, timeout=600,
                              cwd=str(root), env=child_env)
        assert proc.returncode == 0, proc.stderr[-4000:]
        data = json.loads(report.read_text())
        assert data["uid"] == NOBODY and data["mode"] == mode
        if mode == "plain":
            assert data["landlock"] >= 1, "plain mode here relies on Landlock"
        for env, name in zip(envs, NOBODY_ATTACKS, strict=False):
            expect = expectation(name)
            result = data["results"][name]
            by_lab = {lab["name"]: lab for lab in result["labs"]}
            for lab in expect["attacked"]:
                assert by_lab[lab]["score"] == 0, (name, by_lab[lab])
            text = (env.out / "results.json").read_text() + json.dumps(result)
            assert_no_leak(text, env, secrets, f"{name} as nobody ({mode})")
            assert envs[0].secret_env not in text
            check_harmless(env, before_all[name], [(paths.KIT / "solutions"), paths.SUITES,
                                                   (paths.KIT / "rubric.yaml"), env.submission, env.other],
                           expect)
        left = leftovers(names=("atkdaemon", "atkforkbomb"))
        # The driver's zygote, keepers and workers end as a cascade once it exits (each
        # on its parent's death): on a loaded machine that takes a moment, so wait for it.
        deadline = time.monotonic() + 10
        while True:
            stray = [p for p in _procs(lambda p, c, u: u == NOBODY) if p[0] not in existing
                     and _alive(p[0])]
            if not stray or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert left + stray == [], left + stray
    finally:
        for env in reversed(envs):
            env.close()
        shutil.rmtree(root, ignore_errors=True)
