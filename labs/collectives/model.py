"""
The collectives lab's model: a loop of collectives runs at the slower of the host issuing each call and the GPUs
running it (a fixed cost plus the busiest link's bytes at the bus bandwidth, with NCCL's faster protocol); one
layer's data- and tensor-parallel steps put that beside the matmuls' time.

Pure arithmetic on the Params, the GPU's datasheet and the terms a run measured (its own rows, or the recorded run
of this GPU kind). Nothing here needs a GPU. The link for GPUs without NVLink is the transfers lab's PCIe
link (labs/transfers/model.py).
"""

from __future__ import annotations

from labs.engine.gpu import GB, Target
from labs.engine.links import links_for
from labs.engine.params import ParamError
from labs.transfers.model import link_for as pcie_link
from labs.transfers.model import recorded_rows

NAME = "collectives"
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
LAYER_STEPS = ("dp", "tp")
KIB = 1024

# The host's cost of issuing one collective from Python before a run has measured it: an order of magnitude
# (torch's bookkeeping and a kernel launch). Every live run replaces it with its own smallest message's time.
ASSUMED_HOST_US = 20.0

# The GPUs' own time for a small collective before a run has measured it (a kernel and one handshake).
ASSUMED_GPU_US = 10.0
SMALL_MESSAGE_BYTES = 64 * KIB  # a size at or below this measures the latency terms

# NCCL's two protocols here (its log: LL for small messages, Simple for large; LL128 never picked). LL writes
# every 8 bytes as 4 bytes of data and a 4-byte flag that the receiver polls, so it carries data at half the
# rate; Simple moves whole chunks at the full rate but synchronises through memory fences and costs more per
# call. A message whose loop time is at least GPU_BOUND_RATIO x the host's time per call is limited by the GPUs:
# the smallest such message, less its bytes at the bus bandwidth, gives Simple's fixed cost.
LL_DATA_SHARE = 0.5
GPU_BOUND_RATIO = 2.0
ELEMENTWISE_BYTES_PER_FF = {"forward": 10, "backward": 24}  # the MLP's SiLU, product and split, per token x d_ff


# ---------------------------------------------------------------------------------------------
# The ring and NCCL's kernels
# ---------------------------------------------------------------------------------------------
def ring_factor(op: str, n: int) -> float:
    """Bytes each GPU sends on its busiest link, as a fraction of S (the nccl-tests bus-bandwidth factors).

    all-reduce = reduce-scatter + all-gather: 2(n-1)/n; each half alone: (n-1)/n; a pipelined broadcast: 1.
    """
    if n < 1:
        raise ParamError("a collective needs at least one GPU.")
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
            "broadcast": 1.0 if n > 1 else 0.0}[op]


def collective_ms(op: str, nbytes: float, n: int, link_gbps: float, latency_us: float) -> float:
    """The textbook alpha-beta model: t = alpha + factor(op, n) x S / B."""
    return latency_us * 1e-3 + ring_factor(op, n) * nbytes / (link_gbps * 1e9) * 1e3


def bus_gbps(op: str, nbytes: float, n: int, ms: float) -> float:
    """Bus bandwidth: the rate on the busiest link that this time implies (factor x S / t)."""
    return ring_factor(op, n) * nbytes / (ms * 1e-3) / 1e9 if ms > 0 else 0.0


# NCCL moves data with its own kernels: one thread block per channel reads each chunk from memory and writes it
# into the next GPU's staging buffer (a send), or reads it from its own staging buffer and writes it to the
# output (a receive); reductions read two inputs. Bytes read plus written on one GPU, per primitive and per
# byte of the chunk (ring algorithm, Simple protocol, buffers not registered with NCCL):
PRIMITIVE_SM_BYTES = {"send": 2, "recv": 2, "copy_send": 3, "recv_copy_send": 3, "recv_reduce_send": 3,
                      "recv_reduce_copy": 3, "recv_reduce_copy_send": 4}
EXCHANGE_SM_BYTES = 4  # a send/recv exchange: each GPU sends (2) and receives (2) every byte


def ring_primitives(op: str, n: int) -> list:
    """The primitives one GPU runs per chunk of a ring collective over n GPUs (NCCL's ring kernels)."""
    middle = max(n - 2, 0)
    if op == "all_reduce":
        return ["send"] + ["recv_reduce_send"] * middle + ["recv_reduce_copy_send"] + \
            ["recv_copy_send"] * middle + ["recv"]
    if op == "all_gather":  # out of place: the GPU's own part is copied to the output as it is sent
        return ["copy_send"] + ["recv_copy_send"] * middle + ["recv"]
    if op == "reduce_scatter":
        return ["send"] + ["recv_reduce_send"] * middle + ["recv_reduce_copy"]
    if op == "broadcast":  # in place; the busiest GPU: the root sends, a middle GPU receives and forwards
        return ["recv_copy_send"] if n > 2 else ["send"]
    raise ValueError(f"unknown collective {op!r}")


def sm_bytes_per_link_byte(op: str, n: int) -> float:
    """Bytes one GPU's NCCL kernel reads and writes for every byte it sends over the link."""
    if n < 2:
        return 0.0
    steps = ring_primitives(op, n)
    sends = sum(1 for s in steps if s.endswith("send"))
    return sum(PRIMITIVE_SM_BYTES[s] for s in steps) / sends


def nccl_bus_gbps(op: str, n: int, link_gbps: float, exchange_gbps=None) -> float:
    """The bus bandwidth a collective can reach: the link, or NCCL's kernels, whichever is slower.

    NCCL's kernels move bytes through memory at the rate its send/recv exchange shows (EXCHANGE_SM_BYTES per
    byte sent); a collective whose kernel reads and writes k bytes per byte sent reaches that rate x 4 / k.
    Without a measured exchange, the link alone.
    """
    if not exchange_gbps or n < 2:
        return link_gbps
    return min(link_gbps, EXCHANGE_SM_BYTES * exchange_gbps / sm_bytes_per_link_byte(op, n))


def protocol_ms(op: str, nbytes: float, n: int, bus: float, gpu_us: float, simple_us=None) -> tuple:
    """(GPU time of one call, protocol): the busiest link's bytes at the bus bandwidth plus a fixed cost.

    With Simple's fixed cost measured, NCCL's choice between its protocols: LL (the small message's latency
    gpu_us, data at LL_DATA_SHARE of the bus bandwidth) or Simple (simple_us, the full bus bandwidth),
    whichever is faster, as NCCL's tuner picks it. Without it, one protocol: gpu_us at the full bandwidth."""
    link_bytes = ring_factor(op, n) * nbytes
    if simple_us is None:
        return gpu_us * 1e-3 + link_bytes / (bus * 1e9) * 1e3, "-"
    ll = gpu_us * 1e-3 + link_bytes / (LL_DATA_SHARE * bus * 1e9) * 1e3
    simple = simple_us * 1e-3 + link_bytes / (bus * 1e9) * 1e3
    return (ll, "LL") if ll <= simple else (simple, "Simple")


def loop_ms(op: str, nbytes: float, n: int, bus: float, host_us: float, gpu_us: float, simple_us=None) -> float:
    """One call in a loop of back-to-back calls: the slower of the host issuing it (host_us) and the GPUs
    running it (a fixed cost plus the busiest link's bytes at the bus bandwidth, protocol_ms)."""
    return max(host_us * 1e-3, protocol_ms(op, nbytes, n, bus, gpu_us, simple_us)[0])


def link_for(target: Target) -> dict:
    """B: NVLink per direction from the datasheet, else the PCIe link per direction."""
    links = links_for(target.datasheet)
    if links and links.nvlink_gbps:
        return {"link": "NVLink", "link_gbps": links.nvlink_per_direction_gbps,
                "link_source": f"datasheet: {links.source} (half of it per direction)"}
    pcie = pcie_link(target)
    return {"link": f"PCIe Gen{pcie['pcie_gen']} x{pcie['pcie_lanes']}", "link_gbps": pcie["pcie_gbps"],
            "link_source": pcie["link_source"]}


def message_bytes(size_kib: int, n: int, dtype: str) -> int:
    """The buffer the workers really use: a whole number of elements per GPU (as the worker rounds it)."""
    elem = 2 if dtype == "bf16" else 4
    return max(n, size_kib * KIB // elem // n * n) * elem


# ---------------------------------------------------------------------------------------------
# The model's terms: measured in the run (or read from a recorded run of this GPU kind), else datasheet
# ---------------------------------------------------------------------------------------------
def latencies_us(rows: list, experiment: str = "collective") -> dict:
    """Each collective's smallest message time, if small enough to be all latency, in microseconds."""
    out = {}
    for r in sorted((r for r in rows if r["experiment"] == experiment), key=lambda r: r["size_bytes"]):
        if r["op"] not in out and r["size_bytes"] <= SMALL_MESSAGE_BYTES:
            out[r["op"]] = 1e3 * r["measured_ms"]
    return out


def model_terms(rows: list, target: Target) -> dict:
    """Everything the model needs, from measured rows where they exist:

    - host_us[op]: the smallest message's time in a loop of calls (the host issues each call);
    - gpu_us[op]: the same message replayed from a CUDA graph (the GPUs' own latency);
    - link_gbps[pattern]: what the copy engines moved to the next GPU, one GPU alone ("one direction") and
      all GPUs at once ("all at once"); the datasheet's figure per direction where not measured;
    - exchange_gbps: NCCL's send/recv exchange per direction (None if not measured);
    - simple_us[op]: Simple's fixed cost, from the smallest message the GPUs clearly limit (simple_latency_us);
    - layer_host_ms[(kind, step, tokens)]: the CPU's time to issue one layer step (the worker's host_issue_ms).
    """
    sheet = link_for(target)
    peer = {r["op"]: r["measured_gbps"] for r in rows if r["experiment"] == "peer_copy" and r.get("measured_gbps")}
    exchange = [r["measured_gbps"] for r in rows if r["experiment"] == "nccl_p2p" and r.get("measured_gbps")]
    measured = bool(peer or exchange)
    terms = {
        "host_us": latencies_us(rows), "gpu_us": latencies_us(rows, "collective_gpu"),
        "link_gbps": {pattern: peer.get(pattern, sheet["link_gbps"]) for pattern in ("one direction", "all at once")},
        "exchange_gbps": max(exchange) if exchange else None,
        "layer_host_ms": {(r["experiment"], r["step"], r["tokens"]): r["host_ms"] for r in rows
                          if r["experiment"] in LAYER_STEPS and r.get("host_ms")},
        "datasheet_gbps": sheet["link_gbps"],
        "source": "the recorded run of this GPU kind" if measured
        else "the datasheet and assumed latencies (no recorded run of this GPU kind yet)",
    }
    found = {op: simple_latency_us(rows, op, terms) for op in OPS}
    return terms | {"simple_us": {op: us for op, us in found.items() if us is not None}}


def simple_latency_us(rows: list, op: str, terms: dict):
    """Simple's fixed cost for `op`, in microseconds: the smallest message whose loop time is at least
    GPU_BOUND_RATIO x the host's time per call (so the GPUs, not the host, set its pace), less its busiest
    link's bytes at the bus bandwidth. None where no such message was measured."""
    host = terms["host_us"].get(op)
    measured = sorted((r for r in rows if r["experiment"] == "collective" and r["op"] == op
                       and r["size_bytes"] > SMALL_MESSAGE_BYTES), key=lambda r: r["size_bytes"])
    if host is None or not measured:
        return None
    n = measured[0].get("gpus", 2)
    for r in measured:
        if 1e3 * r["measured_ms"] >= GPU_BOUND_RATIO * host:
            us = 1e3 * r["measured_ms"] - ring_factor(op, n) * r["size_bytes"] / (op_bus_gbps(op, n, terms) * 1e3)
            return us if us > 0 else None
    return None


def op_bus_gbps(op: str, n: int, terms: dict) -> float:
    """The bus bandwidth the model uses for `op`: a broadcast uses one direction of each link, the others
    both directions at once."""
    link = terms["link_gbps"]["one direction" if op == "broadcast" else "all at once"]
    return nccl_bus_gbps(op, n, link, terms["exchange_gbps"])


def op_ms(op: str, nbytes: float, n: int, terms: dict) -> float:
    host = terms["host_us"].get(op, ASSUMED_HOST_US)
    gpu = terms["gpu_us"].get(op, min(host, ASSUMED_GPU_US))
    return loop_ms(op, nbytes, n, op_bus_gbps(op, n, terms), host, gpu, terms.get("simple_us", {}).get(op))


def collective_row(op: str, nbytes: int, n: int, terms: dict) -> dict:
    ms = op_ms(op, nbytes, n, terms)
    host = terms["host_us"].get(op, ASSUMED_HOST_US)
    simple = terms.get("simple_us", {}).get(op)
    _, protocol = protocol_ms(op, nbytes, n, op_bus_gbps(op, n, terms),
                              terms["gpu_us"].get(op, min(host, ASSUMED_GPU_US)), simple)
    textbook = collective_ms(op, nbytes, n, terms["datasheet_gbps"], host)
    return {"experiment": "collective", "op": op, "size_bytes": nbytes, "gpus": n, "step": "-", "tokens": 0,
            "predicted_ms": ms, "predicted_busbw_gbps": bus_gbps(op, nbytes, n, ms),
            "predicted_algbw_gbps": nbytes / (ms * 1e-3) / 1e9, "model_bus_gbps": op_bus_gbps(op, n, terms),
            "model_host_us": host, "model_gpu_us": terms["gpu_us"].get(op, min(host, ASSUMED_GPU_US)),
            "model_simple_us": simple, "model_protocol": protocol,
            "sm_bytes_per_link_byte": sm_bytes_per_link_byte(op, n),
            "textbook_ms": textbook, "textbook_busbw_gbps": bus_gbps(op, nbytes, n, textbook)}


# ---------------------------------------------------------------------------------------------
# One layer over several GPUs
# ---------------------------------------------------------------------------------------------
def layer_flops(tokens: int, d: int, ff: int) -> dict:
    """Matmul FLOPs of the gated MLP: forward 3 matmuls of 2 T d ff; backward twice that (inputs and weights)."""
    forward = 6 * tokens * d * ff
    return {"forward": forward, "backward": 2 * forward}


def compute_ms(tokens: int, d: int, ff: int, shards: int, target: Target, dtype: str) -> dict:
    """Forward and backward time of one GPU's share: matmuls at the matmul ceiling, elementwise at copy speed."""
    rate = (target.ceilings.matmul_tflops.get(dtype) or target.ceilings.fma_tflops) * 1e12
    elem = 2 if dtype == "bf16" else 4
    out = {}
    for phase, flops in layer_flops(tokens, d, ff).items():
        nbytes = ELEMENTWISE_BYTES_PER_FF[phase] * tokens * ff / shards * elem / 2
        out[phase] = (flops / shards / rate + nbytes / (target.ceilings.copy_tbps * 1e12)) * 1e3
    return out


def overlap_ms(ready_ms: list, comm_ms: list) -> float:
    """When the last all-reduce ends, if each starts once its gradient is ready and the previous one is done."""
    end = 0.0
    for ready, comm in zip(ready_ms, comm_ms):
        end = max(end, ready) + comm
    return end


def dp_rows(p, tokens: int, n: int, target: Target, terms: dict) -> list:
    d, ff = p.d_model, p.d_ff
    elem = 2 if p.dtype == "bf16" else 4
    t = compute_ms(tokens, d, ff, 1, target, p.dtype)
    grads = [ff * d * elem, 2 * d * ff * elem]  # produced in this order by backward: Wdown, then [Wg | Wu]
    comm = [op_ms("all_reduce", g, n, terms) for g in grads]
    compute = t["forward"] + t["backward"]
    ready = [t["forward"] + t["backward"] / 3, compute]  # Wdown's gradient comes after its own matmuls
    times = {"compute": compute, "communication": sum(comm), "serial": compute + sum(comm),
             "overlapped": max(compute, overlap_ms(ready, comm))}
    return [layer_row("dp", step, ms, tokens, n, terms) for step, ms in times.items()]


def tp_rows(p, tokens: int, n: int, target: Target, terms: dict) -> list:
    elem = 2 if p.dtype == "bf16" else 4
    t = compute_ms(tokens, p.d_model, p.d_ff, n, target, p.dtype)
    comm = 2 * op_ms("all_reduce", tokens * p.d_model * elem, n, terms)
    compute = t["forward"] + t["backward"]
    times = {"compute": compute, "communication": comm, "serial": compute + comm}
    return [layer_row("tp", step, ms, tokens, n, terms) for step, ms in times.items()]


def layer_row(kind: str, step: str, gpu_ms: float, tokens: int, n: int, terms: dict) -> dict:
    """A loop of layer steps runs at the slower of the GPUs' work (gpu_ms) and the CPU issuing it, where a run
    measured that (layer_host_ms). The tensor-parallel step issues its all-reduces from inside autograd: on a
    2x H200 host the CPU took 1.4 ms a step that way (0.5 to 0.6 ms without them), longer than the GPUs' 1.0 ms
    at 1,024 tokens."""
    host_ms = terms.get("layer_host_ms", {}).get((kind, step, tokens))
    bound = "host" if host_ms and host_ms > gpu_ms else "GPUs"
    return {"experiment": kind, "op": "-", "size_bytes": 0, "gpus": n, "step": step, "tokens": tokens,
            "predicted_ms": max(gpu_ms, host_ms or 0.0), "model_gpu_ms": gpu_ms, "model_host_ms": host_ms,
            "model_bound": bound}


def predict_with(p, target: Target, n: int, terms: dict) -> list:
    rows = [collective_row(op, message_bytes(s, n, p.dtype), n, terms) for op in p.ops for s in sorted(p.sizes_kib)]
    for tokens in p.layer_tokens:
        if "dp" in p.layer_steps:
            rows += dp_rows(p, tokens, n, target, terms)
        if "tp" in p.layer_steps:
            rows += tp_rows(p, tokens, n, target, terms)
    return rows


def predict(p, target: Target, n: int = 0) -> list:
    """Before a run: the terms from a recorded run of this GPU kind and GPU count if there is one, else the
    datasheet's link and assumed latencies. n: the GPUs (0: p.gpus, else two, as for a datasheet GPU)."""
    n = n or p.gpus or 2
    return predict_with(p, target, n, model_terms(recorded_rows(NAME, target.key, n), target))


def lesson_numbers(target: Target) -> dict:
    link = link_for(target)
    n = 2
    terms = model_terms(recorded_rows(NAME, target.key, n), target)
    host = terms["host_us"].get("all_reduce", ASSUMED_HOST_US)
    big = collective_ms("all_reduce", GB, n, link["link_gbps"], host)
    half = host * 1e-6 * link["link_gbps"] * 1e9 / ring_factor("all_reduce", n)
    grads_7b = 7e9 * 2
    k = {op: sm_bytes_per_link_byte(op, n) for op in OPS}
    exchange = terms["exchange_gbps"]
    return {
        "gpu": target.name,
        "link": link["link"],
        "link_gbps": f"{link['link_gbps']:.0f}",
        "link_source": link["link_source"],
        "latency_us": f"{host:.0f}",
        "gpu_latency_us": f"{terms['gpu_us'].get('all_reduce', ASSUMED_GPU_US):.0f}",
        "simple_latency_us": f"{terms['simple_us']['all_reduce']:.0f}" if "all_reduce" in terms["simple_us"]
        else "(not measured yet)",
        "terms_source": terms["source"],
        "gb_allreduce_ms": f"{big:.2f}",
        "half_bw_mb": f"{half / 1e6:.1f}",
        "grads_7b_ms_2": f"{collective_ms('all_reduce', grads_7b, 2, link['link_gbps'], 0):.0f}",
        "grads_7b_ms_8": f"{collective_ms('all_reduce', grads_7b, 8, link['link_gbps'], 0):.0f}",
        "k_ar": f"{k['all_reduce']:.0f}", "k_ag": f"{k['all_gather']:.0f}", "k_rs": f"{k['reduce_scatter']:.0f}",
        "k_bc": f"{k['broadcast']:.0f}", "k_ar_8": f"{sm_bytes_per_link_byte('all_reduce', 8):.2f}",
        "copy_gbps": f"{terms['link_gbps']['all at once']:.0f}",
        "exchange_gbps": f"{exchange:.0f}" if exchange else "(not measured yet)",
        "bus_ar": f"{op_bus_gbps('all_reduce', n, terms):.0f}", "bus_ag": f"{op_bus_gbps('all_gather', n, terms):.0f}",
        "bus_bc": f"{op_bus_gbps('broadcast', n, terms):.0f}",
    }
