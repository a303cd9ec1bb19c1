#!/usr/bin/env python3
"""PyTorch's side of the comparison with Gyre (scripts/torch_anchor.sh runs
both): the same model Gyre loads, on CPU, timed as
gpu/examples/torch_anchor.rs times Gyre's engine and trainer. A Hugging
Face checkpoint directory (the tiny Qwen3 shape) runs in `transformers`;
a Gyre safetensors file (Gyre's own model) runs in `GyreModel` below, a
PyTorch module of that architecture (learned positions, RMSNorm, fused
QKV, GELU MLP, untied head) with a KV-cache sampling loop.

    python3 scripts/torch_anchor.py CHECKPOINT_DIR|GYRE.safetensors [REPS]

Prints one JSON line: median seconds of generation with 1 and with 32
concurrent requests (32-token prompts, 64 sampled tokens each, temperature
1, full vocabulary: top_k 0, top_p 1, KV cache on) and of one training
step over 8 rows of 128 tokens (forward+backward of the ratio-weighted
policy loss on the targets after the first 32 tokens, as Gyre's objective
computes it, then AdamW after clipping the gradient norm to 1, as Gyre's
core updates), and the log-probs of the first row's targets under the
initial weights (`logprobs`, compared with Gyre's by the shell script).
PyTorch runs on as many threads as GYRE_THREADS says (default: every
core, as Gyre's thread pools do).
"""

import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from safetensors import safe_open
from transformers import AutoModelForCausalLM

PROMPT, NEW_TOKENS, ROWS, ROW_LEN = 32, 64, 8, 128


class GyreModel(torch.nn.Module):
    """gpu/src/model/gyre.rs in PyTorch, weights from Gyre's safetensors
    file (input-major matrices, as Gyre stores them)."""

    def __init__(self, path):
        super().__init__()
        with safe_open(path, framework="pt") as f:
            self.cfg = json.loads(f.metadata()["gyre.model_config"])
            w = {k: torch.nn.Parameter(f.get_tensor(k)) for k in f.keys()}
        self.w = torch.nn.ParameterDict({k.replace(".", "_"): v for k, v in w.items()})
        self.heads, self.width = self.cfg["heads"], self.cfg["width"]

    def p(self, name):
        return self.w[name.replace(".", "_")]

    @staticmethod
    def norm(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g

    def forward(self, ids, cache=None):
        """Logits of `ids` (batch x new tokens) after `cache` (per layer
        keys and values, extended in place when given)."""
        n, t = ids.shape
        past = cache[0][0].shape[2] if cache and cache[0] else 0
        h, d = self.heads, self.width
        x = self.p("tok_emb")[ids] + self.p("pos_emb")[past : past + t]
        mask = torch.ones(t, past + t, dtype=torch.bool).tril(past)
        for l in range(self.cfg["layers"]):
            pre = f"layers.{l}."
            qkv = self.norm(x, self.p(pre + "attn_norm")) @ self.p(pre + "wqkv")
            q, k, v = (z.view(n, t, h, d // h).transpose(1, 2) for z in qkv.split(d, -1))
            if cache is not None:
                if cache[l]:
                    k = torch.cat([cache[l][0], k], 2)
                    v = torch.cat([cache[l][1], v], 2)
                cache[l] = (k, v)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + a.transpose(1, 2).reshape(n, t, d) @ self.p(pre + "wo")
            m = self.norm(x, self.p(pre + "mlp_norm")) @ self.p(pre + "w1")
            x = x + F.gelu(m) @ self.p(pre + "w2")
        return self.norm(x, self.p("final_norm")) @ self.p("lm_head")

    def generate(self, ids, max_new_tokens, **_):
        cache = [None] * self.cfg["layers"]
        logits = self(ids, cache)[:, -1]
        out = [ids]
        for _ in range(max_new_tokens):
            tok = torch.multinomial(torch.softmax(logits, -1), 1)
            out.append(tok)
            logits = self(tok, cache)[:, -1]
        return torch.cat(out, 1)


def prompt(i):
    return [(t * 7 + i * 13) % 256 for t in range(PROMPT)]


def generate(model, concurrent, rep):
    ids = torch.tensor([prompt(i) for i in range(concurrent)], dtype=torch.long)
    torch.manual_seed(rep)
    t = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            eos_token_id=None,
            pad_token_id=0,
            use_cache=True,
        )
    s = time.perf_counter() - t
    assert out.shape == (concurrent, PROMPT + NEW_TOKENS), out.shape
    return s


def train_ids():
    return torch.tensor(
        [[(t * 31 + r * 7) % 256 for t in range(ROW_LEN)] for r in range(ROWS)],
        dtype=torch.long,
    )


def target_logprobs(model, ids):
    """log π of every token after the first, from the logits before it."""
    out = model(ids)
    logits = (out if isinstance(out, torch.Tensor) else out.logits)[:, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def first_row_logprobs(model):
    """The first training row's target log-probs (positions 32..128)."""
    with torch.no_grad():
        return target_logprobs(model.eval(), train_ids()[:1])[0, PROMPT - 1 :].tolist()


def train_step(model, opt):
    ids = train_ids()
    adv = torch.tensor([1.0 if r % 2 == 0 else -1.0 for r in range(ROWS)]).unsqueeze(1)
    coef = 1.0 / (96.0 * ROWS)
    t = time.perf_counter()
    logp = target_logprobs(model, ids)
    mask = torch.zeros_like(logp)
    mask[:, PROMPT - 1 :] = 1.0
    ratio = torch.exp(logp - (-5.5))
    loss = -(coef * ratio * adv * mask).sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    s = time.perf_counter() - t
    opt.zero_grad(set_to_none=True)
    return s


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    reps = int(sys.argv[2]) if len(sys.argv) == 3 else 5
    torch.set_num_threads(int(os.environ.get("GYRE_THREADS", os.cpu_count())))
    if sys.argv[1].endswith(".safetensors"):
        model, name = GyreModel(sys.argv[1]), "gyre"
    else:
        model = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
        model.generation_config.eos_token_id = None
        name = "qwen3"
    logprobs = first_row_logprobs(model)
    # Gyre's core: the same hyper-parameters (gpu/examples/torch_anchor.rs).
    opt = torch.optim.AdamW(
        model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
    )
    one, many, train = [], [], []
    for rep in range(reps + 1):  # the first round warms up
        a = generate(model.eval(), 1, rep)
        b = generate(model, 32, rep)
        c = train_step(model.train(), opt)
        if rep > 0:
            one.append(a)
            many.append(b)
            train.append(c)
    print(
        json.dumps(
            {
                "impl": "torch",
                "model": name,
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "reps": reps,
                "generate_1_s": statistics.median(one),
                "generate_1_tokens": NEW_TOKENS,
                "generate_32_s": statistics.median(many),
                "generate_32_tokens": 32 * NEW_TOKENS,
                "train_s": statistics.median(train),
                "train_tokens": ROWS * ROW_LEN,
                "logprobs": logprobs,
            }
        )
    )


if __name__ == "__main__":
    main()
