"""What copying students do to a classmate's lab file, as source-to-source transforms (for
tests/test_similarity.py and benchmarks/bench_similarity.py). Each takes the source and a
random generator and returns a source that still parses; none runs the code."""

from __future__ import annotations

import ast
import io
import random
import tokenize


def _local_names(tree: ast.AST) -> set[str]:
    """Parameters and names assigned inside functions (never a public function's name)."""
    names: set[str] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs:
                if a.arg not in ("self", "cls"):
                    names.add(a.arg)
            for node in ast.walk(fn):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.add(node.id)
    return names


def rename(source: str, rng: random.Random) -> str:
    """Every local variable and parameter renamed (the calls' keywords too: same tokens)."""
    names = sorted(_local_names(ast.parse(source)))
    new = {n: f"{rng.choice(['val', 'tmp', 'my', 'x', 'res'])}_{i}_{rng.randrange(999)}"
           for i, n in enumerate(names)}
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    out, previous, depth = [], "", 0
    for i, tok in enumerate(tokens):
        text = tok.string
        after = next((t.string for t in tokens[i + 1:]
                      if t.type not in (tokenize.NL, tokenize.COMMENT)), "")
        keyword_arg = depth > 0 and after == "=" and previous in ("(", ",")
        if tok.type == tokenize.NAME and text in new and previous != "." and not keyword_arg:
            tok = tok._replace(string=new[text])     # a call's keyword stays: it is the API
        depth += text in "([{" and tok.type == tokenize.OP
        depth -= text in ")]}" and tok.type == tokenize.OP
        out.append(tok)
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            previous = text
    return tokenize.untokenize(out)


def _blocks(body: list[ast.stmt]) -> list[tuple[int, int]]:
    return [((s.decorator_list[0].lineno if getattr(s, "decorator_list", None) else s.lineno),
             s.end_lineno) for s in body]


def reorder_functions(source: str, rng: random.Random) -> str:
    """The module's functions and classes in a shuffled order (the rest stays first)."""
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    defs = [s for s in tree.body if isinstance(s, (ast.FunctionDef, ast.ClassDef))]
    if len(defs) < 2:
        return source
    spans = _blocks(defs)
    first = spans[0][0]
    head = lines[:first - 1]
    chunks = [lines[a - 1:b] for a, b in spans]
    rest = [ln for i, ln in enumerate(lines[first - 1:], start=first)
            if not any(a <= i <= b for a, b in spans)]
    rng.shuffle(chunks)
    return "".join(head + [ln for c in chunks for ln in c + ["\n", "\n"]] + rest)


def recomment(source: str, rng: random.Random) -> str:
    """Every comment and docstring replaced by other words."""
    out = []
    previous = tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            tok = tok._replace(string=f"# note {rng.randrange(10**6)}: my own words here")
        elif tok.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.INDENT,
                                                           tokenize.DEDENT, tokenize.NL):
            tok = tok._replace(string=f'"""My documentation, version {rng.randrange(999)}."""')
        out.append(tok)
        previous = tok.type
    return tokenize.untokenize(out)


def reformat(source: str, rng: random.Random) -> str:
    """Laid out again by ``ast.unparse`` (comments gone, quotes, spacing and line breaks new),
    indented by two spaces instead of four."""
    text = ast.unparse(ast.parse(source))
    return "\n".join(ln.replace("    ", "  ") for ln in text.splitlines()) + "\n"


def _independent(a: ast.stmt, b: ast.stmt) -> bool:
    def names(node, ctx):
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}
    wa, wb = names(a, ast.Store), names(b, ast.Store)
    ra, rb = names(a, ast.Load), names(b, ast.Load)
    simple = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr, ast.Assert, ast.If)

    def docstring(s):
        return isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
    return isinstance(a, simple) and isinstance(b, simple) and not docstring(a) \
        and not docstring(b) and not (wa & rb) and not (wb & ra) and not (wa & wb) \
        and not any(isinstance(n, (ast.Return, ast.Raise)) for s in (a, b) for n in ast.walk(s))


def move_statements(source: str, rng: random.Random) -> str:
    """Adjacent independent statements swapped, each such pair with a chance of 0.6 (two
    copiers do not move the same statements)."""
    lines = source.splitlines(keepends=True)
    swaps = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = fn.body
            x = 0
            while x < len(body) - 1:
                if _independent(body[x], body[x + 1]) and rng.random() < 0.6:
                    swaps.append((body[x], body[x + 1]))
                    x += 1
                x += 1
    for a, b in sorted(swaps, key=lambda p: -p[0].lineno):
        first, second = lines[a.lineno - 1:a.end_lineno], lines[b.lineno - 1:b.end_lineno]
        lines[a.lineno - 1:b.end_lineno] = second + first
    return "".join(lines)


def _dead_line(rng: random.Random, ind: str) -> str:
    """A statement that changes nothing, of a random shape (no two copiers write the same)."""
    terms = [rng.choice(["abs({n})", "len('{w}')", "min({n}, {m})", "round({n} / {m})",
                         "int('{n}')", "max([{n}, {m}])", "({n} % {m})", "float({n})"])
             .format(n=rng.randrange(1, 99), m=rng.randrange(1, 99), w="x" * rng.randrange(9))
             for _ in range(rng.randrange(1, 5))]
    expr = f" {rng.choice('+-*')} ".join(terms)
    shape = rng.randrange(3)
    if shape == 0:
        return f"unused_{rng.randrange(999)} = {expr}"
    if shape == 1:
        return f"if {expr} < 0 and False:\n{ind}    print('debug')"
    return f"for _ in range(0):\n{ind}    unused = {expr}"


def add_dead_code(source: str, rng: random.Random) -> str:
    """A line or block that does nothing after the first statement of every function, and a
    helper function nobody calls."""
    lines = source.splitlines(keepends=True)
    inserts = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.body:
            stmt = fn.body[0]
            ind = " " * stmt.col_offset
            code = _dead_line(rng, ind)
            inserts.append((stmt.end_lineno, ind + code + "\n"))
    for at, code in sorted(inserts, reverse=True):
        lines.insert(at, code)
    ops = ["+", "-", "*"]
    body = "".join(f"    total = total {rng.choice(ops)} i {rng.choice(ops)} a\n"
                   if rng.random() < 0.5 else f"    total = max(total, b) {rng.choice(ops)} 1\n"
                   for _ in range(rng.randrange(2, 6)))
    lines.append(f"\n\ndef _helper_{rng.randrange(10**6)}(a, b):\n    total = a\n"
                 f"    for i in range(b):\n    {body.replace(chr(10) + '    ', chr(10) + '        ')}"
                 "    return total\n")
    return "".join(lines)


def everything(source: str, rng: random.Random) -> str:
    """All of the above, one after the other."""
    for step in (rename, move_statements, add_dead_code, reorder_functions, recomment,
                 reformat):
        source = step(source, rng)
    return source


KINDS = {"verbatim": lambda s, rng: s, "renamed": rename, "reordered": reorder_functions,
         "recommented": recomment, "reformatted": reformat, "moved_statements": move_statements,
         "dead_code": add_dead_code, "everything": everything}
