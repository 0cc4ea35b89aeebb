"""Planning cost: a 12-axis matrix (>= 100,000 product cells) planned in full and pairwise, and the
pairwise array's size against the best known for 2,4,3,2,4,2,2,2 (16 rows).

    python -m benchmarks.bench_plan [--quick]
"""

from __future__ import annotations

import argparse
import time

import yaml

from soakmatrix.matrix.coverage import covering_array
from soakmatrix.matrix.plan import plan
from soakmatrix.matrix.spec import load_matrix

AXES = {
    "async_scheduling": [True, False],
    "cudagraph_mode": ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"],
    "mtp": [0, 1, 2],
    "flashinfer_autotune": [True, False],
    "tp": [1, 4, 8],
    "prefix_caching": [True, False],
    "chunked_prefill": [True, False],
    "kv_cache_dtype": ["auto", "fp8", "fp8_e4m3"],
    "enforce_eager": [False, True],
    "expert_parallel": [False, True],
    "max_num_seqs": [8, 64, 256],
    "max_num_batched_tokens": [4096, 16384],
}


def matrix_text(coverage) -> str:
    return yaml.safe_dump({
        "models": {"glm": {"path": "zai-org/GLM-5.1-FP8", "weights_gb": 700, "mtp_head": True, "moe": True},
                   "qwen": {"path": "Qwen/Qwen3.6-35B-A3B", "weights_gb": 22, "moe": True}},
        "gpus": {"H200": {"count": 8, "memory_gb": 141}, "H20": {"count": 8, "memory_gb": 96},
                 "RTX5090": {"count": 1, "memory_gb": 32}},
        "axes": AXES,
        "exclude": [{"enforce_eager": True, "cudagraph_mode": "FULL"}],
        "profiles": {"p": {"coverage": coverage, "soak": "2h"}},
    }, sort_keys=False)


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="skip the 3-way array")
    args = parser.parse_args(argv)
    rows = []
    for coverage in ["full", {"t": 2}] + ([] if args.quick else [{"t": 3}]):
        m = load_matrix("bench.yaml", text=matrix_text(coverage))
        result, seconds = timed(lambda: plan(m))
        rows.append((str(coverage), result.product_size, len(result.cells), len(result.excluded), seconds))
    print(f"{'coverage':<10} {'product':>9} {'cells':>8} {'excluded':>9} {'seconds':>8}")
    for coverage, size, cells, excluded, seconds in rows:
        print(f"{coverage:<10} {size:>9} {cells:>8} {excluded:>9} {seconds:>8.2f}")

    factors = {f"p{i}": list(range(n)) for i, n in enumerate([2, 4, 3, 2, 4, 2, 2, 2])}
    array, seconds = timed(lambda: covering_array(factors, 2, lambda combo: True))
    product = 2 * 4 * 3 * 2 * 4 * 2 * 2 * 2
    print(f"\npairwise 2,4,3,2,4,2,2,2: {len(array)} rows (best known 16, product {product}), "
          f"{len(array) / 16 - 1:+.0%} vs best, {seconds:.3f} s")


if __name__ == "__main__":
    main()
