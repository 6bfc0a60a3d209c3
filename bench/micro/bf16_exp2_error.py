"""The attention error of exp2 on bf16 inputs against attn2's fp32 exp2 (CPU only, numpy).

The design question (docs/attn2.md, "Designs measured and set aside"):
whether attn2's softmax could take its exponentials as `ex2.approx.ftz.bf16x2`,
two per MUFU issue, whose input (s * c - m * c) is rounded to bf16 first.
For 64 query rows against L random keys (L = 2048, 8192, 32768; three
trials each; q and k RMS-normed and bf16, a few keys equal to some q rows so
that some rows are peaked, V bf16), this computes the attention output with
P = bf16(exp2(x)) (attn2: fp32 exp2, P rounded to bf16 for P V) and with
P = bf16(exp2(bf16(x))), both against float64.

  python3 bench/micro/bf16_exp2_error.py

One line per L and trial: the worst relative RMS error of a row so far, for
each form. attn2's accuracy bar is 5e-3 per row and head, for the whole op.
"""

import numpy as np

SCALE_LOG2 = 0.6841258107984375 * 1.4426950408889634  # softmax scale x log2(e), attn2's kScaleLog2 (config.cuh)


def bf16(x):
    """Round float32 to the nearest bf16 (ties to even), kept as float32."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def rms_norm(x):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)


def main():
    rng = np.random.default_rng(0)
    worst = {}
    for L in (2048, 8192, 32768):
        for trial in range(3):
            q = bf16(rms_norm(rng.standard_normal((64, 64)).astype(np.float32)))
            k = bf16(rms_norm(rng.standard_normal((L, 64)).astype(np.float32)))
            k[rng.integers(0, L, 8)] = q[rng.integers(0, 64, 8)]
            v = bf16(rng.standard_normal((L, 64)).astype(np.float32))
            s = (q.astype(np.float64) @ k.T.astype(np.float64)) * SCALE_LOG2
            x = s - s.max(-1, keepdims=True)
            p = np.exp2(x)
            ref = (p @ v) / p.sum(-1, keepdims=True)
            x32 = x.astype(np.float32)
            for name, pp in (("fp32 exp2, bf16 P", bf16(np.exp2(x32))),
                             ("bf16 input, bf16 P", bf16(np.exp2(bf16(x32))))):
                o = (pp.astype(np.float64) @ v) / pp.astype(np.float64).sum(-1, keepdims=True)
                err = np.sqrt(((o - ref) ** 2).sum(-1) / (ref ** 2).sum(-1)).max()
                worst[name] = max(worst.get(name, 0.0), err)
            print(f"L {L:6d} trial {trial}: worst relative RMS so far: "
                  + ", ".join(f"{n} {e:.2e}" for n, e in worst.items()), flush=True)


if __name__ == "__main__":
    main()
