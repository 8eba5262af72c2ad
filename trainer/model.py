"""A small decoder-only transformer LM, configurable depth/width (see config.MODEL_PRESETS).

Why so plain: the trainer's job is checkpoint portability, not modelling. Each block is
its own module so FSDP2 can shard per block (the usual `fully_shard(block)` then
`fully_shard(model)` pattern) and activation checkpointing can wrap blocks.
The forward returns the loss **per sample** (mean over that sample's tokens): the loop
sums those and divides by the global batch size, which makes the loss and gradients the
same whatever the world size or micro-batching.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config import ModelConfig


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        shape = (b, t, self.n_heads, d // self.n_heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TransformerLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError("d_model must be divisible by n_heads")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Per-sample mean next-token cross-entropy, shape [batch], in float32."""
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x)).float()
        loss = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        return loss.mean(dim=1)


def build_model(cfg: ModelConfig, seed: int) -> TransformerLM:
    """Same weights on every rank and every world size: init is seeded before sharding."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TransformerLM(cfg)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
