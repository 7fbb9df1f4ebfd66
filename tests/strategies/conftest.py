"""Fixtures the framework adapters' tests share: a module that sets ``ORDER`` (its class order)
gets ``stream``, 12 synthetic classes in 3 tasks, and ``test_images``, its test set stacked."""

import pytest

from tests.helpers import small_stream, stacked_test_set


@pytest.fixture(scope="module")
def stream(request):
    return small_stream(request.module.ORDER)


@pytest.fixture(scope="module")
def test_images(stream):
    return stacked_test_set(stream)
