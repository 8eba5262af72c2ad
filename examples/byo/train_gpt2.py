"""GPT-2 (Hugging Face `transformers`) trained on the Python standard library's source,
portable with the `trainer` library: stop it anywhere, resume it on any world size.

Nothing is downloaded: the model is built from a `GPT2Config` with random weights, the
corpus is the `.py` files of this interpreter's standard library (on every machine,
offline), and the tokenizer is a byte-level BPE trained on that corpus by `tokenizers`
at start-up (deterministic, so every rank and every later attempt builds the same one;
it is also saved in each checkpoint as a `Stateful`, and a resume with a different
tokenizer, e.g. another Python version's corpus, is refused with one clear line).

    python examples/byo/train_gpt2.py --steps 300
    torchrun --nproc-per-node 2 examples/byo/train_gpt2.py --steps 300
"""

from __future__ import annotations

import argparse
import math
import sysconfig
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel

import trainer as cb


def stdlib_corpus(max_bytes: int) -> list[str]:
    """The standard library's top-level modules, sorted by name, up to `max_bytes`."""
    texts, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return texts


def train_tokenizer(texts: list[str], vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


class TokenizerState:
    """The tokenizer as checkpointed state: saved with the model, checked on resume."""

    def __init__(self, tok: Tokenizer) -> None:
        self.json = tok.to_str()

    def state_dict(self) -> dict[str, Any]:
        return {"json": self.json}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["json"] != self.json:
            raise cb.TrainerError("the checkpoint was trained with a different tokenizer "
                                  "(another corpus?); resume with the same Python version")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--corpus-mb", type=float, default=2.0)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--log-every", type=int, default=25)
    args = p.parse_args()

    run = cb.init(total_steps=args.steps)
    t0 = time.perf_counter()
    texts = stdlib_corpus(int(args.corpus_mb * 1e6))
    tok = train_tokenizer(texts, args.vocab)
    ids = torch.tensor([t for e in tok.encode_batch(texts) for t in e.ids], dtype=torch.long)
    n = args.seq_len + 1
    samples = ids[: len(ids) // n * n].view(-1, n)  # non-overlapping windows
    run.log(f"corpus: {len(texts)} stdlib files, {sum(map(len, texts)) / 1e6:.1f} MB, "
            f"{len(ids):,} tokens (BPE vocab {tok.get_vocab_size()}), {len(samples):,} "
            f"samples of {args.seq_len} tokens; tokenizer in {time.perf_counter() - t0:.1f}s")

    torch.manual_seed(0)  # same random init on every rank
    config = GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=args.seq_len,
                        n_embd=args.width, n_layer=args.layers, n_head=4, bos_token_id=0, eos_token_id=0,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    run.log(f"model: GPT-2, {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params, "
            f"{args.layers} layers x {args.width}, world size {run.world_size}")
    model = run.shard(model)  # fully_shard each of transformer.h, then the root
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    warm = max(1, args.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warm, 0.1 + 0.9 * 0.5 * (
        1 + math.cos(math.pi * min(1.0, s / args.steps)))))
    sampler = cb.ResumableSampler(len(samples), global_batch=args.global_batch, seed=0,
                                  micro_batch=args.micro_batch)
    ckpt = run.checkpointer(model=model, optimizer=opt, scheduler=sched, data=sampler,
                            extra={"tokenizer": TokenizerState(tok)},
                            every=args.checkpoint_every, model_config=config.to_diff_dict())

    t_last = time.perf_counter()
    for step in range(ckpt.resume() + 1, args.steps + 1):
        batch = sampler.next()
        model.train()
        opt.zero_grad(set_to_none=True)
        loss_sum = torch.zeros(())
        for mb in batch.micro:
            seqs = samples[torch.tensor(mb or batch.ids[:1])]
            logits = model(input_ids=seqs[:, :-1]).logits.float()
            per_sample = F.cross_entropy(logits.transpose(1, 2), seqs[:, 1:],
                                         reduction="none").mean(dim=1)
            (per_sample.sum() * (batch.scale if mb else 0.0)).backward()
            loss_sum += per_sample.detach().sum() if mb else 0.0
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss = run.all_sum(loss_sum) / args.global_batch
        if step % args.log_every == 0 or step == 1:
            now = time.perf_counter()
            run.log(f"step {step}/{args.steps} loss {loss:.3f} "
                    f"({(now - t_last) / (args.log_every if step > 1 else 1) * 1000:.0f} ms/step)")
            t_last = now
        run.step_done(step, loss=loss, tokens=args.global_batch * args.seq_len)
    run.finish()


if __name__ == "__main__":
    main()
