"""Tiny random models of each architecture the pipeline meets, built in-process with a fixed seed.

They exist so tests and dry runs of a sweep take seconds and need no download. The tokenizer is
byte-level (256 bytes + 3 specials), so any text round-trips and every architecture shares it.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from src.models import families

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
TINY_CONTEXT = 512
SEED = 0


def byte_tokenizer() -> PreTrainedTokenizerFast:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {PAD: 0, BOS: 1, EOS: 2}
    vocab.update({ch: i + 3 for i, ch in enumerate(alphabet)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    # Prepend BOS like the real models' tokenizers, so prompt lengths are counted the same way.
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS)


def _config(arch: str, vocab_size: int):
    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    # 128 wide so int4 groups of 128 (the default) divide every linear's input features.
    common = dict(
        vocab_size=vocab_size,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=TINY_CONTEXT,
        **ids,
    )
    family = families.FAMILIES.get(arch)
    if family is None or family.tiny is None:
        known = ", ".join(f.name for f in families.FAMILIES.values() if f.tiny is not None)
        raise ValueError(f"no tiny model for arch {arch!r}; known: {known}")
    return family.tiny(common)


def tiny_model(arch: str, seed: int = SEED) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    tokenizer = byte_tokenizer()
    cfg, cls = _config(arch, vocab_size=len(tokenizer))
    # A larger init than the default 0.02 makes logits peaked, so greedy decoding is not a coin toss
    # between near-equal tokens and dtype-equality tests mean something.
    cfg.initializer_range = 0.2
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    return model, tokenizer
