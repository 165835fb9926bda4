from agentreach.coordinator.routing.intents.text import Tokenizer


def test_english_is_stemmed_and_stripped_of_function_words_and_numbers():
    """Inflections fold together; stop words and order numbers vanish; negation stays."""
    tok = Tokenizer()
    assert tok("Refunds refunded for order 12345") == ["refund", "refund", "order"]
    assert tok("I didn't make this charge") == ["not", "make", "charg"]


def test_chinese_becomes_bigrams_and_meaningful_single_characters():
    """A Chinese sentence (no spaces) yields character bigrams plus non-grammar characters."""
    tok = Tokenizer()
    assert "退款" in tok("我要申请退款") and "申请" in tok("我要申请退款")
    assert tok("退款了") == ["退款", "款了", "退", "款"]
    assert tok("了") == []  # a lone grammar character says nothing
    assert Tokenizer(chinese="bigram")("退款了") == ["退款", "款了"]


def test_mixed_text_and_full_width_characters():
    """English and Chinese in one text both tokenize; full-width letters are normalized."""
    tok = Tokenizer()
    tokens = tok("ＡＰＰ打不开 app crash")
    assert tokens[0] == "app" and "打不" in tokens and "crash" in tokens


def test_unknown_mode_is_refused_by_name():
    """A misspelt Chinese mode fails when the tokenizer is built."""
    import pytest

    with pytest.raises(ValueError, match="chinese must be"):
        Tokenizer(chinese="words")  # type: ignore[arg-type]
