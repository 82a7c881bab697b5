# ruff: noqa: E501 - the device's own lines, as printed
"""A failed child's error in one line (kit.experiments.recorded.child_error), as `safety --live` reports it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kit import KitError
from kit.experiments import recorded
from kit.experiments.recorded import child_error

# The end of what the large preset's pairings child printed on the H200 before the replica's capture was ordered
# (two of its 1,000-odd assert lines kept).
DEVICE_ASSERT = """\
/pytorch/aten/src/ATen/native/cuda/IndexKernelUtils.cu:16: vectorized_gather_kernel: block: [60,0,0], thread: [165,0,0] \
Assertion `ind >=0 && ind < ind_dim_size && "vectorized gather kernel index out of bounds"` failed.
/pytorch/aten/src/ATen/native/cuda/IndexKernelUtils.cu:16: vectorized_gather_kernel: block: [60,0,0], thread: [166,0,0] \
Assertion `ind >=0 && ind < ind_dim_size && "vectorized gather kernel index out of bounds"` failed.
Traceback (most recent call last):
  File "/work/main/kit/analysis/equivalence.py", line 56, in compare
    diff = (graph.float() - eager.float()).abs()
torch.AcceleratorError: CUDA error: device-side assert triggered
Search for `cudaErrorAssert' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.

"""


def test_a_device_side_assert_keeps_the_exception_and_the_first_failed_condition():
    error = child_error(DEVICE_ASSERT)
    assert error.startswith("torch.AcceleratorError: CUDA error: device-side assert triggered (first device-side")
    assert "vectorized_gather_kernel" in error and "thread: [165,0,0]" in error and "index out of bounds" in error
    assert "TORCH_USE_CUDA_DSA" not in error and "\n" not in error


@pytest.mark.parametrize(
    "output,error",
    [
        ("kit: error: unknown preset 'huge'\n", "unknown preset 'huge'"),
        ("Traceback (most recent call last):\n  File 'x'\nValueError: bad size\nlater noise\n", "ValueError: bad size"),
        ("a\nsomething odd happened\n", "something odd happened"),
        ("", "no output"),
    ],
)
def test_the_raised_line_wins_over_whatever_came_last(output, error):
    assert child_error(output) == error


def test_run_in_subprocess_raises_one_line_with_the_childs_error(tmp_path, monkeypatch):
    def failing_run(argv, **kwargs):
        return subprocess.CompletedProcess(argv, 1, "", DEVICE_ASSERT)

    monkeypatch.setattr(recorded.subprocess, "run", failing_run)
    with pytest.raises(KitError) as raised:
        recorded.run_in_subprocess("kit.experiments.safety_run", "pr", "large", tmp_path / "o.json", "pairings")
    message = str(raised.value)
    assert message.startswith("pairings failed: torch.AcceleratorError") and "index out of bounds" in message
    assert sys.executable  # the child is this Python


def test_a_recording_made_before_vllms_sizing_says_so_in_its_source_line(tmp_path):
    prov = {"gpu": "NVIDIA H200", "torch": "2.11", "date": "2026-12-03"}
    old = {"provenance": prov, "config": {"hidden_size": 1024}}
    new = {"provenance": prov, "config": {"hidden_size": 1024, "replay_sizing": "vllm"}}
    assert recorded.EARLIER_SIZING in recorded.source_line(old, tmp_path / "small.json")
    assert recorded.EARLIER_SIZING not in recorded.source_line(new, tmp_path / "small.json")
    by_scenario = {"provenance": prov, "scenarios": {"pr": new, "unpatched": old}}
    assert recorded.predates_vllm_sizing(by_scenario) and recorded.predates_vllm_sizing({"provenance": prov})
