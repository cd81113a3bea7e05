"""GPU checks: what only a real GPU can show, one PASS / FAIL / SKIP line per claim.

    python bench/gpu_check.py [--smoke]      # a few minutes on a GPU; exit 1 on any FAIL

Every rank-side check runs inside a real job: ``rankguard run --nproc-per-node 1`` starts
this script as its rank (``--rank-checks``), which calls ``rankguard.init()`` (the real
session, heartbeat publisher and performance reporter, as a training script gets them)
with ``threading.excepthook`` collecting every exception of a background thread.

1. ``init``: ``rankguard.init()`` returns the launcher's session, its heartbeat thread
   runs.
2. ``host lag``: a long kernel (``torch.cuda._sleep``, ~0.5 s) is queued, then the hot
   calls (``step_end``, ``with rg.step(i)``, ``with rg.compute()``) are timed: each must
   return in microseconds and the kernel must still be running when they are done. A call
   that synchronised (``torch.cuda.synchronize()``, ``.item()``; ``set_sync_debug_mode``
   does not flag the first) would have waited for the kernel.
3. ``ns per step``: ``step_end`` in GPU mode (a CUDA event per step), thread CPU time,
   median of 7 x 20k calls, against a bound of ``GPU_STEP_NS`` (CPU mode: ``CPU_STEP_NS``).
4. ``gemm mfu``: a bf16 GEMM timed with CUDA events against the peak table: its MFU must
   be plausible for a dense GEMM (``MFU_RANGE``; a wrong table row, e.g. a sparse peak,
   falls outside) and the performance reporter's MFU over the same steps within 10 %.
5. ``async save``: ``CheckpointManager`` with ``async_save`` from CUDA tensors: staged in
   pinned host memory, committed, and restored exactly (``torch.equal``).
6. ``cuda graphs``: a training step captured in a CUDA graph while the heartbeat thread
   publishes every 0.1 s, replayed with ``step_end`` between replays: no error, progress
   counted from the CUDA events.
7. ``collectives``: a process group of the rank alone (NCCL on a GPU, gloo on a CPU), 5
   all-reduces: the collective sampler reads the group at 5 enqueued and 5 completed,
   and the trace the hang verdict reads has the 5 all-reduces by that backend. On NCCL
   these are in NCCL's own flight recorder, not in the generic one gloo records into.
8. ``thread exceptions``: none in any thread (``threading.excepthook``) over the run.

Then, in jobs of their own:

9. ``inprocess nccl``: world 1, ``rankguard.inprocess.wrap`` on NCCL: the function raises
   once, is re-entered in the same process, and a new NCCL group all-reduces correctly.
10. ``long kernel``: a rank whose kernel runs 8 s while its host keeps calling
   ``step_end`` must end in ``gpu_progress_timeout`` (progress timeout 3 s).
11. ``live nccl``: world 1 with one standby (``--standby-ranks 1``): the rank declares its
    state (``ip.live_state``), all-reduces, and SIGKILLs itself; the standby takes rank 0
    (a new pid), forms a new NCCL group on the same GPU and all-reduces correctly; one
    ``live_recovery`` line in ``restarts.jsonl``. (The survivors' communicator abort
    needs two GPUs and more: with one, only the newcomer's side runs.)

9 and 11 are one job: the in-process re-entry first, then the SIGKILL of the re-entered
rank, as a job with a standby takes an exception and then a lost process: its
``restarts.jsonl`` has the re-entry's ``inprocess`` line (restart 1, cause
``exception``), then the live recovery's ``live_recovery`` line.

Without a GPU (``--smoke`` or not), the checks that can run on a CPU do (1, 3 in CPU
mode, 5 from CPU tensors, 7 and 8, 9 and 11 on gloo) and the rest say ``SKIP (no GPU)``: nothing
passes that was not checked. ``--smoke``: smaller sizes, no standby started to refill
the used one; without a GPU, the jobs side by side (a GPU's timings would suffer from it;
a smoke run's are not results).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

GPU_STEP_NS = 10_000  # step_end in GPU mode (one cudaEventRecord): goal, ns per call
CPU_STEP_NS = 1_000  # the CPU-mode goal (bench/hot_path.py)
HOST_CALL_MAX_S = 0.005  # any single hot call, while a kernel runs
MFU_RANGE = (0.4, 1.0)  # a large dense bf16 GEMM against the dense bf16 peak
MFU_AGREE = 0.10  # reporter's MFU vs the event-timed one (relative)
LONG_KERNEL_S = 8.0
PROGRESS_TIMEOUT_S = 3.0
HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
SKIP_NO_GPU = "SKIP (no GPU)"

Line = tuple[str, str, str]  # (status, check, detail)


# ---- rank side (inside `rankguard run`) --------------------------------------------------


def _thread_errors() -> list[str]:
    errors: list[str] = []

    def hook(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread else "?"
        errors.append(f"{name}: {args.exc_type.__name__}: {args.exc_value}")

    threading.excepthook = hook
    return errors


def _calibrated_sleep(torch: Any, seconds: float) -> Callable[[], Any]:
    """A function that queues one kernel spinning ~``seconds`` and returns its end event."""
    cycles = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    per_s = cycles / (start.elapsed_time(end) / 1e3)

    def launch() -> Any:
        torch.cuda._sleep(int(per_s * seconds))
        done = torch.cuda.Event()
        done.record()
        return done

    return launch


def check_host_lag(rg: Any, torch: Any) -> Line:
    launch = _calibrated_sleep(torch, 0.5)
    for i in range(5):  # GPU mode decided, events pooled
        rg.step_end(i)
    torch.cuda.synchronize()
    done = launch()
    worst, t0 = 0.0, time.perf_counter()
    for i in range(5, 105):
        c0 = time.perf_counter()
        rg.step_end(i)
        with rg.step(i):
            pass
        with rg.compute():
            pass
        worst = max(worst, time.perf_counter() - c0)
    took = time.perf_counter() - t0
    running = not done.query()
    torch.cuda.synchronize()
    ok = running and worst < HOST_CALL_MAX_S
    detail = (
        f"300 hot calls in {took * 1e3:.2f} ms during a 0.5 s kernel, worst step "
        f"{worst * 1e6:.0f} us (bound {HOST_CALL_MAX_S * 1e3:g} ms), kernel still running "
        f"after them: {running}"
    )
    return ("PASS" if ok else "FAIL", "host lag", detail)


def check_ns_per_step(rg: Any, cuda: bool, calls: int) -> Line:
    step_end = rg.step_end
    samples = []
    for _ in range(7):
        t0 = time.thread_time_ns()
        for i in range(calls):
            step_end(i)
        samples.append((time.thread_time_ns() - t0) / calls)
    ns = statistics.median(samples)
    bound = GPU_STEP_NS if cuda else CPU_STEP_NS
    mode = rg.tracker.mode
    ok = ns < bound and mode == ("cuda" if cuda else "cpu")
    detail = f"step_end {ns:.0f} ns/call in {mode} mode (bound {bound} ns, thread CPU time)"
    return ("PASS" if ok else "FAIL", "ns per step", detail)


def check_gemm_mfu(torch: Any, n: int, steps: int) -> Line:
    import io

    from rankguard.perf.config import PerfConfig
    from rankguard.perf.flops import mfu, tflops_per_gpu
    from rankguard.perf.reporter import PerfReporter
    from rankguard.rank.timeline import ProgressTracker

    name = torch.cuda.get_device_name(0)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    tracker = ProgressTracker(mode="cuda")
    reporter = PerfReporter(
        PerfConfig(log_interval=steps, warmup_iterations=2),
        tracker,
        rank=0,
        world_size=1,
        run_id="gpu-check",
        out_dir=None,
        device_name=name,
        cuda_device=0,
        console=io.StringIO(),
    )
    flops = 2.0 * n**3
    reporter.set_flops(flops, "gemm 2n^3")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    tracker.step_end(0)
    tracker.step_end(1)
    start.record()
    for i in range(2, 2 + steps):
        a @ b
        tracker.step_end(i)
    end.record()
    end.synchronize()
    tracker.poll()
    reporter.poll()
    step_s = start.elapsed_time(end) / 1e3 / steps
    timed = mfu(tflops_per_gpu(flops, step_s, 1), reporter.peak_tflops)
    got = (reporter.latest or {}).get("MFU")
    if timed is None:
        return ("FAIL", "gemm mfu", f"no peak for {name!r}: {reporter.peak_source}")
    plausible = MFU_RANGE[0] <= timed <= MFU_RANGE[1]
    agree = got is not None and abs(got - timed) <= MFU_AGREE * timed
    detail = (
        f"{n}^3 bf16 on {name}: {tflops_per_gpu(flops, step_s, 1):.0f} TFLOP/s, MFU "
        f"{timed:.3f} against {reporter.peak_tflops} ({reporter.peak_source}; plausible "
        f"{MFU_RANGE}); reporter's MFU {got} (within {MFU_AGREE:.0%}: {agree})"
    )
    return ("PASS" if plausible and agree else "FAIL", "gemm mfu", detail)


def check_async_save(torch: Any, device: Any, workdir: Path) -> Line:
    from rankguard.checkpoint import CheckpointConfig, CheckpointManager
    from rankguard.checkpoint.stager import HostStager

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 8)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 256, device=device)).sum().backward()
    opt.step()
    cfg = CheckpointConfig(save=str(workdir / "ckpt"), async_save=True)
    manager = CheckpointManager(cfg, {"model": model, "optimizer": opt})
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    t0 = time.perf_counter()
    manager.save(1)
    returned = time.perf_counter() - t0
    manager.wait()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    loaded = manager.load_latest()
    after = model.state_dict()
    exact = loaded == 1 and all(torch.equal(before[k], after[k]) for k in before)
    manager.close()
    pinned: bool | None = None
    if device.type == "cuda":
        staged = HostStager(pin_memory=True).stage(dict(model.state_dict()))
        if hasattr(staged, "result"):
            staged = staged.result(timeout=60)
        tensors = [v for v in staged.values() if isinstance(v, torch.Tensor)]
        pinned = bool(tensors) and all(t.is_pinned() and t.device.type == "cpu" for t in tensors)
    ok = exact and pinned is not False
    where = "CUDA" if device.type == "cuda" else "CPU (no GPU: pinned staging not checked)"
    detail = (
        f"from {where}: save returned in {returned * 1e3:.1f} ms, committed, restored step "
        f"{loaded}, every tensor equal: {exact}" + ("" if pinned is None else f", pinned: {pinned}")
    )
    return ("PASS" if ok else "FAIL", "async save", detail)


def check_cuda_graphs(rg: Any, torch: Any, replays: int) -> Line:
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.Linear(512, 512)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 512, device="cuda"), torch.randn(64, 512, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as the PyTorch docs do
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    before = rg.tracker.progress_seq
    records = rg.publisher.records_written
    try:
        with torch.cuda.graph(graph):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            time.sleep(0.35)  # capturing: the heartbeat thread publishes (every 0.1 s)
        graph.replay()
        torch.cuda.synchronize()
        first = float(loss.item())
        for i in range(replays):
            graph.replay()
            rg.step_end(10_000 + i)
        torch.cuda.synchronize()
        time.sleep(0.3)
        last = float(loss.item())
    except RuntimeError as exc:
        return ("FAIL", "cuda graphs", f"{type(exc).__name__}: {exc}"[:300])
    rg.tracker.poll()
    counted = rg.tracker.progress_seq - before
    published = rg.publisher.records_written - records
    ok = counted >= replays and published >= 3 and last < first
    detail = (
        f"{replays} replays, progress counted {counted}, loss {first:.4f} -> {last:.4f}, "
        f"heartbeats published meanwhile: {published}"
    )
    return ("PASS" if ok else "FAIL", "cuda graphs", detail)


def check_collectives(torch: Any, cuda: bool) -> Line:
    """The rank's collectives as the sampler and the hang verdict read them (see 7)."""
    import torch.distributed as dist

    from rankguard.ft.collectives import CollectiveSampler
    from rankguard.ft.flightrec import _trace_json

    backend = "nccl" if cuda else "gloo"
    name = f"collectives {backend}"
    try:
        dist.init_process_group(backend)
        t = torch.ones(4, device="cuda" if cuda else "cpu")
        for _ in range(5):
            dist.all_reduce(t)
        if cuda:
            torch.cuda.synchronize()
        sampler = CollectiveSampler()
        seen: list[tuple[str, int, int]] = []
        deadline = time.monotonic() + 5.0  # NCCL's watchdog marks the works completed
        while time.monotonic() < deadline:
            sampler.sample()
            block = sampler.block()
            seen = [(g.group, g.enqueued, g.completed) for g in block.groups] if block else []
            if any(enq == 5 and done == 5 for _, enq, done in seen):
                break
            time.sleep(0.1)
        doc = json.loads(_trace_json())
        ops = [
            e.get("profiling_name")
            for e in doc.get("entries") or []
            if isinstance(e, dict) and not e.get("is_p2p")
        ]
    except Exception as exc:
        return ("FAIL", name, f"{type(exc).__name__}: {exc}"[:300])
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    ok = any(enq == 5 and done == 5 for _, enq, done in seen)
    ok = ok and ops.count(f"{backend}:all_reduce") == 5
    detail = f"sampler's groups (name, enqueued, completed): {seen}; trace's collectives: {ops}"
    return ("PASS" if ok else "FAIL", name, detail[:500])


def rank_checks(out: Path, smoke: bool) -> int:
    errors = _thread_errors()
    import torch

    import rankguard
    from rankguard.session import Session

    lines: list[Line] = []
    rg = rankguard.init()
    is_session = isinstance(rg, Session) and rg.publisher is not None
    lines.append(
        (
            "PASS" if is_session else "FAIL",
            "init",
            f"rankguard.init() -> {type(rg).__name__}, heartbeat thread "
            f"{'running' if is_session else 'missing'}",
        )
    )
    if not is_session:
        out.write_text(json.dumps(lines))
        return 1
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(0)
        torch.ones(1, device="cuda")  # CUDA initialised: the tracker picks GPU mode
        lines.append(check_host_lag(rg, torch))
    else:
        lines.append((SKIP_NO_GPU, "host lag", "needs a kernel to wait for"))
    lines.append(check_ns_per_step(rg, cuda, 2_000 if smoke else 20_000))
    if cuda:
        lines.append(check_gemm_mfu(torch, 4096 if smoke else 8192, 20 if smoke else 50))
    else:
        lines.append((SKIP_NO_GPU, "gemm mfu", "no device peak"))
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    with tempfile.TemporaryDirectory() as tmp:
        lines.append(check_async_save(torch, device, Path(tmp)))
    if cuda:
        lines.append(check_cuda_graphs(rg, torch, 50))
    else:
        lines.append((SKIP_NO_GPU, "cuda graphs", ""))
    lines.append(check_collectives(torch, cuda))
    time.sleep(0.3)  # one more heartbeat after everything
    rg.close()
    lines.append(
        (
            "FAIL" if errors else "PASS",
            "thread exceptions",
            "; ".join(errors)[:500] if errors else "none in any thread (threading.excepthook)",
        )
    )
    out.write_text(json.dumps(lines))
    return 0


def live_checks(out: Path) -> int:
    """World 1 + a standby: round 0 all-reduces and raises, the round it re-enters in the
    same process all-reduces on a new group (the in-process restart) and SIGKILLs the
    process; the standby that takes rank 0 all-reduces on a new group (NCCL on a GPU, on
    the same device). One line per round in ``out``: (pid, rank, backend, all_reduce sum,
    restart count, newcomer)."""
    import signal

    import torch
    import torch.distributed as dist

    import rankguard.inprocess as ip

    if torch.cuda.is_available():  # the standby's LOCAL_RANK may name no device here
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    memory: dict[str, Any] = {}

    @ip.wrap
    def train() -> None:
        backend = dist.get_backend()
        device = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
        if not memory:
            memory["net"] = torch.nn.Linear(4, 4).to(device)
            memory["opt"] = torch.optim.SGD(memory["net"].parameters(), lr=0.1)
            memory["step"] = 0
        step = ip.live_state(model=memory["net"], optimizer=memory["opt"], step=memory["step"])
        t = torch.full((4,), 2.0, device=device)
        dist.all_reduce(t)
        memory["net"](torch.ones(1, 4, device=device)).sum().backward()
        memory["opt"].step()  # the newcomer's first step: the recovery's resumed_t
        link = ip.live_link()
        newcomer = link is not None and link.newcomer
        restart = ip.restart_count()
        row = [os.getpid(), dist.get_rank(), backend, float(t.sum()), restart, newcomer]
        with out.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        if not newcomer and restart == 0:
            raise RuntimeError("injected fault in round 0")  # re-entered in this process
        if link is not None and not newcomer and step == 0:
            os.kill(os.getpid(), signal.SIGKILL)  # lost: the standby takes rank 0
        time.sleep(1.5)  # the launcher reads the newcomer's first step

    train()
    return 0


def long_kernel_job(out: Path) -> int:
    """Steps, then one kernel of LONG_KERNEL_S while the host keeps calling step_end."""
    import torch

    import rankguard

    rg = rankguard.init()
    torch.cuda.set_device(0)
    torch.ones(1, device="cuda")
    launch = _calibrated_sleep(torch, LONG_KERNEL_S)
    for i in range(20):
        rg.step_end(i)
        time.sleep(0.05)
    torch.cuda.synchronize()
    launch()
    t0 = time.monotonic()
    i = 20
    while time.monotonic() - t0 < LONG_KERNEL_S:  # the host is not blocked
        rg.step_end(i)
        i += 1
        time.sleep(0.05)
    torch.cuda.synchronize()
    for j in range(10):
        rg.step_end(i + j)
        time.sleep(0.05)
    out.write_text(json.dumps({"host_steps": i}))
    return 0


# ---- orchestrator -------------------------------------------------------------------------


def _job(log_dir: Path, sets: list[str], *script: str, timeout_s: float) -> tuple[int, str, Path]:
    cmd = [sys.executable, "-m", "rankguard.cli.main", "run", "--standalone"]
    cmd += ["--nproc-per-node", "1", "--rdzv-id", "gpu-check", "--log-dir", str(log_dir)]
    for item in ["heartbeat.enabled=true", "heartbeat.scan_interval_s=0.5", *sets]:
        cmd += ["--set", item]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p
    )
    try:
        res = subprocess.run(
            [*cmd, str(HERE), *script],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        code, text = res.returncode, res.stdout + res.stderr
    except subprocess.TimeoutExpired as exc:
        code, text = -1, f"timed out after {timeout_s:.0f} s: {exc.output!r}"[-3000:]
    return code, text, log_dir / "heartbeat" / "gpu-check"


def run_rank_checks(tmp: Path, smoke: bool) -> list[Line]:
    out = tmp / "rank.json"
    sets = ["heartbeat.publish_interval_s=0.1", "perf.enabled=true"]
    args = ["--rank-checks", str(out), *(["--smoke"] if smoke else [])]
    code, text, _ = _job(tmp / "rank-logs", sets, *args, timeout_s=300)
    if not out.is_file():
        return [("FAIL", "rank checks", f"the job wrote no result (exit {code}): {text[-1500:]}")]
    lines = [tuple(x) for x in json.loads(out.read_text())]
    if code != 0:
        lines.append(("FAIL", "rank job", f"exit {code}: {text[-1000:]}"))
    return lines  # type: ignore[return-value]


def run_inprocess_and_live(tmp: Path, cuda: bool, smoke: bool = False) -> list[Line]:
    """One job: the in-process restart's check (the first process's two rounds), then the
    live recovery's (the standby that took rank 0 after the SIGKILL). ``smoke``: no
    standby started to refill the used one (the rank ends 1.5 s after the takeover, before
    a new standby has imported torch: the launcher would wait up to 10 s for it to leave
    and end it)."""
    out = tmp / "live.jsonl"
    sets = [
        "inprocess_restart.enabled=true",
        "inprocess_restart.monitor_thread_interval=0.1",
        "inprocess_restart.standby_ranks=1",
        *(["inprocess_restart.standby_refills=0"] if smoke else []),
    ]
    code, text, run_dir = _job(tmp / "live-logs", sets, "--live-checks", str(out), timeout_s=240)
    rows = [json.loads(x) for x in out.read_text().splitlines() if x] if out.is_file() else []
    path = run_dir / "restarts.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines() if x] if path.is_file() else []
    kinds = [x.get("kind") for x in lines]
    backend = "nccl" if cuda else "gloo"
    first = [r for r in rows if not r[5] and r[0] == rows[0][0]] if rows else []
    newcomers = [r for r in rows if r[5]]
    rounds = [[r[4], r[2], r[3]] for r in first]
    reentry = [(x.get("restart"), x.get("cause")) for x in lines if x.get("kind") == "inprocess"]
    ip_ok = (
        code == 0
        and rounds == [[0, backend, 8.0], [1, backend, 8.0]]
        and reentry == [(1, "exception")]  # the re-entry's line, though SIGKILLed just after
    )
    ip_name = f"inprocess {backend}"
    ip_detail = (
        f"world 1, rounds (restart, backend, all_reduce sum) {rounds}, restarts.jsonl {kinds}"
    )
    if not ip_ok:
        ip_detail += f", exit {code}: {text[-1200:]}"
    result: list[Line] = [("PASS" if ip_ok else "FAIL", ip_name, ip_detail)]
    if not cuda:
        result.append((SKIP_NO_GPU, "inprocess nccl", "the same on NCCL"))
    live = [first[-1], *newcomers] if first else newcomers
    ok = (
        code == 0
        and len(rows) == 3
        and [(r[1], r[2], r[3]) for r in live] == [(0, backend, 8.0)] * 2
        and live[0][0] != live[1][0]
        and kinds == ["inprocess", "live_recovery"]
    )
    name = f"live {backend}"
    pids = [(r[0], r[1], r[2], r[3]) for r in live]
    detail = f"world 1 + 1 standby, (pid, rank, backend, all_reduce sum) {pids}, exit {code}"
    recovery = next((x for x in lines if x.get("kind") == "live_recovery"), None)
    if recovery is not None:
        detail += f", fault -> next step {recovery.get('recovery_s')} s"
    if not ok:
        detail += f": {text[-1200:]}"
    result.append(("PASS" if ok else "FAIL", name, detail))
    if not cuda:
        result.append((SKIP_NO_GPU, "live nccl", "the same on NCCL"))
    return result


def run_long_kernel(tmp: Path) -> Line:
    out = tmp / "long.json"
    sets = [
        "heartbeat.publish_interval_s=0.5",
        f"heartbeat.progress_timeout_s={PROGRESS_TIMEOUT_S}",
        f"heartbeat.eval_timeout_s={PROGRESS_TIMEOUT_S}",
        "heartbeat.process_timeout_s=3",
    ]
    code, text, run_dir = _job(tmp / "long-logs", sets, "--long-kernel", str(out), timeout_s=180)
    path = run_dir / "findings.jsonl"
    found = [json.loads(x) for x in path.read_text().splitlines() if x] if path.is_file() else []
    kinds = [(f.get("finding_type"), f.get("rank")) for f in found]
    ok = ("gpu_progress_timeout", 0) in kinds and out.is_file()
    detail = f"{LONG_KERNEL_S:g} s kernel, progress timeout {PROGRESS_TIMEOUT_S:g} s: {kinds}"
    if not ok:
        detail += f" (exit {code}): {text[-1200:]}"
    return ("PASS" if ok else "FAIL", "long kernel", detail)


def _side_by_side(batches: list[Callable[[], list[Line]]]) -> list[list[Line]]:
    """--smoke on a CPU: every job at once, their lines in the full run's order (a smoke
    run's figures are not results; its jobs each have their own log dir and store)."""
    results: list[list[Line]] = [[] for _ in batches]

    def one(i: int) -> None:
        try:
            results[i] = batches[i]()
        except Exception as exc:  # said as the check's FAIL, not lost with the thread
            results[i] = [("FAIL", "job", f"{type(exc).__name__}: {exc}"[:300])]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--smoke",
        action="store_true",
        help="smaller sizes, on a CPU the jobs side by side (seconds on a CPU)",
    )
    p.add_argument("--rank-checks", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--long-kernel", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--live-checks", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank_checks:
        return rank_checks(args.rank_checks, args.smoke)
    if args.long_kernel:
        return long_kernel_job(args.long_kernel)
    if args.live_checks:
        return live_checks(args.live_checks)

    import torch

    cuda = torch.cuda.is_available()
    where = torch.cuda.get_device_name(0) if cuda else "no GPU"
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {where}", flush=True)
    t0 = time.monotonic()
    lines: list[Line] = []
    with tempfile.TemporaryDirectory(prefix="rankguard-gpu-check-") as d:
        tmp = Path(d)
        batches: list[Callable[[], list[Line]]] = [
            lambda: run_rank_checks(tmp, args.smoke),
            lambda: run_inprocess_and_live(tmp, cuda, args.smoke),
            lambda: [run_long_kernel(tmp)] if cuda else [(SKIP_NO_GPU, "long kernel", "")],
        ]
        together = args.smoke and not cuda  # on a GPU they would disturb its timings
        for batch in _side_by_side(batches) if together else (b() for b in batches):
            for line in batch:
                lines.append(line)
                print(f"{line[0]:<14} {line[1]:<18} {line[2]}", flush=True)
    failed = [name for status, name, _ in lines if status == "FAIL"]
    passed = sum(1 for status, _, _ in lines if status == "PASS")
    print(
        f"\n{passed} PASS, {len(failed)} FAIL, {len(lines) - passed - len(failed)} SKIP in "
        f"{time.monotonic() - t0:.0f} s" + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
