#!/usr/bin/env python3
"""PyTorch's side of the comparison with Gyre (scripts/torch_anchor.sh runs
both): the same Hugging Face checkpoint Gyre loads, in `transformers` on
CPU, timed as gpu/examples/torch_anchor.rs times Gyre's engine and trainer.

    python3 scripts/torch_anchor.py CHECKPOINT_DIR [REPS]

Prints one JSON line: median seconds of generation with 1 and with 32
concurrent requests (32-token prompts, 64 sampled tokens each, temperature
1, full vocabulary: top_k 0, top_p 1, KV cache on) and of one training
forward+backward over 8 rows of 128 tokens (ratio-weighted policy loss on
the targets after the first 32 tokens, as Gyre's objective computes it).
"""

import json
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM

PROMPT, NEW_TOKENS, ROWS, ROW_LEN = 32, 64, 8, 128


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


def train_step(model):
    ids = torch.tensor(
        [[(t * 31 + r * 7) % 256 for t in range(ROW_LEN)] for r in range(ROWS)],
        dtype=torch.long,
    )
    adv = torch.tensor([1.0 if r % 2 == 0 else -1.0 for r in range(ROWS)]).unsqueeze(1)
    coef = 1.0 / (96.0 * ROWS)
    t = time.perf_counter()
    logits = model(ids).logits[:, :-1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    mask = torch.zeros_like(logp)
    mask[:, PROMPT - 1 :] = 1.0
    ratio = torch.exp(logp - (-5.5))
    loss = -(coef * ratio * adv * mask).sum()
    loss.backward()
    s = time.perf_counter() - t
    model.zero_grad(set_to_none=True)
    return s


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    reps = int(sys.argv[2]) if len(sys.argv) == 3 else 5
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
    model.generation_config.eos_token_id = None
    one, many, train = [], [], []
    for rep in range(reps + 1):  # the first round warms up
        a = generate(model.eval(), 1, rep)
        b = generate(model, 32, rep)
        c = train_step(model.train())
        if rep > 0:
            one.append(a)
            many.append(b)
            train.append(c)
    print(
        json.dumps(
            {
                "impl": "torch",
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "reps": reps,
                "generate_1_s": statistics.median(one),
                "generate_1_tokens": NEW_TOKENS,
                "generate_32_s": statistics.median(many),
                "generate_32_tokens": 32 * NEW_TOKENS,
                "train_s": statistics.median(train),
                "train_tokens": ROWS * ROW_LEN,
            }
        )
    )


if __name__ == "__main__":
    main()
