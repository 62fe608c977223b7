"""Lab 2 -- multi-head attention.

One attention operation produces one weighting of the keys per query.  Often a token needs
several relationships at once (its syntactic head, the entity it refers to, the previous
word...).  Multi-head attention runs h attentions side by side: the d_model features are
projected to queries, keys and values, then cut into h slices of d_head = d_model / h
features, and each slice ("head") attends on its own in its own subspace.  The h outputs
are concatenated back to d_model features and mixed by an output projection:

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W_O
    head_i = Attention(Q W_Q[i], K W_K[i], V W_V[i])

Because each head works in d_head dimensions, h heads cost about as much as one full-width
head, and all of them run as one batched matmul: the head axis is just another batch axis.
The reshapes are the whole trick:

    (B, T, d_model) -> (B, T, h, d_head) -> (B, h, T, d_head)      split_heads
    (B, h, T, d_head) -> (B, T, h, d_head) -> (B, T, d_model)      merge_heads

The transpose matters: a plain view of (B, T, d_model) as (B, h, T, d_head) would mix
features of different positions into one "position".  Note that every head scales its scores
by sqrt(d_head), the dimension it actually dots over, not by sqrt(d_model).

Self-attention takes query, key and value from the same sequence.  Cross-attention takes the
queries from one sequence (e.g. a decoder) and keys/values from another (e.g. an encoder), so
seq_q and seq_k may differ; nothing in the code assumes they are equal.

torch.nn.MultiheadAttention computes exactly this.  It stores the three input projections as
one matrix in_proj_weight = [W_q; W_k; W_v] (stacked along dim 0), so copying our q_proj,
k_proj and v_proj into it reproduces our output.  By default it returns the weights averaged
over heads; ours are per head, like its average_attn_weights=False.
"""

import torch
import torch.nn as nn

# Lab 2 may import lab 1 (nothing else of yours). While lab 2 is graded, this import gives
# the course's reference scaled_dot_product_attention (the grader answers its calls), so a
# lab 1 bug costs no lab 2 points; to run this file yourself, keep your lab1_attention.py
# beside it.
from lab1_attention import scaled_dot_product_attention


def split_heads(x, num_heads):
    """(batch, seq, d_model) -> (batch, num_heads, seq, d_model // num_heads);
    head h holds features h*d_head:(h+1)*d_head. ValueError if d_model % num_heads != 0.
    """
    # BEGIN SOLUTION
    # hint: reshape the feature axis into (num_heads, d_head), then move the head axis before seq.
    # hint: a view straight to (batch, num_heads, seq, d_head) mixes up positions.
    batch, seq, d_model = x.shape
    if d_model % num_heads != 0:
        raise ValueError(f"d_model ({d_model}) is not divisible by num_heads ({num_heads})")
    d_head = d_model // num_heads
    x = x.reshape(batch, seq, num_heads, d_head)  # (B, T, h, d_head)
    return x.transpose(1, 2)  # (B, h, T, d_head)
    # END SOLUTION


def merge_heads(x):
    """(batch, num_heads, seq, d_head) -> (batch, seq, num_heads * d_head); inverse of split_heads."""
    # BEGIN SOLUTION
    # hint: undo split_heads step by step, in reverse order.
    # hint: after a transpose the tensor is not contiguous: .view will refuse, .reshape will not.
    batch, num_heads, seq, d_head = x.shape
    x = x.transpose(1, 2)  # (B, T, h, d_head)
    return x.reshape(batch, seq, num_heads * d_head)  # (B, T, d_model)
    # END SOLUTION


class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate q/k/v/out projections (batch-first)."""

    def __init__(self, d_model, num_heads, dropout=0.0, bias=True):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"d_model ({d_model}) is not divisible by num_heads ({num_heads})")
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_head = d_model // num_heads
        self.dropout = float(dropout)  # attention-dropout probability (a number, not a module)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key, value, mask=None, need_weights=True):
        """query: (batch, seq_q, d_model); key, value: (batch, seq_k, d_model) -- self-attention
        when all three are the same tensor, cross-attention otherwise.
        mask: optional bool broadcastable to (batch, num_heads, seq_q, seq_k), True = may attend
        (a key-padding mask is (batch, 1, 1, seq_k)).
        returns (output (batch, seq_q, d_model), weights (batch, num_heads, seq_q, seq_k) or None
        when need_weights is False). Dropout on the weights only in training mode.
        With the same weights it equals torch.nn.MultiheadAttention(batch_first=True) whose
        in_proj is [q_proj; k_proj; v_proj].
        """
        # BEGIN SOLUTION
        # hint: project, split into heads, attend with your Lab 1 function, merge, project out.
        # hint: the head axis acts as an extra batch axis, so no loop over heads is needed.
        # hint: attention dropout should only be active in training mode (self.training).
        # The reshapes are those of split_heads / merge_heads, written out here so that this
        # method can be checked on its own (a solution may just call the two functions).
        B, T_q, _ = query.shape
        T_k = key.size(1)
        h, d_head = self.num_heads, self.d_head
        q = self.q_proj(query).reshape(B, T_q, h, d_head).transpose(1, 2)  # (B, h, T_q, d_head)
        k = self.k_proj(key).reshape(B, T_k, h, d_head).transpose(1, 2)  # (B, h, T_k, d_head)
        v = self.v_proj(value).reshape(B, T_k, h, d_head).transpose(1, 2)  # (B, h, T_k, d_head)
        # The head axis is one more batch axis for Lab 1's function: all heads in one call.
        out, weights = scaled_dot_product_attention(
            q, k, v, mask=mask, dropout_p=self.dropout, training=self.training
        )  # out: (B, h, T_q, d_head), weights: (B, h, T_q, T_k)
        out = out.transpose(1, 2).reshape(B, T_q, self.d_model)  # (B, T_q, d_model)
        out = self.out_proj(out)  # (B, T_q, d_model)
        return out, (weights if need_weights else None)
        # END SOLUTION
