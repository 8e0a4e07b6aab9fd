"""The model zoo: registry, every model builds with the published parameter counts, one training step each,
and user model files.

Building at the default input shape only checks structure and parameter counts, so those tests replace the
random initializers by a zero fill (`cheap_init`): drawing the ~1.5 billion weights of the whole zoo would
take most of the time budget. The training-step tests use the real initializers, at the default input size
for MNIST and CIFAR-10 models and at the reduced sizes of TRAIN_SHAPES for the ImageNet ones:
- ResNets, DenseNets, GoogLeNet: 3x64x64 (global average pooling adapts);
- VGGs: 3x32x32 (the first FC then takes 512 features instead of 25,088);
- AlexNet: 3x67x67 (its smallest input); Inception v3: 3x139x139 (its smallest input, 75x75, leaves 1x1 maps
  whose BatchNormalization over a batch of 2 sees two values: a degenerate, non-smooth loss with gradients
  of 1e7 that blows up the step).
ResNet-50 also takes one step at its full 3x224x224 size.
"""
import difflib
import gc
import inspect

import numpy as np
import pytest

import pydtnn.initializers
from pydtnn import Model
from pydtnn.errors import ConfigError, PyDTNNError, ShapeError
from pydtnn.layers import FC, AdditionBlock, BatchNormalization, Conv2D, ConcatenationBlock
from pydtnn.models import (MODELS, build_model, default_dataset, default_input_shape, default_nclasses,
                           get_model_builder, list_models)
from pydtnn.optimizers import SGD
from pydtnn.plugins import USER_FRAMES

# The upstream zoo (docs: reference "Model zoo" table).
EXPECTED_NAMES = {
    "simplemlp", "simplecnn",
    "vgg1", "vgg2", "vgg3", "vgg3do", "vgg3do2", "vgg3dobn",
    "alexnet_cifar10", "alexnet_imagenet",
    "vgg11_cifar10", "vgg11bn_cifar10", "vgg16_cifar10", "vgg16bn_cifar10",
    "vgg11_imagenet", "vgg16_imagenet", "vgg19_imagenet",
    *(f"resnet{d}_cifar10" for d in (20, 32, 44, 56, 110, 1202)),
    *(f"resnet{d}_{s}" for d in (18, 34, 50, 101, 152) for s in ("cifar10", "imagenet")),
    "resnet50v15_imagenet",
    *(f"densenet{d}_{s}" for d in (121, 161, 169, 201) for s in ("cifar10", "imagenet")),
    "googlenet_cifar10", "googlenet_imagenet",
    "inceptionv3_imagenet",
    "mobilenetv1_cifar10",
}

# Published parameter counts (torchvision / the papers' reference implementations), 1000 classes for
# ImageNet. Inception v3: torchvision's 27,161,264 minus its auxiliary classifier (3,326,696).
# vgg3: the Keras CIFAR-10 tutorial's summary; mobilenetv1_cifar10: the common PyTorch CIFAR MobileNet.
KNOWN_COUNTS = {
    "resnet18_imagenet": 11_689_512,
    "resnet34_imagenet": 21_797_672,
    "resnet50_imagenet": 25_557_032,
    "resnet50v15_imagenet": 25_557_032,
    "resnet101_imagenet": 44_549_160,
    "resnet152_imagenet": 60_192_808,
    "vgg11_imagenet": 132_863_336,
    "vgg16_imagenet": 138_357_544,
    "vgg19_imagenet": 143_667_240,
    "densenet121_imagenet": 7_978_856,
    "densenet161_imagenet": 28_681_000,
    "densenet169_imagenet": 14_149_480,
    "densenet201_imagenet": 20_013_928,
    "inceptionv3_imagenet": 23_834_568,
    "alexnet_imagenet": 62_378_344,
    "vgg3": 550_570,
    "mobilenetv1_cifar10": 3_217_226,
}

TRAIN_SHAPES = {
    **{f"resnet{d}_imagenet": (3, 64, 64) for d in (18, 34, 50, 101, 152)},
    "resnet50v15_imagenet": (3, 64, 64),
    **{f"densenet{d}_imagenet": (3, 64, 64) for d in (121, 161, 169, 201)},
    "googlenet_imagenet": (3, 64, 64),
    **{f"vgg{d}_imagenet": (3, 32, 32) for d in (11, 16, 19)},
    "alexnet_imagenet": (3, 67, 67),
    "inceptionv3_imagenet": (3, 139, 139),
}


@pytest.fixture
def cheap_init(monkeypatch):
    """Zero-filled float32 weights instead of random draws (structure and counts only)."""
    fill = lambda shape, fan_in, fan_out, rng: np.zeros(shape, dtype=np.float32)  # noqa: E731
    for name in list(pydtnn.initializers.INITIALIZERS):
        monkeypatch.setitem(pydtnn.initializers.INITIALIZERS, name, fill)
    yield
    gc.collect()


def new_model(seed=0):
    return Model(backend="cpu", dtype="float32", seed=seed)


# --- registry -----------------------------------------------------------------------------------------
# Beyond upstream (issue 21): transformers and an autoencoder, tested in tests/zoo/test_new_models.py.
NEW_NAMES = {"vit_tiny_mnist": ("mnist", 10, (1, 28, 28), (10,)),
             "conv_autoencoder_mnist": ("mnist", 10, (1, 28, 28), (1, 28, 28)),
             "bytelm_small": ("bytes", 256, (64,), (64, 256))}


def test_registry_holds_exactly_the_upstream_zoo_and_the_new_models():
    assert set(MODELS) == EXPECTED_NAMES | set(NEW_NAMES)
    assert list_models() == sorted(EXPECTED_NAMES | set(NEW_NAMES))
    for name in MODELS:
        assert get_model_builder(name) is MODELS[name]


@pytest.mark.parametrize("name", sorted(NEW_NAMES))
def test_new_models_defaults(name):
    dataset, nclasses, in_shape, out_shape = NEW_NAMES[name]
    assert default_dataset(name) == dataset and default_nclasses(name) == nclasses
    model = build_model(name, new_model())
    assert model.input_shape == in_shape == default_input_shape(name) and model.output_shape == out_shape
    if name == "vit_tiny_mnist":      # conv 3,200 + positions 1,024 + 2 blocks x 33,472 + LayerNorm 128 + head 10,250
        assert model.nparams == 81_546


def test_defaults_per_family():
    for name in EXPECTED_NAMES:
        dataset = default_dataset(name)
        expected = "mnist" if name.startswith("simple") else "imagenet" if name.endswith("_imagenet") else "cifar10"
        assert dataset == expected, name
        assert default_nclasses(name) == (1000 if dataset == "imagenet" else 10)
    assert default_input_shape("simplecnn") == (1, 28, 28)
    assert default_input_shape("vgg3dobn") == (3, 32, 32)
    assert default_input_shape("resnet50_imagenet") == (3, 224, 224)
    assert default_input_shape("alexnet_imagenet") == (3, 227, 227)
    assert default_input_shape("inceptionv3_imagenet") == (3, 299, 299)


def test_builder_signature():
    from pydtnn.models.resnet import resnet50_imagenet
    params = inspect.signature(resnet50_imagenet).parameters
    assert list(params) == ["model", "nclasses", "input_shape"]
    assert params["nclasses"].default == 1000 and params["input_shape"].default is None
    assert MODELS["resnet50_imagenet"] is resnet50_imagenet


def test_unknown_name_lists_close_matches():
    with pytest.raises(ConfigError, match="resnet50_imagenet") as info:
        get_model_builder("resnet50_imagnet")
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="unknown model"):
        build_model("no_such_net", new_model())
    assert difflib.get_close_matches("resnet50_imagnet", MODELS)[0] == "resnet50_imagenet"


def test_bad_arguments_raise_user_errors():
    with pytest.raises(ConfigError, match="nclasses"):
        build_model("simplecnn", new_model(), nclasses=0)
    with pytest.raises(ConfigError, match="nclasses"):
        build_model("simplecnn", new_model(), nclasses="10")
    with pytest.raises(ConfigError, match="input_shape"):
        build_model("simplecnn", new_model(), input_shape=(1, -28, 28))
    with pytest.raises(ShapeError, match="alexnet_imagenet"):
        build_model("alexnet_imagenet", new_model(), input_shape=(3, 40, 40))   # too small for its strides


# --- every model builds at its default shape with the expected parameter count --------------------
@pytest.mark.parametrize("name", sorted(EXPECTED_NAMES))
def test_builds_at_default_shape(name, cheap_init):
    model = new_model()
    assert build_model(name, model) is model
    assert model.input_shape == default_input_shape(name)
    assert model.output_shape == (default_nclasses(name),)
    assert type(model.layers[-1]).__name__ == "Softmax" and isinstance(model.layers[-2], FC)
    assert model.nparams > 0
    text = model.summary()
    assert f"Total parameters: {model.nparams:,}" in text
    if name in KNOWN_COUNTS:
        assert model.nparams == KNOWN_COUNTS[name]
    del model


def test_resnet20_cifar_size_and_shortcuts(cheap_init):
    model = build_model("resnet20_cifar10", new_model())
    assert 260_000 <= model.nparams <= 280_000
    assert model.nparams == 269_722 + 2_752          # option A count + the two 1x1 projection shortcuts
    blocks = [layer for layer in model.layers if isinstance(layer, AdditionBlock)]
    assert len(blocks) == 9
    assert sum(1 for b in blocks if b.paths[1]) == 2      # projections only where the shape changes


def test_conv_before_batchnorm_has_no_bias(cheap_init):
    model = build_model("resnet50_imagenet", new_model())
    layers = list(model.all_layers())
    convs = [layer for layer in layers if isinstance(layer, Conv2D)]
    assert convs and not any(c.use_bias for c in convs)
    assert sum(isinstance(layer, BatchNormalization) for layer in layers) == len(convs)
    assert layers[-2].use_bias
    # v1 strides the first 1x1 convolution of a downsampling bottleneck, v1.5 its 3x3 one
    first = next(layer for layer in model.layers if isinstance(layer, AdditionBlock) and
                 layer.paths[1] and layer.paths[1][0].stride == (2, 2))
    assert first.paths[0][0].stride == (2, 2) and first.paths[0][3].stride == (1, 1)
    v15 = build_model("resnet50v15_imagenet", new_model())
    first = next(layer for layer in v15.layers if isinstance(layer, AdditionBlock) and
                 layer.paths[1] and layer.paths[1][0].stride == (2, 2))
    assert first.paths[0][0].stride == (1, 1) and first.paths[0][3].stride == (2, 2)


def test_family_structure(cheap_init):
    dense = build_model("densenet121_cifar10", new_model())
    blocks = [layer for layer in dense.layers if isinstance(layer, ConcatenationBlock)]
    assert len(blocks) == 6 + 12 + 24 + 16 and all(len(b.paths) == 2 and b.paths[1] == [] for b in blocks)
    google = build_model("googlenet_imagenet", new_model())
    modules = [layer for layer in google.layers if isinstance(layer, ConcatenationBlock)]
    assert len(modules) == 9 and all(len(m.paths) == 4 for m in modules)
    assert modules[0].shape == (256, 28, 28) and modules[-1].shape == (1024, 7, 7)
    mobile = build_model("mobilenetv1_cifar10", new_model())
    groupings = [layer.grouping for layer in mobile.layers if isinstance(layer, Conv2D)]
    assert groupings == [None] + ["depthwise", "pointwise"] * 13
    inception = build_model("inceptionv3_imagenet", new_model())
    assert [m.shape for m in inception.layers if isinstance(m, ConcatenationBlock)][-1] == (2048, 8, 8)


def test_input_shape_and_nclasses_overrides(cheap_init):
    # global average pooling: same weights for any input size, only the classifier follows nclasses
    small = build_model("resnet50_imagenet", new_model(), nclasses=100, input_shape=(3, 64, 64))
    assert small.input_shape == (3, 64, 64) and small.output_shape == (100,)
    assert small.nparams == KNOWN_COUNTS["resnet50_imagenet"] - 900 * 2048 - 900
    # VGG: the first FC takes the flattened features, 512 * 2 * 2 at 64x64
    vgg = build_model("vgg16_imagenet", new_model(), input_shape=(3, 64, 64))
    first_fc = next(layer for layer in vgg.layers if isinstance(layer, FC))
    assert first_fc.in_shape == (2048,)
    assert vgg.nparams == KNOWN_COUNTS["vgg16_imagenet"] - (25088 - 2048) * 4096
    mnist_like = build_model("vgg3", new_model(), input_shape=(1, 28, 28))
    assert mnist_like.input_shape == (1, 28, 28) and mnist_like.output_shape == (10,)


# --- one training step for every model -----------------------------------------------------------
def _one_hot(labels, k):
    y = np.zeros((len(labels), k), dtype=np.float32)
    y[np.arange(len(labels)), labels] = 1
    return y


# Inference at initialization overflows float32 in ResNet-1202: the running statistics are still the identity,
# so each of its 600 residual additions roughly doubles the activations' variance (training-mode batch
# statistics keep it in check).
OVERFLOWS_AT_INIT = {"resnet1202_cifar10"}


def _training_step(name, shape):
    model = build_model(name, new_model(), input_shape=shape)
    nclasses = default_nclasses(name)
    assert model.input_shape == (shape or default_input_shape(name))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, *model.input_shape)).astype(np.float32)
    y = _one_hot([3, 7], nclasses)
    with np.errstate(over="ignore", invalid="ignore"):
        probs = model.forward(x, training=False)
    assert probs.shape == (2, nclasses)
    if name not in OVERFLOWS_AT_INIT:
        assert np.allclose(probs.sum(axis=1), 1, atol=1e-4)
    before = model.params.copy()
    loss, y_pred = model.compute_gradients(x, y, "categorical_cross_entropy")
    assert y_pred.shape == (2, nclasses)
    assert np.isfinite(loss) and loss > 0
    assert np.all(np.isfinite(model.grads)) and np.any(model.grads != 0)
    SGD(learning_rate=0.01, momentum=0.9).step(model.params, model.grads)
    assert np.all(np.isfinite(model.params))
    changed = model.params != before
    # back-propagation reached every parameter tensor, from the classifier back to the first convolution
    unchanged = [key for key, (lo, n) in model.param_offsets.items() if not changed[lo:lo + n].any()]
    assert unchanged == []
    del model, before, changed
    gc.collect()


@pytest.mark.parametrize("name", sorted(EXPECTED_NAMES))
def test_one_training_step(name):
    _training_step(name, TRAIN_SHAPES.get(name))


def test_one_training_step_full_size_resnet50():
    _training_step("resnet50_imagenet", None)


# --- user model files ----------------------------------------------------------------------------
USER_MODEL = """
from pydtnn.layers import Input, Conv2D, Flatten, FC

def create_model(model):
    model.add(Input(shape=(1, 8, 8)))
    model.add(Conv2D(nfilters=2, filter_shape=(3, 3), padding=1, activation="relu"))
    model.add(Flatten())
    model.add(FC(shape=(3,), activation="softmax"))
"""


def test_user_model_file(tmp_path):
    path = tmp_path / "my_net.py"
    path.write_text(USER_MODEL)
    model = new_model()
    assert build_model(str(path), model) is model
    assert model.input_shape == (1, 8, 8) and model.output_shape == (3,)
    assert model.nparams == 2 * 9 + 2 + 128 * 3 + 3
    y = model.forward(np.zeros((4, 1, 8, 8), dtype=np.float32))
    assert y.shape == (4, 3)
    assert build_model(path, new_model(), nclasses=3, input_shape=(1, 8, 8)).nparams == model.nparams  # Path ok
    with pytest.raises(ConfigError, match="3 classes|10 classes"):
        build_model(str(path), new_model(), nclasses=10)
    with pytest.raises(ConfigError, match="input shape"):
        build_model(str(path), new_model(), input_shape=(3, 8, 8))


def test_user_model_file_with_options(tmp_path):
    path = tmp_path / "flexible.py"
    path.write_text("from pydtnn.layers import Input, Flatten, FC\n"
                    "def create_model(model, nclasses=2, input_shape=(4,)):\n"
                    "    model.add(Input(shape=input_shape))\n"
                    "    model.add(Flatten())\n"
                    "    model.add(FC(shape=(nclasses,), activation='softmax'))\n")
    assert build_model(str(path), new_model()).output_shape == (2,)
    model = build_model(str(path), new_model(), nclasses=5, input_shape=(1, 2, 3))
    assert model.input_shape == (1, 2, 3) and model.output_shape == (5,)


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("x = 1\n", "does not define create_model"),
    ("def create_model(model):\n    model.add(\n", r"failed to load \(line 2\): SyntaxError"),
    ("import no_such_module_for_pydtnn\n", "failed to load: ModuleNotFoundError"),
    ("from pydtnn.layers import FC\ndef create_model(model):\n    model.add(FC(shape=(3,)))\n",
     "create_model failed: ShapeError"),
    ("def create_model(model):\n    pass\n", "added no layers"),
])
def test_bad_user_model_files(tmp_path, content, message):
    path = tmp_path / "bad_model.py"
    if content is not None:
        path.write_text(content)
    with pytest.raises(PyDTNNError, match=message) as info:
        build_model(str(path), new_model())
    first, *frames = str(info.value).splitlines()
    assert "bad_model.py" in first
    # the user's code that raised (a line that does not parse, a missing import) shows where, and only that
    assert len(frames) <= 2 * USER_FRAMES and all(f.startswith(f'  File "{path}", line ') or f.startswith("    ")
                                                  for f in frames), frames


BUGGY_LAYER = '''
from pydtnn.layers import Input, Layer


class Buggy(Layer):
    def build(self, in_shape):
        return self.in_shape.nonexistent        # AttributeError: a bug in the user's build


def create_model(model):
    model.add(Input(shape=(3,)))
    model.add(Buggy())
'''


@pytest.mark.parametrize("content, error, line", [
    (BUGGY_LAYER, AttributeError, 7),
    ("raise RuntimeError('boom')\ndef create_model(model): pass\n", RuntimeError, 1),
    ("def create_model(model):\n    raise ValueError('bad layer')\n", ValueError, 2),
])
def test_bugs_in_user_model_files_are_one_line_and_the_users_frames(tmp_path, content, error, line):
    """A bug in the user's code (its layer's build, its create_model, its top level) is one ConfigError: a
    first line naming the file and the exception, then only the user's own frames (file, line, code), the
    last one at the line that raised; the original exception stays chained for a Python caller."""
    path = tmp_path / "buggy_model.py"
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        build_model(str(path), new_model())
    first, *frames = str(info.value).splitlines()
    assert str(path) in first and error.__name__ in first, first
    assert 2 <= len(frames) <= 2 * USER_FRAMES and all(f.startswith(("  File ", "    ")) for f in frames), frames
    assert frames[-2].startswith(f'  File "{path}", line {line},'), frames
    assert isinstance(info.value.__cause__, error)
