"""Lab 7 mistakes: RoPE's pairing and frequencies, ALiBi's slopes, sign and alignment.

``frequencies``, ``rope`` and ``scores`` are the reference RoPE functions
(solutions/lab7_relative_positions.py) with switches that put one classic mistake in;
``slopes`` and ``bias`` the reference ALiBi functions likewise. With every switch off they
give the reference's values (tests/test_feedback.py checks it). The wrong ``rope`` and
``bias`` take their frequencies and slopes from these functions, since the reference's call
their own module's. A student's mistake may sit in the helper (rope_frequencies,
alibi_slopes) and reach every function that calls it, or only in the function that uses
it: each mistake has a variant for each.
"""

from __future__ import annotations

import functools
import math

import torch

from grader.mistakes import DETACHED, FLOAT32_CAST, FLOAT32_PRECISION, Impl, Replay

LAB = "lab7_relative_positions"

# Exponent of base for pair i: right 2i / d_head; the classic slips i / d_head (the pair
# number for the feature index) and 4i / d_head (the even index doubled once more).
EXPONENTS = {"2i": 2, "i": 1, "4i": 4}


def frequencies(d_head, base=10000.0, dtype=torch.float32, *, exponent="2i"):
    """rope_frequencies with theta_i = base ** (-EXPONENTS[exponent] * i / d_head)."""
    if d_head % 2 != 0:
        raise ValueError(f"d_head must be even (RoPE rotates pairs of features), got {d_head}")
    i = torch.arange(d_head // 2, dtype=torch.float64)
    return torch.pow(float(base), -EXPONENTS[exponent] * i / d_head).to(dtype)


def rope(x, positions, base=10000.0, *, pairing="interleaved", exponent="2i", angles_in="x",
         direction=1.0):
    """apply_rope; pairing "rotate_half": feature i is paired with i + d_head / 2 (the
    GPT-NeoX / Hugging Face layout) instead of 2i with 2i + 1. angles_in "float32": theta
    and the angles in float32 whatever x's dtype (rope_frequencies called without dtype=),
    the products with x promoted back to x's dtype; "float32_all": the whole rotation in
    float32, cast back at the end (x.float() ... .type_as(x), as LLaMA's code writes it);
    "float32_cast": the angles float32, cast to x's dtype before cos and sin; "theta_float32":
    theta float32 (rope_frequencies' default dtype), the angles in x's dtype from it.
    direction -1: each pair rotated by -angle (the signs of the sin terms swapped)."""
    if angles_in == "float32_all" and x.dtype != torch.float32:
        return rope(x.float(), positions, base, pairing=pairing, exponent=exponent,
                    direction=direction).to(x.dtype)
    dtype = torch.float32 if angles_in in ("float32", "float32_cast") else x.dtype
    theta_dtype = torch.float32 if angles_in == "theta_float32" else dtype
    theta = frequencies(x.size(-1), base, dtype=theta_dtype, exponent=exponent)
    angles = positions.to(dtype).unsqueeze(-1) * theta
    if angles_in == "float32_cast":
        angles = angles.to(x.dtype)
    cos, sin = torch.cos(angles), direction * torch.sin(angles)
    if pairing == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    half = x.size(-1) // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def scores(q, k, q_positions, k_positions, base=10000.0, *, scaled=True, **switches):
    """rope_scores from the ``rope`` above; scaled False: not divided by sqrt(d_head)."""
    q_rot, k_rot = rope(q, q_positions, base, **switches), rope(k, k_positions, base, **switches)
    dots = q_rot @ k_rot.transpose(-2, -1)
    return dots / math.sqrt(q.size(-1)) if scaled else dots


def comparison(q, k, train_len, offset, num_heads=4, base=10000.0, *, reverse=False, any_n=False,
               by_size=False, first_power=1, alibi_per_key=False, **rope_switches):
    """The reference extrapolation_comparison with RoPE from ``scores`` above and ALiBi's
    slopes from ``slopes`` below (its "rope" and "alibi" entries, weights_past included, are
    what a student's own rope_scores and alibi_slopes make of them); alibi_per_key: ALiBi's
    scores get + slope * p_j (bias's per_key: any origin gives these weights, no mask)."""
    width, d_head = q.shape
    if width > train_len or offset + width <= train_len:
        raise ValueError("the window must fit in train_len and reach past it")
    scale = 1.0 / math.sqrt(d_head)
    inside = torch.arange(width)

    def sinusoidal(positions):
        two_i = torch.arange(0, d_head, 2, dtype=torch.float64)
        angles = positions.to(torch.float64).unsqueeze(1) * torch.pow(float(base), -two_i / d_head)
        pe = torch.stack((torch.sin(angles), torch.cos(angles)), dim=-1).flatten(-2).to(q.dtype)
        return (q + pe) @ (k + pe).T * scale

    def rotary(positions):
        return scores(q, k, positions, positions, base, **rope_switches)

    alibi_slope = slopes(num_heads, reverse=reverse, any_n=any_n, by_size=by_size,
                         first_power=first_power).to(q.dtype).view(-1, 1, 1)

    def alibi(positions):
        if alibi_per_key:
            return q @ k.T * scale + alibi_slope * positions.to(q.dtype).unsqueeze(0)
        distance = (positions.unsqueeze(1) - positions.unsqueeze(0)).abs().to(q.dtype)
        return q @ k.T * scale - alibi_slope * distance

    report = {"learned": {"raised": True, "max_weight_change": None, "weights_past": None}}
    for name, scores_at in (("sinusoidal", sinusoidal), ("rope", rotary), ("alibi", alibi)):
        before = torch.softmax(scores_at(inside), dim=-1)
        after = torch.softmax(scores_at(inside + offset), dim=-1)
        report[name] = {"raised": False, "max_weight_change": float((after - before).abs().max()),
                        "weights_past": after}
    return {name: report[name] for name in ("sinusoidal", "learned", "rope", "alibi")}


def slopes(num_heads, *, reverse=False, any_n=False, by_size=False, first_power=1):
    """alibi_slopes; reverse: the slopes in the opposite order (gentlest first); any_n: the
    power-of-two formula 2 ** (-8 (h + 1) / n) for every n; by_size: sorted steepest first
    (the extra slopes of 2m among those of m, not after them); first_power 0: each geometric
    sequence starts at 1, (2 ** (-8 / n)) ** h from h = 0, instead of at 2 ** (-8 / n)."""
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")

    def powers(n):
        return [2.0 ** (-8.0 * (h + first_power) / n) for h in range(n)]

    if any_n:
        values = powers(num_heads)
    else:
        m = 1 << (num_heads.bit_length() - 1)
        values = powers(m)
        if m < num_heads:
            values += powers(2 * m)[0::2][: num_heads - m]
    if by_size:
        values = sorted(values, reverse=True)
    if reverse:
        values = values[::-1]
    return torch.tensor(values, dtype=torch.float32)


# ALiBi written per key: slope * (j - KEY_ORIGIN[origin]), growing with the key index and the
# same for every query (BLOOM counts j from the first key, MPT from the last one, 0 there).
KEY_ORIGIN = {"first": lambda seq_k: 0, "last": lambda seq_k: seq_k - 1}


def bias(num_heads, seq_q, seq_k, *, sign=-1.0, top_left=False, per_key=None, **slope_switches):
    """alibi_bias (num_heads, seq_q, seq_k); sign +1: a bonus for distance instead of a
    penalty; top_left: query i at position i (distance |i - j|) instead of i + seq_k - seq_q;
    per_key "first" or "last": slope * (j - origin) for every query (KEY_ORIGIN), which is
    the contract's bias plus a constant per row where j <= i + seq_k - seq_q."""
    slope = slopes(num_heads, **slope_switches).view(-1, 1, 1)
    key_pos = torch.arange(seq_k).unsqueeze(0)                        # (1, seq_k)
    if per_key is not None:
        keys = (key_pos - KEY_ORIGIN[per_key](seq_k)).to(torch.float32).expand(seq_q, seq_k)
        return slope * keys
    offset = 0 if top_left else seq_k - seq_q
    query_pos = torch.arange(seq_q).unsqueeze(1) + offset
    distance = (query_pos - key_pos).abs().to(torch.float32)
    return sign * slope * distance


def mistakes():
    def impl(**overrides):
        return Impl(LAB, overrides)

    def rope_variants(**switches):
        """The mistake in rope_frequencies (and so everywhere), or only in apply_rope and
        rope_scores (rope_frequencies right), or only in rope_frequencies (the angles
        computed right elsewhere)."""
        wrong_rope = {"apply_rope": functools.partial(rope, **switches),
                      "rope_scores": functools.partial(scores, **switches),
                      "extrapolation_comparison": functools.partial(comparison, **switches)}
        variants = [impl(**wrong_rope)]
        if "exponent" in switches:
            wrong_freq = {"rope_frequencies": functools.partial(frequencies,
                                                                exponent=switches["exponent"])}
            variants += [impl(**wrong_freq, **wrong_rope), impl(**wrong_freq)]
        return variants

    def alibi_variants(**switches):
        """The mistake in alibi_slopes and so in alibi_bias (and the comparison's ALiBi), in
        alibi_slopes only (and the comparison's ALiBi, which calls it), or in alibi_bias only."""
        wrong_slopes = {"alibi_slopes": functools.partial(slopes, **switches),
                        "extrapolation_comparison": functools.partial(comparison, **switches)}
        wrong_bias = {"alibi_bias": functools.partial(bias, **switches)}
        return [impl(**wrong_slopes, **wrong_bias), impl(**wrong_slopes), impl(**wrong_bias)]

    def float32_angles(angles_in):
        """Angles in float32 reach apply_rope, rope_scores and the comparison's RoPE."""
        return impl(apply_rope=functools.partial(rope, angles_in=angles_in),
                    rope_scores=functools.partial(scores, angles_in=angles_in),
                    extrapolation_comparison=functools.partial(comparison, angles_in=angles_in))

    return [
        # Before the shared float32 rules: with few positions the same mistake is only
        # float32-precise (float32_precision's case), far out it is not; the name must not
        # change with the test.
        Replay(id="rope_angles_float32", name="RoPE angles computed in float32",
               hint="the angles position * theta_i lose precision in float32: near 10^5 "
                    "an angle keeps only ~3 decimals, and a float32 theta_i "
                    "(rope_frequencies(d) without dtype=x.dtype) carries a rounding of up to "
                    "6e-8 of itself, which the position multiplies; compute theta and the "
                    "angles in float64 for float64 inputs (dtype=x.dtype, "
                    "positions.to(x.dtype), no x.float())",
               variants=[float32_angles(a) for a in ("float32", "float32_all", "float32_cast",
                                                     "theta_float32")]),
        FLOAT32_CAST,
        FLOAT32_PRECISION,
        Replay(id="rope_rotate_half", name="RoPE pairs rotate-half, not interleaved",
               hint="the contract rotates interleaved pairs (x[2i], x[2i+1]) by position * "
                    "theta_i; pairing feature i with i + d_head/2 (rotate_half, as in GPT-NeoX "
                    "and Hugging Face) is another convention: take x[..., 0::2] and "
                    "x[..., 1::2] and put the rotated pairs back interleaved",
               variants=rope_variants(pairing="rotate_half")),
        Replay(id="rope_rotation_reversed", name="RoPE rotates the wrong way",
               hint="each pair turns by +position * theta_i: out[2i] = x[2i] cos - x[2i+1] sin, "
                    "out[2i+1] = x[2i] sin + x[2i+1] cos; with the signs of the sin terms "
                    "swapped every pair turns by -angle (the transpose of the rotation)",
               variants=rope_variants(direction=-1.0)),
        Replay(id="rope_scores_unscaled", name="RoPE scores not scaled",
               hint="rope_scores is a scaled dot product like lab 1's: divide the rotated "
                    "q_rot @ k_rot^T by sqrt(d_head) (math.sqrt(q.size(-1)))",
               variants=[impl(rope_scores=functools.partial(scores, scaled=False),
                              extrapolation_comparison=functools.partial(comparison,
                                                                         scaled=False))]),
        Replay(id="rope_frequencies_exponent", name="RoPE frequencies with the wrong exponent",
               hint="theta_i = base ** (-2i / d_head) for pair i = 0 .. d_head/2 - 1: the "
                    "exponent is the even feature index 2i (torch.arange(0, d_head, 2)) over "
                    "d_head, used once; not the pair number i, and not 2 * arange(0, d_head, 2)",
               variants=[v for e in ("i", "4i") for v in rope_variants(exponent=e)]),
        Replay(id="alibi_slopes_reversed", name="ALiBi slopes in reverse order",
               hint="head 0 has the steepest slope: 2 ** (-8 / n), then 2 ** (-16 / n), ... "
                    "down to 2 ** -8 for the last head (with 8 heads: 1/2, 1/4, ..., 1/256); "
                    "the order fixes which head looks close and which far",
               variants=alibi_variants(reverse=True)),
        Replay(id="alibi_slopes_power_of_two_formula",
               name="ALiBi slopes of a power of two used for any head count",
               hint="2 ** (-8 (h + 1) / n) is the rule for a power of two n only; for other n "
                    "Press et al. take the slopes of the largest power of two m below n, then "
                    "every other slope of 2m ([0::2]) until there are n",
               variants=alibi_variants(any_n=True)),
        Replay(id="alibi_slopes_sorted", name="ALiBi slopes sorted by size",
               hint="for n heads not a power of two Press et al. list first the slopes of "
                    "m, the largest power of two below n, then the extra slopes of 2m "
                    "([0::2]) after them; sorting them by size puts the extra ones among the "
                    "others, so most heads get another head's slope",
               variants=alibi_variants(by_size=True)),
        Replay(id="alibi_slopes_start_at_one", name="ALiBi slopes start at 1",
               hint="the geometric sequence starts at its ratio: head h (from 0) has slope "
                    "(2 ** (-8 / n)) ** (h + 1), so the first head has 2 ** (-8 / n) and the "
                    "last 2 ** -8 (with 8 heads 1/2 .. 1/256); raising it to h from 0 gives "
                    "head 0 slope 1 and shifts every head by one step",
               variants=alibi_variants(first_power=0)),
        Replay(id="alibi_bias_sign", name="ALiBi bias is a bonus, not a penalty",
               hint="the bias is -slope * distance: far keys lose score; with a plus sign far "
                    "keys win and attention drifts to the most distant tokens",
               variants=[impl(alibi_bias=functools.partial(bias, sign=1.0))]),
        # After the sign: +slope * distance is no per-key bias, and the two never fit one reply.
        Replay(id="alibi_bias_per_key", name="ALiBi bias per key, not per distance",
               hint="the contract's bias is -slope * |i + seq_k - seq_q - j|; slope * j "
                    "(growing with the key index, as BLOOM and MPT write it) differs from it "
                    "by a constant in each row only on the keys up to the query: under a "
                    "causal softmax the weights are the same, without a mask they are not; "
                    "alibi_bias must return the distance form",
               variants=[impl(alibi_bias=functools.partial(bias, per_key=origin))
                         for origin in KEY_ORIGIN]
                        + [impl(alibi_bias=functools.partial(bias, per_key=origin),
                                extrapolation_comparison=functools.partial(
                                    comparison, alibi_per_key=True))
                           for origin in KEY_ORIGIN]),
        Replay(id="alibi_offset_top_left", name="ALiBi distances aligned top-left",
               hint="with seq_q != seq_k the queries are the LAST seq_q positions: query i sits "
                    "at i + seq_k - seq_q, so its distance to key j is |i + seq_k - seq_q - j|, "
                    "not |i - j| (as for causal masks: the last query meets the last key)",
               variants=[impl(alibi_bias=functools.partial(bias, top_left=True))]),
        DETACHED,
    ]
