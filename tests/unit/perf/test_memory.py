"""CPU memory now and peak come from one source: the peak is never below the current."""

from __future__ import annotations

from rankguard.perf.memory import cpu_memory_bytes, memory_gb

STATUS = "Name:\tpython\nVmPeak:\t 900000 kB\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n"


def test_now_and_peak_from_proc_status() -> None:
    assert cpu_memory_bytes(STATUS) == (102400 * 1024, 204800 * 1024)


def test_peak_never_below_now() -> None:
    lagging = "VmHWM:\t 100 kB\nVmRSS:\t 300 kB\n"
    now, peak = cpu_memory_bytes(lagging)
    assert now == 300 * 1024 and peak == now


def test_this_process_peak_at_least_current() -> None:
    blob = bytearray(64 << 20)  # resident now: touched pages
    blob[::4096] = b"\1" * len(blob[::4096])
    for _ in range(20):
        now, peak, kind = memory_gb(None)
        assert kind == "cpu_rss"
        assert now is not None and peak is not None and peak >= now
    del blob
