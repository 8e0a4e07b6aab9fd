"""The launcher's composition root (pydtnn.cli.run) step by step, in this process and without MPI:
parse -> configuration -> devices -> data and model -> policy and split -> trainer -> train."""
import textwrap

import pytest

from pydtnn import cli
from pydtnn.launch.config import RunConfig, configure
from pydtnn.launch.data_and_model import rank_data_and_model
from pydtnn.launch.split import initial_split
from pydtnn.errors import ConfigError
from pydtnn.parallel.comm import SerialComm
from pydtnn.parallel.balance.policies import DynamicPolicy, FPMPolicy, ProbePolicy, StaticPolicy

FAST = ["--model", "simplemlp", "--synthetic_samples", "64", "--batch_size", "16", "--progress_bar", "false",
        "--lr_schedulers", "", "--threads_per_replica", "1"]


def test_configure_decides_once_from_the_flags():
    c = configure(cli.parse_args(["--parallel", "data", "--balance", "static", "--replica_speeds", "1,2,3",
                                  "--metrics", "categorical_accuracy,regression_mae"]), 3)
    assert isinstance(c, RunConfig) and c.data_parallel and c.devices == ["cpu"] * 3
    assert isinstance(c.policy, StaticPolicy) and c.policy.initial_sizes(60, 3, None) == [10, 20, 30]
    assert c.learning_rate == pytest.approx(0.03) and "linear scaling" in c.learning_rate_why   # SGD x 3 replicas
    assert c.global_batch == 64 * 3 and c.metrics == ["categorical_accuracy", "regression_mae"]
    assert c.weighting([1, 3]) == [0.25, 0.75]
    # static without speeds probes the functional model; probe is the constant model's
    assert isinstance(configure(cli.parse_args(["--parallel", "data", "--balance", "static"]), 2).policy, FPMPolicy)
    assert isinstance(configure(cli.parse_args(["--parallel", "data", "--balance", "probe"]), 2).policy, ProbePolicy)
    assert isinstance(configure(cli.parse_args(["--parallel", "data", "--balance", "dynamic"]), 2).policy,
                      DynamicPolicy)


@pytest.mark.parametrize("args, nreplicas, many, needle", [
    (["--parallel", "data", "--balance", "static", "--replica_speeds", "1,2"], 3, False, "2 values for 3 replicas"),
    (["--replica_speeds", "1,2"], 1, False, "--parallel data --balance static only"),
    (["--parallel", "data", "--devices", "cpu,gpu"], 3, False, "one of cpu/gpu per replica (3)"),
    (["--parallel", "data", "--emulate_speeds", "1,2"], 3, False, "2 values for 3 replicas"),
    (["--enable_conv_winograd", "true", "--conv_algorithm", "direct"], 1, False, "contradicts"),
    (["--enable_nccl", "true"], 1, False, "needs --parallel data"),
    ([], 1, True, "--parallel sequential would train independent copies"),
    (["--parallel", "data", "--balance", "fastest"], 2, False, "--balance must be one of"),
    (["--gradient_weighting", "harmonic"], 1, False, "--gradient_weighting must be one of"),
    (["--lr_schedulers", "cosine", "--cosine_min_lr", "1.0"], 1, False, "cosine: min_lr must be in [0, 0.01]"),
])
def test_every_cross_flag_check_is_in_configure(args, nreplicas, many, needle):
    with pytest.raises(ConfigError) as e:
        configure(cli.parse_args(args), nreplicas, many)
    assert needle in str(e.value)


def test_the_steps_run_in_this_process(capsys):
    p = cli.parse_args(FAST + ["--num_epochs", "1"])
    comm = cli.communicator(p)
    assert isinstance(comm, SerialComm)
    config = cli.configuration(p, None, comm)
    devices = cli.set_up_devices(config, comm)
    assert devices.threads_all == [devices.threads] and devices.emulate == 1.0
    local = cli.build_data_and_model(config, comm)
    assert local.model.input_shape == local.dataset.input_shape and len(local.dataset.train) == 64
    split = cli.policy_and_split(config, local, comm)
    assert split.global_batch == 16 and split.sizes == [16] and config.policy.sizes == [16]
    trainer = cli.make_trainer(config, devices, local, split, comm)
    assert trainer.steps_per_epoch == 4 and trainer.policy is config.policy
    assert cli.train(config, trainer, comm) == 0
    assert len(trainer.history) == 1 and "training time" in capsys.readouterr().out


def test_run_is_the_steps_in_order():
    """cli.run reads as the sequence of named steps (each above is testable on its own)."""
    import inspect
    body = inspect.getsource(cli.run)
    order = ["communicator(", "configuration(", "set_up_devices(", "build_data_and_model(", "policy_and_split(",
             "make_trainer(", "print_banner(", "train("]
    where = [body.index(step) for step in order]
    assert where == sorted(where) and len(body.splitlines()) <= 25


def test_synthetic_data_take_the_models_shape():
    local = rank_data_and_model(cli.parse_args(FAST + ["--model", "simplecnn"]), "cpu", 0)
    assert local.dataset.input_shape == tuple(local.model.input_shape) == (1, 28, 28)   # simplecnn's default
    assert local.dataset.nclasses == local.model.output_shape[0] and len(local.dataset.train) == 64
    imitated = rank_data_and_model(cli.parse_args(FAST + ["--model", "simplecnn", "--dataset", "cifar10",
                                                          "--use_synthetic_data", "true"]), "cpu", 0)
    assert imitated.dataset.input_shape == tuple(imitated.model.input_shape) == (3, 32, 32)


def _write(path, body):
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_a_real_dataset_gives_the_model_its_shape_and_classes(tmp_path):
    data = _write(tmp_path / "mine.py", """
        import numpy as np
        def create_dataset(seed):
            rng = np.random.default_rng(seed)
            return rng.standard_normal((30, 7)), rng.integers(0, 4, 30)
    """)
    local = rank_data_and_model(cli.parse_args(FAST + ["--dataset", data]), "cpu", 0)
    assert tuple(local.model.input_shape) == (7,) and tuple(local.model.output_shape) == (4,)
    assert len(local.dataset.train) == 30


def test_a_model_that_does_not_fit_the_data_is_one_line(tmp_path):
    data = _write(tmp_path / "mine.py", """
        import numpy as np
        def create_dataset(seed):
            return np.zeros((10, 5)), np.arange(10) % 3
    """)
    wide = _write(tmp_path / "wide.py", """
        from pydtnn.layers import FC, Input
        def create_model(model):
            model.add(Input(shape=(6,)))
            model.add(FC(shape=(3,), activation="softmax"))
    """)
    cases = [(["--dataset", data, "--model", wide], f"model {wide} takes inputs (6,) but dataset {data} has (5,)"),
             (["--targets", "inputs"], "model simplemlp gives outputs of shape (10,) but dataset synthetic has "
                                       "targets of shape (1, 28, 28)"),
             (["--model", str(tmp_path / "absent.py")], "no such file"),
             (["--dataset", "bytes", "--use_synthetic_data", "true"], "the bytes dataset is text")]
    for args, needle in cases:
        with pytest.raises(ConfigError) as e:
            rank_data_and_model(cli.parse_args(FAST + args), "cpu", 0)
        assert needle in str(e.value) and "\n" not in str(e.value), args


def test_the_initial_split_is_the_policys_checked_split():
    p = cli.parse_args(FAST + ["--parallel", "data", "--global_batch_size", "60", "--balance", "static",
                               "--replica_speeds", "1,2,3", "--max_local_batch", "25"])
    local = rank_data_and_model(p, "cpu", 0)
    policy = StaticPolicy([1, 2, 3])
    split = initial_split(p, policy, local.model, local.dataset, 3)
    assert (split.global_batch, split.caps) == (60, [25, 25, 25])
    # memory caps bound a pass, not a share: [10, 20, 30] stands, replica 2 runs its 30 as 2 micro-batches of 15
    assert split.sizes == policy.sizes == [10, 20, 30]
    with pytest.raises(ConfigError, match="a global batch of 65 samples is larger than the 64 training"):
        initial_split(cli.parse_args(FAST + ["--global_batch_size", "65"]), policy, local.model,
                      local.dataset, 1)

    class Short(StaticPolicy):
        name = "short"

        def initial_sizes(self, global_batch, nreplicas, caps):
            return [1] * nreplicas
    with pytest.raises(ConfigError, match=r"balance policy short returned the split \[1, 1, 1\]: it sums to 3") as e:
        initial_split(p, Short([1, 1, 1]), local.model, local.dataset, 3)
    assert "\n" not in str(e.value)


def test_trainer_options_in_groups_or_flat():
    import numpy as np

    from pydtnn import Model
    from pydtnn.datasets import from_arrays
    from pydtnn.layers import FC, Input
    from pydtnn.optimizers import SGD
    from pydtnn.training.loop import Trainer
    from pydtnn.training.options import Checkpointing, Loop, Outputs, Parallelism

    def model():
        m = Model(dtype="float64", seed=0)
        m.add(Input(shape=(2,)))
        m.add(FC(shape=(2,), activation="softmax"))
        return m
    rng = np.random.default_rng(0)
    data = from_arrays(rng.standard_normal((12, 2)), np.eye(2)[rng.integers(0, 2, 12)])
    quiet = Outputs(progress=False, log=lambda m: None)
    a = Trainer(model(), data, SGD(), parallel=Parallelism(global_batch=4), loop=Loop(seed=3, steps_per_epoch=2),
                checkpointing=Checkpointing(save_steps=5), outputs=quiet)
    b = Trainer(model(), data, SGD(), global_batch=4, seed=3, steps_per_epoch=2, save_steps=5, progress=False,
                log=lambda m: None)
    c = Trainer(model(), data, SGD(), loop=Loop(seed=9), seed=3, global_batch=4, steps_per_epoch=2, outputs=quiet)
    for t in (a, b, c):
        assert (t.global_batch, t.seed, t.steps_per_epoch) == (4, 3, 2)
    assert a.save_steps == b.save_steps == 5
    a.fit(1), b.fit(1)
    assert np.array_equal(a.model.params, b.model.params)
    with pytest.raises(TypeError, match="unexpected keyword argument 'globl_batch'"):
        Trainer(model(), data, SGD(), globl_batch=4)
