"""Would a small trained draft head beat token recycling on this CPU? A measurement, not a shipped drafter.

The head (EAGLE-style, Li et al. 2024, without attention): from the target's last hidden state f_t (after the
final norm) and the embedding of the next token x_{t+1}, predict the next hidden state; the target's own LM
head (restricted to the K most frequent tokens of the training text) turns it into a draft token, and the
head runs again on its own output for deeper drafts. Training data needs no corpus: SmolLM2 writes user
prompts itself (sampled after the chat template's user header), then answers them greedily; the hidden
states come from those answers. Evaluation: the first N Spec-Bench questions per category (the benchmark's
questions, never trained on), greedy answers of the target, top-1 agreement of the head per draft depth.

  python experiments/head_probe.py gen --batches 4 --out /tmp/head     # ~6 min per batch of 128 on 2 cores
  python experiments/head_probe.py eval-data --out /tmp/head
  python experiments/head_probe.py train --out /tmp/head --epochs 6
"""
import argparse
import glob
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

CKPT = "models/smollm2-135m"


def answers(model, tok, prompts: list, max_new: int):
    """Greedy answers with the hidden state that predicted each answer token -> [(ids [n], h [n,E] f16)]."""
    end = tok.convert_tokens_to_ids("<|im_end|>")
    enc = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        g = model.generate(**enc, do_sample=False, max_new_tokens=max_new, output_hidden_states=True,
                           return_dict_in_generate=True, pad_token_id=end)
    seq = g.sequences[:, enc.input_ids.shape[1]:]
    H = torch.stack([h[-1][:, -1, :] for h in g.hidden_states], 1)  # last layer (after the final norm)
    out = []
    for i in range(len(prompts)):
        stop = (seq[i] == end).nonzero()
        n = int(stop[0]) + 1 if len(stop) else seq.shape[1]
        out.append((seq[i, :n].numpy(), H[i, :n].numpy().astype(np.float16)))
    return out


def save(path: Path, rows, **extra):
    np.savez(path, ids=np.concatenate([r[0] for r in rows]), h=np.concatenate([r[1] for r in rows]),
             lens=np.array([len(r[0]) for r in rows]), **extra)


def cmd_gen(a, model, tok):
    header = tok.apply_chat_template([{"role": "user", "content": "X"}], tokenize=False).split("X")[0]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    for b in range(a.batches):
        torch.manual_seed(a.seed * 1000 + b)
        enc = tok([header] * a.batch, return_tensors="pt")
        with torch.no_grad():
            q = model.generate(**enc, do_sample=True, temperature=1.0, max_new_tokens=48, eos_token_id=end,
                               pad_token_id=end)
        users = [tok.decode(x[enc.input_ids.shape[1]:], skip_special_tokens=True).strip() for x in q]
        prompts = [tok.apply_chat_template([{"role": "user", "content": u}], tokenize=False,
                                           add_generation_prompt=True) for u in users]
        t = time.time()
        save(Path(a.out) / f"train_{a.seed}_{b}.npz", answers(model, tok, prompts, 128))
        print(f"batch {b}: {time.time() - t:.0f} s; e.g. {users[0][:70]!r}", flush=True)


def cmd_eval_data(a, model, tok):
    from specexport.bench import questions

    qs = questions(a.questions, a.per_category)
    rows = []
    for b in range(0, len(qs), 13):
        prompts = [tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], tokenize=False,
                                           add_generation_prompt=True) for q in qs[b:b + 13]]
        rows += answers(model, tok, prompts, 128)
    save(Path(a.out) / "eval.npz", rows)


class Head(torch.nn.Module):
    def __init__(self, E: torch.Tensor, scale: float = 45.0):  # scale: typical norm of a final hidden state
        super().__init__()
        D = E.shape[1]
        self.E, self.scale = E, scale
        self.fc = torch.nn.Linear(2 * D, D)
        self.w1, self.w2 = torch.nn.Linear(D, D), torch.nn.Linear(D, D)

    def forward(self, f, x):
        z = self.fc(torch.cat([f / self.scale, self.E[x]], -1))
        return (z + self.w2(torch.nn.functional.silu(self.w1(z)))) * self.scale


def load(paths):
    ds = [np.load(p) for p in paths]
    ids = np.concatenate([d["ids"] for d in ds]).astype(np.int64)
    lens = np.concatenate([d["lens"] for d in ds])
    return torch.tensor(ids), torch.tensor(np.concatenate([d["h"] for d in ds]).astype(np.float32)), lens


def starts(lens, depth, seqs=None):
    s0 = np.concatenate([[0], np.cumsum(lens)[:-1]])
    seqs = range(len(lens)) if seqs is None else seqs
    return np.array([s0[s] + j for s in seqs for j in range(lens[s] - depth)], dtype=np.int64)


def unroll(head, H, ids, idx, depth, sub, remap, Es):
    """-> (loss, [top-1 agreement per depth], chain all-correct rate)."""
    f, loss, accs, chain = H[idx], 0.0, [], torch.ones(len(idx), dtype=torch.bool)
    for d in range(depth):
        f = head(f, ids[idx + d])
        logits = f @ Es.T
        want = ids[idx + d + 1]
        loss = loss + torch.nn.functional.cross_entropy(logits, remap[want], ignore_index=-100) \
            + torch.nn.functional.smooth_l1_loss(f / head.scale, H[idx + d + 1] / head.scale)
        ok = sub[logits.argmax(-1)] == want
        chain &= ok
        accs.append(ok.float().mean().item())
    return loss, accs, chain.float().mean().item()


def cmd_train(a, model, tok):
    torch.manual_seed(0)
    E = model.get_input_embeddings().weight.detach()
    ids, H, lens = load(sorted(glob.glob(str(Path(a.out) / "train_*.npz"))))
    freq = np.bincount(ids.numpy(), minlength=E.shape[0])
    sub = torch.tensor(np.argsort(-freq)[:a.vocab])
    remap = torch.full((E.shape[0],), -100, dtype=torch.long)
    remap[sub] = torch.arange(len(sub))
    head, Es = Head(E), E[sub]
    tr = starts(lens, a.depth)
    print(f"{len(tr)} training positions from {len(lens)} answers ({len(ids)} tokens); the top-{a.vocab} "
          f"tokens cover {freq[sub.numpy()].sum() / freq.sum():.3f} of them", flush=True)
    opt = torch.optim.AdamW(head.parameters(), lr=a.lr, weight_decay=0.01)
    steps = a.epochs * (len(tr) // a.batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, a.lr, total_steps=steps, pct_start=0.1)
    eids, eH, elens = load([Path(a.out) / "eval.npz"])
    ev = torch.tensor(starts(elens, a.depth))
    t = time.time()
    for ep in range(a.epochs):
        np.random.default_rng(ep).shuffle(tr)
        for b in range(0, len(tr) - a.batch + 1, a.batch):
            loss = unroll(head, H, ids, torch.tensor(tr[b:b + a.batch]), a.depth, sub, remap, Es)[0]
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            sched.step()
        with torch.no_grad():
            _, accs, chain = unroll(head, eH, eids, ev, a.depth, sub, remap, Es)
        print(f"epoch {ep} ({time.time() - t:.0f} s): Spec-Bench top-1 per depth "
              f"{' '.join(f'{x:.3f}' for x in accs)}, all {a.depth} right {chain:.3f}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cmd", choices=["gen", "eval-data", "train"])
    p.add_argument("--out", default="/tmp/head")
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--batch", type=int, default=128, help="gen: prompts per batch; train: positions per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--questions", default="../shared/specbench/question.jsonl")
    p.add_argument("--per-category", type=int, default=4)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--lr", type=float, default=1e-3)
    a = p.parse_args()
    torch.set_num_threads(2)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(CKPT, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(CKPT, dtype=torch.float32).eval()
    {"gen": cmd_gen, "eval-data": cmd_eval_data, "train": cmd_train}[a.cmd](a, model, tok)


if __name__ == "__main__":
    main()
