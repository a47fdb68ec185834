"""Tiny published-style checkpoints, built with transformers' own classes (not this project's
export), for the tests that start a run from them: a Llama (SwiGLU, grouped-query attention,
untied head) and an Apertus (xIELU, QK-norm, Llama 3 RoPE scaling, grouped-query attention), each
with a byte-level transformers tokenizer saved beside it as a hub checkpoint ships one; and one of
this project's own exports (xIELU under µP, with its config sidecar). Every weight is moved away
from its initial value, so that a norm or scalar that loads into the wrong place shows in the
loss. Made once per machine (``data_fixtures.made_once``)."""

from __future__ import annotations

from pathlib import Path

from data_fixtures import made_once

VOCAB = 384  # the byte tokenizer's 257 ids, padded as this project pads a vocabulary
LAYERS, DIM, HEADS, KV_HEADS, HIDDEN, CONTEXT = 2, 32, 2, 1, 96, 64


def _perturbed(model):
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _save_byte_tokenizer(directory: Path) -> None:
    """256 byte tokens and an end-of-text token, in transformers' byte-level BPE (no merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {piece: i for i, piece in enumerate(alphabet)}
    vocab["<|endoftext|>"] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")
    fast.save_pretrained(directory)


def _write_llama(directory: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=DIM, intermediate_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, hidden_act="silu",
        max_position_embeddings=CONTEXT, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )  # fmt: skip
    _perturbed(LlamaForCausalLM(config)).save_pretrained(directory)
    _save_byte_tokenizer(directory)


def _write_apertus(directory: Path) -> None:
    from transformers import ApertusConfig, ApertusForCausalLM

    rope = {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32, "rope_theta": 10000.0,
    }  # fmt: skip
    config = ApertusConfig(
        vocab_size=VOCAB, hidden_size=DIM, intermediate_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, hidden_act="xielu",
        max_position_embeddings=CONTEXT, rope_parameters=rope, dtype="float32",
    )  # fmt: skip
    _perturbed(ApertusForCausalLM(config)).save_pretrained(directory)
    _save_byte_tokenizer(directory)


def _write_own_export(directory: Path) -> None:
    from model import Llama, ModelConfig
    from model.hf import export_hf

    config = ModelConfig(
        vocab_size=VOCAB, dim=DIM, n_layers=LAYERS, n_heads=HEADS, gated_hidden=64,
        max_seq_len=CONTEXT, activation="xielu", parametrization="mup", mup_base_dim=16,
    )  # fmt: skip
    export_hf(_perturbed(Llama(config)), directory)


def llama_checkpoint() -> Path:
    return made_once("hf-llama", _write_llama)


def apertus_checkpoint() -> Path:
    return made_once("hf-apertus", _write_apertus)


def own_export() -> Path:
    return made_once("hf-own-export", _write_own_export)
