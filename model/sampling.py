"""Autoregressive sampling from a ``Llama`` with a KV cache: greedy, temperature, top-k, top-p.

Token ids in, token ids out: the tokenizer (``data/``) stays with the caller
(``eval/generate.py``). Prompts of different lengths decode together in lockstep from position
0, as in Meta's reference Llama code: the batch is prefilled up to the shortest prompt, then
each step feeds every row its next prompt token while it still has one and its sample after,
so every row sees exactly its own prompt at its own positions, without padding or masks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from model.kv_cache import KVCache
from model.llama import Llama


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is drawn from the logits.

    Attributes:
        temperature: logits are divided by it before the softmax; 0 picks the argmax (greedy).
        top_k: keep only the k most likely tokens (``None``: all).
        top_p: keep the smallest set of most likely tokens whose probability reaches p
            (nucleus sampling; 1: all).
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Generation:
    """One prompt's continuation: the new token ids (without the EOS that ended them) and why
    decoding stopped: ``"eos"``, ``"max_new_tokens"``, ``"stop"`` (the caller's stop test) or
    ``"context"`` (the model's ``max_seq_len`` was reached)."""

    tokens: list[int]
    finish_reason: str


def filter_logits(logits: Tensor, sampling: SamplingConfig) -> Tensor:
    """``logits`` [batch, vocab] divided by the temperature, with the tokens that top-k and
    top-p exclude set to -inf (temperature > 0)."""
    logits = logits.float() / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens more likely than it already reach p; the first never is
        before = probs.cumsum(-1) - probs
        drop_sorted = before >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_token(
    logits: Tensor, sampling: SamplingConfig, generator: torch.Generator | None = None
) -> Tensor:
    """One token id per row of ``logits`` [batch, vocab]."""
    if sampling.temperature == 0:
        return logits.argmax(-1)
    probs = filter_logits(logits, sampling).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def document_start(ids: list[int], eos_id: int, bos_id: int | None = None) -> list[int]:
    """A prompt's ids placed where training saw documents begin: after the EOS that ended the
    previous document, and after a BOS when documents carry one."""
    return [eos_id, *([] if bos_id is None else [bos_id]), *ids]


def check_prompt_lengths(lengths: list[int], max_seq_len: int) -> None:
    for i, n in enumerate(lengths):
        if n == 0:
            raise ValueError(f"prompt {i} is empty: start it with at least one token (BOS)")
        if n >= max_seq_len:
            raise ValueError(
                f"prompt {i} has {n} tokens, but the model's context (model.max_seq_len) is "
                f"{max_seq_len} tokens: a prompt must be shorter than that to leave room for "
                "new tokens"
            )


GREEDY = SamplingConfig(temperature=0.0)


@torch.no_grad()
def generate(
    model: Llama,
    prompts: list[list[int]],
    max_new_tokens: int,
    sampling: SamplingConfig = GREEDY,
    eos_id: int | None = None,
    seed: int | None = None,
    vocab_limit: int | None = None,
    stop: Callable[[int, list[int]], bool] | None = None,
    lockstep: Callable[[bool], bool] | None = None,
) -> list[Generation]:
    """Continue each prompt (token ids) by up to ``max_new_tokens`` tokens.

    A row stops at ``eos_id``, after ``max_new_tokens``, when ``stop(row, new_tokens)`` says so
    (e.g. a stop string appeared), or when it fills the model's context. ``seed`` makes
    sampling reproducible (a generator of its own, on the model's device); ``vocab_limit``
    keeps ids at or past it (the padding rows of an embedding rounded up from the tokenizer's
    vocabulary) from ever being drawn.

    ``lockstep`` (several processes decoding their own prompts, ``eval.harness``): given
    whether this process is done, whether every process is. Until they all are, a process
    that is done goes on calling the model on one token and ignores the output, so that every
    process runs the same number of forwards: under FSDP2 each forward is a collective.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    lengths = [len(p) for p in prompts]
    check_prompt_lengths(lengths, model.config.max_seq_len)
    new: list[list[int]] = [[] for _ in prompts]
    reasons: list[str | None] = [None if max_new_tokens else "max_new_tokens" for _ in prompts]
    if not prompts or (not max_new_tokens and lockstep is None):
        return [Generation(t, r) for t, r in zip(new, reasons, strict=True)]
    device = model.embed_tokens.weight.device
    generator = None if seed is None else torch.Generator(device).manual_seed(seed)
    total = min(max(lengths) + max_new_tokens, model.config.max_seq_len)
    tokens = torch.zeros(len(prompts), total, dtype=torch.long, device=device)
    is_prompt = torch.zeros(len(prompts), total, dtype=torch.bool, device=device)
    for i, prompt in enumerate(prompts):
        tokens[i, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        is_prompt[i, : len(prompt)] = True
    cache = KVCache.for_model(model, len(prompts), total)
    position = min(lengths)
    logits = model(tokens[:, :position], cache=cache)[:, -1]
    done = all(r is not None for r in reasons)  # max_new_tokens=0, in lockstep with others
    while True:
        if not done:
            sampled = next_token(logits[:, :vocab_limit], sampling, generator)
            column = torch.where(is_prompt[:, position], tokens[:, position], sampled)
            tokens[:, position] = column
            for i, token in enumerate(column.tolist()):
                if reasons[i] is not None or position < lengths[i]:
                    continue
                if token == eos_id:
                    reasons[i] = "eos"
                    continue
                new[i].append(token)
                if stop is not None and stop(i, new[i]):
                    reasons[i] = "stop"
                elif len(new[i]) == max_new_tokens:
                    reasons[i] = "max_new_tokens"
            position += 1
            done = all(r is not None for r in reasons) or position == total
        if lockstep(done) if lockstep is not None else done:
            break
        if done:  # another process still decodes
            model(tokens[:, :1])
        else:
            logits = model(column[:, None], cache=cache)[:, -1]
    return [Generation(t, r or "context") for t, r in zip(new, reasons, strict=True)]
