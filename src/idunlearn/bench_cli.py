"""Command line of the PIU step benchmark, independent of the workflow and its config.

`python -m idunlearn.bench_cli --preset paper --device cuda --dtype bf16` (or, once wired into __main__,
`python -m idunlearn benchmark-piu ...`) writes results/benchmarks/piu_<preset>_<device>_<dtype>_<time>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shlex
import sys
from pathlib import Path

HELP = "Time PIU steps on a random-weight Arc2Face (paper) or a tiny Arc2Face-shaped model; writes JSON."


def add_benchmark_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--preset", choices=("paper", "tiny"), default="paper",
                        help="paper: real-size UNet, batch 32+32, 400 steps projected; tiny: CPU-sized model")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (the median is reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (compilation happens here)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="bf16: autocast forwards, fp32 master weights")
    parser.add_argument("--compile", action="store_true", help="torch.compile the student and teacher UNets")
    parser.add_argument("--regime", choices=("surgical", "all_cross_attention", "full"), default="surgical")
    parser.add_argument("--forget-batch", type=int, default=None, help="default: the preset's")
    parser.add_argument("--retain-batch", type=int, default=None, help="default: the preset's")
    parser.add_argument("--projected-steps", type=int, default=None, help="steps per identity (default: preset's)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=None,
                        help="JSON path (default results/benchmarks/piu_<preset>_<device>_<dtype>_<time>.json)")
    return parser


def run_benchmark(args: argparse.Namespace) -> Path:
    import torch

    from .benchmarks import benchmark_preset
    from .io import write_json

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    result = benchmark_preset(args.preset, args.steps, device, args.dtype, args.compile, warmup=args.warmup,
                              forget_batch=args.forget_batch, retain_batch=args.retain_batch, regime=args.regime,
                              projected_steps=args.projected_steps, seed=args.seed)
    result["command"] = shlex.join(sys.orig_argv)  # the interpreter's own command line
    result["arguments"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    suffix = "_compiled" if args.compile else ""
    output = args.output or Path("results/benchmarks") / (
        f"piu_{args.preset}_{torch.device(device).type}_{args.dtype}{suffix}_{stamp}.json")
    write_json(result, output)
    print(f"{args.preset} on {result['machine']['device_name']}: {result['seconds_per_step']:.3f} s/step, "
          f"{result['projected_seconds_per_identity'] / 60:.1f} min per identity ({result['projected_steps']} steps), "
          f"{result['achieved_tflops']:.2f} TFLOP/s, peak {result['peak_memory_bytes'] / 2**30:.2f} GiB -> {output}")
    return output


def main(argv: list[str] | None = None) -> Path:
    parser = add_benchmark_arguments(argparse.ArgumentParser(prog="idunlearn.bench_cli", description=HELP))
    return run_benchmark(parser.parse_args(argv))


if __name__ == "__main__":
    main()
