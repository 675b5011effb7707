"""`PipelineDriver.adopt` is the one way a layout becomes current (engine/control/operations.py and recovery.py call
it): it takes the driver's lock, so no reader under the lock sees a layout half installed, and the layout it writes
cannot be written past it. The driver is the real one (one CPU rank on the demo model)."""

from __future__ import annotations

import threading

import pytest

from engine.control.driver import PipelineDriver
from engine.demo import make_demo_checkpoint
from solvers.rig import load_rig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    folder = tmp_path_factory.mktemp("adopt-demo")
    make_demo_checkpoint(folder, force=True)
    driver = PipelineDriver(folder, load_rig("cpu-single"))
    yield driver
    driver.shutdown()


def test_adopt_waits_for_the_lock_a_reader_holds(driver):
    prediction, _ = driver.layouts(driver.cut, driver.shape)
    measured = [dict(figures) for figures in driver.measured]
    scheduler = driver.scheduler
    adopted = threading.Event()
    adopter = threading.Thread(target=lambda: (driver.adopt(driver.cut, driver.shape, prediction, measured),
                                               adopted.set()))
    with driver.lock:
        adopter.start()
        assert not adopted.wait(0.5), "adopt changed the layout while another thread held the driver's lock"
        assert driver.scheduler is scheduler and driver.measured is not measured
    assert adopted.wait(30)
    adopter.join()
    assert driver.measured is measured and driver.prediction is prediction and driver.scheduler is not scheduler


@pytest.mark.parametrize("name", ["cut", "shape", "prediction", "measured"])
def test_the_layout_is_written_through_adopt_only(driver, name):
    with pytest.raises(AttributeError):
        setattr(driver, name, getattr(driver, name))
