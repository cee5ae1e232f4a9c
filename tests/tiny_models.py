"""Tiny transformers models built from config, for tests that save and load real
models: each skips its test where torch or transformers is not installed."""

import pytest


def tiny_llama(seed=0, tied=False):
    """A one-layer Llama of a few thousand parameters, its weights drawn from
    ``seed``, in eval mode; ``tied``: its head tied to the token embedding."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        tie_word_embeddings=tied,
    )
    return transformers.LlamaForCausalLM(config).eval()
