#!/usr/bin/env python3
"""kernel-align vs ONNX Runtime and OpenVINO on CPU, forward ops, in one process.

    .venv/bin/pip install -r bench/requirements-peers.txt   # the peers (pinned there)
    .venv/bin/python bench/compare_peers.py [--quick] [--shapes ...] [--dtypes ...]
        [--threads ...] [--ops ...] [--no-compile] [--allocators A ...] [--json F] [--csv F]

Forward only: the peers are inference runtimes (they have no backward). The ops, with the
shapes, inputs and tables of compare_torch.py (B = 1, H = 24, D = 128, 256 text tokens;
inputs uniform in [-2, 2], weights in [0.5, 1.5], fixed seed) and the C++ benchmark's bytes:
  qk_rmsnorm_fwd       diffusers' weighted RMSNorm per head of q, image-q weight:
                       y = (x.float() * rsqrt(mean(x^2, -1) + eps)).to(w.dtype) * w
  multi_axis_rope_fwd  interleaved pairs (x[2i], x[2i+1]) of q, BSHD [1, S, 24, 128], per-token
                       fp32 cos/sin [S, 64] from kernel_align.rope_tables of
                       kernel_align.qwen_image_rope_positions (diffusers' positions)
  qk_norm_rope_fwd     the fused op on q and k: text rows normalised with the text weight,
                       image rows with the image weight, then RoPE

Implementations, timed in this process with torch's, kernel-align's and the peers' thread
counts all set to the same number:
  ka           our op through torch.ops.kernel_align with no allocation per call: in place
               (multi_axis_rope_, qk_norm_rope_), or into an output allocated once
               (qk_rmsnorm_out, out=)
  ka_new       the functional op, a new output each call
  compile      torch.compile of compare_torch.py's formulas, for reference (rotate-half RoPE:
               the same bytes and flops; its output is not checked here)
  compile_casts  the same with inductor's emulate_precision_casts: by default inductor
               drops the norm's cast of x * rstd to the weight's dtype (one rounding fewer
               than the formula); with it, it rounds where the formula does
  memcpy       torch's dst.copy_(src) of bytes/2 into bytes/2: the op's traffic
  ort_contrib  ONNX Runtime's CPUExecutionProvider on the "contrib" graph below, IOBinding of
               our inputs and of preallocated outputs (its best case)
  ort_alloc    the same, with outputs that ONNX Runtime allocates each call (from its arena)
  ort_primitive, ov_contrib, ov_primitive: ONNX Runtime on the "primitive" graph, OpenVINO
               on both (openvino.Core().read_model of the same ONNX file, compile_model on
               CPU, one infer request with our tensors set as its inputs and outputs)
"ours" is the faster of ka and ka_new (both are our ops and give the same bytes).

ONNX graphs (onnx.helper; ONNX opset ONNX_OPSET, com.microsoft version MS_OPSET):
  contrib    RMSNorm as SimplifiedLayerNormalization (axis -1, epsilon, scale = w): ONNX
             Runtime computes x / sqrt(mean(x^2) + eps) * w in fp32 and rounds once at the
             end, where diffusers rounds twice (x * rstd to w's dtype, then the product);
             OpenVINO's importer splits it into the ops with that first rounding. RoPE as
             com.microsoft RotaryEmbedding (interleaved=1, num_heads=24, cos_cache and
             sin_cache [S, 64], position_ids = arange(S) as a graph input) on its 3-D input
             [1, S, H*D], a view of BSHD; its 4-D input is BHSD and would need a transpose.
             The caches are in the activation's dtype (the operator's type constraint), so
             bf16/fp16 RoPE rotates by tables rounded to that dtype. The fused op, per
             stream: Slice the text and image rows, a norm each, Concat, RoPE.
  primitive  the formulas in standard ONNX ops, in fp32 between Casts, rounding where
             diffusers rounds: Cast, Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Cast to
             the dtype and back, Mul by w, Cast; RoPE: Reshape to pairs [1, S, H, 64, 2],
             Split, Mul/Sub/Add with the fp32 tables, Concat, Reshape, Cast. The variant for
             what a runtime cannot run as contrib ops (ONNX Runtime's bf16 RoPE).
OpenVINO runs with INFERENCE_PRECISION_HINT f32 (its default on a CPU with AVX-512 bf16 is
bf16: fp32 graphs would be computed in bf16), PERFORMANCE_HINT LATENCY and
INFERENCE_NUM_THREADS; ONNX Runtime with intra_op_num_threads, inter_op 1, sequential
execution, every graph optimisation.

Output checks, before timing: each peer (and ka, ka_new) runs once and its output is
compared with the formula evaluated in fp64 and rounded to the dtype where diffusers
rounds. One rounding's tolerance per element is the contract class's atol + rtol * m
(tests/python/formulas.py TOLERANCE, from reference-facts.md: reduction_forward for the
norms, elementwise for RoPE; m the largest |reference| of the row, since RoPE's a*c - b*s
cancels far below the error of its operands); an output passes within ROUNDINGS[op] of
them (diffusers' roundings to the dtype: norm 2, RoPE 1, fused 3). One that does not is
"wrong output" with its error and is not timed; a graph a runtime cannot build or run is
"n/a" with the reason.

Timing: ROUNDS rounds over the implementations in turn, each compare_torch.time_ms (the
median of repeated calls after a warm-up); a time is the median of its rounds. GB/s = the
C++ benchmark's bytes (inputs read once, outputs written once, tables, weights) / time.
Each allocator setting of --allocators (compare_torch.ALLOCATORS; default: glibc's
defaults and the tuned heap, compare_torch.TUNED_GLIBC) is a child process of this script,
and a row of each table (column "allocator"). Ratios are the other time / ours
(> 1: ours faster); ours/memcpy = memcpy time / our time (1.0: memcpy speed). Target (the
issue's): ours ahead of each peer's fastest correct variant.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "python"))
import compare_torch as ct  # noqa: E402
import summarize  # noqa: E402

OPS = ["qk_rmsnorm_fwd", "multi_axis_rope_fwd", "qk_norm_rope_fwd"]
IN_PLACE_OPS = {"multi_axis_rope_fwd", "qk_norm_rope_fwd"}  # ops with an in-place variant
NO_ALLOCATION_OPS = IN_PLACE_OPS | {"qk_rmsnorm_fwd"}  # in place or out=
VARIANTS = ["contrib", "primitive"]
PEERS = {"ort": "ONNX Runtime", "ov": "OpenVINO"}
# Timed in this order in every round; ka_new only where ka is the in-place variant.
COMPILED = list(ct.COMPILE_OPTIONS)  # torch.compile of compare_torch.py's formulas
IMPLS = ["ka", "ka_new", *COMPILED, "memcpy", "ort_contrib", "ort_alloc", "ort_primitive",
         "ov_contrib", "ov_primitive"]
ONNX_OPSET = 17  # ReduceMean's axes are an attribute up to opset 17
MS_OPSET = 1  # com.microsoft RotaryEmbedding
# The seed contract's tolerance class of each op (reference-facts.md; formulas.TOLERANCE),
# and the roundings to the dtype in diffusers' formula: x * rstd and the weight's product;
# the rotation; both of the norm's and the rotation.
TOLERANCE_CLASS = {"qk_rmsnorm_fwd": "reduction_forward", "multi_axis_rope_fwd": "elementwise",
                   "qk_norm_rope_fwd": "reduction_forward"}
ROUNDINGS = {"qk_rmsnorm_fwd": 2, "multi_axis_rope_fwd": 1, "qk_norm_rope_fwd": 3}
ROUNDS = 5
TIMING = (5, 20, 0.4)  # per round: compare_torch.time_ms's min reps, max reps, budget (s)
QUICK_ROUNDS = 1
QUICK_TIMING = (3, 5, 0.2)
QUICK_DEFAULTS = dict(shapes=["t2i_1024x1024"], dtypes=["fp16"], threads=[1])
FULL_DEFAULTS = dict(dtypes=ct.DTYPES, threads=[1, 2])  # shapes: all


# ---------------------------------------------------------------------------------------
# The formulas in fp64, rounded where diffusers rounds (the oracle of the output checks)

def norm64(x, w):
    import torch
    xd = x.double()
    n = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + ct.EPS)
    return (n.to(w.dtype).double() * w.double()).to(x.dtype)


def rope64(x, cos, sin):
    """Interleaved pairs of BSHD x rotated by fp32 tables [S, D/2]."""
    import torch
    xd = x.double()
    c, s = cos.double()[None, :, None, :], sin.double()[None, :, None, :]
    a, b = xd[..., 0::2], xd[..., 1::2]
    return torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2).to(x.dtype)


def norm_rope64(x, text_w, image_w, cos, sin, text_len):
    import torch
    normed = torch.cat((norm64(x[:, :text_len], text_w), norm64(x[:, text_len:], image_w)), 1)
    return rope64(normed, cos, sin)


def reference(op, t, text_len):
    """The op's outputs in the inputs' dtype, from the fp64 formulas."""
    if op == "qk_rmsnorm_fwd":
        return (norm64(t.q, t.weights[2]),)
    if op == "multi_axis_rope_fwd":
        return (rope64(t.q, t.cos, t.sin),)
    wtq, wtk, wiq, wik = t.weights
    return (norm_rope64(t.q, wtq, wiq, t.cos, t.sin, text_len),
            norm_rope64(t.k, wtk, wik, t.cos, t.sin, text_len))


def ulp_of(scale, dtype):
    """ulp in dtype (a torch float dtype) of the fp64 magnitudes scale."""
    import torch
    bits = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}[dtype]
    _, exponent = torch.frexp(scale)  # scale = f * 2^exponent, 0.5 <= f < 1
    return torch.ldexp(torch.ones_like(scale), exponent - 1 - bits)


def torch_of(value):
    """An ONNX Runtime OrtValue's data as a torch tensor sharing it (numpy has no bf16)."""
    import ctypes
    import torch
    dtype = {"tensor(float)": torch.float32, "tensor(bfloat16)": torch.bfloat16,
             "tensor(float16)": torch.float16}[value.data_type()]
    size = math.prod(value.shape()) * dtype.itemsize
    data = (ctypes.c_char * size).from_address(value.data_ptr())
    return torch.frombuffer(data, dtype=dtype).view(value.shape())


def largest(errors):
    """The largest of a tensor of errors, inf where one is NaN (so that it fails a check)."""
    import torch
    return torch.nan_to_num(errors.max(), nan=math.inf).item()


def check(op, outputs, expected, ours):
    """Compare outputs (torch tensors or ONNX Runtime OrtValues) with the reference (the
    acceptance test) and with ours (reported).

    Per element, one rounding's tolerance is the contract class's atol + rtol * m (m: the
    largest |reference| of the row, since RoPE's a*c - b*s cancels to values far below
    the error of its operands); an output passes within ROUNDINGS[op] of them."""
    import formulas
    import torch
    atol, rtol = formulas.TOLERANCE[TOLERANCE_CLASS[op]][expected[0].dtype]
    units = ulps = ulps_ours = err = 0.0
    for out, ref, mine in zip(outputs, expected, ours):
        out = (out if isinstance(out, torch.Tensor) else torch_of(out)).reshape(ref.shape)
        diff = (out.double() - ref.double()).abs()
        scale = ref.double().abs().amax(-1, keepdim=True)  # the row's largest |value|
        ulp = ulp_of(scale, ref.dtype)
        units = max(units, largest(diff / (atol + rtol * scale)))
        ulps = max(ulps, largest(diff / ulp))
        ulps_ours = max(ulps_ours, largest((out.double() - mine.double()).abs() / ulp))
        err = max(err, largest(diff))
    return dict(ok=units <= ROUNDINGS[op], max_abs_err=err, tolerance_units=units,
                max_ulp=ulps, max_ulp_vs_ka=ulps_ours, atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------------------
# ONNX graphs

class Graph:
    """Nodes and constants of one ONNX graph, built in order; names are generated."""

    def __init__(self):
        self.nodes, self.constants, self.count = [], [], 0

    def name(self):
        self.count += 1
        return f"t{self.count}"

    def const(self, array):
        from onnx import numpy_helper
        name = self.name()
        self.constants.append(numpy_helper.from_array(array, name))
        return name

    def node(self, op_type, inputs, domain="", outputs=1, **attributes):
        from onnx import helper
        names = [self.name() for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, domain=domain, **attributes))
        return names[0] if outputs == 1 else names

    def rename(self, produced, name):
        """Give the value `produced` (a node's output) the name `name` (a graph output's)."""
        for node in self.nodes:
            node.output[:] = [name if o == produced else o for o in node.output]


def onnx_type(dtype):
    """The ONNX element type of a torch dtype."""
    import torch
    from onnx import TensorProto
    return {torch.float32: TensorProto.FLOAT, torch.bfloat16: TensorProto.BFLOAT16,
            torch.float16: TensorProto.FLOAT16, torch.int64: TensorProto.INT64}[dtype]


def numpy_of(tensor):
    """A numpy array of a CPU torch tensor's values, bf16 as ml_dtypes.bfloat16 (onnx's)."""
    import ml_dtypes
    import torch
    if tensor.dtype == torch.bfloat16:
        return tensor.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.contiguous().numpy()


def norm_nodes(g, x, weight, variant):
    """RMSNorm over the last dim of x (in weight's dtype) with weight (a torch tensor)."""
    import numpy as np
    import torch
    if variant == "contrib":
        return g.node("SimplifiedLayerNormalization", [x, g.const(numpy_of(weight))],
                      axis=-1, epsilon=ct.EPS)
    narrow = weight.dtype != torch.float32
    fp32 = onnx_type(torch.float32)
    xf = g.node("Cast", [x], to=fp32) if narrow else x
    mean = g.node("ReduceMean", [g.node("Pow", [xf, g.const(np.array(2.0, np.float32))])],
                  axes=[-1], keepdims=1)
    eps = g.const(np.array(ct.EPS, np.float32))
    rstd = g.node("Reciprocal", [g.node("Sqrt", [g.node("Add", [mean, eps])])])
    normed = g.node("Mul", [xf, rstd])
    if narrow:  # diffusers' first rounding: x * rstd to the weight's dtype
        normed = g.node("Cast", [g.node("Cast", [normed], to=onnx_type(weight.dtype))], to=fp32)
    y = g.node("Mul", [normed, g.const(weight.float().numpy())])
    return g.node("Cast", [y], to=onnx_type(weight.dtype)) if narrow else y


def rope_nodes(g, x, positions, cos, sin, variant, dtype, heads):
    """Interleaved RoPE of x [1, S, H*D] (in dtype, H = heads) by fp32 tables [S, D/2];
    [1, S, H*D]."""
    import numpy as np
    import torch
    seq, half = cos.shape
    if variant == "contrib":  # the caches in x's dtype: the operator's type constraint
        return g.node("RotaryEmbedding", [x, positions, g.const(numpy_of(cos.to(dtype))),
                                          g.const(numpy_of(sin.to(dtype)))],
                      domain="com.microsoft", interleaved=1, num_heads=heads)
    narrow = dtype != torch.float32
    xf = g.node("Cast", [x], to=onnx_type(torch.float32)) if narrow else x
    pairs = g.node("Reshape", [xf, g.const(np.array([1, seq, -1, half, 2], np.int64))])
    a, b = g.node("Split", [pairs], outputs=2, axis=-1)
    c = g.const(cos.numpy().reshape(1, seq, 1, half, 1))
    s = g.const(sin.numpy().reshape(1, seq, 1, half, 1))
    ra = g.node("Sub", [g.node("Mul", [a, c]), g.node("Mul", [b, s])])
    rb = g.node("Add", [g.node("Mul", [a, s]), g.node("Mul", [b, c])])
    y = g.node("Reshape", [g.node("Concat", [ra, rb], axis=-1),
                           g.const(np.array([1, seq, -1], np.int64))])
    return g.node("Cast", [y], to=onnx_type(dtype)) if narrow else y


def io_tensors(op, variant, t):
    """The graph's inputs (t's tensors) and new outputs, named, in the graph's shapes:
    x [1, S, H, D] -> y [1, S, H, D] for the norm; x [1, S, H*D] -> y [1, S, H*D] for RoPE
    (the 3-D form of RotaryEmbedding); q, k [1, S, H, D] -> q_out, k_out [1, S, H*D] for
    the fused op: all views of BSHD tensors (no copies). RotaryEmbedding's position_ids
    (arange(S), int64 [1, S]) are an input as in a model's graph: OpenVINO fuses the
    operator into its RoPE kernel only then (with them a constant, it folds the gathers
    of the caches and runs the decomposed graph, about 40% slower)."""
    import torch
    _, seq, heads, dim = t.q.shape
    flat = (1, seq, heads * dim)
    if op == "qk_rmsnorm_fwd":
        inputs, shape = {"x": t.q}, t.q.shape
    elif op == "multi_axis_rope_fwd":
        inputs, shape = {"x": t.q.view(flat)}, flat
    else:
        inputs, shape = {"q": t.q, "k": t.k}, flat
    names = ["y"] if len(inputs) == 1 else ["q_out", "k_out"]
    if variant == "contrib" and op != "qk_rmsnorm_fwd":
        inputs["position_ids"] = torch.arange(seq)[None, :]
    return dict(inputs=inputs, outputs={n: torch.empty_like(t.q).view(shape) for n in names})


def onnx_model(op, variant, t, text_len, io):
    """The ONNX model of op on t's dtype, with t's weights and tables as constants and
    io's (io_tensors) names and shapes as its inputs and outputs."""
    import numpy as np
    from onnx import helper
    g = Graph()
    _, seq, heads, dim = t.q.shape
    if op == "qk_rmsnorm_fwd":
        outputs = {"y": norm_nodes(g, "x", t.weights[2], variant)}
    elif op == "multi_axis_rope_fwd":
        outputs = {"y": rope_nodes(g, "x", "position_ids", t.cos, t.sin, variant, t.q.dtype,
                                   heads)}
    else:
        outputs = {}
        one = g.const(np.array([1], np.int64))
        text, end = g.const(np.array([text_len], np.int64)), g.const(np.array([seq], np.int64))
        for stream, text_w, image_w in (("q", t.weights[0], t.weights[2]),
                                        ("k", t.weights[1], t.weights[3])):
            parts = [norm_nodes(g, g.node("Slice", [stream, lo, hi, one]), w, variant)
                     for lo, hi, w in ((g.const(np.array([0], np.int64)), text, text_w),
                                       (text, end, image_w))]
            rows = g.node("Reshape", [g.node("Concat", parts, axis=1),
                                      g.const(np.array([1, seq, heads * dim], np.int64))])
            outputs[f"{stream}_out"] = rope_nodes(g, rows, "position_ids", t.cos, t.sin, variant,
                                                  t.q.dtype, heads)
    for name, produced in outputs.items():
        g.rename(produced, name)

    def info(name, tensor):
        return helper.make_tensor_value_info(name, onnx_type(tensor.dtype), list(tensor.shape))
    graph = helper.make_graph(g.nodes, f"{op}_{variant}_{str(t.q.dtype)[6:]}",
                              [info(n, x) for n, x in io["inputs"].items()],
                              [info(n, x) for n, x in io["outputs"].items()], g.constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET),
                                                   helper.make_opsetid("com.microsoft", MS_OPSET)])


# ---------------------------------------------------------------------------------------
# Running the graphs. Each runner returns a callable that runs the graph once and returns
# its outputs.

def ort_runner(model, threads, io, preallocated=True):
    """model on ONNX Runtime's CPU provider, with IOBinding of our input tensors and of
    our output tensors, or of outputs that ONNX Runtime allocates each call."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    binding = session.io_binding()  # bind_* take ONNX element types (numpy has no bf16)
    for name, x in io["inputs"].items():
        binding.bind_input(name, "cpu", 0, onnx_type(x.dtype), list(x.shape), x.data_ptr())
    for name, y in io["outputs"].items():
        if preallocated:
            binding.bind_output(name, "cpu", 0, onnx_type(y.dtype), list(y.shape), y.data_ptr())
        else:
            binding.bind_output(name, "cpu")

    def run():  # (io keeps the bound tensors alive as long as the binding)
        session.run_with_iobinding(binding)
        return list(io["outputs"].values()) if preallocated else binding.get_outputs()
    return run


def ov_runner(model, threads, io, workdir):
    """model (read from an ONNX file) on OpenVINO's CPU plugin, our tensors set as the
    infer request's inputs and outputs."""
    import onnx
    import openvino as ov
    import torch
    path = Path(workdir) / f"{model.graph.name}_{threads}.onnx"
    onnx.save(model, str(path))
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU", {
        "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    types = {torch.float32: ov.Type.f32, torch.bfloat16: ov.Type.bf16, torch.float16: ov.Type.f16,
             torch.int64: ov.Type.i64}
    for name, x in {**io["inputs"], **io["outputs"]}.items():
        array = x.view(torch.int16).numpy() if x.dtype == torch.bfloat16 else x.numpy()
        request.set_tensor(name, ov.Tensor(array, list(x.shape), types[x.dtype]))  # shares x

    def run():  # (io keeps the tensors alive as long as the request)
        request.infer(share_inputs=True, share_outputs=True)  # no copies of the results
        return list(io["outputs"].values())
    return run


# ---------------------------------------------------------------------------------------
# Cases: what each implementation runs for one (op, dtype, shape, threads)

def op_bytes(op, t):
    """The C++ benchmark's bytes (bench/kernel_align_bench.cpp op_bytes)."""
    tensor = t.q.numel() * t.q.element_size()
    weight = t.weights[0].numel() * t.weights[0].element_size()
    tables = 2 * t.cos.numel() * 4
    return {"qk_rmsnorm_fwd": 2 * tensor + weight, "multi_axis_rope_fwd": 2 * tensor + tables,
            "qk_norm_rope_fwd": 4 * tensor + 4 * weight + tables}[op]


def ours(op, t, text_len, in_place):
    """Our raw op, returning its outputs: in place on copies of the inputs (the ops
    with an in-place variant), into an output allocated once (qk_rmsnorm's out=), or
    into new outputs (in_place False). The in-place call carries
    `restore`, which copies the inputs back into its buffers: timed without it, the
    fused op normalised its own output over and over, and after about a hundred calls
    12% of the fp32 elements were subnormal and a call took 15-20x as long (docs/
    performance.md, "Results of 2026-12-03")."""
    import torch
    ops = torch.ops.kernel_align
    fused = (*t.weights, t.cos, t.sin, text_len, ct.EPS, "diffusers", "interleaved", "bshd")
    if in_place and op == "qk_rmsnorm_fwd":
        y = torch.empty_like(t.q)

        def run_out():
            ops.qk_rmsnorm_out(t.q, t.weights[2], ct.EPS, "diffusers", y)
            return [y]
        return run_out
    if in_place:
        sources = (t.q,) if op == "multi_axis_rope_fwd" else (t.q, t.k)
        buffers = [source.clone() for source in sources]

        def run():
            if op == "multi_axis_rope_fwd":
                ops.multi_axis_rope_(*buffers, t.cos, t.sin, "interleaved", "bshd")
            else:
                ops.qk_norm_rope_(*buffers, *fused)
            return buffers

        def restore():
            for buffer, source in zip(buffers, sources, strict=True):
                buffer.copy_(source)
        run.restore = restore
        return run
    calls = {
        "qk_rmsnorm_fwd": lambda: [ops.qk_rmsnorm(t.q, t.weights[2], ct.EPS, "diffusers", None)],
        "multi_axis_rope_fwd": lambda: [ops.multi_axis_rope(t.q, t.cos, t.sin, "interleaved", "bshd")],
        "qk_norm_rope_fwd": lambda: list(ops.qk_norm_rope(t.q, t.k, *fused, None)),
    }
    return calls[op]


def build_cases(op, t, threads, text_len, impls, workdir, expected, our_outputs):
    """impl -> callable to time, or a string saying why it is not timed ("n/a: ...",
    "wrong output: ..."); and the output checks, impl -> check()."""
    import torch
    cases, checks = {}, {}

    def checked(impl, run):
        checks[impl] = c = check(op, run(), expected, our_outputs)
        if c["ok"]:
            return run
        return (f"wrong output: max error {c['max_abs_err']:.3g} = {c['tolerance_units']:.2f} "
                f"x (atol {c['atol']} + rtol {c['rtol']} * row max) > {ROUNDINGS[op]}")

    for impl in impls:
        if impl == "ka":
            cases[impl] = checked(impl, ours(op, t, text_len, in_place=op in NO_ALLOCATION_OPS))
        elif impl == "ka_new" and op in NO_ALLOCATION_OPS:
            cases[impl] = checked(impl, ours(op, t, text_len, in_place=False))
        elif impl in COMPILED:
            cases[impl] = ct.case_builders([impl], compile_now=True)[impl](op, t)
        elif impl == "memcpy":
            src = torch.empty(op_bytes(op, t) // 2, dtype=torch.uint8).random_()
            dst = torch.empty_like(src)
            cases[impl] = lambda: dst.copy_(src)
        elif impl.startswith(tuple(PEERS)):
            peer, variant = impl.split("_")
            graph = "contrib" if variant == "alloc" else variant
            try:
                io = io_tensors(op, graph, t)
                model = onnx_model(op, graph, t, text_len, io)
                run = (ov_runner(model, threads, io, workdir) if peer == "ov" else
                       ort_runner(model, threads, io, preallocated=variant != "alloc"))
                cases[impl] = checked(impl, run)
            except Exception as e:  # a runtime that cannot build or run the graph
                cases[impl] = "n/a: " + " ".join(str(e).split())[:160]
    return cases, checks


# ---------------------------------------------------------------------------------------
# Measuring, printing

def measure(args):
    import torch
    import kernel_align as ka
    torch.manual_seed(0)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    rounds, timing = (QUICK_ROUNDS, QUICK_TIMING) if args.quick else (ROUNDS, TIMING)
    impls = [i for i in IMPLS if not (args.no_compile and i in COMPILED)]
    rows, checks, isa = [], [], None
    with tempfile.TemporaryDirectory(prefix="ka-peers-") as workdir:
        for shape in args.shapes:
            for dtype in args.dtypes:
                t = ct.make_tensors(args.shape_of[shape], torch_dtype[dtype], ["ka"])
                for op in args.ops:
                    expected = reference(op, t, t.text_len)
                    our_outputs = ours(op, t, t.text_len, in_place=False)()
                    for threads in args.threads:
                        torch.set_num_threads(threads)
                        ka.set_num_threads(threads)
                        t0 = time.perf_counter()
                        cases, op_checks = build_cases(op, t, threads, t.text_len, impls,
                                                       workdir, expected, our_outputs)
                        isa = isa or ka.last_call().isa
                        samples = {impl: [] for impl, c in cases.items() if callable(c)}
                        for _ in range(rounds):
                            for impl in samples:
                                samples[impl].append(ct.time_ms(
                                    cases[impl], *timing,
                                    before=getattr(cases[impl], "restore", None))[0])
                        row = dict(op=op, dtype=dtype, shape=shape, threads=threads,
                                   bytes=op_bytes(op, t))
                        for impl in IMPLS:  # "-": not built (not asked for, or no such variant)
                            case = cases.get(impl, "-")
                            ms = statistics.median(samples[impl]) if impl in samples else math.nan
                            row[f"{impl}_ms"] = ms
                            row[f"{impl}_gbps"] = row["bytes"] / ms * 1e-6
                            row[f"{impl}_status"] = "ok" if callable(case) else case
                        judge(row)
                        rows.append(row)
                        checks += [dict(op=op, dtype=dtype, shape=shape, threads=threads, impl=i, **c)
                                   for i, c in op_checks.items()]
                        print(f"compare_peers: {op} {dtype} {shape} t={threads}: "
                              + ", ".join(f"{i} {row[f'{i}_ms']:.2f}" for i in samples)
                              + f" ms ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
                        del cases
                    del expected, our_outputs
                del t
    return rows, checks, isa


def judge(row):
    """Ratios to ours (the faster of ka and ka_new: both are our ops, giving the same
    bytes), and the issue's target: ours ahead of each peer's fastest correct variant."""
    ours_ms = min(row["ka_ms"], row["ka_new_ms"]) if row["ka_new_status"] == "ok" else row["ka_ms"]
    row["ours_ms"] = ours_ms
    row["ours_over_memcpy"] = row["memcpy_ms"] / ours_ms
    for impl in COMPILED + [f"{p}_{v}" for p in PEERS for v in VARIANTS]:
        row[f"{impl}_over_ours"] = row[f"{impl}_ms"] / ours_ms
    verdicts, ahead = [], True
    for peer, label in PEERS.items():
        times = [row[f"{peer}_{v}_ms"] for v in VARIANTS if row[f"{peer}_{v}_status"] == "ok"]
        if not times:
            verdicts.append(f"{label} n/a")
            continue
        row[f"{peer}_best_over_ours"] = min(times) / ours_ms
        ahead = ahead and min(times) > ours_ms
        verdicts.append(f"{label} {min(times) / ours_ms:.2f}x")
    row["ahead_of_peers"] = ahead
    row["verdict"] = ("yes" if ahead else "NO") + " (" + ", ".join(verdicts) + ")"


def cell(row, impl):
    """ms (GB/s), or why it was not timed."""
    status = row[f"{impl}_status"]
    if status == "ok":
        return f"{row[f'{impl}_ms']:.2f} ({row[f'{impl}_gbps']:.1f})"
    return status.split(":")[0]  # "n/a", "wrong output", "-": the reasons are listed below


def print_tables(rows, checks, header):
    f = summarize.fmt
    print(header)
    print()
    print("ms (GB/s), medians. ours: the faster of ka (in place where the op has an in-place "
          "variant) and ka_new (new output). Ratios: the other time / ours (> 1: ours "
          "faster); ours/memcpy = memcpy time / our time (1.0: memcpy speed). Target: ours "
          "ahead of each peer's fastest correct variant (best peer time / ours shown).")
    print()
    shown = [i for i in IMPLS if i != "ort_alloc"]
    ratios = COMPILED + [f"{p}_{v}" for p in PEERS for v in VARIANTS]
    print("| op | dtype | shape | threads | allocator | " + " | ".join(shown) + " | ours/memcpy | "
          + " | ".join(f"{i}/ours" for i in ratios) + " | ahead of ORT and OV |")
    print("|---|---|---|---:|---|" + "---:|" * (len(shown) + 1 + len(ratios)) + "---|")
    for r in rows:
        print(f"| {r['op']} | {r['dtype']} | {r['shape']} | {r['threads']} | {r['allocator']} | "
              + " | ".join(cell(r, i) for i in shown) + f" | {f(r['ours_over_memcpy'])} | "
              + " | ".join(f(r[f'{i}_over_ours']) for i in ratios) + f" | {r['verdict']} |")
    print()
    print("ONNX Runtime, contrib graph: outputs allocated by it each call (its arena) "
          "against IOBinding into our preallocated outputs:")
    print()
    print("| op | dtype | shape | threads | allocator | IOBinding ms | allocated ms "
          "| allocated / IOBinding |")
    print("|---|---|---|---:|---|---:|---:|---:|")
    for r in rows:
        if r["ort_contrib_status"] == "ok" and r["ort_alloc_status"] == "ok":
            print(f"| {r['op']} | {r['dtype']} | {r['shape']} | {r['threads']} | {r['allocator']} | "
                  f"{f(r['ort_contrib_ms'])} | {f(r['ort_alloc_ms'])} | "
                  f"{f(r['ort_alloc_ms'] / r['ort_contrib_ms'])} |")
    print()
    print("Not timed (\"-\": not asked for, or no such variant):")
    print()
    reasons = {}
    for r in rows:
        for i in IMPLS:
            status = r[f"{i}_status"]
            if status not in ("ok", "-"):
                reasons.setdefault((i, status), []).append(f"{r['op']}/{r['dtype']}")
    for (impl, status), where in sorted(reasons.items()):
        print(f"- {impl} [{', '.join(sorted(set(where)))}]: {status}")
    if not reasons:
        print("- none")
    print()
    print("Output checks, worst over shapes and thread counts: error against the fp64 "
          "formula (rounded where diffusers rounds), in units of one rounding's tolerance "
          "(the contract class's atol + rtol * row max; passes up to the formula's "
          "roundings: norm 2, RoPE 1, fused 3) and in ulps of the row's largest value; and "
          "the distance to ka's functional op in those ulps.")
    print()
    print("| impl | op | dtype | max abs error | tolerance units (limit) | ulps of row max "
          "| ulps of row max vs ka | passed |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    worst = {}
    for c in checks:
        w = worst.setdefault((c["impl"], c["op"], c["dtype"]), dict(c))
        for k in ("max_abs_err", "tolerance_units", "max_ulp", "max_ulp_vs_ka"):
            w[k] = max(w[k], c[k])
        w["ok"] = w["ok"] and c["ok"]
    for (impl, op, dtype), c in worst.items():
        print(f"| {impl} | {op} | {dtype} | {c['max_abs_err']:.3g} | "
              f"{c['tolerance_units']:.2f} ({ROUNDINGS[op]}) | {c['max_ulp']:.1f} | "
              f"{c['max_ulp_vs_ka']:.1f} | {'yes' if c['ok'] else 'NO'} |")


def environment(isa):
    import onnx
    import onnxruntime
    import openvino
    import torch
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), commit=commit,
                cpu=cpu, cores=os.cpu_count(), ka_isa=isa, torch=torch.__version__,
                onnx=onnx.__version__, onnxruntime=onnxruntime.__version__,
                openvino=openvino.__version__)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: t2i_1024x1024, fp16, 1 thread, one round of few calls")
    ap.add_argument("--shapes", nargs="+", help="default: all (kernel-align shapes)")
    ap.add_argument("--cli", default=str(ct.DEFAULT_CLI),
                    help="the kernel-align executable, whose `shapes` lists the shapes")
    ap.add_argument("--dtypes", nargs="+", choices=ct.DTYPES, help="default: all")
    ap.add_argument("--threads", nargs="+", type=int, help="default: 1 2")
    ap.add_argument("--ops", nargs="+", default=OPS, choices=OPS)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--allocators", nargs="+", default=ct.DEFAULT_ALLOCATORS,
                    choices=list(ct.ALLOCATORS),
                    help="allocator settings (compare_torch.ALLOCATORS), a child process "
                         "each and a row each (default: default tuned)")
    ap.add_argument("--child-json", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="write the environment, rows and output checks as JSON")
    ap.add_argument("--csv", help="write the rows as CSV")
    args = ap.parse_args(argv)
    for name, value in (QUICK_DEFAULTS if args.quick else FULL_DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    ct.resolve_shapes(ap, args)

    if args.child_json:  # one allocator setting, in the environment the parent set up
        rows, checks, isa = measure(args)
        for row in rows:
            row["allocator"] = args.allocators[0]
        with open(args.child_json, "w") as fh:
            json.dump(dict(rows=rows, checks=checks, isa=isa), fh)
        return 0

    # glibc (and torch, and the extension) read their settings at start-up: a child
    # process per allocator setting, its rows side by side.
    argv = sys.argv[1:] if argv is None else list(argv)
    load_before = os.getloadavg()[0]  # the machine is shared: how busy it was
    rows, checks, isa = [], [], None
    with tempfile.TemporaryDirectory(prefix="ka-peers-alloc-") as tmp:
        for alloc in args.allocators:
            out = os.path.join(tmp, f"{alloc}.json")
            print(f"compare_peers: allocator {alloc} ({ct.ALLOCATORS[alloc] or 'as is'})",
                  file=sys.stderr, flush=True)
            # argparse keeps the last --allocators given: this child's.
            subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv,
                            "--allocators", alloc, "--child-json", out],
                           env=ct.allocator_env(alloc), check=True)
            with open(out) as fh:
                child = json.load(fh)
            rows += child["rows"]
            checks += child["checks"]
            isa = isa or child["isa"]
    info = dict(environment(isa), allocators=" ".join(args.allocators),
                load_average=f"{load_before:.1f} -> {os.getloadavg()[0]:.1f}")
    print_tables(rows, checks, "Environment: " + ", ".join(f"{k}={v}" for k, v in info.items()))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(environment=info, rows=rows, checks=checks), fh, indent=1)
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["op"])
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
