"""Where is AtP wrong? AtP, input-path IG and IG on each layer's own activations against exact patching.

    python analyses/attribution_diagnosis.py [MODEL=gpt2-facts] [HOOK=mlp_out] [N_PAIRS_FOR_IG=all] [STEPS=4]

Same pairs and metric as ``analyses/attribution.py`` (gpt2-facts: 50 drawn, all known kept; other models: 80 drawn,
first 50 known); the exact sweep comes from its disk cache (computed once if missing). Prints and writes
``results/attribution_diagnosis_<model>_<hook>.json``: for each estimate, Spearman ρ on the mean effect and per pair
× cell, ρ on the 60 largest exact cells, the mean effect's relative L1 error, the share of that error in each third
of the layers and at the last position; the exact effect's mass in its top-20 cells; sign agreement on the large
cells. The activation-path IG is written out here with autograd (one pass per layer from that layer on, steps in
the batch axis), independently of ``attribute(..., ig_path="activations")``.
"""
import sys, time, json, torch
torch.set_num_threads(1)
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
import gpt2_interp as gi
from einops import rearrange, reduce
from gpt2_interp.analysis.attribution import attribute, spearman
from gpt2_interp.analysis.metrics import logit_diff
from gpt2_interp.analysis.patching import pair_tokens
from gpt2_interp.facts.base import FactBase
from gpt2_interp.facts.pairs import subject_swaps
from attribution import known_pairs, pair_effects, cached_patch, CACHE_DIR
name = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"
hook = sys.argv[2] if len(sys.argv) > 2 else "mlp_out"
drawn, keep = (80, 50) if name != "gpt2-facts" else (50, 50)
model = gi.load(name).eval()
for p in model.parameters(): p.requires_grad_(False)
fp = known_pairs(model, subject_swaps(FactBase.load(), model.tokenizer, drawn, seed=0)).subset(range(keep))
fp = fp.subset(range(min(keep, len(fp))))
m = logit_diff(fp.answers, fp.wrongs); m.name = "logit_diff(clean object, corrupted object)"
ex, secs, hit = cached_patch(model, fp, m, hook, None, CACHE_DIR)
print("exact cached:", hit, flush=True)
NSUB = int(sys.argv[3]) if len(sys.argv) > 3 else len(fp)
pe_all = pair_effects(ex)
atp_all = pair_effects(attribute(model, fp.clean, fp.corrupted, m, hook=hook, method="atp"))
print("all pairs: AtP rho mean", round(spearman(atp_all.mean(0), pe_all.mean(0)), 3), "per pair", round(spearman(atp_all, pe_all), 3), flush=True)
pe_m = pe_all.mean(0); at_m = atp_all.mean(0); err = (at_m - pe_m).abs(); n_ = model.cfg.n_layer
print("all pairs AtP: rel L1 err of mean", round(float(err.sum() / pe_m.abs().sum()), 3),
      "err share by layer third", [round(float(err[i*n_//3:(i+1)*n_//3].sum() / err.sum()), 2) for i in range(3)],
      "exact mass by layer third", [round(float(pe_m.abs()[i*n_//3:(i+1)*n_//3].sum() / pe_m.abs().sum()), 2) for i in range(3)],
      "AtP/exact sum ratio", round(float(at_m.sum() / pe_m.sum()), 3), flush=True)
o = pe_m.abs().flatten().argsort(descending=True)
print("all pairs AtP: rho on top-36 cells", round(spearman(at_m.flatten()[o[:36]], pe_m.flatten()[o[:36]]), 3),
      "on the other 324", round(spearman(at_m.flatten()[o[36:]], pe_m.flatten()[o[36:]]), 3),
      "top-36 share of |exact|", round(float(pe_m.abs().flatten()[o[:36]].sum() / pe_m.abs().sum()), 3), flush=True)
fp = fp.subset(range(NSUB))
m = logit_diff(fp.answers, fp.wrongs)
pe = pe_all[:NSUB]
n = model.cfg.n_layer
ct, kt, mask = pair_tokens(model, fp.clean, fp.corrupted)
b, P = ct.shape
names = [f"blocks.{l}.hook_{hook}" for l in range(n)]
rp = [f"blocks.{l}.hook_resid_pre" for l in range(n)]
with torch.no_grad():
    _, cc = model.run_with_cache(ct, attention_mask=mask, names_filter=names)
    _, kc = model.run_with_cache(kt, attention_mask=mask, names_filter=names + rp)
a_ids, w_ids = torch.tensor(fp.answers), torch.tensor(fp.wrongs)
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 4
alphas = (torch.arange(steps) + 0.5) / steps
t0 = time.time()
lay = torch.zeros(b, n, P)
for l in range(n):
    d = cc[names[l]] - kc[names[l]]
    leaf = rearrange(kc[names[l]][None] + alphas.view(-1, 1, 1, 1) * d[None], "s b p d -> (s b) p d").requires_grad_(True)
    x0 = rearrange(kc[rp[l]][None].expand(steps, -1, -1, -1), "s b p d -> (s b) p d")
    mk = None if mask is None else mask.repeat(steps, 1)
    with torch.enable_grad(), model.hooks([(names[l], lambda act, hook: leaf)]):
        resid = model(x0, start_at_layer=l, stop_at_layer=n, attention_mask=mk)
        x = model.ln_final(resid[:, -1])
        logit = x @ model.W_U
        met = logit.gather(1, a_ids.repeat(steps)[:, None]) - logit.gather(1, w_ids.repeat(steps)[:, None])
        g, = torch.autograd.grad(met.sum(), [leaf])
    g = reduce(rearrange(g, "(s b) p d -> s b p d", s=steps), "s b p d -> b p d", "mean")
    lay[:, l] = (d * g).sum(-1)
print(f"layer-IG({steps}) {time.time()-t0:.0f} s", flush=True)
res = {"layer_ig": lay}
for meth in ("atp", "ig"):
    est = attribute(model, fp.clean, fp.corrupted, m, hook=hook, method=meth, ig_steps=5)
    res[meth] = pair_effects(est)
out = {}
exm = pe.mean(0)
order = exm.abs().flatten().argsort(descending=True)
for k, e in res.items():
    em = e.mean(0)
    row = {"rho_mean": spearman(em, exm), "rho_pairs": spearman(e, pe),
           "rho_mean_top60": spearman(em.flatten()[order[:60]], exm.flatten()[order[:60]]),
           "rho_mean_rest": spearman(em.flatten()[order[60:]], exm.flatten()[order[60:]]),
           "rel_err_mean": float((em - exm).abs().sum() / exm.abs().sum())}
    err = (em - exm).abs()
    row["err_share_by_layer_third"] = [float(err[i*n//3:(i+1)*n//3].sum() / err.sum()) for i in range(3)]
    row["err_share_last_pos"] = float(err[:, -1].sum() / err.sum())
    out[k] = row
    print(k, {kk: (round(v, 3) if isinstance(v, float) else [round(x, 2) for x in v]) for kk, v in row.items()}, flush=True)
out["exact_mass_top20"] = float(exm.abs().flatten()[order[:20]].sum() / exm.abs().sum())
out["exact_share_last_pos"] = float(exm.abs()[:, -1].sum() / exm.abs().sum())
print("exact |mean effect| mass in top-20 cells", round(out["exact_mass_top20"], 3), "at last pos", round(out["exact_share_last_pos"], 3))
# sign agreement on large cells
big = exm.abs() > 0.05 * exm.abs().max()
for k, e in res.items():
    em = e.mean(0)
    print(k, "sign agreement on cells > 5% of max:", float((em[big].sign() == exm[big].sign()).float().mean()), int(big.sum()))
from attribution import RESULTS
(RESULTS / f"attribution_diagnosis_{name}_{hook}.json").write_text(json.dumps(out, indent=1) + "\n")
