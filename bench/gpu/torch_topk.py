#!/usr/bin/env python3
"""torch.topk of |x| on a CUDA device, for the sizes and densities of
bench/gpu/device_topk_bench.cpp: the peer the device top-k is measured against
(docs/benchmarks/kernels.md, "GPU"). One JSON object per line. Needs PyTorch with CUDA."""
import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="10000000,100000000")
    ap.add_argument("--ratios", default="0.001,0.01")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 77
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    for n in (int(s) for s in a.sizes.split(",")):
        x = torch.randn(n, device=dev, generator=g)
        for ratio in (float(r) for r in a.ratios.split(",")):
            k = max(1, int(-(-ratio * n // 1)))
            torch.topk(x.abs(), k, sorted=False)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.reps):
                torch.topk(x.abs(), k, sorted=False)
            torch.cuda.synchronize()
            t = (time.perf_counter() - t0) / a.reps
            print(json.dumps({"device": torch.cuda.get_device_name(0), "n": n, "ratio": ratio, "k": k,
                              "method": "torch.topk", "torch": torch.__version__, "seconds": t,
                              "input_gbps": 4 * n / t / 1e9}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
