"""Transformers: a tiny Vision Transformer for MNIST and a small causal byte-level language model.

Both use pre-norm blocks: x + MultiHeadAttention(LayerNorm(x)), then x + MLP(LayerNorm(x)) with the MLP
FC(mlp_ratio * D, GELU) -> FC(D), each residual an AdditionBlock with an identity path.
"""
from pydtnn.layers import (FC, AdditionBlock, Conv2D, Embedding, Flatten, ImageToSequence, Input, LayerNorm,
                           MultiHeadAttention, PositionEmbedding)
from pydtnn.activations import Softmax

from ._common import add_classifier, add_input, zoo


def transformer_block(dim, heads, mlp_ratio=2, causal=False, dropout=0.0):
    """The two residual halves of a pre-norm transformer block, as layers to `add`."""
    return [AdditionBlock([LayerNorm(), MultiHeadAttention(dim, heads, causal=causal, dropout=dropout)], []),
            AdditionBlock([LayerNorm(), FC(mlp_ratio * dim, activation="gelu"), FC(dim)], [])]


@zoo("mnist")
def vit_tiny_mnist(model, nclasses=10, input_shape=None, dim=64, heads=4, depth=2, patch=7):
    """Patch embedding by a patch x patch, stride-patch Conv2D (28x28 -> 4x4 = 16 tokens of 64), learned
    positions, 2 transformer blocks (4 heads, GELU MLP of 128), LayerNorm, then Flatten + FC class head
    (81,546 parameters)."""
    add_input(model, input_shape)
    model.add(Conv2D(nfilters=dim, filter_shape=(patch, patch), stride=patch))
    model.add(ImageToSequence())
    model.add(PositionEmbedding())
    for _ in range(depth):
        for layer in transformer_block(dim, heads):
            model.add(layer)
    model.add(LayerNorm())
    model.add(Flatten())
    add_classifier(model, nclasses)


@zoo("bytes")
def bytelm_small(model, nclasses=256, input_shape=None, dim=64, heads=4, depth=2):
    """A causal language model over bytes: Embedding(256, 64) + learned positions, 2 causal transformer
    blocks, LayerNorm, FC(256) + Softmax at every position (next-byte distributions, (T, 256))."""
    model.add(Input(shape=input_shape, dtype="int64"))
    model.add(Embedding(nclasses, dim, weights_initializer="small_normal"))
    model.add(PositionEmbedding())
    for _ in range(depth):
        for layer in transformer_block(dim, heads, causal=True):
            model.add(layer)
    model.add(LayerNorm())
    model.add(FC(nclasses))
    model.add(Softmax())
