"""Forward-only studies in float32 and in bf16 on an induction model of d_model 256 (every block
product in bf16, lib/bf16.h): the largest difference of each study's scores, absolute and
relative to its largest score (docs/performance.md). Run from a build directory:
PYTHONPATH=$PWD/python OMP_NUM_THREADS=2 /usr/bin/python3 ../scripts/bf16_studies_difference.py"""
import time, warnings, numpy as np, headlab as hl
warnings.simplefilter("ignore")
t0 = time.time()
t = hl.Trainer(task="induction", d_model=256, heads=4, layers=2, steps=150, threads=2, quiet=True, seed=0)
t.run()
m = t.model
print("trained in %.0f s" % (time.time() - t0), flush=True)
data = hl.repeated_random_tokens(64, 16, m.config.d_vocab, seed=1)
def both(f):
    a = np.asarray(f(), dtype=np.float64)
    with hl.precision("bf16"):
        b = np.asarray(f(), dtype=np.float64)
    d = np.abs(a - b)
    return d.max(), d.max() / max(np.abs(a).max(), 1e-30), np.abs(a).max()
for name, f in [("detect induction", lambda: hl.detect_heads(m, data, kind="induction")),
                ("detect previous_token", lambda: hl.detect_heads(m, data, kind="previous_token")),
                ("head importance", lambda: hl.head_importance(m, data)),
                ]:
    try:
        mx, rel, scale = both(f)
        print(f"{name}: max |bf16 - float32| {mx:.3g}, relative to the largest score {rel:.3g} (largest {scale:.3g})", flush=True)
    except Exception as e:
        print(name, "failed:", e, flush=True)
l32 = hl.evaluate(m, t.task.held_out(256))["loss"]
with hl.precision("bf16"):
    l16 = hl.evaluate(m, t.task.held_out(256))["loss"]
print(f"held-out loss float32 {l32:.6f} bf16 {l16:.6f} rel {abs(l16-l32)/l32:.3g}")
