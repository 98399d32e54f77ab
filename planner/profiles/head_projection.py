"""Put back the output projection a measured head layer cannot have run.

A transformer's head multiplies every token's hidden state by the vocabulary matrix:
2 x vocabulary x hidden FLOPs per token (split over TP), more than a block's matmuls for
GPT-Neo-2.7B (129M against 79M parameters). When a profile's head forward is faster than
those FLOPs at the GPU's datasheet peak, the profiler timed the head without it: Sailor's
profiler times a tied model's head (GPT-Neo-2.7B, whose projection is the token embedding)
as its final norm alone, 1.4 ms at micro-batch 8 on A100-40 where the projection needs
13.5 ms at peak. The training run still computes the projection on the last stage
(DeepSpeed's tied layer), so a profile without it prices that stage short by about 1.6
blocks.

with_head_projection adds it, priced at the rate the same profile measured for its own
blocks (their matmul FLOPs per second, forward and backward apart): the same GPU, TP degree
and micro-batch size running the same kind of GEMM, no constant. Profiles whose head is
plausible (OPT's untied heads, the project's own profiler, which times the head with its
projection and loss) are returned unchanged. Called by the Sailor importer
(profiles/sailor.py); pure.
"""

from __future__ import annotations

import statistics

from sailplan.planner.catalog import GPUSpec
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.flops import layer_forward_flops
from sailplan.planner.profiles.types import ComputeProfile


def head_runs_its_projection(profile: ComputeProfile, model: ModelSpec, gpu: GPUSpec) -> bool:
    """Whether the profile's head forward is slow enough to contain the projection."""
    head = model.num_layers - 1
    if not model.is_transformer or model.layer_kind(head) != "head":
        return True
    flops = layer_forward_flops(model, head, profile.tensor_parallel, profile.micro_batch_size)
    return profile.forward_s[head] >= flops / gpu.peak_flops


def with_head_projection(profile: ComputeProfile, model: ModelSpec, gpu: GPUSpec) -> ComputeProfile:
    """`profile` with the head's projection added where the head cannot have run it."""
    if (
        profile.oom
        or len(profile.forward_s) != model.num_layers
        or head_runs_its_projection(profile, model, gpu)
    ):
        return profile
    tp, mbs = profile.tensor_parallel, profile.micro_batch_size
    blocks = [i for i in range(model.num_layers) if model.layer_kind(i).endswith("block")]
    timed = [i for i in blocks if profile.forward_s[i] > 0 and profile.backward_s[i] > 0]
    if not timed:
        return profile
    forward_rate = statistics.median(
        layer_forward_flops(model, i, tp, mbs) / profile.forward_s[i] for i in timed
    )
    backward_rate = statistics.median(
        2.0 * layer_forward_flops(model, i, tp, mbs) / profile.backward_s[i] for i in timed
    )
    head = model.num_layers - 1
    flops = layer_forward_flops(model, head, tp, mbs)
    forward = list(profile.forward_s)
    backward = list(profile.backward_s)
    forward[head] += flops / forward_rate
    backward[head] += 2.0 * flops / backward_rate
    note = "; head without its output projection: added at this profile's block rate"
    return profile.model_copy(
        update={
            "forward_s": tuple(forward),
            "backward_s": tuple(backward),
            "provenance": profile.provenance.model_copy(
                update={"note": profile.provenance.note + note}
            ),
        }
    )
