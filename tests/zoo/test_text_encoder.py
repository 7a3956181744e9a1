"""The word-embedding text encoder: fixed vocabulary, unknown words, padding, serialization."""

import pytest
import torch

from sixbit.zoo.shapes.text_encoder import ShapesTextEncoder
from sixbit.zoo.shapes.world import VOCABULARY


def test_unknown_word_raises_and_lists_the_vocabulary():
    enc = ShapesTextEncoder()
    with pytest.raises(ValueError) as err:
        enc.encode("a purple circle moving right")
    msg = str(err.value)
    assert "purple" in msg and all(w in msg for w in VOCABULARY)


def test_tokenize_pads_and_is_case_insensitive():
    enc = ShapesTextEncoder(max_length=10)
    ids = enc.tokenize(["a red circle moving right", "A RED circle  moving right", ""])
    assert ids.shape == (3, 10)
    assert torch.equal(ids[0], ids[1])
    assert (ids[0, :5] > 0).all() and (ids[0, 5:] == 0).all()
    assert (ids[2] == 0).all()  # the empty prompt is all padding = the unconditional embedding
    with pytest.raises(ValueError, match="at most 10"):
        enc.tokenize(" ".join(["a"] * 11))


def test_distinct_words_give_distinct_embeddings():
    enc = ShapesTextEncoder()
    e = enc.encode(["a red circle moving right", "a blue circle moving right"])
    assert e.shape == (2, 10, 64)
    assert not torch.allclose(e[0, 1], e[1, 1])
    torch.testing.assert_close(e[0, 2:], e[1, 2:], rtol=0, atol=0)


def test_save_and_load_roundtrip(tmp_path):
    torch.manual_seed(0)
    enc = ShapesTextEncoder(embed_dim=16, max_length=12)
    enc.save_pretrained(tmp_path)
    loaded = ShapesTextEncoder.from_pretrained(tmp_path)
    assert loaded.vocabulary == list(VOCABULARY) and loaded.config.max_length == 12
    prompts = ["a yellow triangle moving down on a textured background", ""]
    torch.testing.assert_close(loaded.encode(prompts), enc.encode(prompts), rtol=0, atol=0)
