"""Rank residual-rotation seeds without GPTQ: per decoder linear of the rotated float model, the output error of
rounding its weight to one ternary plane (TWN scales per group of 64, nearest level), under the Hessian of its own
inputs on the first 32 default calibration windows; summed relative to tr(W H W^T), and as a sum of logs."""
import json, math, sys, time
from pathlib import Path
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM
from trit.quant.rotate import make_rotation, rotate_tensor, rotated_config
from trit.quant.twn import quantize_twn
from trit.quant.common import dequantize_ternary

torch.set_num_threads(2)
src = Path.home() / ".cache/trit/SmolLM2-135M-Instruct"
config = json.loads((src / "config.json").read_text())
sd = {k: v.float() for k, v in load_file(src / "model.safetensors").items()}
ids = torch.load(Path.home() / ".cache/trit/calib/cd575de6cf4049c6d4d4bcd4edde43fc.pt")[:32]
seeds = [int(s) for s in sys.argv[2].split(",")]
out = []
for seed in seeds:
    t0 = time.time()
    if seed < 0:
        rsd, cfg = sd, config
    else:
        rot = make_rotation(config, tied=True, seed=seed)
        rsd = {}
        for name, t in sd.items():
            rsd.update(rotate_tensor(rot, name, t, sd.__getitem__))
        cfg = rotated_config(config)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "model_type"}, model_type=cfg["model_type"]), dtype=torch.float32)
    missing = model.load_state_dict(rsd, strict=False)
    model.eval()
    H = {}
    def hook(name):
        def f(mod, inp, outp):
            x = inp[0].reshape(-1, inp[0].shape[-1]).double()
            H[name] = H.get(name, 0) + x.T @ x
        return f
    hs = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()
          if isinstance(m, torch.nn.Linear) and ".layers." in n]
    with torch.no_grad():
        for i in range(0, 32, 8):
            model(ids[i:i + 8])
    for h in hs: h.remove()
    rel, logs, rtn_w = 0.0, 0.0, 0.0
    per = {}
    for name, h in H.items():
        w = rsd[name + ".weight"].float()
        q = dequantize_ternary(quantize_twn(w, 64)).float()
        d = (w - q).double()
        e = float(torch.einsum("nk,kl,nl->", d, h, d)) / float(torch.einsum("nk,kl,nl->", w.double(), h, w.double()))
        per[name] = e
        rel += e
        logs += math.log(e)
        rtn_w += float((d ** 2).sum() / (w.double() ** 2).sum())
    row = {"seed": seed, "sum_rel_output_error": rel, "mean_log_rel_output_error": logs / len(H),
           "sum_rel_weight_error": rtn_w, "layers": len(H), "seconds": time.time() - t0,
           "by_kind": {k: sum(v for n, v in per.items() if n.endswith(k)) for k in
                       ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}}
    print(json.dumps(row), flush=True)
    out.append(row)
Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
