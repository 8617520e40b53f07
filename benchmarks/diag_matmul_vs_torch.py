import statistics as st, time, sys, json
import torch, cudalab
from cudalab.bench import measure
from cudalab.monitor import GpuMonitor
n = 8192
dt = sys.argv[1] if len(sys.argv) > 1 else "float16"
a = cudalab.random.normal((n, n), dtype=dt, seed=1); b = cudalab.random.normal((n, n), dtype=dt, seed=2)
out = cudalab.empty((n, n), dtype=dt)
ta, tb = torch.from_dlpack(a), torch.from_dlpack(b); tout = torch.empty_like(ta)
f_cl = lambda: cudalab.matmul(a, b, out=out)
f_t = lambda: torch.mm(ta, tb, out=tout)
from torch.profiler import profile, ProfilerActivity
for f in (f_cl, f_t): f()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as p:
    f_cl(); f_t(); torch.cuda.synchronize()
for e in p.events():
    if e.device_type.name == "CUDA": print("kernel", e.name[:140], round(e.device_time, 1))
mon = GpuMonitor(interval_ms=25); mon.start()
t0 = time.perf_counter()
while time.perf_counter() - t0 < 1.0:
    f_cl(); f_t()
torch.cuda.synchronize()
res = {"cl": [], "t": []}
for r in range(300):
    for k, f in (("cl", f_cl), ("t", f_t)) if r % 2 else (("t", f_t), ("cl", f_cl)):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); f(); e.record(); res[k].append((s, e))
torch.cuda.synchronize()
for k, v in res.items():
    t = [s.elapsed_time(e) for s, e in v]
    print(k, "median %.4f ms first %.4f last %.4f min %.4f" % (st.median(t), st.median(t[:20]), st.median(t[-20:]), min(t)))
mon.stop()
s = mon.samples
print("clocks over time:", [x.sm_clock_mhz for x in s][::4])
print("power:", [round(x.power_w or 0) for x in s][::4])
for f, name in ((f_cl, "cudalab"), (f_t, "torch"), (f_cl, "cudalab again"), (f_t, "torch again")):
    m = measure(f, flops=2*n**3, warmup=0.5)
    print(name, "%.4f ms" % (m.median*1e3), "%.1f TFLOP/s" % m.tflops, "iqr %.1f%%" % (100*m.relative_iqr), m.repeats, m.clocks)
for f, name in ((f_cl, "cudalab unheld"), (f_t, "torch unheld")):
    m = measure(f, flops=2*n**3, warmup=0.5, hold=False)
    print(name, "%.4f ms" % (m.median*1e3), "%.1f TFLOP/s" % m.tflops)
