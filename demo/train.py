"""Train the shipped demo model: a small CN-CLIP (ViT + BERT towers) on the generated shape pictures.

    python -m demo.train --out build/demo-train --minutes 28

CPU only, two threads. Pictures are drawn afresh for every batch (drawing one costs well under a
millisecond, far less than a training step), so there is no dataset to store and no overfitting to
a fixed pool. Captions come from the training templates only; held-out combinations and phrasings
never appear. The loss is CLIP's symmetric contrastive loss with one change: a caption such as
"红色的星星" describes every red star in the batch, so each row's target spreads over all the
pictures (or captions) it truly matches instead of only its own pair.

A checkpoint in Chinese-CLIP's format (`{"state_dict": ..., "config": ...}`) is written every
`--save-every` steps and at the end, so a killed run keeps its progress; `--resume` continues one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import queue
import random
import threading
import time
from pathlib import Path

# The two cores are shared: OpenMP threads that spin at barriers while a neighbour holds a core make
# a step several times slower (measured 1.5 s vs 7 s per 64 pictures on a busy machine). Must be set
# before torch loads libgomp.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from demo import dataset, vocabulary  # noqa: E402
from retrieval.manifest import CNCLIP_MEAN, CNCLIP_STD  # noqa: E402
from retrieval.tokenizer import tokenize  # noqa: E402
from retrieval.toolchain.convert.model import CLIP  # noqa: E402

CONFIG_PATH = Path(__file__).with_name("model_config.json")
_MEAN = torch.tensor(CNCLIP_MEAN).view(1, 3, 1, 1)
_STD = torch.tensor(CNCLIP_STD).view(1, 3, 1, 1)


def load_config(path: Path = CONFIG_PATH) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def images_to_tensor(images: list) -> torch.Tensor:
    """224-px RGB pictures → cn_clip's normalised input (the pictures are drawn at 224 px, so the
    BICUBIC resize of the serving preprocess is the identity)."""
    arr = np.stack([np.asarray(im, dtype=np.uint8) for im in images]).transpose(0, 3, 1, 2)
    x = torch.from_numpy(np.ascontiguousarray(arr)).float().div_(255.0)
    return x.sub_(_MEAN).div_(_STD)


def patch_labels(images: list, attrs: list[vocabulary.Attributes], patch: int = 32) -> torch.Tensor:
    """[B, grid*grid] per patch: the shape's index where object pixels cover > 10 % of it, else len(shapes)."""
    # Every 4th pixel of every 4th row (8×8 samples per patch) estimates the cover well enough, and
    # costs a sixteenth: the full-resolution mask took half of the time to make a batch.
    stride = 4
    arr = np.stack([np.asarray(im)[stride // 2 :: stride, stride // 2 :: stride] for im in images]).astype(np.int16)
    colours = np.array([vocabulary.COLOURS[a.colour] for a in attrs], dtype=np.int16)[:, None, None, :]
    # Backgrounds never share a colour with the object, so "within the jitter of its colour" is its mask.
    mask = (np.abs(arr - colours).max(axis=3) <= 14).astype(np.float32)
    b, h, w = mask.shape
    cell = patch // stride
    cover = mask.reshape(b, h // cell, cell, w // cell, cell).mean(axis=(2, 4)).reshape(b, -1)
    shapes = np.array([vocabulary.VALUES["shape"].index(a.shape) for a in attrs])[:, None]
    return torch.from_numpy(np.where(cover > 0.1, shapes, len(vocabulary.SHAPES)).astype(np.int64))


def visual_features_and_patches(model: CLIP, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The image tower's forward (as `CLIP.encode_image`), also returning the last layer's patch tokens."""
    v = model.visual
    x = v.conv1(pixels).flatten(2).transpose(1, 2)
    x = torch.cat([v.class_embedding.expand(x.shape[0], 1, -1), x], dim=1) + v.positional_embedding
    x = v.transformer(v.ln_pre(x))
    return v.ln_post(x[:, 0, :]) @ v.proj, x[:, 1:, :]


def match_matrix(attrs: list[vocabulary.Attributes], captions: list[dataset.Caption]) -> torch.Tensor:
    """[images, captions] 1.0 where the picture has every attribute the caption names."""
    return torch.tensor([[float(a.matches(c.named)) for c in captions] for a in attrs])


def soft_clip_loss(img: torch.Tensor, txt: torch.Tensor, scale: torch.Tensor, match: torch.Tensor) -> torch.Tensor:
    logits = scale * img @ txt.t()
    to_text = match / match.sum(1, keepdim=True)
    to_image = (match / match.sum(0, keepdim=True)).t()
    loss_i = -(to_text * F.log_softmax(logits, dim=1)).sum(1).mean()
    loss_t = -(to_image * F.log_softmax(logits.t(), dim=1)).sum(1).mean()
    return (loss_i + loss_t) / 2


# Shape is what a patch-32 ViT learns last (colour and background come almost for free from the
# pixel means); its probe counts triple so that the first minutes go where they are needed.
PROBE_WEIGHTS = {"shape": 3.0}


class AttributeHeads(torch.nn.Module):
    """Training-only linear probes, one per attribute, shared by both towers' normalised features.

    From random initialisation both towers start out mapping everything to nearly one point, and
    the contrastive loss alone first learns only which captions are generic; on a few shared CPU
    cores the run collapsed and stayed there. Asking both image and text features to predict the
    attributes through the *same* heads gives every picture and caption a direct, aligned signal
    from the first step. The heads are not part of the shipped model.
    """

    def __init__(self, dim: int, width: int) -> None:
        super().__init__()
        self.heads = torch.nn.ModuleDict({k: torch.nn.Linear(dim, len(v)) for k, v in vocabulary.VALUES.items()})
        # Per patch token: which shape (or background) it shows. A dense signal that teaches the patch
        # embedding and early layers local shape features long before attention learns to find them.
        self.patch_head = torch.nn.Linear(width, len(vocabulary.SHAPES) + 1)

    def patch_loss(self, patches: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.patch_head(patches).flatten(0, 1), labels.flatten())

    def loss(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over attributes; label -100 = not named (captions), ignored."""
        losses = []
        for i, (key, head) in enumerate(self.heads.items()):
            target = labels[:, i]
            if (target >= 0).any():
                weight = PROBE_WEIGHTS.get(key, 1.0)
                losses.append(weight * F.cross_entropy(10.0 * head(features), target, ignore_index=-100))
        return torch.stack(losses).mean()


def attribute_labels(named: list[dict[str, object]]) -> torch.Tensor:
    """[n, keys] value indices per attribute, -100 where an attribute is not named."""
    rows = [[vocabulary.VALUES[k].index(d[k]) if k in d else -100 for k in vocabulary.VALUES] for d in named]
    return torch.tensor(rows, dtype=torch.int64)


@dataclasses.dataclass
class Batch:
    pixels: torch.Tensor  # [B, 3, 224, 224]
    tokens: torch.Tensor  # [B*k, 52]
    match: torch.Tensor  # [B, B*k]: 1 where the caption fits the picture
    image_labels: torch.Tensor  # [B, keys]
    text_labels: torch.Tensor  # [B*k, keys], -100 = not named
    patch_labels: torch.Tensor  # [B, 49]: shape index of the object in each patch, or "background"


class Batches:
    """Fresh training batches: pictures of training combinations, captions from training templates.

    `next()` returns a `Batch` of B pictures with k captions each."""

    def __init__(self, batch_size: int, seed: int, captions_per_image: int = 2) -> None:
        self.batch_size = batch_size
        self.captions_per_image = captions_per_image
        self.rng = random.Random(seed)
        self.token_cache: dict[str, np.ndarray] = {}
        self.counter = 0

    def _tokens(self, texts: list[str]) -> torch.Tensor:
        missing = [t for t in set(texts) if t not in self.token_cache]
        if missing:
            for t, row in zip(missing, tokenize(missing), strict=True):
                self.token_cache[t] = row
        return torch.from_numpy(np.stack([self.token_cache[t] for t in texts]))

    def prefetch(self, depth: int = 2) -> None:
        """Draw upcoming batches on a thread: drawing holds the GIL only while torch's kernels do not."""
        self.queue: queue.Queue = queue.Queue(maxsize=depth)

        def work() -> None:
            while True:
                self.queue.put(self.make())

        threading.Thread(target=work, daemon=True, name="batches").start()

    def next(self) -> Batch:
        return self.queue.get() if hasattr(self, "queue") else self.make()

    def make(self) -> Batch:
        attrs = [dataset.sample_split(self.rng, "train") for _ in range(self.batch_size)]
        images = []
        for a in attrs:
            self.counter += 1
            images.append(dataset.render(a, seed=self.rng.getrandbits(40)))
        # Several captions per picture: text is cheap to encode, pictures are not.
        captions = [dataset.caption(a, self.rng, framed=0.3) for a in attrs for _ in range(self.captions_per_image)]
        return Batch(
            pixels=images_to_tensor(images),
            tokens=self._tokens([c.text for c in captions]),
            match=match_matrix(attrs, captions),
            image_labels=attribute_labels([dataclasses.asdict(a) for a in attrs]),
            text_labels=attribute_labels([c.named for c in captions]),
            patch_labels=patch_labels(images, attrs),
        )


@torch.no_grad()
def quick_eval(model: CLIP, n: int = 200) -> dict[str, float]:
    """Held-out text → image R@1 on a small gallery, in torch (the shipped numbers come from demo.evaluate)."""
    model.eval()
    gallery = dataset.samples("heldout", n, seed=99)
    rng = random.Random(5)
    queries = [dataset.caption(s.attributes, rng, dataset.HELDOUT_TEMPLATES) for s in gallery]
    img = F.normalize(model.encode_image(images_to_tensor([s.image() for s in gallery])), dim=-1)
    txt = F.normalize(model.encode_text(torch.from_numpy(tokenize([q.text for q in queries]))), dim=-1)
    top = (txt @ img.t()).argmax(1).tolist()
    hits = [gallery[j].attributes.matches(q.named) for q, j in zip(queries, top, strict=True)]
    model.train()
    return {"t2i_r1": sum(hits) / len(hits)}


def param_groups(model: CLIP, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        # Norms, biases, embeddings and the temperature are not decayed (as in CLIP training).
        if p.ndim < 2 or "embedding" in name or name == "logit_scale":
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def save_checkpoint(
    path: Path, model: CLIP, heads: AttributeHeads, config: dict, step: int, optimizer: torch.optim.Optimizer
) -> None:
    state = {"state_dict": model.state_dict(), "config": config, "step": step}
    tmp = path.with_suffix(".tmp")
    torch.save({**state, "heads": heads.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
    tmp.replace(path)


def _resume(ckpt: Path, model: CLIP, heads: AttributeHeads, optimizer: torch.optim.Optimizer) -> int:
    """Load a run's checkpoint into the model, the heads and (when it fits) the optimizer; its step."""
    raw = torch.load(ckpt, map_location="cpu", weights_only=True)
    model.load_state_dict(raw["state_dict"])
    missing = heads.load_state_dict(raw["heads"], strict=False).missing_keys
    if not missing:  # an optimizer state only fits the same set of parameters
        optimizer.load_state_dict(raw["optimizer"])
    return int(raw["step"])


def _train_step(
    model: CLIP, heads: AttributeHeads, optimizer: torch.optim.Optimizer, batch: Batch, attribute_weight: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimisation step; returns (contrastive loss, probe loss, logit scale) for the log."""
    raw_img, patches = visual_features_and_patches(model, batch.pixels)
    img = F.normalize(raw_img, dim=-1)
    txt = F.normalize(model.encode_text(batch.tokens), dim=-1)
    scale = model.logit_scale.exp()
    contrastive = soft_clip_loss(img, txt, scale, batch.match)
    probes = heads.loss(img, batch.image_labels) + heads.loss(txt, batch.text_labels)
    probes = probes + heads.patch_loss(patches, batch.patch_labels)
    loss = contrastive + attribute_weight * probes
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([*model.parameters(), *heads.parameters()], 1.0)
    optimizer.step()
    with torch.no_grad():
        model.logit_scale.clamp_(0, math.log(100))
    return contrastive, probes, scale


def train(args: argparse.Namespace) -> Path:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = load_config(Path(args.config))
    (out / "model_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    model = CLIP.from_config(config).train()
    heads = AttributeHeads(model.embed_dim, config["vision_width"])
    groups = param_groups(model, args.weight_decay) + [{"params": list(heads.parameters()), "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.98), eps=1e-6)
    ckpt = out / "checkpoint.pt"
    start = _resume(ckpt, model, heads, optimizer) if args.resume and ckpt.is_file() else 0
    batches = Batches(args.batch_size, seed=args.seed * 7919 + start, captions_per_image=args.captions_per_image)
    batches.prefetch()
    log = (out / "train.log").open("a", encoding="utf-8")
    began = time.monotonic()
    step = start
    for step in range(start + 1, args.steps + 1):
        # The cosine schedule follows whichever budget runs out first, steps or minutes, so a run on
        # busy cores still anneals instead of being cut off at a high learning rate.
        elapsed = time.monotonic() - began
        progress = min(1.0, max(step / args.steps, elapsed / (args.minutes * 60)))
        warm = min(1.0, step / args.warmup)
        lr = args.lr * warm * 0.5 * (1 + math.cos(math.pi * progress))
        for g in optimizer.param_groups:
            g["lr"] = lr
        contrastive, probes, scale = _train_step(model, heads, optimizer, batches.next(), args.attribute_weight)
        elapsed = time.monotonic() - began
        if step % args.log_every == 0 or step == args.steps:
            line = f"step {step} loss {contrastive.item():.4f} probes {probes.item():.4f} scale {scale.item():.1f} lr {lr:.2e} elapsed {elapsed:.0f}s"
            if step % args.eval_every == 0 or step == args.steps:
                line += f" heldout_t2i_r1 {quick_eval(model)['t2i_r1']:.3f}"
            print(line, flush=True)
            log.write(line + "\n")
            log.flush()
        if step % args.save_every == 0:
            save_checkpoint(ckpt, model, heads, config, step, optimizer)
        if progress >= 1.0:
            print(f"time budget of {args.minutes} min reached at step {step}", flush=True)
            break
    save_checkpoint(ckpt, model, heads, config, step, optimizer)
    # The shipped checkpoint: weights and config only, as `cnclip convert --checkpoint` reads it.
    final = out / "demo.pt"
    torch.save({"state_dict": model.state_dict(), "config": config, "step": step}, final)
    return final


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="build/demo-train", help="checkpoint + log directory")
    p.add_argument("--config", default=str(CONFIG_PATH), help="cn_clip merged model config (JSON)")
    p.add_argument("--steps", type=int, default=100_000, help="step budget (by default the time budget ends the run)")
    p.add_argument("--minutes", type=float, default=28.0, help="stop after this much wall-clock time")
    p.add_argument("--batch-size", type=int, default=64, help="pictures per step")
    p.add_argument("--captions-per-image", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--attribute-weight", type=float, default=1.0, help="weight of the attribute probes' loss")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup", type=int, default=60)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    print(f"wrote {train(p.parse_args())}")


if __name__ == "__main__":
    main()
