"""ImageToSequence: (C, H, W) feature maps -> (H * W, C) tokens, positions in row-major (h, w) order, as
PyTorch's `x.flatten(2).transpose(1, 2)` after a ViT's patch-embedding convolution.

On the CPU's NHWC layout this is a free reshape.
"""
from pydtnn.layers.base import Layer


class ImageToSequence(Layer):
    internal_layout = True      # reads the backend's layout to order the tokens the same on every backend

    def build(self, in_shape):
        if len(in_shape) != 3:
            raise self.shape_error("ImageToSequence needs (C, H, W) input")
        c, h, w = in_shape
        return (h * w, c)

    def forward(self, x, training=False):
        n = x.shape[0]
        if self.channel_axis == 3:                             # (N, H, W, C)
            return x.reshape(n, -1, x.shape[3])
        return x.reshape(n, x.shape[1], -1).transpose(0, 2, 1)  # (N, C, H, W)

    def backward(self, dy):
        n = dy.shape[0]
        c, h, w = self.in_shape
        shape = self.backend.internal_shape(n, (c, h, w))
        if self.channel_axis == 3:
            return dy.reshape(shape)
        return self.xp.ascontiguousarray(dy.transpose(0, 2, 1)).reshape(shape)
