"""Layers, each written once for every backend (see pydtnn/backends/__init__.py for the kernel contract)."""
from pydtnn.layers.base import Layer
from pydtnn.layers.input import Input
from pydtnn.layers.fc import FC
from pydtnn.layers.conv2d import Conv2D
from pydtnn.layers.pooling import MaxPool2D, AveragePool2D
from pydtnn.layers.dropout import Dropout
from pydtnn.layers.flatten import Flatten
from pydtnn.layers.batchnorm import BatchNormalization
from pydtnn.layers.blocks import AdditionBlock, ConcatenationBlock
from pydtnn.layers.composite import Composite
from pydtnn.layers.layernorm import LayerNorm
from pydtnn.layers.groupnorm import GroupNorm
from pydtnn.layers.embedding import Embedding
from pydtnn.layers.attention import MultiHeadAttention
from pydtnn.layers.conv_transpose2d import ConvTranspose2D
from pydtnn.layers.upsample2d import Upsample2D
from pydtnn.layers.position_embedding import PositionEmbedding
from pydtnn.layers.image_to_sequence import ImageToSequence

_ACTIVATION_NAMES = ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "Softmax", "GELU", "SiLU")


def __getattr__(name):
    # Activations live in pydtnn.activations (which imports layers.base); re-exported lazily to avoid a cycle.
    if name in _ACTIVATION_NAMES:
        import pydtnn.activations
        return getattr(pydtnn.activations, name)
    raise AttributeError(name)


__all__ = ["Layer", "Input", "FC", "Conv2D", "MaxPool2D", "AveragePool2D", "Dropout", "Flatten",
           "BatchNormalization", "AdditionBlock", "ConcatenationBlock", "Composite", "LayerNorm", "GroupNorm", "Embedding",
           "MultiHeadAttention", "ConvTranspose2D", "Upsample2D", "PositionEmbedding", "ImageToSequence",
           "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Softmax", "GELU", "SiLU"]
