"""LR schedulers and callbacks against hand-traced sequences of epoch logs."""
import os
from types import SimpleNamespace

import pytest

from pydtnn.errors import ConfigError
from pydtnn.optimizers import SGD
from pydtnn.schedulers import (EarlyStopping, ModelCheckpoint, ReduceLREveryNEpochs, ReduceLROnPlateau, StopAtLoss,
                               WarmUp, make_schedulers)


class FakeTrainer:
    def __init__(self, lr=0.1, steps_per_epoch=4):
        self.optimizer = SGD(learning_rate=lr)
        self.steps_per_epoch = steps_per_epoch
        self.stop_training = False
        self.saved, self.messages = [], []

    def log(self, msg):
        self.messages.append(msg)

    def save_checkpoint(self, path, epoch):
        self.saved.append((os.path.basename(path), epoch))


def test_warm_up_ramps_linearly_per_batch():
    t, s = FakeTrainer(lr=0.8, steps_per_epoch=2), WarmUp(warm_up_epochs=2)
    lrs = []
    for step in range(6):
        s.on_batch_begin(t, step)
        lrs.append(t.optimizer.learning_rate)
    assert lrs == pytest.approx([0.2, 0.4, 0.6, 0.8, 0.8, 0.8])


def test_early_stopping_after_patience():
    t, s = FakeTrainer(), EarlyStopping("val_categorical_cross_entropy", patience=2)
    losses = [1.0, 0.8, 0.85, 0.9]
    for epoch, v in enumerate(losses):
        s.on_epoch_end(t, epoch, {"val_loss": v})     # the loss is named "loss" in the logs
        if epoch < 3:
            assert not t.stop_training
    assert t.stop_training and s.best == 0.8


def test_early_stopping_on_accuracy_maximizes():
    t, s = FakeTrainer(), EarlyStopping("val_categorical_accuracy", patience=1)
    for epoch, v in enumerate([0.5, 0.6, 0.7]):
        s.on_epoch_end(t, epoch, {"val_categorical_accuracy": v})
    assert not t.stop_training
    s.on_epoch_end(t, 3, {"val_categorical_accuracy": 0.65})
    assert t.stop_training


def test_reduce_lr_on_plateau_and_min_lr():
    t, s = FakeTrainer(lr=1.0), ReduceLROnPlateau("val_loss", factor=0.5, patience=1, min_lr=0.3)
    lrs = []
    for epoch, v in enumerate([1.0, 1.1, 1.2, 0.9, 0.95, 0.99]):
        s.on_epoch_end(t, epoch, {"val_loss": v})
        lrs.append(t.optimizer.learning_rate)
    assert lrs == pytest.approx([1.0, 0.5, 0.3, 0.3, 0.3, 0.3])


def test_reduce_every_n_epochs():
    t, s = FakeTrainer(lr=1.0), ReduceLREveryNEpochs(factor=0.1, nepochs=2, min_lr=0.005)
    lrs = []
    for epoch in range(6):
        s.on_epoch_end(t, epoch, {})
        lrs.append(t.optimizer.learning_rate)
    assert lrs == pytest.approx([1.0, 0.1, 0.1, 0.01, 0.01, 0.005])


def test_stop_at_loss_both_directions():
    t = FakeTrainer()
    StopAtLoss("val_categorical_accuracy", 0.9).on_epoch_end(t, 0, {"val_categorical_accuracy": 0.89})
    assert not t.stop_training
    StopAtLoss("val_categorical_accuracy", 0.9).on_epoch_end(t, 1, {"val_categorical_accuracy": 0.91})
    assert t.stop_training
    t = FakeTrainer()
    StopAtLoss("loss", 0.1).on_epoch_end(t, 0, {"loss": 0.05})
    assert t.stop_training


def test_model_checkpoint_frequency_and_best():
    t, s = FakeTrainer(), ModelCheckpoint("val_loss", save_freq=2, checkpoint_dir="ck")
    for epoch, v in enumerate([1.0, 0.5, 0.7, 0.4]):
        s.on_epoch_end(t, epoch, {"val_loss": v})
    assert t.saved == [("best.npz", 1), ("epoch_0002.npz", 2), ("best.npz", 2), ("epoch_0004.npz", 4),
                       ("best.npz", 4)]


def test_missing_metric_is_a_clear_error():
    with pytest.raises(ConfigError, match="val_loss.*validation_split"):
        EarlyStopping("val_categorical_cross_entropy", 1).on_epoch_end(FakeTrainer(), 0, {"loss": 1.0})


def test_state_roundtrip_and_factory():
    p = SimpleNamespace(warm_up_epochs=1, early_stopping_metric="val_loss", early_stopping_patience=3,
                        reduce_lr_on_plateau_metric="val_loss", reduce_lr_on_plateau_factor=0.1,
                        reduce_lr_on_plateau_patience=2, reduce_lr_on_plateau_min_lr=0.0,
                        reduce_lr_every_nepochs_factor=0.5, reduce_lr_every_nepochs_nepochs=3,
                        reduce_lr_every_nepochs_min_lr=0.0, stop_at_loss_metric="val_categorical_accuracy",
                        stop_at_loss_threshold=0.99, model_checkpoint_metric="val_loss", model_checkpoint_save_freq=1,
                        checkpoint_dir="x")
    made = make_schedulers("warm_up, early_stopping,reduce_lr_on_plateau,reduce_lr_every_nepochs,stop_at_loss,"
                           "model_checkpoint", p)
    assert [s.name for s in made] == ["warm_up", "early_stopping", "reduce_lr_on_plateau",
                                      "reduce_lr_every_nepochs", "stop_at_loss", "model_checkpoint"]
    es = made[1]
    es.on_epoch_end(FakeTrainer(), 0, {"val_loss": 0.5})
    fresh = make_schedulers("early_stopping", p)[0]
    fresh.load_state_dict(es.state_dict())
    assert fresh.best == 0.5 and fresh.wait == 0 and fresh.patience == 3
    assert make_schedulers("", p) == []
    with pytest.raises(ConfigError, match="unknown LR scheduler"):
        make_schedulers("cyclic", p)
