"""Lab 8's training budget: does train() reach the 95% tier in time, from any grader start?

    .venv/bin/python benchmarks/bench_lab8_training.py                  # 8 starts, the reference
    .venv/bin/python benchmarks/bench_lab8_training.py --starts 12 --budget 20
    .venv/bin/python benchmarks/bench_lab8_training.py \\
        --submission tests/fixtures/submissions/ok_lab8_float64/lab8_train_transformer.py

The grader runs ``train(TRAIN_SEED, budget_s)`` once per lab file, every
``Seq2SeqTransformer`` built in it starting from ``start_state(training_start)``, a seed
drawn from the course secret and the file (grader.secret.training_start_seed): a fresh
clone, or ``grader init``, gives another start. So the start is the variable here: for
each of ``--starts`` start seeds (as in the worker: protocol ``GivenStart`` installed on
the lab's class), on one torch thread, this prints the CPU seconds train took
(time.process_time, model construction included), its steps (the length of its
loss_history), and what the grader checks on the returned weights with the reference code:

* exact: the fraction of 512 held-out sequences of 1-8 digits (``heldout``, as the hidden
  tests draw them, from a generator seeded per start) reversed exactly by greedy decoding:
  the tiers need 50/80/95%; ``exact4k`` the same on 4,096 sequences (the expected figure
  without the 512's sampling noise);
* the loss at the grader's start and after, teacher-forced on those 512, and the loss of
  train's last 50 steps (its own figure);
* the evidence of training: the median and lowest per-matrix correlation of the returned
  weights with the start, and the median with another start of the same kind (what weights
  trained from any other start show); what the matrices compute through the start
  (``functional_correlations``: pooled and median, f_pool and f_med) and, pooled, through
  another start (f_other: chance).

Then the worst case over the starts. ``--submission`` trains another lab 8 file the same
way (a fixture; a file that imports lab 1 gets the reference's lab 1 here, in this process:
its CPU figure leaves out the round trips the grader charges). ``--save PATH`` keeps the
last start's weights (an attack fixture's "weights trained elsewhere"). Every figure is
measured in this run; on a shared machine CPU seconds, not wall, are the budget's measure.
Exit 0 when every start reached the 95% tier within the budget with the evidence intact.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader import paths  # noqa: E402
from grader.engine.reference import use_solutions  # noqa: E402
from grader.rubric import load_rubric  # noqa: E402
from grader.sandbox.protocol import GivenStart  # noqa: E402
from grader.suites import _training  # noqa: E402

LAB = "lab8_train_transformer"
TIER = max(_training.HIDDEN_TIERS)


def rubric_budget() -> float:
    test = load_rubric((paths.KIT / "rubric.yaml")).labs[LAB].tests["test_train_returns_a_trained_model_within_budget"]
    return float(test.budget.cpu_s)


def load_lab(path: Path | None):
    """The lab 8 module to train: the reference, or the file at ``path`` (its imports of
    earlier labs resolved to the reference's)."""
    if path is None:
        return _training.reference()
    if str(paths.KIT / "solutions") not in sys.path:
        sys.path.append(str(paths.KIT / "solutions"))
    spec = importlib.util.spec_from_file_location(f"bench_{path.parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(lab, start_seed: int, budget_s: float, train_seed: int) -> dict:
    start_state = _training.start_state(start_seed)
    with GivenStart(lab.Seq2SeqTransformer, start_state).installed():
        start = time.process_time()
        model = lab.train(train_seed, budget_s)
        cpu_s = time.process_time() - start
    final = {k: v.detach().clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(10_000 + start_seed)
    src, tgt = _training.heldout(gen)
    big_src, big_tgt = _training.heldout(gen, n=4096)
    correlations = sorted(_training.weight_correlations(start_state, final).values())
    other = sorted(_training.weight_correlations(_training.start_state(start_seed + 7_777),
                                                 final).values())
    pooled, per_matrix = _training.functional_correlations(start_state, final, src, tgt)
    chance, _ = _training.functional_correlations(_training.start_state(start_seed + 7_777),
                                                  final, src, tgt)
    history = [float(x) for x in getattr(model, "loss_history", None) or []]
    return {
        "start": start_seed, "cpu_s": cpu_s, "steps": len(history), "final": final,
        "own_loss": sum(history[-50:]) / max(1, len(history[-50:])) if history else float("nan"),
        "exact": _training.exact_fraction(final, src, tgt),
        "exact4k": _training.exact_fraction(final, big_src, big_tgt),
        "loss_before": _training.teacher_forced_loss(start_state, src, tgt),
        "loss_after": _training.teacher_forced_loss(final, src, tgt),
        "corr_median": correlations[len(correlations) // 2], "corr_min": correlations[0],
        "other_median": other[len(other) // 2],
        "func_pooled": pooled, "func_median": sorted(per_matrix.values())[len(per_matrix) // 2],
        "func_other": chance,
        "problems": _training.training_problems({"state_dict": final, "start": start_state},
                                                src, tgt),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=8,
                        help="how many grader starts (start seeds 1000, 1001, ...)")
    parser.add_argument("--first", type=int, default=1_000, help="the first start seed")
    parser.add_argument("--train-seed", type=int, default=_training.TRAIN_SEED,
                        help="train's seed argument (the grader's: TRAIN_SEED)")
    parser.add_argument("--budget", type=float, default=None,
                        help="CPU seconds (default: the rubric's budget)")
    parser.add_argument("--submission", type=Path, default=None,
                        help="a lab 8 file to train instead of the reference")
    parser.add_argument("--save", type=Path, default=None,
                        help="torch.save the last start's trained state dict there")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    # The trusted side's reference model (what the grader scores with) is the kit's.
    use_solutions(paths.KIT / "solutions")
    lab = load_lab(args.submission)
    budget = args.budget if args.budget is not None else rubric_budget()
    print(f"{args.submission or 'reference'}: train({args.train_seed}, {budget:g}), one "
          f"thread, {args.starts} grader starts; tier {TIER:.0%} exact on 512 of lengths 1-8")
    print(f"{'start':>5} {'cpu_s':>6} {'steps':>5} {'exact':>6} {'exact4k':>7} "
          f"{'loss0':>6} {'loss':>7} {'own50':>7} {'corr_med':>8} {'corr_min':>8} "
          f"{'other':>6} {'f_pool':>6} {'f_med':>6} {'f_other':>7}  evidence")
    rows = []
    for start_seed in range(args.first, args.first + args.starts):
        r = measure(lab, start_seed, budget, args.train_seed)
        rows.append(r)
        print(f"{r['start']:>5} {r['cpu_s']:>6.1f} {r['steps']:>5} {r['exact']:>6.1%} "
              f"{r['exact4k']:>7.2%} {r['loss_before']:>6.3f} {r['loss_after']:>7.4f} "
              f"{r['own_loss']:>7.4f} {r['corr_median']:>8.3f} {r['corr_min']:>8.3f} "
              f"{r['other_median']:>6.3f} {r['func_pooled']:>6.3f} {r['func_median']:>6.3f} "
              f"{r['func_other']:>7.3f}  "
              f"{'ok' if not r['problems'] else '; '.join(r['problems'])}", flush=True)
    ok = all(r["exact"] >= TIER and r["cpu_s"] <= budget and not r["problems"] for r in rows)
    print(f"worst: cpu_s {max(r['cpu_s'] for r in rows):.1f} of {budget:g}, "
          f"exact {min(r['exact'] for r in rows):.1%} (4k: {min(r['exact4k'] for r in rows):.2%}), "
          f"loss {max(r['loss_after'] for r in rows):.4f}, "
          f"corr_med {min(r['corr_median'] for r in rows):.3f}, "
          f"f_pool {min(r['func_pooled'] for r in rows):.3f}, "
          f"f_med {min(r['func_median'] for r in rows):.3f}; "
          f"mean cpu_s {sum(r['cpu_s'] for r in rows) / len(rows):.1f}, "
          f"mean exact {sum(r['exact'] for r in rows) / len(rows):.1%}")
    if args.save is not None:
        torch.save(rows[-1]["final"], args.save)
    print(f"every start reached the {TIER:.0%} tier within the budget" if ok
          else f"NOT every start reached the {TIER:.0%} tier within the budget")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
