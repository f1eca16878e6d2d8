'''The code each offline strategy appends after a task's reference source.

Rules every text here keeps, because the evaluator and the report rely on them:
- it only imports torch (the candidate runs in a child process without this package);
- it never prints and never touches global precision flags (TF32, matmul precision, cudnn settings);
- it keeps no outputs between calls: every call computes from the inputs it was given;
- its private names start with `_cuda_l1_` so they cannot clash with the task's own names.
'''

from __future__ import annotations

EAGER = '''
class ModelNew(Model):
    """The reference Model unchanged: the calibration baseline (its speedup should read about 1.0)."""
'''

# torch.compile of the reference forward, bound to this instance: one compiled graph per model object,
# so two models built from different seeds never share guards or a recompilation budget.
COMPILE = '''
import torch as _cuda_l1_torch


class ModelNew(Model):
    """The reference Model with its forward compiled by torch.compile ({mode_text})."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._cuda_l1_forward = _cuda_l1_torch.compile(super().forward{mode_arg})

    def forward(self, *args, **kwargs):
        return self._cuda_l1_forward(*args, **kwargs)
'''

# Shared by the two strategies that replay CUDA graphs: a graph writes every replay's result into the
# same memory, so what the caller gets must be a copy or the next call would change it.
CLONE_OUTPUTS = '''

def _cuda_l1_clone_outputs(value):
    """A copy of every tensor in a forward result (tensor, tuple, namedtuple, list or dict)."""
    if isinstance(value, _cuda_l1_torch.Tensor):
        return value.clone()
    if isinstance(value, tuple):
        items = [_cuda_l1_clone_outputs(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, list):
        return [_cuda_l1_clone_outputs(v) for v in value]
    if isinstance(value, dict):
        return {k: _cuda_l1_clone_outputs(v) for k, v in value.items()}
    return value
'''

# mode="reduce-overhead" replays CUDA graphs owned by torch.compile. Marking a step before each call
# tells it the previous outputs are no longer read by it, and the clone keeps the caller's copy intact.
COMPILE_REDUCE_OVERHEAD = (
    '''
import torch as _cuda_l1_torch
'''
    + CLONE_OUTPUTS
    + '''

class ModelNew(Model):
    """The reference Model compiled with torch.compile(mode="reduce-overhead") (CUDA graphs)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._cuda_l1_forward = _cuda_l1_torch.compile(super().forward, mode="reduce-overhead")

    def forward(self, *args, **kwargs):
        _cuda_l1_torch.compiler.cudagraph_mark_step_begin()
        return _cuda_l1_clone_outputs(self._cuda_l1_forward(*args, **kwargs))
'''
)

# Manual whole-forward capture as the PyTorch CUDA-graphs notes describe: static inputs, warm-up on a
# side stream, capture, then copy-in / replay / copy-out on every call.
CUDAGRAPH = (
    '''
import torch as _cuda_l1_torch
'''
    + CLONE_OUTPUTS
    + '''

_CUDA_L1_WARMUP_CALLS = 3  # eager calls on a side stream before capture (lazy init, cuBLAS workspaces)


def _cuda_l1_key_part(value):
    """What a captured graph depends on for one argument: a tensor's layout, or any other value."""
    if isinstance(value, _cuda_l1_torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device)
    try:
        hash(value)
        return ("value", type(value), value)
    except TypeError:
        return ("value", type(value), repr(value))


def _cuda_l1_static(value):
    """A graph-owned copy of one argument; non-tensor arguments are baked into the graph as they are."""
    if isinstance(value, _cuda_l1_torch.Tensor):
        return value.detach().clone()
    return value


class ModelNew(Model):
    """The reference Model replayed from a CUDA graph captured on the first call of each input signature.

    Inference only: capture and replay run without autograd, so outputs carry no gradient history.
    A call whose arguments differ in shape, dtype, device or non-tensor values captures again; moving
    the module (.cuda(), .to(), .half()) drops the graph, since it points at the old parameter memory.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # (signature, graph, static args, static kwargs, static output) of the current capture, or None.
        self._cuda_l1_graph = None

    def _apply(self, fn, *args, **kwargs):
        self._cuda_l1_graph = None
        return super()._apply(fn, *args, **kwargs)

    def _cuda_l1_device(self, values):
        for value in values:
            if isinstance(value, _cuda_l1_torch.Tensor) and value.is_cuda:
                return value.device
        for tensor in list(self.parameters()) + list(self.buffers()):
            if tensor.is_cuda:
                return tensor.device
        raise RuntimeError(
            "the cudagraph strategy needs CUDA tensors (inputs or parameters); this call has none."
        )

    def _cuda_l1_capture(self, key, device, args, kwargs):
        self._cuda_l1_graph = None  # release the previous graph and its memory pool first
        static_args = [_cuda_l1_static(a) for a in args]
        static_kwargs = {k: _cuda_l1_static(v) for k, v in kwargs.items()}
        cuda = _cuda_l1_torch.cuda
        with cuda.device(device):
            side = cuda.Stream()
            side.wait_stream(cuda.current_stream())
            with cuda.stream(side):
                for _ in range(_CUDA_L1_WARMUP_CALLS):
                    super().forward(*static_args, **static_kwargs)
            cuda.current_stream().wait_stream(side)
            graph = cuda.CUDAGraph()
            with cuda.graph(graph):
                static_out = super().forward(*static_args, **static_kwargs)
        self._cuda_l1_graph = (key, graph, static_args, static_kwargs, static_out)

    def forward(self, *args, **kwargs):
        names = sorted(kwargs)
        values = list(args) + [kwargs[n] for n in names]
        key = (
            tuple(_cuda_l1_key_part(v) for v in values),
            tuple(names),
            self.training,
            _cuda_l1_torch.is_inference_mode_enabled(),
        )
        with _cuda_l1_torch.no_grad():
            if self._cuda_l1_graph is None or self._cuda_l1_graph[0] != key:
                self._cuda_l1_capture(key, self._cuda_l1_device(values), args, kwargs)
            _, graph, static_args, static_kwargs, static_out = self._cuda_l1_graph
            for static, value in zip(static_args, args):
                if isinstance(static, _cuda_l1_torch.Tensor):
                    static.copy_(value)
            for name, static in static_kwargs.items():
                if isinstance(static, _cuda_l1_torch.Tensor):
                    static.copy_(kwargs[name])
            graph.replay()
            return _cuda_l1_clone_outputs(static_out)
'''
)


def compile_code(mode: str | None) -> str:
    """The torch.compile strategy text for one mode (None: torch's default mode)."""
    mode_text = f'mode="{mode}"' if mode else "default mode"
    mode_arg = f', mode="{mode}"' if mode else ""
    return COMPILE.replace("{mode_text}", mode_text).replace("{mode_arg}", mode_arg)
