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


@pytest.mark.parametrize("spin", [False, True])
def test_a_pending_stop_ends_a_padded_step_within_a_quarter_second(spin):
    """Issue 46: a step emulated as very slow could not be stopped (the signal flag was read after the step).
    The pad looks at `interrupted()` at least every CHECK_S and returns early, saying so (`cut_short`)."""
    from pydtnn.parallel.emulation import CHECK_S, EmulatedCost
    clock = FakeClock()
    emu = SpeedEmulator(1.0, spin=spin, clock=clock, sleep=clock.sleep, cost=EmulatedCost(20.0, 1.0, 1e-3))
    start = clock()
    emu.interrupted = lambda: clock.now >= start + 5.0         # the signal arrives 5 s into a 20 s step
    emu.pad(start, 10)
    assert emu.cut_short and start + 5.0 <= clock.now <= start + 5.0 + CHECK_S + 1e-3
    assert CHECK_S <= 0.25 and all(s <= CHECK_S + 1e-9 for s in clock.slept)
    emu.interrupted = lambda: False                             # none: the whole emulated step
    start = clock()
    emu.pad(start, 10)
    assert not emu.cut_short and clock.now == pytest.approx(start + 20.0 + 10 * 1e-3, abs=1e-3)


def test_unpadded_passes_run_at_this_machines_speed_and_nest():
    from pydtnn.parallel.emulation import EmulatedCost
    clock = FakeClock()
    emu = SpeedEmulator(1.0, clock=clock, sleep=clock.sleep, cost=EmulatedCost(1.0, 1.0, 1e-3))
    with emu.unpadded():
        with emu.unpadded():                                    # a warm-up inside the base's timing
            pass
        assert emu.pad(clock(), 10) == 0.0 and emu.t0 == 0.0    # nothing padded, nothing calibrated
    start = clock()
    emu.pad(start, 10)
    assert clock.now == pytest.approx(start + 1.0 + 10e-3, abs=1e-3)
