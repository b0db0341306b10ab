"""Tiny random causal LMs and left-padded prompts for the decoder tests (fast path, decode-step variants)."""
import torch
from transformers import (LlamaConfig, LlamaForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

ARCHITECTURES = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM),
                 "phi3": (Phi3Config, Phi3ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}


def tiny_causal_lm(arch: str, seed: int, **config) -> torch.nn.Module:
    """A random ``arch`` LM of ``config`` in eval mode, its weights drawn after ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    cfg_cls, lm_cls = ARCHITECTURES[arch]
    return lm_cls(cfg_cls(**config)).eval()


def embedded_prompts(lm, lengths, seed: int = 1):
    """Random token prompts of ``lengths``, embedded and LEFT padded: (embeds [B, L, D], attention [B, L])."""
    g = torch.Generator().manual_seed(seed)
    L = max(lengths)
    ids = torch.zeros(len(lengths), L, dtype=torch.long)
    attention = torch.zeros(len(lengths), L, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, L - n:] = torch.randint(1, lm.config.vocab_size, (n,), generator=g)
        attention[i, L - n:] = 1
    with torch.no_grad():
        return lm.get_input_embeddings()(ids), attention



def left_padded_embeds(lm, rows):
    """Token rows of different lengths as left-padded input embeddings ``[n, L, D]`` and attention ``[n, L]``."""
    L = max(map(len, rows))
    ids, attention = torch.zeros(len(rows), L, dtype=torch.long), torch.zeros(len(rows), L, dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, L - len(row):], attention[r, L - len(row):] = row, 1
    with torch.no_grad():
        return lm.get_input_embeddings()(ids), attention
