"""A convolutional autoencoder for MNIST: trained with `--targets inputs --loss_func mean_squared_error`."""
from pydtnn.layers import Conv2D, ConvTranspose2D, Upsample2D

from ._common import add_input, zoo


@zoo("mnist")
def conv_autoencoder_mnist(model, nclasses=None, input_shape=None):
    """Encoder: Conv 3x3/2 16 ReLU (14x14), Conv 3x3/2 32 ReLU (7x7). Decoder: ConvTranspose2D 3x3/2 16
    ReLU (14x14), Upsample2D x2 (28x28), Conv 3x3 back to the input's channels (linear: the targets are
    the normalized pixels). Output shape = input shape."""
    add_input(model, input_shape)
    channels = model.input_shape[0]
    model.add(Conv2D(nfilters=16, filter_shape=(3, 3), stride=2, padding=1, activation="relu",
                     weights_initializer="he_uniform"))
    model.add(Conv2D(nfilters=32, filter_shape=(3, 3), stride=2, padding=1, activation="relu",
                     weights_initializer="he_uniform"))
    model.add(ConvTranspose2D(16, (3, 3), stride=2, padding=1, output_padding=1, activation="relu",
                              weights_initializer="he_uniform"))
    model.add(Upsample2D(2, mode="bilinear"))
    model.add(Conv2D(nfilters=channels, filter_shape=(3, 3), padding=1))
