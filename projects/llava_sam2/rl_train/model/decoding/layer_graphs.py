"""The decoder-layer loop of the grouped scoring passes, replayed from CUDA graphs (``GRPOConfig.graph_loss_layers``).

The grouped log-prob passes (``grouped_scoring.grouped_hidden``: the loss, ``old_logp``, the reference) run the
decoder's layers as one Python loop of per-layer calls, each a few hundred small kernels (LoRA, RMSNorm, rotary,
the masks), with activation checkpointing around each layer. On an H100 that loop is bound by the host: the 4b loss
pass keeps the GPU busy for about a third of its wall time. Here the whole loop (every layer, the checkpoints with
them) is recorded once per shape into a CUDA graph, and later calls of that shape copy their inputs into the graph's
input tensors and replay it: one launch instead of ~10^5.

With gradients, the forward and the backward of the loop are two graphs (the backward one recorded from the forward
one's autograd graph, as ``torch.cuda.make_graphed_callables`` does), joined to the caller's autograd graph by one
``torch.autograd.Function`` whose inputs are the loop's tensor inputs and the layers' trainable parameters:

    forward:   copy inputs -> static inputs;  replay F;  return copies of F's outputs
    backward:  copy dL/d(outputs) -> static grad outputs;  replay B;  return copies of B's grads (inputs, parameters)

so DDP's and DeepSpeed's gradient hooks see the parameters' gradients arrive as from any eager layer. What this adds
to ``make_graphed_callables``:

* **Keyed by everything that changes the recorded work**: the inputs' shapes, dtypes and ``requires_grad``, grad
  mode, train mode, autocast, the checkpoint settings, the compile backend, and the state of the adapters of the
  first layer (peft's ``disable_adapter()`` for the reference, merged or active adapters, dropout in train mode: the
  layers are toggled together). Values are read at replay, so the EMA partner's and the reference's values, which
  ``grpo.weights.WeightSets`` copies into the live parameters, are what a replay computes with. A parameter that
  moved (``.to()``, a state dict loaded by assignment) drops every graph of the body.
* **The first call of a key runs eagerly** and returns its own result (cuDNN plans, a compiled layer's first-call
  work and allocator growth happen there, not inside a capture); the graphs are then recorded for the later calls.
  The first capture with and without gradients is preceded by one throw-away run on the capture stream (its lazy
  cuBLAS state). A key whose capture fails runs eagerly from then on (one warning).
* **Gradients of aliases**: the recorded loop reads detached aliases of the trainable parameters (the same storage,
  new leaves; ``torch_seams.parameters_replaced``), made inside the capture. The live parameters' gradient
  accumulators were made on the training stream, and a backward recorded through them fails
  (``cudaErrorStreamCaptureImplicit``: the legacy stream would wait on the capture).
* **One forward in flight per graph**: the forward graph's memory holds the checkpointed activations until its
  backward replays; a second forward of the same key before that (two minibatches' forwards before one backward)
  would overwrite them, so it runs eagerly instead (counted). The graph is free again once its backward ran or its
  autograd graph was dropped (an ``old_logp`` pass detached).
* **Memory**: each gradient key has its own memory pool (the step's loops hold their forwards together until one
  backward); the no-grad keys of a body share one (they run one at a time and their outputs are copied). At most
  ``max_keys`` keys are kept (least recently used dropped). The length buckets (``GRPOConfig.prompt_length_multiple``,
  ``completion_length_multiple``) keep the number of shapes small.
* **Autocast**: recorded with autocast's weight-cast cache off (a cast cached before the capture would be read
  from stale memory at replay); the casts are recorded in the graph instead.

Values: a replay runs the recorded kernels on the new inputs, so it equals the eager loop of the same key bit for
bit on a GPU (checked there, docs/speed.md); on CPU the tests replace the recorder by one that reruns the loop.
"""
from __future__ import annotations

import itertools
import logging
import os
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..network.torch_seams import parameters_replaced

logger = logging.getLogger(__name__)

GRAPH_ATTRIBUTE = "grouped_layer_graphs"  # on the decoder body: its LayerGraphs, or absent (eager)
MAX_KEYS = 8
CAPTURE_ERROR_MODE = "thread_local"  # other threads (data loading, reward clients) may use CUDA during a capture
# diagnosis: every replay is also run eagerly and the largest differences are logged (slow; off unless set to 1)
CHECK_REPLAYS = os.environ.get("SA2VA_CHECK_LAYER_GRAPHS") in ("1", "refresh")
REFRESH_BEFORE_BACKWARD = os.environ.get("SA2VA_CHECK_LAYER_GRAPHS") == "refresh"  # diagnosis: forward replayed again

Inputs = Sequence[Tensor | None]
Outputs = tuple[Tensor, ...]


@contextmanager
def _autocast_cache_off():
    """Inside an active CUDA autocast: the same autocast with its cast cache off."""
    if not torch.is_autocast_enabled("cuda") or not torch.is_autocast_cache_enabled():
        yield
        return
    with torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False):
        yield


class CudaGraphRecorder:
    """Records on a side stream of the current device into ``torch.cuda.CUDAGraph`` s."""

    def __init__(self):
        self.stream = torch.cuda.Stream()

    def new_pool(self):
        return torch.cuda.graph_pool_handle()

    def warm_up(self, run: Callable[[], object]) -> None:
        main = torch.cuda.current_stream()
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            run()
        main.wait_stream(self.stream)

    def record(self, forward: Callable[[], Outputs], backward: Callable[[Outputs], Outputs] | None,
               pool) -> tuple[Callable[[], None], Callable[[], None] | None, Outputs, Outputs | None]:
        """``(replay_forward, replay_backward, outputs, grads)``: forward, then backward of its outputs, recorded into
        ``pool`` (nothing runs)."""
        main = torch.cuda.current_stream()
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            forward_graph, outputs = self._capture(forward, pool)
            backward_graph, grads = (None, None) if backward is None else self._capture(lambda: backward(outputs), pool)
        main.wait_stream(self.stream)
        return forward_graph.replay, None if backward_graph is None else backward_graph.replay, outputs, grads

    @staticmethod
    def _capture(step: Callable[[], Outputs], pool) -> tuple[torch.cuda.CUDAGraph, Outputs]:
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(pool=pool, capture_error_mode=CAPTURE_ERROR_MODE)
        try:
            result = step()
        except BaseException:
            try:
                graph.capture_end()
            except RuntimeError:  # the capture is already invalid; the step's error is the one to see
                pass
            raise
        graph.capture_end()
        return graph, result


@dataclass
class _Entry:
    """The graphs of one key: static inputs, outputs, grad outputs and grads, and the replays."""
    inputs: list[Tensor | None]
    outputs: Outputs
    replay_forward: Callable[[], None]
    differentiable: tuple[bool, ...] = ()  # which outputs had a gradient when recorded
    grad_outputs: list[Tensor] = field(default_factory=list)  # one per output that requires grad
    grads: Outputs | None = None  # one per input that requires grad, then one per trainable parameter (None: unused)
    replay_backward: Callable[[], None] | None = None
    pending: Callable[[], object] | None = None  # weakref to the autograd node of the forward awaiting its backward
    stack: Callable[..., Outputs] | None = None  # the eager loop (for CHECK_REPLAYS)

    def load(self, inputs: Inputs) -> None:
        for static, value in zip(self.inputs, inputs):
            if static is not None and static.data_ptr() != value.data_ptr():
                static.copy_(value)

    def is_busy(self) -> bool:
        return self.pending is not None and self.pending() is not None


class _ReplayedLayers(torch.autograd.Function):
    """Forward and backward of a recorded layer loop, as one node of the caller's autograd graph."""

    @staticmethod
    def forward(ctx, entry: _Entry, num_inputs: int, *tensors: Tensor) -> Outputs:
        entry.load(tensors[:num_inputs])
        entry.replay_forward()
        entry.pending = weakref.ref(ctx)
        ctx.entry, ctx.num_inputs = entry, num_inputs
        ctx.input_needs_grad = [t is not None and t.requires_grad for t in tensors[:num_inputs]]
        ctx.num_parameters = len(tensors) - num_inputs
        if CHECK_REPLAYS:
            ctx.inputs, ctx.parameters = tensors[:num_inputs], tensors[num_inputs:]
            ctx.autocast = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
            with torch.no_grad():
                _log_differences("forward", entry.outputs, entry.stack(*ctx.inputs))
        return tuple(out.clone() for out in entry.outputs)

    @staticmethod
    def backward(ctx, *grad_outputs: Tensor):
        entry = ctx.entry
        if REFRESH_BEFORE_BACKWARD:
            entry.replay_forward()
        differentiable = [grad for grad, needed in zip(grad_outputs, entry.differentiable) if needed]
        for static, grad in zip(entry.grad_outputs, differentiable):
            static.copy_(grad)
        entry.replay_backward()
        entry.pending = None
        grads = iter(entry.grads)
        # grads come in the order of the inputs that required grad at capture, then the parameters
        for_inputs = [_clone(next(grads)) if needs else None for needs in ctx.input_needs_grad]
        for_parameters = [_clone(next(grads)) for _ in range(ctx.num_parameters)]
        if CHECK_REPLAYS:
            with torch.enable_grad(), torch.autocast("cuda", dtype=ctx.autocast[1], enabled=ctx.autocast[0]):
                inputs = [None if t is None else t.detach().requires_grad_(needs)
                          for t, needs in zip(ctx.inputs, ctx.input_needs_grad)]
                outputs = entry.stack(*inputs)
                wrt = [t for t, needs in zip(inputs, ctx.input_needs_grad) if needs] + list(ctx.parameters)
                eager = torch.autograd.grad([o for o, d in zip(outputs, entry.differentiable) if d], wrt,
                                            differentiable, allow_unused=True)
            _log_differences("backward", [g for g in (*for_inputs, *for_parameters) if g is not None],
                             [g for g in eager if g is not None])
        return None, None, *for_inputs, *for_parameters


def _log_differences(where: str, replayed: Sequence[Tensor], eager: Sequence[Tensor]) -> None:
    """CHECK_REPLAYS: the largest difference of a replay from the eager loop, and its non-finite tensors."""
    largest = max(((r.float() - e.float()).abs().max().item() for r, e in zip(replayed, eager)), default=0.0)
    scale = max((e.float().abs().max().item() for e in eager), default=0.0)
    bad = sum(int(not bool(torch.isfinite(r).all())) for r in replayed)
    logger.warning("layer graphs check, %s: %d tensors, largest difference %.3g (eager's largest %.3g), %d non-finite "
                   "(eager: %d)", where, len(replayed), largest, scale, bad,
                   sum(int(not bool(torch.isfinite(e).all())) for e in eager))


def _clone(grad: Tensor | None) -> Tensor | None:
    # a copy: the static grad is overwritten by the next replay, and AccumulateGrad may keep the tensor it gets as .grad
    return None if grad is None else grad.clone()


def _adapter_state(layer: nn.Module) -> tuple:
    """What of a layer's submodules changes the kernels it runs: class, train mode, peft's adapter switches."""
    state = []
    for module in layer.modules():
        entry = (type(module), module.training)
        if hasattr(module, "active_adapters"):
            entry += (bool(getattr(module, "disable_adapters", False)), tuple(module.active_adapters),
                      tuple(getattr(module, "merged_adapters", ())))
        state.append(entry)
    return tuple(state)


def _describe(tensor: Tensor | None) -> tuple | None:
    if tensor is None:
        return None
    return tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.device, tensor.requires_grad


class LayerGraphs:
    """The recorded layer loops of one decoder body, by key (module docstring)."""

    def __init__(self, recorder=None, max_keys: int = MAX_KEYS):
        self.recorder = recorder
        self.max_keys = max_keys
        self.entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self.failed: set[tuple] = set()
        self.weights: tuple[int, ...] | None = None
        self._shared_pool = None
        self._warmed: set[bool] = set()
        self.counts = {"eager_first": 0, "captured": 0, "replayed": 0, "eager_busy": 0, "eager_failed": 0}

    def run(self, stack: Callable[..., Outputs], inputs: Inputs, layers: Iterable[nn.Module], setting: tuple) -> Outputs:
        """``stack(*inputs)``: eagerly the first time a key is seen, then from its graphs."""
        layers = list(layers)
        parameters = list(itertools.chain.from_iterable(layer.parameters() for layer in layers))
        weights = tuple(p.data_ptr() for p in parameters)
        if weights != self.weights:  # a parameter moved: every graph reads the old storage
            self.entries.clear()
            self.failed.clear()
            self.weights = weights
        trainable = [p for p in parameters if p.requires_grad] if torch.is_grad_enabled() else []
        with_grad = bool(trainable) or any(t is not None and t.requires_grad for t in inputs)
        key = (setting, with_grad, torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
               torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"),
               tuple(_describe(t) for t in inputs), _adapter_state(layers[0]))
        entry = self.entries.get(key)
        if entry is None:
            counted = "eager_failed" if key in self.failed else "eager_first"
            self.counts[counted] += 1
            outputs = stack(*inputs)
            if key not in self.failed:
                self._capture(key, stack, inputs, layers, with_grad)
            return outputs
        self.entries.move_to_end(key)
        if entry.is_busy():
            self.counts["eager_busy"] += 1
            return stack(*inputs)
        self.counts["replayed"] += 1
        if not with_grad:
            entry.load(inputs)
            entry.replay_forward()
            if CHECK_REPLAYS:
                _log_differences("no-grad forward", entry.outputs, stack(*inputs))
            return tuple(out.clone() for out in entry.outputs)
        return _ReplayedLayers.apply(entry, len(inputs), *inputs, *trainable)

    def _capture(self, key: tuple, stack: Callable[..., Outputs], inputs: Inputs, layers: list[nn.Module],
                 with_grad: bool) -> None:
        recorder = self.recorder = self.recorder or CudaGraphRecorder()
        static = [None if t is None else t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
        # the recorded loop reads detached aliases of the trainable parameters (same storage, new leaves): the live
        # parameters' gradient accumulators belong to the training stream, which a capture must not reach
        container = nn.ModuleList(layers)
        aliases = {name: p.detach().requires_grad_(True)
                   for name, p in container.named_parameters() if p.requires_grad and with_grad}
        wrt = [t for t in static if t is not None and t.requires_grad] + list(aliases.values())
        grad_outputs: list[Tensor] = []  # allocated by the first backward (the warm-up), then the graph's input

        def forward() -> Outputs:
            with parameters_replaced(container, aliases):
                return stack(*static)

        def backward(outputs: Outputs) -> Outputs:
            differentiable = [out for out in outputs if out.requires_grad]
            if not grad_outputs:
                grad_outputs.extend(torch.empty_like(out) for out in differentiable)
            with parameters_replaced(container, aliases):  # checkpointed layers run again in here
                return torch.autograd.grad(differentiable, wrt, grad_outputs, allow_unused=True)

        try:
            with _autocast_cache_off():
                if with_grad not in self._warmed:  # lazy per-stream state: once per kind of pass
                    recorder.warm_up(lambda: backward(forward()) if with_grad else forward())
                    self._warmed.add(with_grad)
                if with_grad:
                    pool = recorder.new_pool()
                else:
                    pool = self._shared_pool = self._shared_pool or recorder.new_pool()
                replay_forward, replay_backward, outputs, grads = recorder.record(
                    forward, backward if with_grad else None, pool)
        except Exception as err:  # noqa: BLE001 - any failure of the capture: run this key eagerly
            self.failed.add(key)
            logger.warning("grouped layer graphs: the capture of a %s pass failed (%s: %s); that shape runs eagerly.",
                           "gradient" if with_grad else "no-grad", type(err).__name__, err)
            return
        self.counts["captured"] += 1
        self.entries[key] = _Entry(static, tuple(out.detach() for out in outputs), replay_forward,
                                   tuple(out.requires_grad for out in outputs), grad_outputs, grads, replay_backward,
                                   stack=stack)
        while len(self.entries) > self.max_keys:
            self.entries.popitem(last=False)

    def __deepcopy__(self, memo) -> "LayerGraphs":
        """A copied model records its own graphs (these read the original's tensors)."""
        recorder = None if isinstance(self.recorder, CudaGraphRecorder) else self.recorder
        return LayerGraphs(recorder, self.max_keys)


def graph_group_layers(lm: nn.Module, enabled: bool, recorder=None) -> None:
    """From now on run ``lm``'s grouped layer loops from CUDA graphs (``enabled``; on CUDA tensors only) or eagerly.
    ``recorder``: a stand-in for :class:`CudaGraphRecorder` (the CPU tests')."""
    from .generation import decoder_and_head

    body, _ = decoder_and_head(lm)
    if enabled:
        if not isinstance(getattr(body, GRAPH_ATTRIBUTE, None), LayerGraphs):
            setattr(body, GRAPH_ATTRIBUTE, LayerGraphs(recorder))
    elif hasattr(body, GRAPH_ATTRIBUTE):
        delattr(body, GRAPH_ATTRIBUTE)


def layer_graphs_of(body: nn.Module, on_cuda: bool) -> LayerGraphs | None:
    """The body's :class:`LayerGraphs` when the loop should run from graphs now, else None."""
    graphs = getattr(body, GRAPH_ATTRIBUTE, None)
    if graphs is None or torch.compiler.is_compiling():
        return None
    return graphs if on_cuda or graphs.recorder is not None else None
