"""``trit heal``: short quantization-aware distillation of a ternary checkpoint from its float teacher.

The student starts exactly at the ternary checkpoint: each trit-plane of each
ternary layer gets a float master weight equal to its dequantized weight and a
trainable copy of its group scales (a layer of two planes, as ``--planes 2``
or a bits budget writes, trains both, summed). The forward pass re-quantizes the master weight to
``scale * clamp(round(W / scale), -1, 1)`` with a straight-through estimator
for the rounding, so step 0 reproduces the checkpoint's outputs. The scale
learns through the product only, the codes taken as constants: LSQ's gradient
(Esser et al. 2020, arXiv:1902.08153), which also differentiates ``W / scale``,
is zero for a weight on its grid point, which is where every weight starts.
The loss is the KL divergence from the float teacher's next-token
distribution to the student's. Training text is data-free by default:
sequences the teacher samples itself (LLM-QAT; Liu et al. 2023,
arXiv:2305.17888), or windows of ``--data FILE``. The held-out loss is
measured every ``eval_every`` steps on sequences never trained on, and the
best student is what gets written: a normal trit checkpoint (same group size,
scale dtype and layout), through the atomic :func:`trit.checkpoint.write_checkpoint`. AdamW, linear
warm-up over the first 5% of the steps, then a cosine down to 10% of ``lr``.

Embeddings and ``lm_head`` stay frozen unless ``train_embeddings`` (they are
float in the checkpoint, so training them leaves the format and the bits per
ternary weight as they were); the ternary layers (weights and scales) and the
norms train, or, with ``freeze_codes``, the scales and norms
only (every code stays, as in the scale-only phase of EfficientQAT). The
latent weights may take their own learning rate (``weight_lr``): a code flips
only once its weight has moved half a scale, so their step size is a
different question from the scales'. bf16 autocast on CUDA, gradient
checkpointing (optional). On CUDA the step is compiled by default: each
decoder block of the teacher and the student goes through ``torch.compile``
on its own (one compilation serves every layer), and so does the loss.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from trit import format as fmt
from trit.arch import kv_cache_bytes
from trit.checkpoint import CheckpointError, check_paths, write_checkpoint
from trit.configs import HealConfig
from trit.errors import ConvertError
from trit.nn import TritLinear

COMPILE_BACKEND = "inductor"  # torch.compile's backend for HealConfig.compile


def _is_cuda(device: str | torch.device) -> bool:
    """``cuda``, ``cuda:0``, a ``torch.device``: whether the device is a CUDA GPU."""
    return torch.device(device).type == "cuda"


@dataclass
class HealReport:
    out_dir: Path
    steps: int = 0
    seconds: float = 0.0
    heldout: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out KL)
    elapsed: list[float] = field(default_factory=list)  # seconds from the first step to the end of each evaluation
    train_kl: list[tuple[int, float]] = field(default_factory=list)  # (step, mean training KL since the last one)
    train_windows: torch.Tensor | None = None  # (S, T) the token windows trained on, for overlap checks
    tokens: int = 0  # tokens trained on (steps x batch x sequence length)

    @property
    def best(self) -> tuple[int, float]:
        return min(self.heldout, key=lambda s: s[1])

    def summary(self) -> str:
        first, (best_step, best) = self.heldout[0], self.best
        return (f"wrote {self.out_dir}: {self.steps} steps ({self.tokens} tokens) in {self.seconds:.0f} s; "
                f"held-out KL to the teacher {first[1]:.4f} at step 0 -> {best:.4f} at step {best_step} (the one written)")


class QATLinear(nn.Module):
    """A ternary layer in training: each trit-plane's float master weight and group scales, re-quantized every
    forward; the layer's weight is the planes' sum. Plane 1's are ``weight`` and ``scale``, plane p's ``weight_p``
    and ``scale_p``: each plane starts on its own grid, so step 0 is the checkpoint exactly, and each learns
    through the sum (its codes flip once its own weight has moved half its own scale)."""

    def __init__(self, layer: TritLinear):
        super().__init__()
        self.in_features, self.out_features, self.group_size = layer.in_features, layer.out_features, layer.group_size
        self.planes = layer.planes
        for p, (packed, scale) in enumerate(layer.planes_tensors()):
            weight_name, scale_param = self._names(p)
            # (N, K_pad) f32, on the grid at the start; (N, G) scales
            self.register_parameter(weight_name, nn.Parameter(fmt.dequantize(packed, scale)))
            self.register_parameter(scale_param, nn.Parameter(scale.float().clone()))
        self.bias = layer.bias
        self.scale_dtype = layer.weight_scale.dtype
        self.frozen: list[torch.Tensor] | None = None  # each plane's fixed codes (N, G, g) once freeze() is called

    @staticmethod
    def _names(plane: int) -> tuple[str, str]:
        return ("weight", "scale") if plane == 0 else (f"weight_{plane + 1}", f"scale_{plane + 1}")

    def weights(self) -> list[nn.Parameter]:
        return [getattr(self, self._names(p)[0]) for p in range(self.planes)]

    def scales(self) -> list[nn.Parameter]:
        return [getattr(self, self._names(p)[1]) for p in range(self.planes)]

    def freeze(self) -> None:
        """Fix the codes: from now on only the scales learn, with the codes as constants (``d(t a)/da = t``)."""
        self.frozen = [self.codes(p)[0].detach() for p in range(self.planes)]
        for w in self.weights():
            w.requires_grad_(False)

    def unfreeze(self) -> None:
        """Let the codes move again, from the grid point of the fixed codes and the scales learned meanwhile."""
        if self.frozen is None:
            return
        with torch.no_grad():
            grid = [self.codes(p) for p in range(self.planes)]
            for w, (t, a) in zip(self.weights(), grid):
                w.copy_((t * a).view(w.shape))
        self.frozen = None
        for w in self.weights():
            w.requires_grad_(True)

    def codes(self, plane: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """A plane's codes (N, G, g) in {-1, 0, 1} float and scales (N, G, 1)."""
        weight, scale = self.weights()[plane], self.scales()[plane]
        a = scale.abs().clamp(min=1e-8)[:, :, None]
        if self.frozen is not None:
            return self.frozen[plane], a
        r = weight.view(weight.shape[0], a.shape[1], -1) / a.detach()  # the scale learns through t * a
        t = torch.clamp(r + (torch.round(r) - r).detach(), -1, 1)  # straight-through rounding
        return t, a

    def quantized_weight(self) -> torch.Tensor:
        w = None
        for p in range(self.planes):
            t, a = self.codes(p)
            w = t * a if w is None else w + t * a
        return w.view(self.weight.shape)[:, : self.in_features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.quantized_weight().to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def export(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each plane's ``(weight_packed (N, K_pad // 4) uint8, weight_scale (N, G))`` in the checkpoint's dtype."""
        out = []
        with torch.no_grad():
            for p in range(self.planes):
                t, a = self.codes(p)
                packed = fmt.pack(t.view(self.weight.shape).round().to(torch.int8)).cpu()
                scale = fmt.to_scale(a[:, :, 0].float(), fmt.ScaleDtype(str(self.scale_dtype).removeprefix("torch.")),
                                     "heal").cpu()
                out.append((packed, scale))
        return out


def _swap_in_qat(model: nn.Module) -> dict[str, QATLinear]:
    qat = {}
    for name, mod in list(model.named_modules()):
        if isinstance(mod, TritLinear):
            parent, _, child = name.rpartition(".")
            new = QATLinear(mod)
            setattr(model.get_submodule(parent), child, new)
            qat[name] = new
    return qat


def _kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of KL(teacher || student), in float32."""
    t = F.log_softmax(teacher_logits.float(), -1)
    s = F.log_softmax(student_logits.float(), -1)
    return (t.exp() * (t - s)).sum(-1).mean()


def _sequences(teacher, tokenizer, opts: HealConfig, progress: bool = False,
               device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Training and held-out token windows ``(S, T)``; the two never share a window (sampled on ``device``)."""
    from trit.calibrate import sample_from_model, windows_from_text

    def sample_batch() -> int:  # asked only where the teacher samples
        free = torch.cuda.mem_get_info(torch.device(device))[0] if _is_cuda(device) else None
        return opts.sampling_batch(device, kv_cache_bytes(teacher.config, opts.seq_len), free)

    samples = opts.training_samples()
    total = samples + opts.heldout_samples
    if opts.data is not None:
        if not Path(opts.data).is_file():
            raise CheckpointError(opts.data, "no such training text file")
        ids = tokenizer(Path(opts.data).read_text(), return_tensors="pt").input_ids[0]
        # held-out windows: the text's tail, side by side; a text too short for that is shared in proportion
        cut = ids.numel() - opts.heldout_samples * opts.seq_len
        if cut < opts.seq_len:
            cut = int(ids.numel() * samples / total)
        train = windows_from_text(ids[:cut], samples, opts.seq_len)
        if opts.mix_sampled:  # more, other text than the file's; the held-out windows stay the file's
            train = torch.cat([train, sample_from_model(teacher, tokenizer, opts.mix_sampled, opts.seq_len, opts.seed,
                                                        sample_batch(), progress, first=opts.sample_first)])
        return train, windows_from_text(ids[cut:], opts.heldout_samples, opts.seq_len)
    seqs = sample_from_model(teacher, tokenizer, total, opts.seq_len, opts.seed, sample_batch(), progress,
                             first=opts.sample_first)
    return seqs[:samples], seqs[samples:]


@torch.no_grad()
def _heldout_kl(student, teacher_logits: list[torch.Tensor], heldout: torch.Tensor, batch: int, amp) -> float:
    student.eval()
    total = 0.0
    for i, t_logits in zip(range(0, heldout.shape[0], batch), teacher_logits):
        with amp():
            total += float(_kl(student(heldout[i:i + batch]).logits, t_logits)) * heldout[i:i + batch].shape[0]
    student.train()
    return total / heldout.shape[0]


def heal(
    ckpt_dir: str | Path, teacher_dir: str | Path, out_dir: str | Path, opts: HealConfig = HealConfig(),
    overwrite: bool = False, progress: bool = True, log: Callable[[str], None] = print,
) -> HealReport:
    """Distil ``teacher_dir`` into the ternary ``ckpt_dir``; write the best student to ``out_dir``."""
    from contextlib import nullcontext

    from transformers import AutoModelForCausalLM

    from trit import runtime

    ckpt_dir, out = Path(ckpt_dir), Path(out_dir)
    _check_options(opts)
    check_paths(ckpt_dir, out, overwrite)
    device = opts.device or runtime.default_device()
    # no kernel warm-up: the ternary layers are swapped for trainable ones at once
    loaded = runtime.load(ckpt_dir, device=device, dtype=torch.float32, warm=False, lm_head="stored")  # it trains
    if loaded.trit_config is None:
        raise ConvertError(f"{ckpt_dir}: not a trit checkpoint (heal starts from a ternary model)")
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32).to(device).eval()
    teacher.requires_grad_(False)
    amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if _is_cuda(device) else nullcontext
    torch.manual_seed(opts.seed)
    train, heldout = (t.to(device) for t in _sequences(teacher, loaded.tokenizer, opts, progress, device))
    # no KV cache from here on (sampling above used one): a compiled block would recompile for each layer's cache
    teacher.config.use_cache = False
    with torch.no_grad(), amp():
        teacher_heldout = [teacher(heldout[i:i + opts.batch]).logits.float()
                           for i in range(0, heldout.shape[0], opts.batch)]
    student = loaded.model
    qat = _swap_in_qat(student)
    student.requires_grad_(False)
    if opts.grad_checkpointing and hasattr(student, "gradient_checkpointing_enable"):
        student.gradient_checkpointing_enable()
    student.config.use_cache = False
    student.train()
    report = HealReport(out, train_windows=train.cpu())
    report.heldout.append((0, _heldout_kl(student, teacher_heldout, heldout, opts.batch, amp)))
    report.elapsed.append(0.0)
    best = _snapshot(student, qat)
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(opts.seed)

    kl = _kl
    if opts.compiles(device):
        for model in (teacher, student):
            _compile_blocks(model)
        kl = torch.compile(_kl, backend=COMPILE_BACKEND, dynamic=False)

    def step_loss(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), amp():
            t_logits = teacher(x).logits
        with amp():
            return kl(student(x).logits, t_logits)
    phases = [(opts.scales_first, opts.scales_first_lr, True)] if opts.scales_first > 0 else []
    phases.append((opts.steps, opts.lr, opts.freeze_codes))
    done = 0
    # compiled blocks keep a graph for each of: the teacher, the student's held-out pass and its training step (the
    # first block's input takes no gradient, the others' do), in each phase: more than dynamo's default 8
    with torch._dynamo.config.patch(recompile_limit=max(16, torch._dynamo.config.recompile_limit)):
        for i, (steps, lr, freeze) in enumerate(phases):
            if i > 0:  # the next phase starts from the best state so far
                _restore(student, qat, best)
            trainable, optim, sched = _phase_setup(student, qat, opts, steps, lr, freeze)
            desc = "heal" if len(phases) == 1 else f"heal {i + 1}/{len(phases)}"
            # the phase's batches drawn at once: no host-to-device copy (and wait) a step
            order = torch.randint(0, train.shape[0], (steps, opts.batch), generator=gen).to(train.device)
            train_sum, train_steps = torch.zeros((), device=train.device), 0  # read at each evaluation (no wait)
            for step in tqdm(range(done + 1, done + steps + 1), desc=desc, unit="step", disable=not progress):
                loss = step_loss(train[order[step - done - 1]])
                train_sum += loss.detach()
                train_steps += 1
                optim.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(trainable, 1.0)
                optim.step()
                sched.step()
                if step % opts.eval_every == 0 or step == done + steps:
                    report.heldout.append((step, _heldout_kl(student, teacher_heldout, heldout, opts.batch, amp)))
                    report.elapsed.append(time.perf_counter() - start)
                    report.train_kl.append((step, float(train_sum) / train_steps))
                    train_sum.zero_()
                    train_steps = 0
                    if report.heldout[-1][1] <= report.best[1]:
                        best = _snapshot(student, qat)
            done += steps
    report.steps, report.seconds = done, time.perf_counter() - start
    report.tokens = done * opts.batch * train.shape[1]
    _restore(student, qat, best)
    _write(loaded, qat, student, out, progress)
    log(report.summary())
    return report


def _compile_blocks(model: nn.Module) -> None:
    """torch.compile each of the model's repeated blocks (its longest ``ModuleList``: the decoder layers) in place.

    The blocks share one forward, so one compilation serves them all: a block's graph is traced and its kernels
    generated once, not once for each of the model's layers (three minutes for SmolLM2-135M, whole, on an H200
    machine). Shapes are static: a heal's batch and sequence length do not change."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    blocks = max(lists, key=len) if lists else [model]
    for block in blocks:
        block.compile(backend=COMPILE_BACKEND, dynamic=False)


def _check_options(opts: HealConfig) -> None:
    """Counts and rates a run can use, named by their flags; before anything is loaded or written."""
    at_least = {"--steps": (opts.steps, 0), "--scales-first": (opts.scales_first, 0), "--batch": (opts.batch, 1),
                "--seq-len": (opts.seq_len, 2), "--train-samples": (opts.training_samples(), 1),
                "--heldout-samples": (opts.heldout_samples, 1), "--eval-every": (opts.eval_every, 1),
                "--sample-batch": (1 if opts.sample_batch is None else opts.sample_batch, 1),
                "--mix-sampled": (opts.mix_sampled, 0)}
    for flag, (value, low) in at_least.items():
        if value < low:
            raise ConvertError(f"heal {flag} {value}: must be at least {low}")
    if opts.mix_sampled and opts.data is None:
        raise ConvertError(f"heal --mix-sampled {opts.mix_sampled}: mixes sampled sequences into --data text; "
                           "without --data every training sequence is sampled already")
    from trit.calibrate import FIRST

    if opts.sample_first not in FIRST:
        raise ConvertError(f"heal --sample-first {opts.sample_first!r}: expected one of {', '.join(FIRST)}")
    rates = {"--lr": opts.lr, "--scales-first-lr": opts.scales_first_lr, "--weight-lr": opts.weight_lr}
    for flag, value in rates.items():
        if value is not None and not (value >= 0 and math.isfinite(value)):
            raise ConvertError(f"heal {flag} {value}: must be a finite rate, 0 or more")


def _snapshot(student: nn.Module, qat: dict[str, QATLinear]) -> tuple[dict, dict]:
    """The student's parameters, and each ternary layer's fixed codes (None where the codes move).

    Each tensor is copied once, on any device; names that share one tensor (tied embeddings) share its copy.
    """
    copies: dict[tuple, torch.Tensor] = {}
    state = {}
    for k, v in student.state_dict().items():
        alias = (v.data_ptr(), v.dtype, tuple(v.shape), v.stride(), v.device)
        if alias not in copies:
            copies[alias] = v.detach().to("cpu", copy=True)
        state[k] = copies[alias]
    return state, {name: None if m.frozen is None else [t.clone() for t in m.frozen] for name, m in qat.items()}


def _restore(student: nn.Module, qat: dict[str, QATLinear], snapshot: tuple[dict, dict]) -> None:
    state, frozen = snapshot
    student.load_state_dict(state)
    for name, m in qat.items():
        m.frozen = frozen[name]


def _phase_setup(student: nn.Module, qat: dict[str, QATLinear], opts: HealConfig, steps: int, lr: float,
                 freeze: bool) -> tuple[list[nn.Parameter], torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """One phase's trainable parameters (codes fixed or not), AdamW and its schedule: a linear warm-up over 5% of
    the steps, then cosine down to 10%. Scales and norms learn at ``lr``, latent weights and embeddings at
    ``opts.weight_lr``."""
    for m in qat.values():
        if freeze:
            m.freeze()
        else:
            m.unfreeze()
    scales = [s for m in qat.values() for s in m.scales()] + [p for n, p in student.named_parameters() if "norm" in n]
    weights = [] if freeze else [w for m in qat.values() for w in m.weights()]
    if opts.train_embeddings:
        embeddings = (student.get_input_embeddings(), student.get_output_embeddings())  # a ternary lm_head: not here
        weights += list({id(e.weight): e.weight for e in embeddings if e is not None and not isinstance(e, QATLinear)
                         }.values())
    trainable = scales + weights
    for p in trainable:
        p.requires_grad_(True)
    groups = [{"params": scales, "lr": lr}]
    if weights:
        groups.append({"params": weights, "lr": lr if opts.weight_lr is None else opts.weight_lr})
    optim = torch.optim.AdamW(groups, weight_decay=0.0, fused=all(p.is_cuda for p in trainable) or None)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: min(1.0, (s + 1) / warmup) * (
        0.55 + 0.45 * math.cos(math.pi * min(1.0, s / max(1, steps)))))
    return trainable, optim, sched


def _write(loaded, qat: dict[str, QATLinear], student: nn.Module, out: Path, progress: bool) -> None:
    """The original checkpoint's files, with the healed codes, scales, norms (and embeddings) in their place."""
    ckpt = loaded.checkpoint
    exported = {name: m.export() for name, m in qat.items()}
    # every float parameter that trained, under each of its names (a tied lm_head is the embedding's tensor)
    params = {n: p.detach().cpu() for n, p in student.named_parameters(remove_duplicate=False) if p.requires_grad
              and not any(n.startswith(q + ".") for q in qat)}

    def transform(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        module, leaf = name.rsplit(".", 1)
        if module in exported:
            for (packed, scale), suffixes in zip(exported[module], fmt.plane_suffixes(len(exported[module]))):
                if leaf in suffixes:
                    return {name: packed if leaf == suffixes[0] else scale}
        if name in params:
            return {name: params[name].to(tensor.dtype)}
        return {name: tensor.contiguous()}

    write_checkpoint(ckpt, out, transform, dict(ckpt.config), progress, desc="write")
