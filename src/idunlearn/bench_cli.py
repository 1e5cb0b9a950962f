"""Command lines of the PIU step benchmark and the optimiser comparison, independent of the workflow and its config.

`python -m idunlearn.bench_cli --preset paper --device cuda --dtype bf16` (or `python -m idunlearn benchmark-piu ...`)
writes results/benchmarks/piu_<preset>_<device>_<dtype>_<time>.json.
`python -m idunlearn benchmark-optimisers --preset tiny --steps 5` writes
results/benchmarks/optimisers_<preset>_<device>_<dtype>_<time>.json and prints one line per optimiser.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shlex
import sys
from pathlib import Path

HELP = "Time PIU steps on a random-weight Arc2Face (paper) or a tiny Arc2Face-shaped model; writes JSON."


def _shared_arguments(parser: argparse.ArgumentParser, preset: str, preset_help: str, what: str,
                      output_name: str) -> argparse.ArgumentParser:
    """The arguments both benchmarks take; ``what`` says what a timed step is."""
    parser.add_argument("--preset", choices=("paper", "tiny", "offline"), default=preset, help=preset_help)
    parser.add_argument("--steps", type=int, default=5, help=f"timed {what} (the median is reported)")
    parser.add_argument("--warmup", type=int, default=1, help=f"untimed {what} first (compilation happens here)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="the run setting precision: bf16 = bf16 autocast forwards, attention and master weights fp32")
    parser.add_argument("--regime", choices=("surgical", "all_cross_attention", "full"), default="surgical")
    parser.add_argument("--forget-batch", type=int, default=None, help="default: the preset's")
    parser.add_argument("--retain-batch", type=int, default=None, help="default: the preset's")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=None,
                        help=f"JSON path (default results/benchmarks/{output_name}_<preset>_<device>_<dtype>_"
                             "<time>.json)")
    return parser


def _device(args: argparse.Namespace) -> str:
    """Applies --threads; --device, else cuda when there is one."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    return args.device or ("cuda" if torch.cuda.is_available() else "cpu")


def _write_result(result: dict, args: argparse.Namespace, device: str, name: str, suffix: str = "") -> Path:
    """``result`` with the command line and arguments, to --output or results/benchmarks/<name>_<preset>_<device
    type>_<dtype><suffix>_<time>.json."""
    import torch

    from .io import write_json

    result["command"] = shlex.join(sys.orig_argv)  # the interpreter's own command line
    result["arguments"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    output = args.output or Path("results/benchmarks") / (
        f"{name}_{args.preset}_{torch.device(device).type}_{args.dtype}{suffix}_{stamp}.json")
    write_json(result, output)
    return output


def add_benchmark_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    _shared_arguments(parser, "paper", "paper: real-size UNet, batch 32+32, 400 steps projected; tiny: CPU-sized model; offline: the "
                      "shipped mini Arc2Face's architecture, batch 8+8, 200 steps projected",
                      "steps", "piu")
    parser.add_argument("--compile", action="store_true", help="torch.compile the student and teacher UNets")
    parser.add_argument("--projected-steps", type=int, default=None, help="steps per identity (default: preset's)")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="CPU only: that many more steps under torch.profiler, their time split by kernel kind "
                             "(attention, convolution, matrix products, casts, other) and projected per identity")
    return parser


def run_benchmark(args: argparse.Namespace) -> Path:
    from .benchmarks import benchmark_preset

    device = _device(args)
    result = benchmark_preset(args.preset, args.steps, device, args.dtype, args.compile, warmup=args.warmup,
                              forget_batch=args.forget_batch, retain_batch=args.retain_batch, regime=args.regime,
                              projected_steps=args.projected_steps, seed=args.seed, profile_steps=args.profile_steps)
    output = _write_result(result, args, device, "piu", "_compiled" if args.compile else "")
    print(f"{args.preset} on {result['machine']['device_name']}: {result['seconds_per_step']:.3f} s/step, "
          f"{result['projected_seconds_per_identity'] / 60:.1f} min per identity ({result['projected_steps']} steps), "
          f"{result['achieved_tflops']:.3f} TFLOP/s (dense matmul here: {result['reference_matmul_tflops']:.3f}), "
          f"peak {result['peak_memory_bytes'] / 2**30:.2f} GiB -> {output}")
    if "profile" in result:
        profiled = result["profile"]
        print(f"profiled ({profiled['profiled_steps']} steps, {profiled['profiled_seconds_per_step']:.3f} s/step under "
              "the profiler), seconds per identity by kernel kind: "
              + ", ".join(f"{kind} {value:.1f}" for kind, value in profiled["projected_seconds_per_identity"].items()))
    return output


OPTIMISER_HELP = ("Compare the optimisers (weighted sum, EUPMU, EUPMU-fast, explicit surgery, epsilon-constrained) on "
                  "the same PIU steps in one process: seconds per step, backward passes, peak memory; writes JSON.")


def add_optimiser_benchmark_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    _shared_arguments(parser, "tiny", "paper: real-size UNet, batch 32+32; tiny: CPU-sized model, batch 4+4",
                      "steps per optimiser", "optimisers")
    parser.add_argument("--optimisers", nargs="+", default=None,
                        help="optimiser names (default: weighted_sum eupmu eupmu_fast unilateral_surgery "
                             "epsilon_constrained)")
    return parser


def run_optimiser_benchmark(args: argparse.Namespace) -> Path:
    from .benchmarks import OPTIMISER_COMPARISON, benchmark_optimisers_preset

    device = _device(args)
    optimisers = tuple(args.optimisers or OPTIMISER_COMPARISON)
    result = benchmark_optimisers_preset(args.preset, args.steps, device, args.dtype, optimisers,
                                         warmup=args.warmup, forget_batch=args.forget_batch,
                                         retain_batch=args.retain_batch, regime=args.regime, seed=args.seed)
    output = _write_result(result, args, device, "optimisers")
    print(f"{args.preset} on {result['machine']['device_name']}, {result['timed_steps']} timed steps each; "
          f"memory: {result['memory_source']}")
    for name, row in result["optimisers"].items():
        ratio = (f"{row['time_vs_weighted_sum']:.2f}x time, {row['flops_vs_weighted_sum']:.2f}x FLOPs of weighted_sum"
                 if "time_vs_weighted_sum" in row else "")
        peak = "n/a" if row["peak_memory_bytes"] is None else f"{row['peak_memory_bytes'] / 2**20:.0f} MiB"
        rise = "n/a" if row["step_memory_rise_bytes"] is None else f"{row['step_memory_rise_bytes'] / 2**20:.0f} MiB"
        print(f"  {name:20s} {row['seconds_per_step']:.3f} s/step ({ratio})  backward "
              f"{row['backward_passes_per_step']:g}  extra forward {row['extra_forward_passes_per_step']:g}  "
              f"peak {peak} (step rise {rise})")
    print(f"-> {output}")
    return output


PHASE_TWO_HELP = ("How close epsilon-constrained Phase II ends to its bound on the shipped mini generator with PIU's "
                  "objectives, per beta; writes JSON.")


def add_phase_two_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--steps", type=int, default=200, help="steps of every run")
    parser.add_argument("--batch", type=int, default=2, help="forget and retain batch")
    parser.add_argument("--betas", type=float, nargs="+", default=[1.0], help="Phase II's epsilon_beta values")
    parser.add_argument("--fraction", type=float, default=0.5, help="Phase II's place between the boundaries")
    parser.add_argument("--adam-betas", type=float, nargs=2, default=None, metavar=("BETA1", "BETA2"),
                        help="AdamW betas of the base step (default: the epsilon-constrained runs' (0.9, 0.95)); "
                             "BETA1 0 takes the momentum out")
    parser.add_argument("--epsilon-scale", choices=["first_step", "batch"], default="first_step",
                        help="Phase II's loss scale (run setting epsilon_scale)")
    parser.add_argument("--hold-bound", action="store_true",
                        help="correct every step to end on or above the bound (run setting epsilon_hold_bound)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=None,
                        help="JSON path (default results/benchmarks/phase_two_<time>.json)")
    return parser


def run_phase_two(args: argparse.Namespace) -> Path:
    import tempfile

    import torch

    from .benchmarks import (
        default_run_settings,
        random_unlearning_data,
        shipped_mini_generator,
    )
    from .config import resolve_run_settings
    from .controllable import phase_two_tracking
    from .io import write_json

    if args.threads:
        torch.set_num_threads(args.threads)
    generator = shipped_mini_generator(args.seed)
    data = random_unlearning_data(dim=generator.encoder.width, n_forget=4, n_retain=16, seed=args.seed)
    betas = {"betas": list(args.adam_betas)} if args.adam_betas else {}
    run = {**resolve_run_settings({**default_run_settings(), "optimiser": "epsilon_constrained",
                                   "epsilon_scale": args.epsilon_scale,
                                   "epsilon_hold_bound": args.hold_bound, **betas}),
           "steps": args.steps, "checkpoint_every": args.steps, "forget_batch": args.batch, "retain_batch": args.batch}
    with tempfile.TemporaryDirectory() as workdir:
        table = phase_two_tracking(generator, data, run, workdir, args.betas, args.fraction, args.seed)
    output = args.output or Path("results/benchmarks") / f"phase_two_{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    write_json({"command": shlex.join(sys.orig_argv), "rows": table.to_dict("records")}, output)
    for row in table.itertuples():
        print(f"beta {row.beta:g}: epsilon {row.epsilon:.5f} on {row.bounded}, spacing {row.spacing:.5f}, at the end "
              f"{row.f1_end:.5f} ({row.spacings_from_bound:.2f} spacings from the bound, "
              f"violation {row.violation:.5f}; "
              f"f1 itself {row.spacings_from_f1_bound:.2f} spacings from the first_step bound); "
              f"first at the bound at step {row.first_step_at_bound}, eta_t = 0 on {row.eta_zero_share_after:.0%} "
              f"of the steps from there")
    print(f"-> {output}")
    return output


def main(argv: list[str] | None = None) -> Path:
    parser = add_benchmark_arguments(argparse.ArgumentParser(prog="idunlearn.bench_cli", description=HELP))
    return run_benchmark(parser.parse_args(argv))


if __name__ == "__main__":
    main()
