"""`retrieval.tokenize` against cn_clip's own FullTokenizer (imported by file path, no torch)."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest

import retrieval
from retrieval.tokenizer import VOCAB_PATH, Tokenizer, load_vocab


def _load_reference():
    import cn_clip

    path = Path(cn_clip.__file__).parent / "clip" / "bert_tokenizer.py"
    spec = importlib.util.spec_from_file_location("cn_clip_bert_tokenizer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FullTokenizer(vocab_file=str(VOCAB_PATH))


@pytest.fixture(scope="module")
def reference():
    return _load_reference()


def reference_tokenize(ref, text: str, context_length: int = 52) -> list[int]:
    """cn_clip.clip.tokenize, line for line, with a list instead of a torch tensor."""
    ids = [ref.vocab["[CLS]"]] + ref.convert_tokens_to_ids(ref.tokenize(text))[: context_length - 2]
    ids.append(ref.vocab["[SEP]"])
    return ids + [0] * (context_length - len(ids))


def parity_corpus() -> list[str]:
    """≥ 300 strings over every category the issue names, fixed by a seed."""
    rng = random.Random(20240607)
    fixed = [
        "穿红色裙子的女孩",
        "一只猫在沙发上睡觉",
        "海边的日落",
        "北京天安门广场上的人群",
        "a dog running on the beach",
        "Red Car parked on the STREET",
        "iPhone 15 Pro Max 手机壳",
        "2024年5月1日 下午3点",
        "价格：￥1,299.00元",
        "3.14159 2.71828 1e-10",
        "😀🐱🚗 emoji 表情",
        "👨‍👩‍👧‍👦 family",
        "ＡＢＣ　ｄｅｆ　１２３，全角！",
        "café naïve résumé Ångström Øresund",
        "Ĳsselmeer ǅemal İstanbul straße",
        "Привет мир",
        "こんにちは世界 カタカナ",
        "안녕하세요 세계",
        "مرحبا بالعالم",
        "שלום עולם",
        "नमस्ते दुनिया",
        "สวัสดีชาวโลก",
        "Γειά σου Κόσμε ; ·",
        "tab\tnew\nline\rcarriage",
        "zero\u200bwidth\u200cjoin\u200d\ufeffbom",
        "control\x00\x01\x07\x1b\x7f chars",
        "line\u2028sep\u2029para\x85next\x1cfs",
        "\ufffdreplacement\ufffd",
        "",
        " ",
        "   \t\n  ",
        "\u3000\u3000",
        "...!!!???",
        "(括号)【方括号】《书名号》「引号」",
        "hello-world_foo/bar\\baz",
        "x" * 199,
        "x" * 200,
        "x" * 201,
        "supercalifragilisticexpialidocious antidisestablishmentarianism",
        "𠀀𠀁𪚥 rare CJK ext B",
        "丽 compatibility 﨑",
        "a" + "\u0301" * 5 + "b",
        "ﬁ ligature ﬀ",
        "½ ² ³ ⅓ Ⅻ",
        "°C ℃ ‰ № ™ ©",
        "https://example.com/path?q=1&r=2#frag",
        "user@example.com",
        "#hashtag @mention $100 50%",
        "。，、；：？！",
        "中" * 60,
        "很长的句子" * 30,
        "word " * 80,
        "混合mixed中英文English文本text",
    ]
    pools = {
        "chinese": "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安场身车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连断深难近矿千周委素技备半办青省列习响约支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派层片始却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严龙飞",
        "english": [
            "the",
            "a",
            "of",
            "and",
            "dog",
            "cat",
            "car",
            "red",
            "blue",
            "girl",
            "boy",
            "running",
            "beach",
            "sunset",
            "mountain",
            "city",
            "photo",
            "picture",
            "of",
            "with",
            "on",
            "in",
            "at",
        ],
        "digits": "0123456789",
        "punct": "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~，。！？、；：“”‘’（）【】《》—…·",
        "accented": "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿÀÉÎÕÜŠŽčćđłńśźżőű",
        "scripts": "абвгдежзийклмнопрстуфхцчшщъыьэюяαβγδεζηθικλμνξοπρστυφχψωあいうえおアイウエオ가나다라마바사אבגדהوزحطيکگहिन्दीไทย",
        "emoji": "😀😃😄😁😆😅🤣😂🙂🙃😉😊😇🥰😍🤩😘🐶🐱🐭🐹🐰🦊🐻🐼🚗🚕🚙🚌🏎🌸🌺🌻🌹🍎🍊🍋🍌",
        "fullwidth": "ＡＢＣＤＥＦＧＨＩＪａｂｃｄｅｆｇｈｉｊ０１２３４５６７８９！？（）",
        "invisible": "\u200b\u200c\u200d\u2060\ufeff\u00ad\u200e\u200f\u202a\u202c",
        "space": " \t\n\u3000\u00a0\u2002\u2003\u2009",
        "control": "\x00\x01\x02\x08\x0b\x0c\x0e\x1f\x7f\x80\x9f",
    }
    corpus = list(fixed)
    for _ in range(320):
        kinds = rng.sample(sorted(pools), rng.randint(1, 4))
        parts = []
        for _ in range(rng.randint(1, 12)):
            pool = pools[rng.choice(kinds)]
            piece = rng.choice(pool) if isinstance(pool, list) else "".join(rng.choices(pool, k=rng.randint(1, 6)))
            parts.append(piece)
        corpus.append(rng.choice(["", " "]).join(parts))
    corpus.append("".join(rng.choices(pools["chinese"] + pools["english"][0] + " ,.!", k=10_000)))
    corpus.append(" ".join(rng.choices(pools["english"], k=2_000)))
    return corpus


def test_corpus_is_large_enough() -> None:
    assert len(parity_corpus()) >= 300


def test_identical_to_cn_clip_on_parity_corpus(reference) -> None:
    corpus = parity_corpus()
    ours = retrieval.tokenize(corpus)
    assert ours.dtype == np.int64 and ours.shape == (len(corpus), 52)
    mismatches = [t for t, row in zip(corpus, ours, strict=True) if row.tolist() != reference_tokenize(reference, t)]
    assert mismatches == []


def test_other_context_lengths_match(reference) -> None:
    corpus = parity_corpus()[:80]
    for length in (2, 8, 77):
        ours = retrieval.tokenize(corpus, context_length=length)
        assert ours.tolist() == [reference_tokenize(reference, t, length) for t in corpus]


def test_shape_special_tokens_and_padding() -> None:
    single = retrieval.tokenize("猫")
    assert single.shape == (1, 52)
    vocab = load_vocab()
    assert single[0, :3].tolist() == [vocab["[CLS]"], vocab["猫"], vocab["[SEP]"]]
    assert not single[0, 3:].any()
    empty = retrieval.tokenize([""])
    assert empty[0, :2].tolist() == [101, 102] and not empty[0, 2:].any()
    long = retrieval.tokenize(["猫" * 100])[0]
    assert long[0] == 101 and long[-1] == 102 and (long[1:-1] == vocab["猫"]).all()
    assert retrieval.tokenize([]).shape == (0, 52)


def test_unknown_word_and_long_word_are_unk() -> None:
    tokenizer = Tokenizer()
    unk = tokenizer.vocab["[UNK]"]
    assert tokenizer.encode("\U0001f9ff") == [unk]  # a character not in the vocabulary
    assert tokenizer.encode("a" * 201) == [unk]  # cn_clip's 200-character word limit


def test_rejects_non_strings() -> None:
    with pytest.raises(TypeError):
        retrieval.tokenize([b"bytes"])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        retrieval.tokenize("x", context_length=1)


def test_vocab_matches_cn_clip_file() -> None:
    import cn_clip

    theirs = Path(cn_clip.__file__).parent / "clip" / "vocab.txt"
    assert VOCAB_PATH.read_bytes() == theirs.read_bytes()
    assert len(load_vocab()) == 21128
