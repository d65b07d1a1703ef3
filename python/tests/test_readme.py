"""The README's Python examples, run as written: the first anywhere, the torch one on a GPU."""
import os
import pathlib
import re

import pytest

README = pathlib.Path(os.environ.get("RTATTN_README", pathlib.Path(__file__).resolve().parents[2] / "README.md"))


def block(marker):
    m = re.search(rf"<!-- {marker}:begin -->[^`]*```python\n(.*?)```[^`]*<!-- {marker}:end -->", README.read_text(),
                  re.S)
    assert m, f"README.md has no ```python block between <!-- {marker}:begin/end -->"
    return m.group(1)


def test_readme_python_example(capsys):
    exec(compile(block("python-example"), "README.md (python-example)", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("144 144 wgmma")
    assert out[1].startswith("head_dim_qk - head_dim_qk: 300 is out of range")


@pytest.mark.gpu
def test_readme_python_gpu_example():
    exec(compile(block("python-gpu-example"), "README.md (python-gpu-example)", "exec"), {})
