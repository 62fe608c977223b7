"""Lab 1 mistakes: scaled dot-product attention and the causal mask.

``attention`` below is the reference ``scaled_dot_product_attention`` (solutions/lab1_attention.py,
the same operations in the same order) with switches that put one classic mistake in; with
every switch off it *is* the reference. Lab 2 reuses it, since a student's Lab 2 usually calls
their own Lab 1 function.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from grader.mistakes import (
    DETACHED,
    FLOAT32_CAST,
    FLOAT32_PRECISION,
    DropoutPlacement,
    DropoutSite,
    DropoutStats,
    Impl,
    Replay,
    bind,
)

LAB = "lab1_attention"
SDPA = "scaled_dot_product_attention"


def attention(q, k, v, mask=None, dropout_p=0.0, training=False, *, scale="d_k", softmax_dim=-1,
              invert_mask=False, mask_after_softmax=False, nan_rows=False, fill=None,
              multiply_mask=False):
    """The reference attention, with one switch per classic mistake.

    scale: "d_k" (right), None (no scaling) or a number n (divide by sqrt(n), e.g. d_model);
    softmax_dim: -1 (right, over the keys) or -2 (over the queries); invert_mask: read the mask
    as True = blocked; mask_after_softmax: zero blocked weights after an unmasked softmax;
    nan_rows: no special case for a query whose keys are all blocked (NaN); fill: a large
    finite number (-1e9) for blocked scores and no special case (all-blocked rows come out
    uniform); multiply_mask: zero the weights by multiplying them with the mask as given (NaN made
    0 first) instead of the reference's steps.
    """
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1)
    if scale == "d_k":
        scores = scores / math.sqrt(d_k)
    elif scale is not None:
        scores = scores / math.sqrt(scale)
    given = mask
    if mask is not None and invert_mask:
        mask = ~mask
    special_rows = not nan_rows and fill is None and not multiply_mask
    if mask is not None and not mask_after_softmax:
        scores = scores.masked_fill(~mask, float("-inf") if fill is None else fill)
        if special_rows:
            fully_blocked = ~mask.any(dim=-1, keepdim=True)
            scores = scores.masked_fill(fully_blocked, 0.0)
    weights = torch.softmax(scores, dim=softmax_dim)
    if mask is not None and multiply_mask:
        weights = torch.nan_to_num(weights) * given
    elif mask is not None and special_rows:
        weights = weights.masked_fill(~mask, 0.0)
    if training and dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    return weights @ v, weights


def causal(seq_q, seq_k=None, device=None, *, shift=0, top_left=False):
    """causal_mask with the diagonal moved by ``shift`` (-1: a query cannot see itself), or
    aligned top-left (``top_left``: query i sees keys j <= i, torch.tril's and is_causal's
    convention) instead of the last query with the last key."""
    if seq_k is None:
        seq_k = seq_q
    i = torch.arange(seq_q, device=device).unsqueeze(1)
    j = torch.arange(seq_k, device=device).unsqueeze(0)
    return j <= i + (0 if top_left else seq_k - seq_q) + shift


# -- mistakes shared with lab 2 (by id, name and hint) ---------------------------------------

NAMES = {
    "no_scale": ("no 1/sqrt(d_k) scaling",
                 "divide the scores q @ k^T by sqrt(d_k) (d_k = q.size(-1)) before the softmax; "
                 "unscaled scores grow with d_k and push the softmax towards one-hot"),
    "softmax_dim": ("softmax over the wrong axis",
                    "take the softmax over the keys, the last axis (dim=-1), so that each "
                    "query's weights sum to 1; another axis normalises over the queries"),
    "mask_inverted": ("mask polarity inverted",
                      "in these labs True means 'may attend': the blocked keys are where the "
                      "mask is False (~mask), so those scores get -inf, not the ones where it "
                      "is True"),
    "mask_after_softmax": ("mask applied after the softmax",
                           "set the blocked scores to -inf before the softmax, so the allowed "
                           "keys' weights are renormalised to sum to 1; zeroing weights after "
                           "the softmax leaves rows that sum to less than 1"),
    "nan_blocked_rows": ("NaN on all-blocked rows",
                         "a query whose keys are all blocked takes a softmax over only -inf, "
                         "which is 0/0 = NaN; find the rows with no allowed key (mask.any over "
                         "the key axis is False), give them a finite score before the softmax "
                         "and zero weights after"),
    "mask_fill_finite": ("blocked scores filled with a large finite number",
                         "a large negative fill (-1e9, -1e4) gives blocked keys almost no "
                         "weight, but a query whose keys are all blocked then gets uniform "
                         "weights over them instead of zeros: use -inf, give the rows with no "
                         "allowed key (mask.any over the key axis is False) a finite score "
                         "before the softmax and zero their weights after"),
    "dropout_in_eval": ("dropout in eval mode",
                        "apply attention dropout only when training "
                        "(F.dropout(weights, p, training=training)); F.dropout's training "
                        "argument defaults to True"),
    "dropout_no_rescale": ("dropout without 1/(1-p)",
                           "after zeroing weights with probability p, scale the survivors by "
                           "1/(1-p) (F.dropout does both), so the expected weights stay the same"),
    "weights_before_dropout": ("weights returned before dropout",
                               "dropout is applied, but the weights returned are the ones from "
                               "before it; return the dropped weights, the very tensor that "
                               "is multiplied with v, so that output == weights @ v"),
    "dropout_missing": ("no dropout in training",
                        "when training and dropout_p > 0, apply dropout to the weights "
                        "(F.dropout(weights, p=dropout_p, training=training)); pass the "
                        "training flag and probability through to where the weights are made"),
}

# mistake id -> the switches of each way it is commonly written (one Impl variant each)
SWITCHES = {
    "no_scale": [{"scale": None}],
    "softmax_dim": [{"softmax_dim": -2}],
    "mask_inverted": [{"invert_mask": True},
                      {"invert_mask": True, "multiply_mask": True},   # masked_fill(mask), * mask
                      {"invert_mask": True, "fill": -1e9}],
    "mask_after_softmax": [{"mask_after_softmax": True}],
    "nan_blocked_rows": [{"nan_rows": True}],
    "mask_fill_finite": [{"fill": -1e9}],
}


def sdpa_site(req: dict):
    """Dropout in a scaled_dot_product_attention call: on the returned weights."""
    if req.get("op") != "call" or req.get("target") != SDPA or req.get("ctor") is not None:
        return None
    a = bind(attention, req.get("args", ()), req.get("kwargs", {}))
    clean = dict(req, args=[a["q"], a["k"], a["v"]],
                 kwargs={"mask": a["mask"], "dropout_p": 0.0, "training": False})
    return DropoutSite(p=float(a["dropout_p"]), training=bool(a["training"]), clean_req=clean,
                       component=lambda reply: reply[1])


def mistakes():
    def sdpa(**switches):
        return Impl(LAB, {SDPA: functools.partial(attention, **switches)})

    replayed = [Replay(id=key, name=NAMES[key][0], hint=NAMES[key][1],
                       variants=[sdpa(**sw) for sw in ways])
                for key, ways in SWITCHES.items()]
    by_id = {m.id: m for m in replayed}
    return [
        FLOAT32_CAST,
        FLOAT32_PRECISION,
        by_id["nan_blocked_rows"],
        by_id["mask_fill_finite"],
        by_id["mask_inverted"],
        by_id["mask_after_softmax"],
        by_id["softmax_dim"],
        by_id["no_scale"],
        DropoutStats(id="dropout_in_eval", name=NAMES["dropout_in_eval"][0],
                     hint=NAMES["dropout_in_eval"][1], mode="eval", site=sdpa_site),
        DropoutStats(id="dropout_no_rescale", name=NAMES["dropout_no_rescale"][0],
                     hint=NAMES["dropout_no_rescale"][1], mode="no_rescale", site=sdpa_site),
        DropoutPlacement(id="weights_before_dropout", name=NAMES["weights_before_dropout"][0],
                         hint=NAMES["weights_before_dropout"][1], mode="output_only",
                         site=sdpa_site),
        DropoutPlacement(id="dropout_missing", name=NAMES["dropout_missing"][0],
                         hint=NAMES["dropout_missing"][1], mode="none", site=sdpa_site),
        Replay(id="causal_top_left", name="causal mask aligned top-left",
               hint="with more keys than queries (seq_k > seq_q, e.g. new queries over cached "
                    "keys) the queries are the LAST seq_q positions: query i sits at position "
                    "i + seq_k - seq_q and sees keys j <= i + seq_k - seq_q; torch.tril of a "
                    "(seq_q, seq_k) block and PyTorch's is_causal align the first query with "
                    "the first key instead",
               variants=[Impl(LAB, {"causal_mask": functools.partial(causal, top_left=True)})]),
        Replay(id="causal_off_by_one", name="causal mask off by one",
               hint="query i may attend to every key j <= i, itself included (with seq_k > "
                    "seq_q the queries are the last positions: j <= i + seq_k - seq_q); "
                    "check the diagonal",
               variants=[Impl(LAB, {"causal_mask": functools.partial(causal, shift=-1)}),
                         Impl(LAB, {"causal_mask": functools.partial(causal, shift=1)})]),
        DETACHED,
    ]
