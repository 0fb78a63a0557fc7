"""The footer shows only the keys that fit whole, the palette's at the right: at 80 columns a key cut in
half ("e prom") read as a key that does not exist. A wider terminal shows more of them, in order."""

import pytest
from apptools import make_app, settle

from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.fitting_footer import FittingFooter


def footer_keys(app) -> list:
    from textual.widgets._footer import FooterKey

    return list(app.journey.query_one(FittingFooter).query(FooterKey))


@pytest.mark.parametrize("width", [80, 100, 160])
async def test_every_footer_key_is_whole_and_the_palette_stays(width):
    app = make_app(SamplingSettings(temperature=0))
    async with app.run_test(size=(width, 30)) as pilot:
        await settle(app, pilot)
        await pilot.pause()
        keys = footer_keys(app)
        palette = [k for k in keys if k.has_class("-command-palette")]
        shown = [k for k in keys if k not in palette]
        assert len(palette) == 1 and [k.description for k in shown[:2]] == ["quit", "help"]
        for key in shown:  # each whole, left of the palette's
            assert key.region.width >= len(key.key_display) + len(key.description)
            assert key.region.right <= palette[0].region.x, (key.description, key.region, palette[0].region)
        if width == 160:
            assert len(shown) > 8
