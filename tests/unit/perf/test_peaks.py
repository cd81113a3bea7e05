"""Peak table: device-name matching, dtypes, and where a peak comes from."""

from __future__ import annotations

import pytest

from rankguard.perf.peaks import (
    CPU_REASON,
    known_devices,
    lookup_peak,
    normalize_dtype,
    resolve_peak_tflops,
)

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("device_name", "row", "bf16"),
    [
        # Strings as torch.cuda.get_device_name() prints them.
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4),
        ("NVIDIA H100", "H100 SXM", 989.4),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
        ("NVIDIA H100 80GB HBM2e", "H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", "H100 NVL", 835.5),
        ("NVIDIA H200", "H200", 989.4),
        ("NVIDIA H200 NVL", "H200 NVL", 835.5),
        ("NVIDIA GH200 480GB", "GH200", 989.4),
        ("NVIDIA H800", "H800 SXM", 989.4),
        ("NVIDIA B200", "B200", 2250.0),
        ("NVIDIA GB200", "GB200", 2500.0),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM", 312.0),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM", 312.0),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe", 312.0),
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe", 312.0),
        ("NVIDIA A10G", "A10G", 70.0),
        ("NVIDIA A10", "A10", 125.0),
        ("NVIDIA A40", "A40", 149.7),
        ("NVIDIA L40S", "L40S", 362.05),
        ("NVIDIA L40", "L40", 181.05),
        ("NVIDIA L4", "L4", 121.0),
        ("AMD Instinct MI300X", "MI300X", 1307.4),
        ("AMD Instinct MI300X VF", "MI300X", 1307.4),
        ("AMD Instinct MI325X", "MI325X", 1307.4),
        ("AMD Instinct MI355X", "MI355X", 2516.6),
        ("AMD Instinct MI250X/MI250", "MI250X (per GCD)", 191.5),
        ("nvidia h100 nvl", "H100 NVL", 835.5),  # case-insensitive
    ],
)
def test_device_names_resolve_to_their_row(device_name: str, row: str, bf16: float) -> None:
    info = lookup_peak(device_name, "bf16")
    assert info is not None
    assert (info.name, info.dtype, info.tflops) == (row, "bf16", bf16)
    assert info.source
    assert resolve_peak_tflops(override=None, dtype="bf16", device_name=device_name) == (
        bf16,
        f"table:{row}",
    )


@pytest.mark.parametrize(
    ("device_name", "fp8"),
    [
        ("NVIDIA H100 80GB HBM3", 1978.9),
        ("NVIDIA H200", 1978.9),
        ("NVIDIA B200", 4500.0),
        ("NVIDIA GB200", 5000.0),
        ("NVIDIA L40S", 733.0),  # datasheet: BF16 362.05 dense, FP8 733 dense
        ("AMD Instinct MI300X", 2614.9),
    ],
)
def test_fp8_peaks_are_dense(device_name: str, fp8: float) -> None:
    info = lookup_peak(device_name, "fp8")
    assert info is not None and info.tflops == fp8
    bf16 = lookup_peak(device_name, "bf16")
    assert bf16 is not None and fp8 == pytest.approx(2 * bf16.tflops, rel=0.03)


def test_missing_dtype_gives_none() -> None:
    assert lookup_peak("NVIDIA A100-SXM4-80GB", "fp8") is None
    assert lookup_peak("Tesla V100-SXM2-16GB", "bf16") is None
    v100 = lookup_peak("Tesla V100-SXM2-16GB", "fp16")
    assert v100 is not None and (v100.name, v100.tflops) == ("V100 SXM2", 125.0)
    peak, origin = resolve_peak_tflops(
        override=None, dtype="fp8", device_name="NVIDIA A100-SXM4-80GB"
    )
    assert peak is None and origin == "table:A100 SXM has no fp8 peak"


def test_every_row_matches_its_own_name_and_is_dense() -> None:
    # Dense tensor-core rates keep fixed ratios: fp16 = bf16, tf32 = bf16 / 2, fp8 = 2 bf16.
    # A sparse figure copied by mistake would break one of these.
    for name in known_devices():
        bf16 = lookup_peak(name, "bf16")
        fp16 = lookup_peak(name, "fp16")
        assert fp16 is not None and fp16.name == name
        if bf16 is None:
            continue  # Volta / Turing
        assert bf16.tflops == fp16.tflops, name
        tf32 = lookup_peak(name, "tf32")
        if tf32 is not None:
            assert tf32.tflops == pytest.approx(bf16.tflops / 2, rel=0.03), name
        fp8 = lookup_peak(name, "fp8")
        if fp8 is not None:
            assert fp8.tflops == pytest.approx(2 * bf16.tflops, rel=0.03), name
        fp32 = lookup_peak(name, "fp32")
        assert fp32 is not None and fp32.tflops < bf16.tflops, name


def test_dtype_aliases_and_unknown_dtype() -> None:
    assert normalize_dtype("bfloat16") == "bf16"
    assert normalize_dtype("torch.float16") == "fp16"
    assert normalize_dtype("FP32") == "fp32"
    info = lookup_peak("NVIDIA H100 80GB HBM3", "torch.bfloat16")
    assert info is not None and info.dtype == "bf16"
    with pytest.raises(ValueError, match=r"^dtype:"):
        lookup_peak("NVIDIA H100 80GB HBM3", "int3")


def test_override_wins() -> None:
    assert resolve_peak_tflops(override=500.0, dtype="bf16", device_name="NVIDIA H100") == (
        500.0,
        "override",
    )
    assert resolve_peak_tflops(override=123.0, dtype="bf16", device_name=None) == (
        123.0,
        "override",
    )
    with pytest.raises(ValueError, match="peak_tflops"):
        resolve_peak_tflops(override=0.0, dtype="bf16", device_name=None)


def test_unknown_device_gives_none_with_reason() -> None:
    assert lookup_peak("NVIDIA GeForce GT 710") is None
    assert resolve_peak_tflops(
        override=None, dtype="bf16", device_name="NVIDIA GeForce GT 710"
    ) == (None, "unknown device NVIDIA GeForce GT 710")


def test_cpu_has_no_peak() -> None:
    assert resolve_peak_tflops(override=None, dtype="bf16", device_name=None) == (
        None,
        CPU_REASON,
    )
    assert CPU_REASON == "cpu: no peak (give perf.peak_tflops)"
