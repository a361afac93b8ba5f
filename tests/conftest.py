"""Shared test set-up: the devices the engine's tests run on.

Every test in a module named ``test_engine*`` runs once per available device: the CPU always, CUDA too
when torch sees a GPU. ``SERVELAB_TEST_DEVICES=cuda`` (comma-separated) restricts the list, as
``tools/gpu_check.sh`` does. The device reaches the engine through the one device rule
(:func:`servelab.device.pick_device` reads ``SERVELAB_DEVICE``), so a test that builds an engine with
no explicit device runs on the parametrized one; a test that needs the name requests ``engine_device``.
"""

from __future__ import annotations

import os

import pytest
import torch

from servelab.device import DEVICE_ENV, pick_device

DEVICE_PARAMETRIZED_PREFIX = "test_engine"
TEST_DEVICES_ENV = "SERVELAB_TEST_DEVICES"


def available_devices() -> list[str]:
    """``SERVELAB_TEST_DEVICES`` (each checked by ``pick_device``: asking for an absent GPU fails), else
    ``["cpu"]`` plus ``"cuda"`` when a GPU is present."""
    chosen = [d.strip() for d in os.environ.get(TEST_DEVICES_ENV, "").split(",") if d.strip()]
    if chosen:
        for device in chosen:
            pick_device(device)
        return chosen
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.module.__name__.rpartition(".")[2].startswith(DEVICE_PARAMETRIZED_PREFIX):
        if "engine_device" not in metafunc.fixturenames:
            metafunc.fixturenames.append("engine_device")
        metafunc.parametrize("engine_device", available_devices(), indirect=True, scope="module")


@pytest.fixture(scope="module")
def engine_device(request: pytest.FixtureRequest):
    """The device name of this run of the module (``"cpu"`` or ``"cuda"``), also set as
    ``SERVELAB_DEVICE`` while the module's tests run."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(DEVICE_ENV, request.param)
        yield request.param


# The test file that mostly waits (notebooks hanging until nbval's limit kills them) starts first, so
# that one pytest worker waits on it while the other runs the rest and the two end together.
WAIT_FIRST = ("test_nbval_hangs.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in WAIT_FIRST)
