"""Residual networks (He et al. 2015).

CIFAR-style, resnet{20,32,44,56,110,1202}_cifar10 (paper section 4.2): a 3x3 convolution with 16 filters,
then three stages of n = (depth - 2) / 6 BasicBlocks with 16, 32 and 64 filters (stride 2 at the first block
of stages 2 and 3), global average pooling and the classifier. Downsampling shortcuts are option B: a 1x1
stride-2 convolution + BatchNormalization (our layers have no zero-padding identity, option A); that adds
2,752 parameters, so ResNet-20 has 272,474 (option A: 269,722) with 10 classes.

ImageNet-style, resnet{18,34,50,101,152}_{cifar10,imagenet}: stages of 64, 128, 256, 512 filters with
BasicBlocks (18, 34) or Bottleneck blocks (50, 101, 152, expansion 4); projection shortcuts (1x1 conv + BN)
wherever the shape changes. The *_imagenet stem is a 7x7 stride-2 convolution and a 3x3 stride-2 max pool
(3x224x224 input); the *_cifar10 stem a 3x3 stride-1 convolution without pooling (3x32x32). Global average
pooling before the classifier, so any input size that survives the strides works.
- resnet50_imagenet is the original v1 bottleneck (stride on the first 1x1 convolution);
  resnet50v15_imagenet puts the stride on the 3x3 convolution (v1.5, as torchvision). Same parameters.
- With 1000 classes: ResNet-18 11,689,512; 34 21,797,672; 50 25,557,032; 101 44,549,160; 152 60,192,808.

Every convolution is bias-free (He-normal) and followed by BatchNormalization; the FC has a bias.
"""
from pydtnn.activations import Relu
from pydtnn.layers import AdditionBlock, AveragePool2D, Flatten, MaxPool2D

from ._common import add_all, add_classifier, add_input, conv_bn, zoo


def basic_block(filters, stride, in_channels):
    """3x3 conv-BN-ReLU, 3x3 conv-BN, plus the shortcut; then ReLU (two layers to add)."""
    main = conv_bn(filters, 3, stride=stride, padding=1) + conv_bn(filters, 3, padding=1, relu=False)
    shortcut = [] if stride == 1 and in_channels == filters else conv_bn(filters, 1, stride=stride, relu=False)
    return [AdditionBlock(main, shortcut), Relu()], filters


def bottleneck_block(filters, stride, in_channels, stride_on_3x3=False):
    """1x1 conv (filters), 3x3 conv (filters), 1x1 conv (4 * filters), each with BN; shortcut; ReLU."""
    out = 4 * filters
    s1, s3 = (1, stride) if stride_on_3x3 else (stride, 1)
    main = (conv_bn(filters, 1, stride=s1) + conv_bn(filters, 3, stride=s3, padding=1)
            + conv_bn(out, 1, relu=False))
    shortcut = [] if stride == 1 and in_channels == out else conv_bn(out, 1, stride=stride, relu=False)
    return [AdditionBlock(main, shortcut), Relu()], out


def _head(model, nclasses):
    model.add(AveragePool2D(pool_shape=(0, 0)))         # global average pooling
    model.add(Flatten())
    add_classifier(model, nclasses)


def _stages(model, channels, stage_filters, blocks_per_stage, block, **block_kw):
    for i, (filters, nblocks) in enumerate(zip(stage_filters, blocks_per_stage)):
        for b in range(nblocks):
            stride = 2 if b == 0 and i > 0 else 1
            layers, channels = block(filters, stride, channels, **block_kw)
            add_all(model, layers)
    return channels


# --- CIFAR-style (3 stages of 16 / 32 / 64) ---------------------------------------------------------
def _resnet_cifar(model, input_shape, nclasses, depth):
    assert (depth - 2) % 6 == 0
    n = (depth - 2) // 6
    add_input(model, input_shape)
    add_all(model, conv_bn(16, 3, padding=1))
    _stages(model, 16, (16, 32, 64), (n, n, n), basic_block)
    _head(model, nclasses)


@zoo("cifar10")
def resnet20_cifar10(model, nclasses=10, input_shape=None):
    """ResNet-20 for CIFAR-10 (3 x 3 BasicBlocks)."""
    _resnet_cifar(model, input_shape, nclasses, 20)


@zoo("cifar10")
def resnet32_cifar10(model, nclasses=10, input_shape=None):
    """ResNet-32 for CIFAR-10 (3 x 5 BasicBlocks)."""
    _resnet_cifar(model, input_shape, nclasses, 32)


@zoo("cifar10")
def resnet44_cifar10(model, nclasses=10, input_shape=None):
    """ResNet-44 for CIFAR-10 (3 x 7 BasicBlocks)."""
    _resnet_cifar(model, input_shape, nclasses, 44)


@zoo("cifar10")
def resnet56_cifar10(model, nclasses=10, input_shape=None):
    """ResNet-56 for CIFAR-10 (3 x 9 BasicBlocks)."""
    _resnet_cifar(model, input_shape, nclasses, 56)


@zoo("cifar10")
def resnet110_cifar10(model, nclasses=10, input_shape=None):
    """ResNet-110 for CIFAR-10 (3 x 18 BasicBlocks)."""
    _resnet_cifar(model, input_shape, nclasses, 110)


@zoo("cifar10")
def resnet1202_cifar10(model, nclasses=10, input_shape=None):
    """ResNet-1202 for CIFAR-10 (3 x 200 BasicBlocks, about 19.4 M parameters)."""
    _resnet_cifar(model, input_shape, nclasses, 1202)


# --- ImageNet-style (4 stages of 64 / 128 / 256 / 512) ----------------------------------------------
_LAYOUTS = {18: (basic_block, (2, 2, 2, 2)), 34: (basic_block, (3, 4, 6, 3)),
            50: (bottleneck_block, (3, 4, 6, 3)), 101: (bottleneck_block, (3, 4, 23, 3)),
            152: (bottleneck_block, (3, 8, 36, 3))}


def _resnet(model, input_shape, nclasses, depth, imagenet_stem, **block_kw):
    block, blocks = _LAYOUTS[depth]
    add_input(model, input_shape)
    if imagenet_stem:
        add_all(model, conv_bn(64, 7, stride=2, padding=3))
        model.add(MaxPool2D(pool_shape=(3, 3), stride=2, padding=1))
    else:
        add_all(model, conv_bn(64, 3, padding=1))
    _stages(model, 64, (64, 128, 256, 512), blocks, block, **block_kw)
    _head(model, nclasses)


@zoo("cifar10")
def resnet18_cifar10(model, nclasses=10, input_shape=None):
    """ResNet-18 with a 3x3 stem and no max pooling, for 32x32 inputs."""
    _resnet(model, input_shape, nclasses, 18, imagenet_stem=False)


@zoo("cifar10")
def resnet34_cifar10(model, nclasses=10, input_shape=None):
    """ResNet-34 with a 3x3 stem and no max pooling, for 32x32 inputs."""
    _resnet(model, input_shape, nclasses, 34, imagenet_stem=False)


@zoo("cifar10")
def resnet50_cifar10(model, nclasses=10, input_shape=None):
    """ResNet-50 with a 3x3 stem and no max pooling, for 32x32 inputs."""
    _resnet(model, input_shape, nclasses, 50, imagenet_stem=False)


@zoo("cifar10")
def resnet101_cifar10(model, nclasses=10, input_shape=None):
    """ResNet-101 with a 3x3 stem and no max pooling, for 32x32 inputs."""
    _resnet(model, input_shape, nclasses, 101, imagenet_stem=False)


@zoo("cifar10")
def resnet152_cifar10(model, nclasses=10, input_shape=None):
    """ResNet-152 with a 3x3 stem and no max pooling, for 32x32 inputs."""
    _resnet(model, input_shape, nclasses, 152, imagenet_stem=False)


@zoo("imagenet")
def resnet18_imagenet(model, nclasses=1000, input_shape=None):
    """ResNet-18 for 224x224 ImageNet crops."""
    _resnet(model, input_shape, nclasses, 18, imagenet_stem=True)


@zoo("imagenet")
def resnet34_imagenet(model, nclasses=1000, input_shape=None):
    """ResNet-34 for 224x224 ImageNet crops."""
    _resnet(model, input_shape, nclasses, 34, imagenet_stem=True)


@zoo("imagenet")
def resnet50_imagenet(model, nclasses=1000, input_shape=None):
    """ResNet-50 v1 (stride on the first 1x1 convolution of a bottleneck) for 224x224 ImageNet crops."""
    _resnet(model, input_shape, nclasses, 50, imagenet_stem=True)


@zoo("imagenet")
def resnet50v15_imagenet(model, nclasses=1000, input_shape=None):
    """ResNet-50 v1.5 (stride on the 3x3 convolution of a bottleneck) for 224x224 ImageNet crops."""
    _resnet(model, input_shape, nclasses, 50, imagenet_stem=True, stride_on_3x3=True)


@zoo("imagenet")
def resnet101_imagenet(model, nclasses=1000, input_shape=None):
    """ResNet-101 for 224x224 ImageNet crops."""
    _resnet(model, input_shape, nclasses, 101, imagenet_stem=True)


@zoo("imagenet")
def resnet152_imagenet(model, nclasses=1000, input_shape=None):
    """ResNet-152 for 224x224 ImageNet crops."""
    _resnet(model, input_shape, nclasses, 152, imagenet_stem=True)
