"""Lab 5 -- a decoder-only language model: parallel in training, sequential in generation.

A GPT-style model reads tokens t_0 .. t_{T-1} and predicts, at every position i, the next
token t_{i+1}.  Causal self-attention makes position i depend only on positions j <= i, so
one forward pass computes the predictions of *all* positions at once:

    logits = head(norm(blocks(tok_emb(tokens) + pos_emb(0 .. T-1))))      # (B, T, vocab)

That is why Transformers train fast where RNNs cannot: the T positions of a training
sequence are independent matrix rows, and teacher forcing supplies every prefix at once.

Generation is different: token t_{i+1} is not known before position i has been computed, so
tokens come out one at a time.  Recomputing the whole prefix at every step repeats work:
step t runs attention over a t x t score matrix, O(t^2 d) per step and O(L^3 d) for L
tokens.  But in a causal model the keys and values of the earlier positions never change
once computed (position j never sees anything after j).  A **KV cache** keeps them, per
layer:

    cache[layer] = (k, v),  each (B, num_heads, T_past, d_head)

and a step feeds only the new token: its query attends over the T_past cached keys plus its
own, so the score tensor of the step is (B, num_heads, 1, T_past + 1): O(L d) attention work
per step instead of O(L^2 d).  The new key and value are appended (on the sequence axis,
dim 2) and the grown cache is returned for the next step.

Two things must carry over from the cache:

1. **Positions.**  The new token sits at absolute position T_past (the cache's length), not
   at 0: its positional embedding is pos_emb(T_past + i).  Restarting at 0 on every step gives
   a model that never saw its position during training.
2. **The causal mask, aligned bottom-right.**  A chunk of T_new queries after T_past cached
   keys: query i is at absolute position T_past + i and may see keys j <= T_past + i

        mask = ones(T_new, T_past + T_new).tril(diagonal=T_past)      # True = may attend

   (the last query sees the last key, as lab 1's causal_mask(seq_q, seq_k) with seq_k > seq_q).
   torch.nn.functional.scaled_dot_product_attention(..., is_causal=True) aligns its mask
   **top-left** (query i sees keys j <= i): right for a whole sequence, wrong for a chunk after
   a cache, where query 0 would see only the very first key.  Pass an explicit attn_mask.

Feeding a sequence in any split into chunks (the whole prompt at once, then one token at a
time, or any other split) therefore gives exactly the logits of the parallel forward; the
lab's tests check it, and that greedy generation with the cache picks the same tokens as the
argmax of the parallel forward.  The cache costs memory instead of time: 2 x num_layers x B x
T x d_model numbers, growing linearly with the tokens generated.
"""

import math

import torch
import torch.nn as nn


class DecoderLayer(nn.Module):
    """A pre-norm GPT block: causal multi-head self-attention with an optional KV cache."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads, self.d_head = num_heads, d_model // num_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, past_kv=None):
        """x: (B, T_new, d_model), the positions that follow the T_past cached ones.
        past_kv: None or (k, v), each (B, num_heads, T_past, d_head) as returned before.
        Causal self-attention of the new positions over all T_past + T_new keys:
            h = x + dropout(out_proj(attn(norm1(x))));  y = h + dropout(ff(norm2(h)))
        returns (y (B, T_new, d_model), (k_all, v_all)) with k_all, v_all
        (B, num_heads, T_past + T_new, d_head): the past keys/values followed by the new ones.
        """
        # BEGIN SOLUTION
        # hint: project norm1(x) to q, k, v and split the heads: (B, T, d_model) -> (B, h, T, d_head).
        # hint: append the new k, v to the cached ones on the sequence axis (dim 2); return both.
        # hint: query i of the chunk is at position T_past + i: it sees keys j <= T_past + i
        # hint: (mask aligned bottom-right; is_causal=True in PyTorch aligns top-left).
        batch, t_new, d_model = x.shape
        h = self.norm1(x)

        def heads(t):
            return t.view(batch, t_new, self.num_heads, self.d_head).transpose(1, 2)  # (B, h, T_new, d_head)

        q, k, v = heads(self.q_proj(h)), heads(self.k_proj(h)), heads(self.v_proj(h))
        if past_kv is not None:
            k = torch.cat([past_kv[0], k], dim=2)  # (B, h, T_past + T_new, d_head)
            v = torch.cat([past_kv[1], v], dim=2)  # (B, h, T_past + T_new, d_head)
        t_all = k.size(2)
        t_past = t_all - t_new
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, h, T_new, T_all)
        mask = torch.ones(t_new, t_all, dtype=torch.bool, device=x.device).tril(t_past)  # (T_new, T_all)
        scores = scores.masked_fill(~mask, float("-inf"))
        attn = torch.softmax(scores, dim=-1) @ v  # (B, h, T_new, d_head)
        attn = attn.transpose(1, 2).reshape(batch, t_new, d_model)  # (B, T_new, d_model)
        h = x + self.dropout(self.out_proj(attn))
        y = h + self.dropout(self.ff(self.norm2(h)))
        return y, (k, v)
        # END SOLUTION


class DecoderLM(nn.Module):
    """A decoder-only (GPT-style) language model with learned positions and a KV cache."""

    def __init__(self, vocab_size, d_model=64, num_heads=4, d_ff=128, num_layers=2,
                 max_len=128, dropout=0.0):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_len, d_model)                   # learned positions
        self.layers = nn.ModuleList(DecoderLayer(d_model, num_heads, d_ff, dropout)
                                    for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.max_len = max_len

    def forward(self, tokens):
        """tokens: (B, T) long -> logits (B, T, vocab_size), all positions in one pass
        (causal). ValueError if T > max_len."""
        # BEGIN SOLUTION
        # hint: x = tok_emb(tokens) + pos_emb(positions 0..T-1); every layer sees the whole sequence.
        # hint: logits = head(norm(x)); the layers' caches are not needed here.
        seq = tokens.size(1)
        if seq > self.max_len:
            raise ValueError(f"sequence of {seq} tokens is longer than max_len={self.max_len}")
        positions = torch.arange(seq, device=tokens.device)  # (T,)
        x = self.tok_emb(tokens) + self.pos_emb(positions)  # (B, T, d_model)
        for layer in self.layers:
            x, _ = layer(x)
        return self.head(self.norm(x))  # (B, T, vocab_size)
        # END SOLUTION

    def forward_step(self, tokens, cache=None):
        """tokens: (B, T_new) long, the positions after those in cache (T_new >= 1: a prompt
        chunk or one token). cache: None or the list returned by the previous call, one
        (k, v) per layer. returns (logits (B, T_new, vocab_size), new cache). Positions are
        counted from the start of the sequence (the cache's length is the offset).
        Feeding a sequence in any split into chunks gives forward(tokens)'s logits.
        ValueError if the total length would exceed max_len."""
        # BEGIN SOLUTION
        # hint: the offset is the cached length: cache[0][0].size(2) (0 without a cache).
        # hint: positions offset .. offset + T_new - 1; each layer gets its own (k, v) and returns it grown.
        t_new = tokens.size(1)
        offset = 0 if cache is None else cache[0][0].size(2)
        if offset + t_new > self.max_len:
            raise ValueError(f"{offset} cached + {t_new} new tokens exceed max_len={self.max_len}")
        positions = torch.arange(offset, offset + t_new, device=tokens.device)  # (T_new,)
        x = self.tok_emb(tokens) + self.pos_emb(positions)  # (B, T_new, d_model)
        new_cache = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, None if cache is None else cache[i])
            new_cache.append(kv)  # (k, v), each (B, h, offset + T_new, d_head)
        return self.head(self.norm(x)), new_cache  # (B, T_new, vocab_size)
        # END SOLUTION

    @torch.no_grad()
    def generate(self, prompt, max_new_tokens):
        """prompt: (B, T0) long -> (B, T0 + max_new_tokens) long; greedy (argmax) decoding:
        one forward_step on the prompt, then one per new token except the last (the last
        token is never fed). max_new_tokens = 0 returns the prompt. ValueError if
        T0 + max_new_tokens > max_len. A cache is not reused across calls."""
        # BEGIN SOLUTION
        # hint: check the length first; logits[:, -1].argmax(-1) is the next token of each row.
        # hint: after the prompt, feed only the newest token (B, 1) with the cache.
        if prompt.size(1) + max_new_tokens > self.max_len:
            raise ValueError(f"{prompt.size(1)} + {max_new_tokens} tokens exceed max_len={self.max_len}")
        if max_new_tokens == 0:
            return prompt.clone()
        out = [prompt]
        logits, cache = self.forward_step(prompt)
        for step in range(max_new_tokens):
            token = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
            out.append(token)
            if step + 1 < max_new_tokens:
                logits, cache = self.forward_step(token, cache)
        return torch.cat(out, dim=1)  # (B, T0 + max_new_tokens)
        # END SOLUTION
