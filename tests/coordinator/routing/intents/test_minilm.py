import numpy as np

from agentreach.coordinator.routing.intents.minilm import WordPiece, _basic_tokens, model_dir


def test_basic_tokenizer_splits_cjk_punctuation_and_accents():
    """BERT's pre-tokenizer: each CJK character alone, punctuation split off, accents stripped."""
    assert _basic_tokens("Café, 退款!") == ["cafe", ",", "退", "款", "!"]


def test_embeddings_are_unit_vectors_independent_of_batching(minilm):
    """Each text's vector has norm 1 and does not depend on what it was batched with."""
    texts = [
        "refund please",
        "我的订单到哪了",
        "a much longer request about a parcel that never arrived",
    ]
    together = minilm.encode(texts)
    alone = np.stack([minilm.encode([t])[0] for t in texts])
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    assert np.allclose(together, alone, atol=1e-5)


def test_wordpiece_known_ids(minilm):
    """Token ids match the reference BERT tokenizer on a sample (checked against `tokenizers`)."""
    wp = WordPiece(model_dir() / "vocab.txt")
    assert wp.encode("I'm not receiving the verification code") == [
        101,
        1045,
        1005,
        1049,
        2025,
        4909,
        1996,
        22616,
        3642,
        102,
    ]
