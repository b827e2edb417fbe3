"""The training script: its loss, its batches, and a checkpoint that `cnclip convert` can read."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from demo import dataset, train, vocabulary
from retrieval.preprocess import normalise
from retrieval.toolchain.convert.checkpoint import build_model, load_checkpoint

TINY = {
    **train.load_config(),
    "vision_layers": 1,
    "vision_width": 64,
    "embed_dim": 32,
    "text_hidden_size": 32,
    "text_num_attention_heads": 1,
    "text_intermediate_size": 64,
    "text_num_hidden_layers": 1,
}


def test_soft_loss_is_lowest_when_features_agree_with_the_match_matrix() -> None:
    torch.manual_seed(0)
    img = F.normalize(torch.randn(4, 16), dim=-1)
    scale = torch.tensor(20.0)
    # Captions 0 and 1 both describe picture 0 ("红色的星星" fits two pictures): two positives in row 0.
    match = torch.eye(4)
    match[1, 0] = 1.0
    aligned = train.soft_clip_loss(img, img.clone(), scale, match)
    shuffled = train.soft_clip_loss(img, img[[1, 2, 3, 0]], scale, match)
    assert aligned < shuffled
    assert torch.isfinite(aligned)


def test_batches_match_matrix_says_which_caption_fits_which_picture() -> None:
    batches = train.Batches(batch_size=6, seed=0, captions_per_image=2)
    batch = batches.next()
    assert batch.pixels.shape == (6, 3, 224, 224)
    assert batch.tokens.shape == (12, 52) and batch.tokens.dtype == torch.int64
    assert batch.match.shape == (6, 12)
    for i in range(6):  # each picture's own captions fit it
        assert batch.match[i, 2 * i] == 1 and batch.match[i, 2 * i + 1] == 1
    # Pictures have every attribute; captions only those they name (-100 elsewhere).
    assert batch.image_labels.shape == (6, len(vocabulary.VALUES)) and (batch.image_labels >= 0).all()
    assert ((batch.text_labels >= 0).sum(1) >= 1).all()


def test_attribute_labels_index_the_value_lists() -> None:
    labels = train.attribute_labels([{"shape": "星形", "colour": "红色"}, {"position": None, "count": 3}])
    keys = list(vocabulary.VALUES)
    assert labels[0, keys.index("shape")] == vocabulary.VALUES["shape"].index("星形")
    assert labels[0, keys.index("count")] == -100
    assert labels[1, keys.index("position")] == len(vocabulary.VALUES["position"]) - 1
    assert labels[1, keys.index("count")] == 2


def test_training_pixels_equal_the_serving_preprocess() -> None:
    img = dataset.samples("train", 1, seed=0)[0].image()
    ours = train.images_to_tensor([img])[0].numpy()
    assert np.allclose(ours, normalise(img), atol=1e-5)


def test_two_steps_write_a_checkpoint_that_convert_loads(tmp_path: Path) -> None:
    config_path = tmp_path / "tiny.json"
    config_path.write_text(json.dumps(TINY), encoding="utf-8")
    args = Namespace(
        out=str(tmp_path / "run"),
        config=str(config_path),
        steps=2,
        minutes=5.0,
        batch_size=4,
        captions_per_image=2,
        lr=1e-3,
        attribute_weight=1.0,
        weight_decay=0.05,
        warmup=1,
        threads=1,
        seed=0,
        log_every=1,
        eval_every=1000,
        save_every=1,
        resume=False,
    )
    final = train.train(args)
    assert "step 2 loss" in (tmp_path / "run" / "train.log").read_text(encoding="utf-8")
    config, state = load_checkpoint(final)
    assert config == TINY
    model = build_model(config, state)  # strict: every key of the architecture, nothing else
    assert model.encode_text(torch.zeros(1, 52, dtype=torch.int64)).shape == (1, 32)
