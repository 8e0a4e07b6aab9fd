"""The speed emulation's arithmetic on a fake clock (end to end in virtual time in test_heterogeneity.py; its
real-time fidelity is measured by scripts/experiments/heterogeneity_experiment.py)."""
import pytest

from pydtnn.errors import ConfigError
from pydtnn.parallel import emulation
from pydtnn.parallel.emulation import SpeedEmulator


class FakeClock:
    def __init__(self):
        self.now, self.slept = 0.0, []

    def __call__(self):
        self.now += 1e-4              # every reading takes a little time: a spin loop ends
        return self.now

    def sleep(self, s):
        self.slept.append(s)
        self.now += s


def test_calibration_is_the_median_time_per_sample_after_a_warm_up():
    clock = FakeClock()
    durations = iter([5.0, 0.30, 0.10, 0.20, 0.40, 0.20])      # the warm-up (5 s) is left out
    emu = SpeedEmulator(0.5, clock=clock, sleep=clock.sleep)

    def once():
        clock.now += next(durations)
    emu.calibrate(once, samples=100)
    assert emu.t0 == pytest.approx(0.20 / 100, rel=1e-2)


@pytest.mark.parametrize("spin", [False, True])
def test_each_step_is_padded_to_its_deadline(spin):
    clock = FakeClock()
    emu = SpeedEmulator(0.25, spin=spin, clock=clock, sleep=clock.sleep)
    emu.t0 = 0.001                                     # 1 ms per sample unslowed
    start = clock()
    clock.now += 0.05                                  # 50 samples computed in 50 ms
    emu.pad(start, 50)
    assert clock.now == pytest.approx(start + 50 * 0.001 / 0.25, abs=2e-4)   # 200 ms in all
    if spin:
        assert clock.slept == []                       # busy-waits: no sleep to slow the next step
    else:
        assert clock.slept == [pytest.approx(0.2 - 0.05 - emulation.SPIN_S, abs=3e-4)]


def test_deadline_follows_the_reference_replicas_and_never_shortens_a_slow_step():
    clock = FakeClock()
    emu = SpeedEmulator(0.5, spin=True, clock=clock, sleep=clock.sleep)
    emu.t0 = 0.001                                     # calibrated: 1 ms per sample
    emu.follow(0.002)
    emu.follow(0.002)
    assert emu.t0 == 0.001                             # three steps of the reference before it counts
    for t in (0.002, 0.002, 0.009):                    # the full-speed replicas now take 2 ms per sample
        emu.follow(t)                                  # (one compiling step: left out)
    assert emu.t0 == pytest.approx(0.002)
    start = clock()
    clock.now += 0.05
    emu.pad(start, 100)
    assert clock.now == pytest.approx(start + 100 * 0.002 / 0.5, abs=2e-4)
    start = clock()
    clock.now += 1.0                                   # a step slower than its deadline is not cut short
    assert emu.pad(start, 100) == 0.0


def test_full_speed_replica_and_bad_fraction():
    emu = SpeedEmulator(1.0)
    assert not emu.active and emu.pad(0.0, 10) == 0.0
    for bad in (0.0, -1.0, 1.5):
        with pytest.raises(ConfigError, match="emulate_speeds"):
            SpeedEmulator(bad)
