"""pytest setup: the `gpu` marker (tests that need torch and a CUDA GPU skip, visibly, without them) and a fresh
cache directory per test that asks for one."""
import functools

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs torch and a CUDA GPU (skipped, visibly, without them)")


@functools.lru_cache(maxsize=None)
def gpu_unavailable():
    try:
        import torch
    except ImportError:
        return "no GPU tests here: torch is not installed"
    if not torch.cuda.is_available():
        return "no GPU: torch.cuda.is_available() is False"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and gpu_unavailable():
            item.add_marker(pytest.mark.skip(reason=gpu_unavailable()))


@pytest.fixture
def cache_dir(tmp_path):
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    return str(d)
