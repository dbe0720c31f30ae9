"""Prototype: SmolLM2 float model with norms absorbed and the residual stream rotated (QuaRot-style), saved float32."""
import shutil, sys, torch
from pathlib import Path
from transformers import AutoModelForCausalLM

src, dst, kind = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
cfg = m.config
d, hd = cfg.hidden_size, cfg.head_dim

def sylvester(n):
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n ** 0.5

def rand_orth(n):
    q, r = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float().contiguous()

if kind == "orth":
    Q = rand_orth(d)
elif kind == "had":  # random signs, then H_64 (x) random orthogonal 9
    signs = torch.randint(0, 2, (d,)).float() * 2 - 1
    Q = torch.diag(signs) @ torch.kron(rand_orth(d // 64), sylvester(64))
elif kind == "none":
    Q = torch.eye(d)
Hh = torch.diag(torch.randint(0, 2, (hd,)).float() * 2 - 1) @ sylvester(hd) if kind != "none" else torch.eye(hd)
assert torch.allclose(Q @ Q.T, torch.eye(d), atol=1e-5)

with torch.no_grad():
    E = m.model.embed_tokens.weight.data.clone()
    head = (E if cfg.tie_word_embeddings else m.lm_head.weight.data) * m.model.norm.weight.data[None]
    m.model.norm.weight.data.fill_(1.0)
    m.model.embed_tokens.weight = torch.nn.Parameter(E @ Q)
    m.lm_head.weight = torch.nn.Parameter(head @ Q)
    for layer in m.model.layers:
        a, mlp = layer.self_attn, layer.mlp
        for lin, g in ((a.q_proj, layer.input_layernorm), (a.k_proj, layer.input_layernorm), (a.v_proj, layer.input_layernorm),
                       (mlp.gate_proj, layer.post_attention_layernorm), (mlp.up_proj, layer.post_attention_layernorm)):
            lin.weight.data = (lin.weight.data * g.weight.data[None]) @ Q
        layer.input_layernorm.weight.data.fill_(1.0)
        layer.post_attention_layernorm.weight.data.fill_(1.0)
        # outputs into the residual stream
        a.o_proj.weight.data = Q.T @ a.o_proj.weight.data
        mlp.down_proj.weight.data = Q.T @ mlp.down_proj.weight.data
        # per-head rotation of v (rows) and o (input columns)
        nkv = a.v_proj.weight.shape[0] // hd
        v = a.v_proj.weight.data.reshape(nkv, hd, d)
        a.v_proj.weight.data = torch.einsum("ji,hjd->hid", Hh, v).reshape(nkv * hd, d)  # rows: H^T v per head
        o = a.o_proj.weight.data.reshape(d, -1, hd)
        a.o_proj.weight.data = (o @ Hh).reshape(d, -1)
cfg.tie_word_embeddings = False
m.config.tie_word_embeddings = False
dst.mkdir(parents=True, exist_ok=True)
m.save_pretrained(dst, safe_serialization=True)
for f in src.iterdir():
    if f.name.startswith("tokenizer") or f.name in ("chat_template.jinja", "generation_config.json"):
        shutil.copy(f, dst / f.name)
print("saved", dst)
