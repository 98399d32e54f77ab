"""How many parameters per second DeepSpeed's CPU Adam updates on this machine.

The simulator prices an offloaded optimizer step (a stage's `optimizer_offload`) with
SimulatorConstants.cpu_adam_params_per_s; this script is where that number comes from.
It times `DeepSpeedCPUAdam.step()` (fp32 parameters, gradients and moments in host memory,
the trainer's betas and eps, plain Adam) on one flat tensor, as ZeRO's offload runs it on a
rank's flat partition, and prints the median over the repeats. The op is JIT-built on first
use (about 80 s with gcc 12 and ninja on a 2-core VM).

    python benchmarks/cpu_adam.py                      # 64 Mi parameters, 5 repeats
    python benchmarks/cpu_adam.py --parameters 16777216 --repeats 9

The rate scales with the host's cores (the op is OpenMP-parallel): the threads it used are
printed with the table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parameters", type=int, default=64 * 2**20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from deepspeed.ops.adam import DeepSpeedCPUAdam

    from sailplan.trainer.optimizer import ADAM_BETAS, ADAM_EPS

    flat = torch.nn.Parameter(torch.zeros(args.parameters))
    flat.grad = torch.randn(args.parameters, generator=torch.Generator().manual_seed(0))
    optimizer = DeepSpeedCPUAdam(
        [flat], lr=1e-4, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=0.0, adamw_mode=False
    )
    optimizer.step()  # allocates the moments
    seconds = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        optimizer.step()
        seconds.append(time.perf_counter() - started)
    median = statistics.median(seconds)
    print(f"threads {torch.get_num_threads()}, parameters {args.parameters}")
    print("| parameters | median step s | parameters/s |")
    print("| --- | --- | --- |")
    print(f"| {args.parameters} | {median:.4f} | {args.parameters / median:.3g} |")


if __name__ == "__main__":
    main()
