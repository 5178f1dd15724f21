"""English glosses of Chinese text from CC-CEDICT (the real dictionary the package ships)."""

from __future__ import annotations

from psych_sidecar.search import english_gloss, first_sentence, tool_texts


def test_text_without_han_characters_has_no_gloss() -> None:
    assert english_gloss("Get the weather forecast") == ""
    assert english_gloss("") == ""
    # Kana and Hangul are not in CC-CEDICT.
    assert english_gloss("ひらがな 한국어") == ""


def test_words_are_cut_longest_first_and_glossed_in_order() -> None:
    gloss = english_gloss("获取菜谱")
    # 获取 (to acquire) before 菜谱 (recipe), each as a whole word, not character by character.
    assert gloss.index("to acquire") < gloss.index("recipe")
    assert "vegetable" not in gloss  # 菜 alone would say "vegetable"


def test_traditional_characters_gloss_too() -> None:
    assert "recipe" in english_gloss("菜譜")


def test_measure_words_and_pinyin_references_are_left_out() -> None:
    gloss = english_gloss("猫")
    assert "cat" in gloss
    assert "CL:" not in gloss
    assert "[" not in gloss


def test_mixed_text_glosses_only_its_chinese() -> None:
    assert english_gloss("36 氪 hot list") == english_gloss("氪")


def test_the_encoder_reads_a_chinese_description_as_name_words_and_gloss() -> None:
    words, text = tool_texts("whatToEat", "根据人数推荐菜品")
    assert words == "what To Eat"
    assert text.startswith("what To Eat. ")
    assert "recommend" in text
    assert tool_texts("now", " Current time. ") == ("now", "Current time.")
    assert tool_texts("get_it", "  ") == ("get it", "get it")


def test_first_sentence_is_what_the_tool_is_for() -> None:
    assert first_sentence("Search PubMed. Use the think tool first.") == "Search PubMed."
    assert first_sentence("\n  Convert an address.\n\nArgs: address") == "Convert an address."
    assert first_sentence("Version e.g.1.2 of it") == "Version e.g.1.2 of it"
    assert first_sentence("获取热榜。包含新闻") == "获取热榜。"
