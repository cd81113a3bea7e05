"""Dense peak TFLOP/s per accelerator and dtype, for MFU.

Why a table of our own: Lightning's has no H200/B200, torchtitan's has bf16 only and
silently falls back to A100 for an unknown GPU. Here an unknown GPU gives no peak and says
why, and an explicit ``perf.peak_tflops`` override always wins.

Every number is a vendor datasheet figure WITHOUT structured sparsity: NVIDIA prints the
2:4-sparse tensor-core figure and marks it with an asterisk, so those are halved here.
``fp32`` is the non-tensor FP32 peak on NVIDIA (use ``tf32`` when TF32 matmuls are
enabled) and the FP32 matrix peak on AMD. A dtype a device has no hardware path for
(FP8 before Hopper/Ada/CDNA3, BF16 and TF32 on Volta/Turing) is absent, so a lookup
gives None rather than a misleading number. AMD MI250/MI250X appear to torch as one
device per GCD (two per package), so their rows are per GCD.

Names are matched against ``torch.cuda.get_device_name()`` case-insensitively with
word-bounded patterns, most specific row first (H100 NVL and PCIe before H100, GH200
before H200, GB200 before B200, L40S before L40 before L4).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "DTYPES",
    "PeakInfo",
    "known_devices",
    "lookup_peak",
    "normalize_dtype",
    "resolve_peak_tflops",
]

DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp8")

_DTYPE_ALIASES = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "tf32": "tf32",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "fp8": "fp8",
    "float8": "fp8",
}

CPU_REASON = "cpu: no peak (give perf.peak_tflops)"


@dataclass(frozen=True, slots=True)
class PeakInfo:
    """One table hit: the device row's name, the dtype, its dense peak and the source."""

    name: str
    dtype: str
    tflops: float
    source: str


@dataclass(frozen=True, slots=True)
class _Device:
    name: str
    patterns: tuple[str, ...]  # every regex must match the lower-cased device name
    tflops: Mapping[str, float]
    source: str


def _peaks(
    *,
    bf16: float | None = None,
    fp16: float | None = None,
    tf32: float | None = None,
    fp32: float | None = None,
    fp8: float | None = None,
) -> dict[str, float]:
    values = {"bf16": bf16, "fp16": fp16, "tf32": tf32, "fp32": fp32, "fp8": fp8}
    return {k: v for k, v in values.items() if v is not None}


_NV_H100 = (
    "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet; dense "
    "figures from https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"
)
_NV_H200 = (
    "https://resources.nvidia.com/en-us-data-center-overview-mc/en-us-data-center-overview/"
    "hpc-datasheet-sc23-h200"
)
_NV_BLACKWELL = "https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (per-GPU table)"
_NV_A100 = (
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
_NV_V100 = (
    "https://images.nvidia.com/content/technologies/volta/pdf/"
    "volta-v100-datasheet-update-us-1165301-r5.pdf"
)
_AMD = "https://www.amd.com/en/products/accelerators/instinct/"

# Most specific first. Comments give the datasheet's sparse figures where halved.
_TABLE: tuple[_Device, ...] = (
    # --- NVIDIA Blackwell ---
    # GB200 NVL72, per GPU: BF16 5 PF*, FP8 10 PF*, TF32 2.5 PF*, FP32 80 TF (* sparse).
    _Device(
        "GB200",
        (r"\bgb200\b",),
        _peaks(bf16=2500.0, fp16=2500.0, tf32=1250.0, fp32=80.0, fp8=5000.0),
        _NV_BLACKWELL,
    ),
    # HGX B200, per GPU: BF16 4.5 PF*, FP8 9 PF*, TF32 2.2 PF*, FP32 75 TF.
    _Device(
        "B200",
        (r"\bb200\b",),
        _peaks(bf16=2250.0, fp16=2250.0, tf32=1100.0, fp32=75.0, fp8=4500.0),
        _NV_BLACKWELL,
    ),
    # --- NVIDIA Hopper ---
    # GH200 superchip GPU: same tensor throughput as H100 SXM (BF16 1979*, FP8 3958*).
    _Device(
        "GH200",
        (r"\bgh200\b",),
        _peaks(bf16=989.4, fp16=989.4, tf32=494.7, fp32=67.0, fp8=1978.9),
        "https://resources.nvidia.com/en-us-grace-cpu/grace-hopper-superchip",
    ),
    # H200 NVL: FP32 60, TF32 835*, BF16 1671*, FP8 3341*.
    _Device(
        "H200 NVL",
        (r"\bh200\b", r"\bnvl\b"),
        _peaks(bf16=835.5, fp16=835.5, tf32=417.5, fp32=60.0, fp8=1670.5),
        _NV_H200,
    ),
    # H200 SXM: FP32 67, TF32 989*, BF16 1979*, FP8 3958* (same as H100 SXM).
    _Device(
        "H200",
        (r"\bh200\b",),
        _peaks(bf16=989.4, fp16=989.4, tf32=494.7, fp32=67.0, fp8=1978.9),
        _NV_H200,
    ),
    # H100 NVL (per GPU): FP32 60, TF32 835*, BF16 1671*, FP8 3341*.
    _Device(
        "H100 NVL",
        (r"\bh100\b", r"\bnvl\b"),
        _peaks(bf16=835.5, fp16=835.5, tf32=417.5, fp32=60.0, fp8=1670.5),
        _NV_H100,
    ),
    # H100 PCIe (80GB HBM2e): FP32 51, TF32 756*, BF16 1513*, FP8 3026* (whitepaper: 756
    # dense BF16).
    _Device(
        "H100 PCIe",
        (r"\bh100\b", r"pcie|hbm2e"),
        _peaks(bf16=756.0, fp16=756.0, tf32=378.0, fp32=51.0, fp8=1513.0),
        _NV_H100,
    ),
    # H100 SXM ("NVIDIA H100 80GB HBM3"; also any other H100 name: the highest peak, so an
    # unknown variant never inflates MFU): FP32 67, TF32 989*, BF16 1979*, FP8 3958*;
    # the Hopper whitepaper gives dense BF16 989.4, TF32 494.7, FP8 1978.9.
    _Device(
        "H100 SXM",
        (r"\bh100\b",),
        _peaks(bf16=989.4, fp16=989.4, tf32=494.7, fp32=67.0, fp8=1978.9),
        _NV_H100,
    ),
    # H800: H100 silicon with reduced NVLink/FP64; tensor throughput as H100 PCIe / SXM.
    _Device(
        "H800 PCIe",
        (r"\bh800\b", r"pcie"),
        _peaks(bf16=756.0, fp16=756.0, tf32=378.0, fp32=51.0, fp8=1513.0),
        "NVIDIA H800 PCIe datasheet (as H100 PCIe)",
    ),
    _Device(
        "H800 SXM",
        (r"\bh800\b",),
        _peaks(bf16=989.4, fp16=989.4, tf32=494.7, fp32=67.0, fp8=1978.9),
        "NVIDIA H800 SXM5 datasheet (as H100 SXM)",
    ),
    # --- NVIDIA Ada ---
    # L40S: FP32 91.6, TF32 366*, BF16 733*, FP8 1466*.
    _Device(
        "L40S",
        (r"\bl40s\b",),
        _peaks(bf16=362.05, fp16=362.05, tf32=183.0, fp32=91.6, fp8=733.0),
        "https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413",
    ),
    # L40: FP32 90.5, TF32 181*, BF16 362.1*, FP8 724*.
    _Device(
        "L40",
        (r"\bl40\b",),
        _peaks(bf16=181.05, fp16=181.05, tf32=90.5, fp32=90.5, fp8=362.0),
        "https://images.nvidia.com/content/Solutions/data-center/vgpu-L40-datasheet.pdf",
    ),
    # L4: FP32 30.3, TF32 120*, BF16 242*, FP8 485*.
    _Device(
        "L4",
        (r"\bl4\b",),
        _peaks(bf16=121.0, fp16=121.0, tf32=60.0, fp32=30.3, fp8=242.5),
        "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet",
    ),
    # --- NVIDIA Ampere --- (no FP8)
    # A100 40/80GB, SXM and PCIe alike: BF16 312 (624*), TF32 156 (312*), FP32 19.5.
    _Device(
        "A100 SXM",
        (r"\ba100\b", r"sxm"),
        _peaks(bf16=312.0, fp16=312.0, tf32=156.0, fp32=19.5),
        _NV_A100,
    ),
    _Device(
        "A100 PCIe",
        (r"\ba100\b", r"pcie"),
        _peaks(bf16=312.0, fp16=312.0, tf32=156.0, fp32=19.5),
        _NV_A100,
    ),
    _Device(
        "A100",
        (r"\ba100\b",),
        _peaks(bf16=312.0, fp16=312.0, tf32=156.0, fp32=19.5),
        _NV_A100,
    ),
    # A800: A100 silicon with reduced NVLink; same tensor throughput.
    _Device(
        "A800",
        (r"\ba800\b",),
        _peaks(bf16=312.0, fp16=312.0, tf32=156.0, fp32=19.5),
        "NVIDIA A800 datasheet (as A100)",
    ),
    # A40: FP32 37.4, TF32 74.8 (149.6*), BF16 149.7 (299.4*).
    _Device(
        "A40",
        (r"\ba40\b",),
        _peaks(bf16=149.7, fp16=149.7, tf32=74.8, fp32=37.4),
        "https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf",
    ),
    # A30: FP32 10.3, TF32 82 (165*), BF16 165 (330*).
    _Device(
        "A30",
        (r"\ba30\b",),
        _peaks(bf16=165.0, fp16=165.0, tf32=82.0, fp32=10.3),
        "https://www.nvidia.com/content/dam/en-zz/Solutions/data-center/products/a30-gpu/pdf/"
        "a30-datasheet.pdf",
    ),
    # A10G (AWS G5): NVIDIA publishes no datasheet; half the A10's tensor rate, 80 SMs.
    _Device(
        "A10G",
        (r"\ba10g\b",),
        _peaks(bf16=70.0, fp16=70.0, tf32=35.0, fp32=35.0),
        "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/",
    ),
    # A10: FP32 31.2, TF32 62.5 (125*), BF16 125 (250*).
    _Device(
        "A10",
        (r"\ba10\b",),
        _peaks(bf16=125.0, fp16=125.0, tf32=62.5, fp32=31.2),
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/a10-datasheet.pdf",
    ),
    # --- NVIDIA Volta / Turing --- (FP16 tensor cores only)
    _Device("V100S PCIe", (r"\bv100s\b",), _peaks(fp16=130.0, fp32=16.4), _NV_V100),
    _Device("V100 PCIe", (r"\bv100\b", r"pcie"), _peaks(fp16=112.0, fp32=14.0), _NV_V100),
    _Device("V100 SXM2", (r"\bv100\b",), _peaks(fp16=125.0, fp32=15.7), _NV_V100),
    _Device(
        "T4",
        (r"\bt4\b",),
        _peaks(fp16=65.0, fp32=8.1),
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
        "t4-tensor-core-datasheet-951643.pdf",
    ),
    # --- AMD Instinct --- (CU count x clock x FLOPs/CU/clock, as on AMD's spec pages)
    # MI355X: 256 CU at 2.4 GHz; FP16/BF16 2516.6 (5033.2*), FP8 5033.2, FP32 157.3. CDNA 4
    # has no TF32 matrix path.
    _Device(
        "MI355X",
        (r"\bmi355x?\b",),
        _peaks(bf16=2516.6, fp16=2516.6, fp32=157.3, fp8=5033.2),
        _AMD + "mi350/mi355x.html",
    ),
    # MI350X: 256 CU at 2.2 GHz; FP16/BF16 2306.9, FP8 4613.7, FP32 144.2.
    _Device(
        "MI350X",
        (r"\bmi350x?\b",),
        _peaks(bf16=2306.9, fp16=2306.9, fp32=144.2, fp8=4613.7),
        _AMD + "mi350/mi350x.html",
    ),
    # MI325X: 304 CU at 2.1 GHz, compute as MI300X.
    _Device(
        "MI325X",
        (r"\bmi325x?\b",),
        _peaks(bf16=1307.4, fp16=1307.4, tf32=653.7, fp32=163.4, fp8=2614.9),
        _AMD + "mi300/mi325x.html",
    ),
    # MI300X: FP16/BF16 1307.4 (2614.9*), FP8 2614.9 (5229.8*), TF32 653.7, FP32 163.4.
    _Device(
        "MI300X",
        (r"\bmi300x\b",),
        _peaks(bf16=1307.4, fp16=1307.4, tf32=653.7, fp32=163.4, fp8=2614.9),
        _AMD + "mi300/mi300x.html",
    ),
    # MI300A: 228 CU at 2.1 GHz; FP16/BF16 980.6, FP8 1961.2, TF32 490.3, FP32 122.6.
    _Device(
        "MI300A",
        (r"\bmi300a\b",),
        _peaks(bf16=980.6, fp16=980.6, tf32=490.3, fp32=122.6, fp8=1961.2),
        _AMD + "mi300/mi300a.html",
    ),
    # MI250X per GCD (package: FP16/BF16 383, FP32 matrix 95.7; two GCDs).
    _Device(
        "MI250X (per GCD)",
        (r"\bmi250x\b",),
        _peaks(bf16=191.5, fp16=191.5, fp32=47.9),
        _AMD + "mi200/mi250x.html",
    ),
    # MI250 per GCD (package: FP16/BF16 362.1, FP32 matrix 90.5; two GCDs).
    _Device(
        "MI250 (per GCD)",
        (r"\bmi250\b",),
        _peaks(bf16=181.0, fp16=181.0, fp32=45.3),
        _AMD + "mi200/mi250.html",
    ),
)

_COMPILED = tuple((row, tuple(re.compile(p) for p in row.patterns)) for row in _TABLE)


def known_devices() -> tuple[str, ...]:
    """Row names in match order."""
    return tuple(row.name for row in _TABLE)


def normalize_dtype(dtype: str) -> str:
    """``bf16``/``bfloat16``/``torch.bfloat16`` -> ``bf16`` and so on; ValueError if unknown."""
    key = str(dtype).strip().lower().removeprefix("torch.")
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"dtype: must be one of {DTYPES} (or an alias), got {dtype!r}")
    return _DTYPE_ALIASES[key]


def _match(device_name: str) -> _Device | None:
    name = device_name.strip().lower()
    for row, patterns in _COMPILED:
        if all(p.search(name) for p in patterns):
            return row
    return None


def lookup_peak(device_name: str, dtype: str = "bf16") -> PeakInfo | None:
    """Dense peak of ``device_name`` (a ``torch.cuda.get_device_name()`` string) in ``dtype``.

    None when the device is not in the table or has no peak for that dtype.
    """
    key = normalize_dtype(dtype)
    row = _match(device_name)
    if row is None or key not in row.tflops:
        return None
    return PeakInfo(name=row.name, dtype=key, tflops=row.tflops[key], source=row.source)


def resolve_peak_tflops(
    *, override: float | None, dtype: str, device_name: str | None
) -> tuple[float | None, str]:
    """The peak to compute MFU against, and where it came from.

    Order: an explicit ``override`` (``"override"``); no device (``device_name`` None, a
    CPU run) gives None; then the table (``"table:<row>"``). A device not in the table
    gives None with ``"unknown device <name>"``; a known device without that dtype gives
    None with ``"table:<row> has no <dtype> peak"``.
    """
    if override is not None:
        if isinstance(override, bool) or not override > 0:
            raise ValueError(f"peak_tflops: must be > 0 or None, got {override!r}")
        return float(override), "override"
    key = normalize_dtype(dtype)
    if device_name is None:
        return None, CPU_REASON
    row = _match(device_name)
    if row is None:
        return None, f"unknown device {device_name}"
    if key not in row.tflops:
        return None, f"table:{row.name} has no {key} peak"
    return row.tflops[key], f"table:{row.name}"
