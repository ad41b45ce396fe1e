import pytest
import torch

import kernel_align


@pytest.fixture(autouse=True)
def _restore_runtime():
    """Every test starts and ends with the same backend choice, strict mode, trace and
    thread count."""
    backend, strict = kernel_align.get_backend(), kernel_align.is_strict()
    threads = kernel_align.get_num_threads()
    yield
    kernel_align.set_backend(backend)
    kernel_align.strict(strict)
    kernel_align.trace_to(None)
    kernel_align.set_num_threads(threads)


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(1234)
