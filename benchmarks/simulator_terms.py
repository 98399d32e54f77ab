"""Term-by-term audit of the simulator on the Sailor artifact's consumer-GPU cluster.

The artifact measured the network between Titan-RTX, RTX-2080 and RTX-3090 machines in one
zone (network/multizone_bandwidths_het.json: ~23 Gbit/s between Titan and RTX-2080 VMs,
~0.9 Gbit/s to and from every RTX-3090 VM) and OPT-350M's layer times on each GPU. For a
set of OPT-350M plans over those machines (1-4 GPUs per VM, several TP/DP/PP shapes) this
prints each term of the simulator's prediction (CostModel through simulate(), DeepSpeed's
runtime as the artifact's runs had it) beside the same term computed here by hand from the
artifact's raw files, so a difference points at one modelling choice:

- compute: forward + backward of one micro-batch through the stage's layers on its slowest
  replica (profile.json, micro-batch and TP of the plan);
- update: the profile's optimizer-step column added up over the stage's layers (each
  entry is one layer's step: profiles/sailor.py);
- p2p: one copy of the boundary activation (llm_info.json act_output of the stage's last
  layer, 16-bit, x micro-batch), sent as TP parts of 1/TP at once, at the rate of the het
  fit measured from the sender's VM (GPU type, GPUs per VM) to the receiver's, times the
  sender's share of its VM (its GPUs of the VM's GPUs: the VM's other GPUs send at the same
  time), or times the number of VMs a TP group spread over 1-GPU VMs sends from;
- all-reduce: a ring over the stage's replicas, 2 (n - 1) / n x the gradient bytes of one
  TP rank (llm_info params, 16-bit; every TP rank runs its own ring) per bucket of 5e8
  elements of that rank (DeepSpeed counts its bucket in elements) at
  the slowest ring edge: the het
  fit between two VMs, or the intra-node fit when both replicas share a VM (replicas of
  one pool fill its VMs in order, as the plan importer assumes); NCCL's ring or tree and
  latencies are left out here (they are microseconds against these links);
- iteration: 1F1B with blocking sends (each boundary paid twice per cycle), then the
  slowest stage's all-reduce + update.

    python benchmarks/simulator_terms.py [--artifact DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from sailplan.planner.catalog import default_catalog
from sailplan.planner.profiles.estimate import complete_profiles
from sailplan.planner.profiles.sailor import import_artifact, plan_from_sailor
from sailplan.planner.simulator import (
    DEEPSPEED_PIPELINE_CONSTANTS,
    PlanningContext,
    simulate,
)

ARTIFACT = Path(__file__).resolve().parents[2] / "shared" / "reference" / "sailor-artifact"
ZONE = "us-central1-a"
# DeepSpeed's PipelineEngine, as the artifact's runs trained (blocking, partitioned sends)
RUNTIME = DEEPSPEED_PIPELINE_CONSTANTS
HALF = 2
# DeepSpeed's gradient bucket, counted in elements per rank (MEMORY_OPT_ALLREDUCE_SIZE)
BUCKET_BYTES = 5e8 * HALF

Replicas = list[tuple[str, int, int]]  # (GPU as the artifact names it, GPUs per VM, TP)


def sailor_plan(stages: list[tuple[range, Replicas]], mbs: int, gbs: int) -> dict[str, Any]:
    return {
        "pipeline_list": [
            {
                "num_stages": len(stages),
                "layers_per_stage": [list(layers) for layers, _ in stages],
                "tmp_per_stage": [
                    [[[[gpu, per_vm, ZONE]], tp] for gpu, per_vm, tp in replicas]
                    for _, replicas in stages
                ],
                "dp": [len(replicas) for _, replicas in stages],
            }
        ],
        "mbs": mbs,
        "gbs": gbs,
    }


T, R2080, R3090 = "Titan-RTX", "RTX-2080", "RTX-3090"
PLANS: dict[str, dict[str, Any]] = {
    "Titan>2080 x1": sailor_plan(
        [(range(13), [(T, 1, 1)]), (range(13, 26), [(R2080, 1, 1)])], 2, 32
    ),
    "Titan x2 DP2": sailor_plan([(range(26), [(T, 2, 1), (T, 2, 1)])], 2, 32),
    "Titan+3090 DP2": sailor_plan([(range(26), [(T, 1, 1), (R3090, 1, 1)])], 2, 32),
    "3090 x2 DP4": sailor_plan([(range(26), [(R3090, 2, 1)] * 4)], 1, 32),
    "Titan x4 TP4": sailor_plan([(range(26), [(T, 4, 4)])], 4, 64),
    "Titan x1 TP2 DP2": sailor_plan([(range(26), [(T, 1, 2), (T, 1, 2)])], 2, 32),
    "3090 x1 TP2>Titan": sailor_plan(
        [(range(13), [(R3090, 1, 2)]), (range(13, 26), [(T, 1, 2)])], 2, 32
    ),
    "2080>3090 TP2": sailor_plan(
        [(range(13), [(R2080, 2, 2)]), (range(13, 26), [(R3090, 2, 2)])], 2, 32
    ),
    "T>2080>3090 DP2": sailor_plan(
        [
            (range(9), [(T, 2, 1), (T, 2, 1)]),
            (range(9, 18), [(R2080, 2, 1), (R2080, 2, 1)]),
            (range(18, 26), [(R3090, 2, 1), (R3090, 2, 1)]),
        ],
        2,
        64,
    ),
}


class ByHand:
    """The terms from the artifact's raw JSON files, independent of the importer."""

    def __init__(self, root: Path) -> None:
        def read(*parts: str) -> Any:
            return json.loads(root.joinpath(*parts).read_text())

        self.profiles = {
            g: read("profiles", "OPT-350", g, "profile.json") for g in (T, R2080, R3090)
        }
        self.info = read("models", "llm_info.json")["OPT-350"]
        self.het = read("network", "multizone_bandwidths_het.json")
        self.intra = read("network", "intra_node_bandwidths.json")

    @staticmethod
    def rate(entry: Any, nbytes: float) -> float:
        (c0, c1, c2), top = entry
        x = math.log2(nbytes / 1e6)
        return float(min((c0 * x * x + c1 * x + c2) * 1e9, top))

    def link(self, a: tuple[str, int], b: tuple[str, int]) -> Any:
        return self.het[ZONE][a[0]][str(a[1])][ZONE][b[0]][str(b[1])]

    def layers(self, gpu: str, mbs: int, tp: int) -> dict[str, list[float]]:
        table: dict[str, list[float]] = self.profiles[gpu][str(mbs)][str(tp)]
        return table

    def terms(self, doc: dict[str, Any]) -> dict[str, float]:
        pipe = doc["pipeline_list"][0]
        mbs, gbs = doc["mbs"], doc["gbs"]
        stages, groups = pipe["layers_per_stage"], pipe["tmp_per_stage"]
        dp = len(groups[0])
        micro = gbs // (mbs * dp)
        compute, update, tails = [], [], []
        for layers, replicas in zip(stages, groups, strict=True):
            t = u = 0.0
            for vms, tp in replicas:
                table = self.layers(vms[0][0], mbs, tp)
                t = max(t, sum(table[str(i)][0] + table[str(i)][1] for i in layers))
                u = max(u, sum(table[str(i)][2] for i in layers))
            compute.append(t)
            update.append(u)
            tails.append(self.allreduce(layers, replicas) + u)
        links = []
        for k in range(len(stages) - 1):
            nbytes = self.info["1"][str(stages[k][-1])]["act_output_floats"] * HALF * mbs
            slowest = 0.0
            for (va, tpa), (vb, tpb) in zip(groups[k], groups[k + 1], strict=True):
                (ga, na, _), (gb, nb, _) = va[0], vb[0]
                flows = min(tpa, tpb)  # each TP rank sends its 1/TP part at once
                # the group's GPUs' share of a VM's NIC, or the NICs of all its VMs
                share = tpa / na if tpa <= na else math.ceil(tpa / na)
                rate = self.rate(self.link((ga, na), (gb, nb)), nbytes / flows) * share
                slowest = max(slowest, nbytes / rate)
            links.append(slowest)
        cycle = max(
            t + 2 * ((links[i - 1] if i else 0.0) + (links[i] if i < len(links) else 0.0))
            for i, t in enumerate(compute)
        )
        pipeline = sum(compute) + 2 * sum(links) + (micro - 1) * cycle
        slowest_tail = max(range(len(tails)), key=lambda i: tails[i])
        return {
            "compute": max(compute),
            "p2p": max(links, default=0.0),
            "allreduce": tails[slowest_tail] - update[slowest_tail],
            "update": update[slowest_tail],
            "iteration": pipeline + tails[slowest_tail],
        }

    def allreduce(self, layers: list[int], replicas: list[Any]) -> float:
        n = len(replicas)
        if n < 2:
            return 0.0
        tp = replicas[0][1]
        grads = sum(self.info["1"][str(i)]["params_floats"] for i in layers) * HALF / tp
        # replicas of one (GPU, GPUs per VM) fill VMs in order, VM-size // TP to a VM
        placed, filled = [], {}
        for vms, _ in replicas:
            gpu, per_vm, _ = vms[0]
            slot = filled.get((gpu, per_vm), 0)
            filled[(gpu, per_vm)] = slot + 1
            placed.append((gpu, per_vm, slot // max(1, per_vm // tp)))
        seconds, left = 0.0, grads
        while left > 0:
            bucket = min(left, BUCKET_BYTES)
            left -= bucket
            message = bucket / n
            slowest = math.inf
            for i in range(n):
                a, b = placed[i], placed[(i + 1) % n]
                if a == b:
                    entry = self.intra[a[0]][str(a[1])]
                else:
                    entry = self.link((a[0], a[1]), (b[0], b[1]))
                slowest = min(slowest, self.rate(entry, message))
            seconds += 2 * (n - 1) / n * bucket / slowest
        return seconds


def ours(doc: dict[str, Any], root: Path) -> dict[str, float]:
    catalog = default_catalog()
    model = catalog.model("OPT-350M")
    run = plan_from_sailor(doc, model, catalog)
    plan = run.plan
    profiles = complete_profiles(
        model,
        sorted({w.gpu_type for w in plan.workers()}),
        sorted({s.tensor_parallel for s in plan.stages}),
        [plan.micro_batch_size],
        measured=import_artifact(root, catalog).profiles,
        catalog=catalog,
    )
    context = PlanningContext(
        model=model, cluster=run.cluster, profiles=profiles, constants=RUNTIME
    )
    predicted = simulate(plan, context)
    costs = context.costs
    links = [
        max(
            costs.boundary_seconds(
                costs.boundary_bytes(plan.micro_batch_size, b.layer_start),
                ra,
                rb,
                a.tensor_parallel,
                b.tensor_parallel,
            )
            for ra, rb in zip(a.replicas, b.replicas, strict=True)
        )
        for a, b in zip(plan.stages, plan.stages[1:], strict=False)
    ]
    return {
        "compute": max(s.forward_backward_seconds for s in predicted.stages),
        "p2p": max(links, default=0.0),
        "allreduce": predicted.allreduce_seconds,
        "update": predicted.update_seconds,
        "iteration": predicted.iteration_seconds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact", type=Path, default=ARTIFACT)
    args = parser.parse_args()
    if not (args.artifact / "network" / "multizone_bandwidths_het.json").exists():
        print(f"skipped: the Sailor artifact is not at {args.artifact}", file=sys.stderr)
        return 0
    hand = ByHand(args.artifact)
    terms = ("compute", "p2p", "allreduce", "update", "iteration")
    print("seconds, simulator / by hand")
    header = f"{'plan':<17}" + "".join(f"{t:>17}" for t in terms) + f"{'diff':>8}"
    print(header)
    print("-" * len(header))
    worst = dict.fromkeys(terms, 0.0)
    for name, doc in PLANS.items():
        a, b = ours(doc, args.artifact), hand.terms(doc)
        for t in terms:
            if b[t] > 0:
                worst[t] = max(worst[t], abs(a[t] - b[t]) / b[t])
        cells = "".join(f"{f'{a[t]:.3f}/{b[t]:.3f}':>17}" for t in terms)
        diff = 100 * (a["iteration"] - b["iteration"]) / b["iteration"]
        print(f"{name:<17}{cells}{diff:>+7.1f}%")
    print("largest difference: " + ", ".join(f"{t} {100 * worst[t]:.1f}%" for t in terms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
