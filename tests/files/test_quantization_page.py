"""The page of a text scored against a base (files.quantization_page): a model's text reaches it only as
JSON with `<` escaped, so a hostile piece cannot end the script or open another."""

from __future__ import annotations

from tokenviz.files.quantization_page import quantization_page, save_quantization_page

HOSTILE = "</script><script>alert(1)</script><img src=x onerror=alert(2)>"


def document() -> dict:
    side = {"name": HOSTILE}
    tail = {"index": 1, "id": 7, "text": HOSTILE, "before": HOSTILE, "kld": 0.5, "dp": -0.1, "lens": None}
    tail |= {"top": [{"id": 7, "text": HOSTILE, "prob": 0.5}], "base_top": [{"id": 8, "text": "x", "prob": 0.6}]}
    statistics = {"mean_kld": 0.5, "max_kld": 0.5, "rms_dp": 0.1, "same_top_p": 0.0, "ppl_ratio": 1.1}
    return {
        "model": side,
        "base": side,
        "window": 4,
        "windows": 1,
        "statistics": statistics,
        "tails": {"by_kld": [tail], "by_dp": [tail], "changed_top": [tail], "changed_top_count": 1},
        "scored": {"index": [1], "kld": [0.5], "dp": [-0.1], "changed": [True]},
        "pieces": [HOSTILE, HOSTILE, "a", "b"],
    }


def test_a_hostile_piece_stays_data(tmp_path):
    page = quantization_page(document())
    assert page.count("<script") == 2 and page.count("</script>") == 2  # the data and the code, no more
    assert "<img" not in page and "alert(1)</script>" not in page
    path = save_quantization_page(tmp_path / "q.html", document())
    assert path.read_text() == page
