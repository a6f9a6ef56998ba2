"""core.nn.compile_boundary: the functions that run eagerly under torch.compile (the encoder's token gathering, the
diagnostics stash, the object sizes) are disabled for dynamo only when something compiles, so no entry point
imports torch._dynamo at start-up (about a second of every evaluate.py / pretrain*.py process), and compiling
still breaks the graph exactly there."""

import os
import subprocess
import sys

import torch

from core.nn import apply_compile_boundaries, compile_boundary, compile_module
from models.variants import views_ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_no_entry_point_imports_dynamo_at_start_up():
    code = (
        "import sys, evaluate, pretrain, pretrain_encoder, run_jobs, experiments.science.cli;"
        "print('torch._dynamo' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


def test_marked_functions_run_eagerly_and_are_disabled_once_something_compiles():
    calls = []

    class Box(torch.nn.Module):
        @compile_boundary
        def gather(self, x):
            calls.append(torch.compiler.is_compiling())
            return x[x > 0].sum().view(1)  # a data-dependent shape

        def forward(self, x):
            return self.gather(x) * 2

    @compile_boundary
    def sizes(x):
        calls.append(torch.compiler.is_compiling())
        return x.nonzero().shape[0] + x

    x = torch.tensor([1.0, -2.0, 3.0])
    assert Box()(x).item() == 8.0 and sizes(x).tolist() == [4.0, 1.0, 6.0] and calls == [False, False]
    compiled = compile_module(Box(), backend="eager")
    assert compiled(x).item() == 8.0
    assert getattr(Box.gather.__compile_slot__[0], "_torchdynamo_disable", False)
    assert torch.compile(lambda t: sizes(t) * 2, backend="eager")(x).tolist() == [8.0, 2.0, 12.0]
    assert calls[2:] == [False, False]  # the marked functions ran outside the graph both times
    before = apply_compile_boundaries()
    assert apply_compile_boundaries() == before  # idempotent: nothing is wrapped twice
    inner = Box.gather.__compile_slot__[0]._torchdynamo_orig_callable
    assert not getattr(inner, "_torchdynamo_disable", False)  # disabled once, not a disabled disabled function


def test_the_object_sizes_compile_as_a_directly_disabled_function_does():
    """Under compile, the marked object_sizes gives the graphs, breaks and ops that torch.compiler.disable on the
    same function gives (what the decorator was before), and the eager values."""
    apply_compile_boundaries()
    tokens = torch.tensor([[2, 2, 3, 0], [2, 3, 3, 1]])
    direct = torch.compiler.disable(views_ops.object_sizes.__compile_slot__[0]._torchdynamo_orig_callable)
    shape = []
    for f in (views_ops.object_sizes, direct):
        torch._dynamo.reset()
        e = torch._dynamo.explain(lambda t, f=f: f(t, 2) + 1)(tokens)
        shape.append((e.graph_count, e.graph_break_count, e.op_count))
        compiled = torch.compile(lambda t, f=f: f(t, 2) + 1, backend="eager")
        torch.testing.assert_close(compiled(tokens), views_ops.object_sizes(tokens, 2) + 1)
    assert shape[0] == shape[1], shape
