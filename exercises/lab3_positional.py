# Generated from solutions/lab3_positional.py by `grader stubs`. Fill in the TODOs; keep the given code.
"""Lab 3 -- positional encoding.

Attention by itself has no notion of order.  Shuffle the tokens of a sequence and the
attention outputs are shuffled the same way but otherwise unchanged: self-attention is
permutation-equivariant, since every score depends only on the two vectors being compared.
"dog bites man" and "man bites dog" would look alike.  To give the model order we add to
each token embedding a vector that depends on its position.

Sinusoidal encoding (fixed, no parameters).  Feature pairs (2i, 2i+1) are a sine and a cosine
of the position at a frequency that falls geometrically with i:

    PE[pos, 2i]   = sin(pos / base^(2i / d_model))
    PE[pos, 2i+1] = cos(pos / base^(2i / d_model))          (base = 10000)

Low features oscillate fast and high ones slowly, like the digits of a clock, so every
position gets a distinct pattern, and because sin/cos of (pos + k) is a fixed rotation of
sin/cos of pos, a relative offset is easy for the model to read off.  When d_model is odd the
last feature (index d_model - 1, even) is a sine without a cosine partner.  The formula is
defined for any position, so the table can be computed for sequences longer than any seen in
training (whether the model then generalises is a separate question).

Learned embedding.  An nn.Embedding(max_len, d_model) holds one trainable vector per
position, trained along with the model.  It can fit whatever the data wants, but it has no row
for position max_len or beyond, so it cannot extrapolate past the length it was built for.

Both variants add the encoding to the input (batch, seq, d_model) and apply dropout.  Both
refuse a sequence longer than max_len: the fixed table is only precomputed that far.
"""

import torch
import torch.nn as nn


def sinusoidal_positional_encoding(seq_len, d_model, base=10000.0):
    """float32 (seq_len, d_model): PE[pos, 2i] = sin(pos / base**(2i/d_model)),
    PE[pos, 2i+1] = cos(pos / base**(2i/d_model)); an odd d_model keeps the last sin column.
    """
    # TODO(Lab 3): build a column of positions and a row of frequencies; their product is every angle.
    # TODO(Lab 3): even feature columns take the sine, odd ones the cosine (slice with 0::2 and 1::2).
    # TODO(Lab 3): with an odd d_model there is one more sine column than cosine columns.
    raise NotImplementedError("Lab 3: sinusoidal_positional_encoding")


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal table to (batch, seq, d_model) inputs, then dropout."""

    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.d_model = d_model
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        # A buffer, not a parameter: it moves with .to(device) and is saved in the state_dict,
        # but the optimiser never touches it.
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model))

    def forward(self, x):
        """x: (batch, seq, d_model) -> dropout(x + pe[:seq]); ValueError if seq > max_len."""
        # TODO(Lab 3): add the first seq rows of the (max_len, d_model) table; broadcasting does the batch.
        # TODO(Lab 3): check seq against max_len first, and give the table x's dtype.
        raise NotImplementedError("Lab 3: SinusoidalPositionalEncoding.forward")


class LearnedPositionalEmbedding(nn.Module):
    """Adds one trainable vector per position to (batch, seq, d_model) inputs, then dropout."""

    def __init__(self, max_len, d_model, dropout=0.0):
        super().__init__()
        self.max_len = max_len
        self.d_model = d_model
        self.embedding = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        """x: (batch, seq, d_model) -> dropout(x + embedding(positions 0..seq-1)); ValueError if seq > max_len."""
        # TODO(Lab 3): look up the embedding of the positions 0..seq-1 (an integer tensor on x's device).
        # TODO(Lab 3): an index >= max_len has no row: raise a ValueError before the lookup fails.
        raise NotImplementedError("Lab 3: LearnedPositionalEmbedding.forward")
